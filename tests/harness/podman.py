"""podman with a private store, configuration and hooks dir.

Every podman call gets its own storage root, runroot, tmpdir and config files
(through CONTAINERS_CONF, CONTAINERS_STORAGE_CONF and
CONTAINERS_REGISTRIES_CONF), so the tests neither see nor change the host's
images and containers, read no host hooks, and never reach for a registry
(empty registries.conf, `--pull never`, `--network none`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from .rootfs import RootfsCache, image_ref

CONTAINERS_CONF = """\
[containers]
netns = "none"

[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
runtime = "runc"
"""

# podman 4.3 reads CDI specs only from the fixed /etc/cdi and /var/run/cdi.
# To give one run its own spec dir without touching the host, podman runs in a
# private mount namespace where /etc is overlaid (upper layer on a tmpfs) and
# the test's dir is bind-mounted on /etc/cdi.
CDI_WRAPPER = """\
set -e
spec_dir=$1; scratch=$2; shift 2
mount -t tmpfs tmpfs "$scratch"
mkdir "$scratch/upper" "$scratch/work"
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$scratch/upper,workdir=$scratch/work" /etc
mkdir -p /etc/cdi
mount --bind "$spec_dir" /etc/cdi
exec "$@"
"""

# /etc/subuid and /etc/subgid as the file given, in a private mount namespace (`--userns=auto` takes
# its ranges from the user `containers` there; the host's files stay as they are).
SUBIDS_WRAPPER = """\
set -e
mount --bind "$1" /etc/subuid
mount --bind "$1" /etc/subgid
shift
exec "$@"
"""


class Podman:
    """podman confined to `workdir`; images are imported from rootfs tarballs."""

    def __init__(self, workdir: Path, rootfs: RootfsCache, binary: str = "podman") -> None:
        self.workdir = Path(workdir)
        self.rootfs = rootfs
        self.binary = binary
        self._images: set[str] = set()
        for sub in ("storage", "runroot", "tmp", "hooks.d", "cdi-scratch"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)
        (self.workdir / "containers.conf").write_text(CONTAINERS_CONF)
        (self.workdir / "registries.conf").write_text("")
        (self.workdir / "storage.conf").write_text(
            f'[storage]\ndriver = "vfs"\nrunroot = "{self.workdir / "runroot"}"\n'
            f'graphroot = "{self.workdir / "storage"}"\n'
        )
        self.env = {
            **os.environ,
            "CONTAINERS_CONF": str(self.workdir / "containers.conf"),
            "CONTAINERS_STORAGE_CONF": str(self.workdir / "storage.conf"),
            "CONTAINERS_REGISTRIES_CONF": str(self.workdir / "registries.conf"),
        }

    def command(self, hooks_dirs: Sequence[Path] | None = ()) -> list[str]:
        """podman plus the global flags that keep it private.

        With no `hooks_dirs`, an empty private dir stands in for the host's
        default hooks dirs; None: podman's own (containers.conf's hooks_dir), as a user has them.
        """
        cmd = [
            self.binary,
            "--root",
            str(self.workdir / "storage"),
            "--runroot",
            str(self.workdir / "runroot"),
            "--tmpdir",
            str(self.workdir / "tmp"),
            "--storage-driver",
            "vfs",
            "--cgroup-manager",
            "cgroupfs",
            "--runtime",
            "runc",
            "--events-backend",
            "file",
        ]
        for hooks_dir in () if hooks_dirs is None else hooks_dirs or (self.workdir / "hooks.d",):
            cmd += ["--hooks-dir", str(hooks_dir)]
        return cmd

    def remove_containers(self) -> None:
        """Remove every container of the private store, waiting for podman's own cleanup (a
        container's removal may still run in its cleanup process when `run --rm` returns), so the
        work dir can be deleted. (Not `system reset`: that also drops the host's podman networks.)"""
        subprocess.run(
            [*self.command(), "rm", "--all", "--force", "--time", "0"],
            capture_output=True,
            env=self.env,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        # A container's conmon runs `podman container cleanup` as it exits, after `run --rm` may have
        # returned: it still writes this store's tmpdir (its events) as the work dir is deleted.
        # Two looks 0.1 s apart find none: a conmon that exits as /proc is read has forked its cleanup.
        deadline, seen = time.monotonic() + 30, True
        while (users := self._store_users()) or seen:
            if time.monotonic() > deadline:
                raise RuntimeError(f"processes still use the podman store in {self.workdir} after 30 s: {users}")
            seen = bool(users)
            time.sleep(0.1)

    def _store_users(self) -> list[str]:
        """The command lines of the processes (conmon, podman's cleanup) that name this store."""
        marker = os.fsencode(f"{self.workdir}/")
        users = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:  # gone meanwhile
                continue
            if marker in cmdline:
                users.append(cmdline.replace(b"\0", b" ").decode(errors="replace")[:200])
        return users

    def import_tarball(self, tarball: Path, ref: str) -> str:
        """`podman import` a rootfs tarball as `ref`; returns `ref`."""
        subprocess.run(
            [*self.command(), "import", "--quiet", "--change", "CMD=/bin/sh", str(tarball), ref],
            check=True,
            capture_output=True,
            env=self.env,
            timeout=60,
        )
        return ref

    def image(self, variant: str = "debian") -> str:
        """The image of the `variant` rootfs, imported on first use."""
        ref = image_ref(variant)
        if ref not in self._images:
            self.import_tarball(self.rootfs.tarball(variant), ref)
            self._images.add(ref)
        return ref

    def run(
        self,
        image: str,
        args: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
        hooks_dirs: Sequence[Path] | None = (),
        cdi_spec_dir: Path | None = None,
        runtime: str | None = None,
        subids: Path | None = None,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        """`podman run --rm` of `args` in `image`; output captured, never raises on failure.

        `extra_args` go before the image (e.g. `--device nvidia.com/gpu=0`);
        `runtime` replaces runc (e.g. a wrapper script path); `cdi_spec_dir`
        is seen by podman as /etc/cdi (see CDI_WRAPPER); `subids` as /etc/subuid and /etc/subgid
        (see SUBIDS_WRAPPER).
        """
        cmd = self.command(hooks_dirs)
        if runtime is not None:
            cmd[cmd.index("--runtime") + 1] = runtime
        cmd += [
            "run",
            "--rm",
            "--pull",
            "never",
            "--network",
            "none",
            "--ulimit",
            "nofile=1024:1024",
            "--ulimit",
            "nproc=1024:1024",
        ]
        for key, value in (env or {}).items():
            cmd += ["-e", f"{key}={value}"]
        cmd += [*extra_args, image, *args]
        if cdi_spec_dir is not None:
            cmd = [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                CDI_WRAPPER,
                "sh",
                str(cdi_spec_dir),
                str(self.workdir / "cdi-scratch"),
                *cmd,
            ]
        if subids is not None:
            cmd = [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                SUBIDS_WRAPPER,
                "sh",
                str(subids),
                *cmd,
            ]
        return subprocess.run(
            cmd, capture_output=True, text=True, env=self.env, timeout=timeout, stdin=subprocess.DEVNULL
        )


def own_engine_config(tmp_path: Path) -> None:
    """Copies of podman's and CRI-O's configuration directories (/usr/share/containers, /etc/containers)
    bound over them in the calling test's private mount namespace (active_2gpu's): `nvc-py setup` writes
    there as on a user's host, and the host's own stay untouched."""
    for directory in ("/usr/share/containers", "/etc/containers"):
        copy = tmp_path / directory.strip("/").replace("/", "-")
        shutil.copytree(directory, copy, symlinks=True)
        subprocess.run(["mount", "--bind", str(copy), directory], check=True)

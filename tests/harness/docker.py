"""A private dockerd (Debian's docker.io) driven with the docker CLI.

The daemon gets its own data root, exec root, pid file, API socket and daemon.json, no iptables and no
bridge, vfs storage (plain copies: no overlay mounts to leave behind) and cgroupfs under a cgroup parent
of its own. It starts a containerd of its own, under its exec root (short: containerd's sockets live
there): the session's tmpfs on /run/containerd hides a host containerd's socket, which dockerd would
otherwise use. daemon.json's ``deprecated-key-path`` keeps dockerd 20.10's identity key out of
/etc/docker; /run/docker, where dockerd makes its plugin directory whatever it is told, is one of the
session's private tmpfs (tests/hostcheck.py). TMPDIR is a directory of the test's: dockerd restarts a
containerd that stops answering its health checks, first asking it with SIGUSR1 for a dump of its stacks,
which containerd writes to its temporary directory (/tmp by default, a place the suite keeps as it found
it). The binaries are named by path: /usr/local/bin/docker may
be another client than Debian's.

Stopped by pid (SIGTERM, which stops the containers and its containerd, then SIGKILL), then any mount
left under its directories detached and the directories and cgroups removed.
"""

from __future__ import annotations

import glob
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from fakedriver.activate import MNT_DETACH, umount

from .daemon import stop_daemon
from .rootfs import RootfsCache, image_ref

DOCKERD = "/usr/sbin/dockerd"
DOCKER = "/usr/bin/docker"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def base_config(workdir: Path) -> dict[str, str]:
    """The daemon.json settings the harness needs (before what a test's ``setup docker`` adds)."""
    return {"deprecated-key-path": str(workdir / "key.json")}


class Dockerd:
    """A running private dockerd reading ``config_file``; ``path`` goes before the system PATH in its
    environment (where it looks for nvidia-container-runtime-hook), ``env`` is added to it (its hooks
    get dockerd's environment). `stop()` must be called (the fixture does)."""

    def __init__(
        self,
        workdir: Path,
        rootfs: RootfsCache,
        config_file: Path,
        path: Sequence[Path] = (),
        env: Mapping[str, str] | None = None,
        start_timeout: float = 60,
    ) -> None:
        self.workdir = Path(workdir)
        self.rootfs = rootfs
        self._images: set[str] = set()
        self._names = itertools.count()
        self.exec_root = Path(tempfile.mkdtemp(prefix="nvc-docker-"))
        self.socket = self.exec_root / "docker.sock"
        self.cgroup_parent = f"nvc-test-docker-{os.getpid()}"
        self.log = self.workdir / "dockerd.log"
        self.client_env = {**os.environ, "DOCKER_CONFIG": str(self.workdir / "client")}
        self.client_env.pop("DOCKER_HOST", None)
        tmp = self.workdir / "tmp"
        tmp.mkdir(exist_ok=True)
        daemon_env = {
            **os.environ,
            **(env or {}),
            "PATH": ":".join([*map(str, path), SYSTEM_PATH]),
            "TMPDIR": str(tmp),
        }
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [
                    DOCKERD,
                    "--config-file",
                    str(config_file),
                    "--data-root",
                    str(self.workdir / "data"),
                    "--exec-root",
                    str(self.exec_root),
                    "--pidfile",
                    str(self.workdir / "dockerd.pid"),
                    "-H",
                    f"unix://{self.socket}",
                    "--iptables=false",
                    "--ip-masq=false",
                    "--bridge=none",
                    "--storage-driver",
                    "vfs",
                    "--exec-opt",
                    "native.cgroupdriver=cgroupfs",
                    "--cgroup-parent",
                    self.cgroup_parent,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=daemon_env,
            )
        self._wait_ready(start_timeout)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.stop()
                raise RuntimeError(f"dockerd exited ({self.process.returncode}): {self.log.read_text()[-2000:]}")
            if self.socket.exists() and self.docker("version").returncode == 0:
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"dockerd not serving on {self.socket} after {timeout}s")

    def docker(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Debian's docker CLI against this daemon; never raises on failure."""
        return subprocess.run(
            [DOCKER, "-H", f"unix://{self.socket}", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.client_env,
            stdin=subprocess.DEVNULL,
        )

    def info(self) -> dict:
        return json.loads(self.docker("info", "--format", "{{json .}}").stdout)

    def image(self, variant: str = "debian") -> str:
        """The image of the `variant` rootfs, made by `docker import` on first use."""
        ref = image_ref(variant)
        if ref not in self._images:
            result = self.docker("import", "--change", 'CMD ["/bin/sh"]', str(self.rootfs.tarball(variant)), ref)
            if result.returncode != 0:
                raise RuntimeError(f"docker import failed: {result.stderr}")
            self._images.add(ref)
        return ref

    def run(
        self, image: str, args: Sequence[str], *, extra_args: Sequence[str] = (), timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """`docker run --rm` of `args` in `image`, `extra_args` before the image (`--gpus all`...)."""
        name = f"nvc-test-{os.getpid()}-{next(self._names)}"
        try:
            return self.docker(
                "run", "--rm", "--name", name, "--network", "none", *extra_args, image, *args, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            self.docker("rm", "--force", name)
            raise

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM by pid, wait, then SIGKILL; then what it may have left: mounts, directories, cgroups."""
        stop_daemon(self.process, timeout)
        roots = (str(self.exec_root), str(self.workdir / "data"))
        mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
        for mountpoint in reversed(mounts):
            if mountpoint.startswith(roots):
                umount(mountpoint, MNT_DETACH)
        shutil.rmtree(self.exec_root, ignore_errors=True)
        for cgroup in glob.glob(f"/sys/fs/cgroup/{self.cgroup_parent}") + glob.glob(
            f"/sys/fs/cgroup/*/{self.cgroup_parent}"
        ):
            os.rmdir(cgroup)

"""A private containerd daemon driven with ctr.

The daemon gets its own root, state dir and sockets and runs without the CRI
plugin and the snapshotters that need extra kernel or disk setup; images live
in the `nvc-test` namespace on the native snapshotter (plain copies: slower
than overlayfs but works on any backing filesystem). ctr's runc state goes to
a private `--runc-root`. Left shared with any host containerd: the shim socket
dir /run/containerd/s, which containerd 1.6 hard-codes (names are hashed per
socket address, so they cannot collide).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from .daemon import stop_daemon
from .image import build_oci_archive
from .rootfs import RootfsCache, image_ref

NAMESPACE = "nvc-test"
SNAPSHOTTER = "native"
DISABLED_PLUGINS = (
    "io.containerd.grpc.v1.cri",
    "io.containerd.internal.v1.opt",
    "io.containerd.internal.v1.tracing",
    "io.containerd.tracing.processor.v1.otlp",
    "io.containerd.snapshotter.v1.aufs",
    "io.containerd.snapshotter.v1.btrfs",
    "io.containerd.snapshotter.v1.devmapper",
    "io.containerd.snapshotter.v1.zfs",
)


def _config(workdir: Path, socket: Path) -> str:
    disabled = ", ".join(f'"{p}"' for p in DISABLED_PLUGINS)
    return (
        f'version = 2\nroot = "{workdir / "root"}"\nstate = "{workdir / "state"}"\n'
        f"disabled_plugins = [{disabled}]\n\n"
        f'[grpc]\n  address = "{socket}"\n\n[ttrpc]\n  address = "{socket}.ttrpc"\n\n'
        f'[debug]\n  address = ""\n\n[metrics]\n  address = ""\n'
    )


class Containerd:
    """A running private containerd; `stop()` must be called (the fixture does)."""

    def __init__(self, workdir: Path, rootfs: RootfsCache, start_timeout: float = 10) -> None:
        self.workdir = Path(workdir)
        self.rootfs = rootfs
        self._images: set[str] = set()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.socket = self.workdir / "containerd.sock"
        config = self.workdir / "config.toml"
        config.write_text(_config(self.workdir, self.socket))
        self.log = self.workdir / "containerd.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                ["containerd", "--config", str(config)], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        self._wait_ready(start_timeout)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"containerd exited ({self.process.returncode}): {self.log.read_text()[-2000:]}")
            if self.socket.exists() and self.ctr("version").returncode == 0:
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"containerd not serving on {self.socket} after {timeout}s")

    def ctr(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """ctr against this daemon, in the test namespace; never raises on failure."""
        return subprocess.run(
            ["ctr", "--address", str(self.socket), "--namespace", NAMESPACE, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def import_archive(self, archive: Path) -> None:
        """Import and unpack an OCI image-layout tar (see image.build_oci_archive)."""
        result = self.ctr("images", "import", "--snapshotter", SNAPSHOTTER, str(archive))
        if result.returncode != 0:
            raise RuntimeError(f"ctr images import {archive} failed: {result.stderr}")

    def image(self, variant: str = "debian") -> str:
        """The image of the `variant` rootfs, built and imported on first use."""
        ref = image_ref(variant)
        if ref not in self._images:
            archive = build_oci_archive(self.rootfs.tarball(variant), ref, self.workdir / f"{variant}-oci.tar")
            self.import_archive(archive)
            self._images.add(ref)
        return ref

    def run(
        self,
        image: str,
        container_id: str,
        args: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
        runc_binary: str | None = None,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        """`ctr run --rm` through the runc v2 shim; `runc_binary` swaps runc (e.g. a wrapper)."""
        cmd = [
            "run",
            "--rm",
            "--snapshotter",
            SNAPSHOTTER,
            "--runc-root",
            str(self.workdir / "runc"),
            "--fifo-dir",
            str(self.workdir / "fifo"),
        ]
        if runc_binary is not None:
            cmd += ["--runc-binary", runc_binary]
        for key, value in (env or {}).items():
            cmd += ["--env", f"{key}={value}"]
        try:
            return self.ctr(*cmd, *extra_args, image, container_id, *args, timeout=timeout)
        except subprocess.TimeoutExpired:
            # ctr was killed, so nothing will remove the task and container.
            self.ctr("tasks", "kill", "--signal", "SIGKILL", container_id)
            self.ctr("tasks", "delete", "--force", container_id)
            self.ctr("containers", "delete", container_id)
            raise

    def stop(self, timeout: float = 10) -> None:
        """SIGTERM, wait, then SIGKILL: containerd must not outlive the session."""
        stop_daemon(self.process, timeout)

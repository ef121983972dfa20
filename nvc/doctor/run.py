"""``nvc-py doctor --run``: one small container through each registered engine, asking for GPU 0.

The container is made from the host's own parts (no image to pull): busybox (Debian's
busybox-static) and the host's C library, which nvidia-smi needs; the hook brings the driver's
files as it does for any image. It runs ``nvidia-smi -L`` and passes when GPU 0 is listed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
import tempfile
from collections.abc import Callable

from nvc import containerenv
from nvc.doctor import Check, fail, ok, skip

BUSYBOX = ("/usr/bin/busybox", "/bin/busybox")
GLIBC = ("libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1")
LOADER = "/lib64/ld-linux-x86-64.so.2"
COMMAND = ["/bin/sh", "-c", "nvidia-smi -L 2>&1"]
TIMEOUT = 120  # seconds per container start
IMAGE = "nvc-py-doctor:latest"
ASK_GPU0 = containerenv.assignment(containerenv.VISIBLE_DEVICES, "0")  # an engine's -e value


def _copy(source: str, root: str, target: str) -> None:
    dest = os.path.join(root, target.lstrip("/"))
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    shutil.copy2(os.path.realpath(source), dest)


def make_rootfs(root: str) -> str | None:
    """A rootfs in ``root`` with busybox as /bin/sh and the host's loader and C library; why not (a
    line) where the host lacks them."""
    busybox = next((b for b in BUSYBOX if os.path.isfile(b)), None)
    if busybox is None:
        return "needs busybox (apt-get install busybox-static)"
    libdir = f"/lib/{sysconfig.get_config_var('MULTIARCH') or 'x86_64-linux-gnu'}"
    if not os.path.exists(LOADER) or not os.path.exists(os.path.join(libdir, "libc.so.6")):
        return f"needs the host's C library in {libdir} and {LOADER}"
    for name in ("proc", "dev", "sys", "tmp", "run", "etc", "usr/bin", "usr/lib"):
        os.makedirs(os.path.join(root, name), exist_ok=True)
    _copy(busybox, root, "/bin/busybox")
    os.symlink("busybox", os.path.join(root, "bin/sh"))
    _copy(LOADER, root, LOADER)
    for name in GLIBC:
        if os.path.exists(os.path.join(libdir, name)):
            _copy(os.path.join(libdir, name), root, os.path.join(libdir, name))
    with open(os.path.join(root, "etc/passwd"), "w") as f:
        f.write("root:x:0:0:root:/root:/bin/sh\n")
    return None


def _verdict(name: str, result: subprocess.CompletedProcess[str] | str, how: str = "") -> Check:
    """Whether the container ``how`` started (e.g. ``docker run --gpus device=0``) saw GPU 0."""
    asked = f"a container started with `{how}`" if how else "a container asking for GPU 0"
    if isinstance(result, str):
        return fail(name, result, "see the checks above")
    output = (result.stdout + result.stderr).strip()
    gpu = next((line for line in output.splitlines() if line.startswith("GPU 0:")), None)
    if result.returncode == 0 and gpu:
        return ok(name, f"{asked} sees it: {gpu}")
    last = output.splitlines()[-1] if output else f"exit status {result.returncode}"
    return fail(name, f"{asked} does not see GPU 0: {last}",
                "read the hook's log line for that start (log: in the configuration)")


def _run(argv: list[str]) -> subprocess.CompletedProcess[str] | str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    except OSError as err:
        return f"{argv[0]}: {err.strerror}"
    except subprocess.TimeoutExpired:
        return f"{' '.join(argv[:3])}: no answer in {TIMEOUT} s"


def podman(rootfs: str) -> Check:
    """podman, with its own configuration (the hooks it reads), on the rootfs as it is."""
    return _verdict("podman run", _run(["podman", "run", "--rm", "--network", "none", "-e",
                                        ASK_GPU0, "--rootfs", rootfs, *COMMAND]))


def docker(rootfs: str, host: str | None, gpus_flag: bool) -> Check:
    """docker (to the dockerd at ``host``, None: the client's default), with the rootfs imported as an
    image: ``--gpus device=0`` where dockerd finds a hook for it, else nvc-py's runtime."""
    client = ["docker", *(["-H", host] if host else [])]
    tar = subprocess.run(["tar", "-C", rootfs, "-c", "."], capture_output=True, timeout=TIMEOUT)
    imported = subprocess.run([*client, "import", "-", IMAGE], input=tar.stdout, capture_output=True,
                              timeout=TIMEOUT)
    if imported.returncode != 0:
        return fail("docker run", f"docker import: {imported.stderr.decode(errors='replace').strip()}",
                    "is dockerd running?")
    ask = ["--gpus", "device=0"] if gpus_flag else ["--runtime", "nvc-py", "-e", ASK_GPU0]
    try:
        return _verdict("docker run", _run([*client, "run", "--rm", "--network", "none", *ask, IMAGE, *COMMAND]),
                        f"docker run {' '.join(ask)}")
    finally:
        subprocess.run([*client, "rmi", "-f", IMAGE], capture_output=True, timeout=TIMEOUT)


def run_containers(engines: dict[str, Callable[[str], Check]]) -> list[Check]:
    """One container per engine of ``engines`` (name -> how to run it on a rootfs)."""
    if not engines:
        return [skip("containers", "no engine with nvc-py registered to start one through")]
    with tempfile.TemporaryDirectory(prefix="nvc-doctor-") as work:
        rootfs = os.path.join(work, "rootfs")
        why = make_rootfs(rootfs)
        if why:
            return [skip("containers", f"--run {why}")]
        return [start(rootfs) for start in engines.values()]

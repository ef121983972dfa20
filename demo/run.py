"""`make demo`: start real podman containers through nvc-py's hook and show what they see.

On a host with an NVIDIA driver it uses the real driver and GPUs. Otherwise it builds the fake
driver of the test suite (a test double: two fake GPUs, one with MIG devices), shows it at the
real /proc and /dev paths in a private mount namespace of this process, and says so: what the
containers list then are fake GPUs, seen through the fake nvidia-smi.

Nothing on the host is reconfigured: podman gets a private store and hooks dir, the hook a
private configuration file, /run/nvc-py, /run/containerd and /run/runc are private tmpfs (the
hook's config cache, runtime state), and the image is assembled from host parts (no network needed).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from contextlib import nullcontext
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
PROGRAMS = Path("/usr/lib/nvc-py")  # the Makefile's LIBDIR and the package's: the programs, not pip's scripts


def _show(args: list[str], env: dict[str, str] | None = None, shown: str | None = None) -> None:
    prefix = " ".join(f"{k}={v}" for k, v in (env or {}).items())
    print(f"$ {prefix + ' ' if prefix else ''}{shown or ' '.join(args)}", flush=True)
    result = subprocess.run(args, env={**os.environ, **(env or {})}, capture_output=True, text=True)
    print(result.stdout + result.stderr, end="", flush=True)
    if result.returncode != 0:
        print(f"(exit status {result.returncode})", flush=True)
    print(flush=True)


def _runc_demo(work: Path, rootfs_cache, config: Path) -> int:  # noqa: ANN001 (harness.rootfs.RootfsCache)
    """Without podman: the same containers through runc or crun, the hook registered in config.json."""
    from harness.bundle import make_bundle
    from harness.runtime import Runc

    runtime = shutil.which("runc") or shutil.which("crun")
    if runtime is None:
        print("neither podman nor runc/crun is installed: cannot start a container")
        return 1
    hook = {
        "path": str(PROGRAMS / "nvc-py-hook"),
        "args": ["nvc-py-hook", "prestart"],
        "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", f"NVC_PY_CONFIG={config}"],
    }
    print(f"podman is not installed: using {runtime} with nvc-py-hook as the prestart hook in config.json\n")
    for i, value in enumerate(("0", "1", "all", None)):
        env = {} if value is None else {"NVIDIA_VISIBLE_DEVICES": value}
        bundle = make_bundle(
            work / f"bundle{i}",
            rootfs_cache.copy("debian", work / f"rootfs{i}"),
            ["sh", "-c", "nvidia-smi -L 2>&1 || true"],
            env=env,
            hooks={"prestart": [hook]},
        )
        result = Runc(work / "runc-state", runtime).create_start(bundle)
        shown = f"NVIDIA_VISIBLE_DEVICES={value}" if value is not None else "NVIDIA_VISIBLE_DEVICES unset"
        print(f"$ {Path(runtime).name} run ({shown}) -- nvidia-smi -L")
        print(result.stdout + result.stderr, flush=True)
        if result.returncode != 0:
            return 1
    return 0


def _podman_demo(work: Path, rootfs_cache, hooks: Path) -> int:  # noqa: ANN001 (harness.rootfs.RootfsCache)
    from harness.podman import Podman

    print(
        "Importing a small image made from host parts (busybox + glibc) into a private podman store ...\n", flush=True
    )
    podman = Podman(work / "podman", rootfs_cache)
    try:
        return _podman_runs(podman, hooks)
    finally:
        podman.remove_containers()


# What the printed podman commands leave out, and how the host's own podman does the same.
PRIVATE_PODMAN = """\
# The podman commands below run with this demo's own store (the image exists only there), runc and
# cgroupfs, and go away with it: copied as printed they find no image. On this host's own podman:
#   nvc-py setup podman
#   podman run --rm -e NVIDIA_VISIBLE_DEVICES=0 IMAGE nvidia-smi -L
"""


def _podman_runs(podman, hooks: Path) -> int:  # noqa: ANN001 (harness.podman.Podman)
    image = podman.image()
    print(PRIVATE_PODMAN, flush=True)
    for value in ("0", "1", "all", None):
        env = {} if value is None else {"NVIDIA_VISIBLE_DEVICES": value}
        flags = f"-e NVIDIA_VISIBLE_DEVICES={value} " if value is not None else ""
        result = podman.run(image, ["nvidia-smi", "-L"], env=env, hooks_dirs=[hooks])
        if value is None:
            print("# no NVIDIA_VISIBLE_DEVICES: not a GPU container, the hook adds nothing")
        print(f"$ podman run --rm --hooks-dir {hooks} {flags}{image} nvidia-smi -L", flush=True)
        print(result.stdout + result.stderr, end="")
        print(f"(exit status {result.returncode})\n" if result.returncode else "\n", end="", flush=True)
        if value is not None and result.returncode != 0:
            return 1
    return 0


def main() -> int:
    from hostcheck import PrivateRun

    # The hook's config cache, runc's state, containerd's shim sockets: in tmpfs of this process's
    # own mount namespace (and its containers'), not the host's /run.
    private = PrivateRun()
    try:
        return _demo()
    finally:
        private.leave()


def _demo() -> int:
    from harness.rootfs import RootfsCache

    real = Path("/proc/driver/nvidia/version").exists()
    with tempfile.TemporaryDirectory(prefix="nvc-demo-") as tmp:
        work = Path(tmp)
        if real:
            print("== nvc-py demo: real NVIDIA driver found on this host ==\n", flush=True)
            root, activation = "/", nullcontext()
        else:
            print(
                "== nvc-py demo: no NVIDIA driver on this host; using the built-in FAKE driver (test double: "
                "two fake GPUs, the second with two MIG devices) ==\n",
                flush=True,
            )
            from fakedriver.activate import activate
            from fakedriver.build import build

            fake = build(REPO / "tests" / "fakedriver" / "machines" / "two-gpu-mig.yaml", work / "fake")
            root, activation = str(fake.root), activate(fake)
        config = work / "config.yaml"
        config.write_text(f"root: {root}\nlog: {{file: {work / 'hook.log'}}}\n")
        hooks = work / "hooks.d"
        rootfs_cache = RootfsCache(work / "rootfs")
        with activation:
            _show([str(PROGRAMS / "nvc-py"), "--root", root, "info"], shown=f"nvc-py --root {root} info")
            if shutil.which("podman"):
                # --no-server: a demo leaves no systemd units and no server behind on the host
                _show(
                    [
                        str(PROGRAMS / "nvc-py"),
                        "setup",
                        "podman",
                        "--hooks-dir",
                        str(hooks),
                        "--config",
                        str(config),
                        "--no-server",
                    ],
                    shown=f"nvc-py setup podman --hooks-dir {hooks} --config {config} --no-server",
                )
                print(
                    f"# (the warning is for a podman left to its defaults: this demo's is given --hooks-dir {hooks})\n",
                    flush=True,
                )
                code = _podman_demo(work, rootfs_cache, hooks)
            else:
                code = _runc_demo(work, rootfs_cache, config)
        print("The hook's log (one line per container start):")
        print((work / "hook.log").read_text(), flush=True)
    if not real:
        print(
            "This demo's fake driver is removed with it: `make try` opens a shell where nvc-py info, list, "
            "cdi generate and configure --dry-run answer from one."
        )
    return code


if __name__ == "__main__":
    sys.exit(main())

"""``nvc-py doctor --run``: one small container through each registered engine, asking for GPU 0.

The container is made from the host's own parts (no image to pull): busybox (Debian's
busybox-static) and the host's C library, which nvidia-smi needs; the hook brings the driver's
files as it does for any image. It runs ``nvidia-smi -L`` and passes when GPU 0 is listed.
``doctor --security`` starts its hostile images through the same :class:`Engine`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
import tempfile
import uuid
from collections.abc import Callable, Mapping, Sequence

from nvc import containerenv
from nvc.doctor import OK, Check, fail, ok, skip
from nvc.records import NamedTuple

BUSYBOX = ("/usr/bin/busybox", "/bin/busybox")
GLIBC = ("libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1")
LOADER = "/lib64/ld-linux-x86-64.so.2"
COMMAND = ["/bin/sh", "-c", "nvidia-smi -L 2>&1"]
TIMEOUT = 120  # seconds per container start
IMAGE = "nvc-py-doctor"  # throw-away images and containers: this and a unique suffix
NO_ANSWER = f"no answer in {TIMEOUT} s"
ASK_GPU0 = containerenv.assignment(containerenv.VISIBLE_DEVICES, "0")  # an engine's -e value

Result = subprocess.CompletedProcess[str] | str  # what a start gave, or why it could not run


class Engine(NamedTuple):
    """A registered engine: ``start(rootfs, command, env)`` runs ``command`` in a throw-away container of
    ``rootfs`` asking for GPU 0, ``env`` the image's own environment, and removes what it made.
    ``in_place``: the container's root is ``rootfs`` itself (what happens to it during the start,
    the container sees)."""

    name: str
    how: str
    start: Callable[[str, Sequence[str], Mapping[str, str]], Result]
    in_place: bool


def _copy(source: str, root: str, target: str) -> None:
    dest = os.path.join(root, target.lstrip("/"))
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    shutil.copy2(os.path.realpath(source), dest)


def libdir() -> str:
    """The host's (and the doctor's images') C library directory."""
    return f"/lib/{sysconfig.get_config_var('MULTIARCH') or 'x86_64-linux-gnu'}"


def make_rootfs(root: str) -> str | None:
    """A rootfs in ``root`` with busybox as /bin/sh and the host's loader and C library; why not (a
    line) where the host lacks them."""
    busybox = next((b for b in BUSYBOX if os.path.isfile(b)), None)
    if busybox is None:
        return "needs busybox (apt-get install busybox-static)"
    lib = libdir()
    if not os.path.exists(LOADER) or not os.path.exists(os.path.join(lib, "libc.so.6")):
        return f"needs the host's C library in {lib} and {LOADER}"
    for name in ("proc", "dev", "sys", "tmp", "run", "etc", "usr/bin", "usr/lib"):
        os.makedirs(os.path.join(root, name), exist_ok=True)
    _copy(busybox, root, "/bin/busybox")
    os.symlink("busybox", os.path.join(root, "bin/sh"))
    _copy(LOADER, root, LOADER)
    for name in GLIBC:
        if os.path.exists(os.path.join(lib, name)):
            _copy(os.path.join(lib, name), root, os.path.join(lib, name))
    with open(os.path.join(root, "etc/passwd"), "w") as f:
        f.write("root:x:0:0:root:/root:/bin/sh\n")
    return None


def _verdict(name: str, result: Result, how: str = "", log: str | None = None, logged: Sequence[str] = ()) -> Check:
    """Whether the container ``how`` started (e.g. ``docker run --gpus device=0``) saw GPU 0; where not,
    the line that explains it (:func:`explanation`), ``logged`` the lines the hook log ``log`` gained
    during that start."""
    asked = f"a container started with `{how}`" if how else "a container asking for GPU 0"
    if isinstance(result, str):
        return fail(name, result, "see the checks above")
    output = (result.stdout + result.stderr).strip()
    gpu = next((line for line in output.splitlines() if line.startswith("GPU 0:")), None)
    if result.returncode == 0 and gpu:
        return ok(name, f"{asked} sees it: {gpu}")
    quoted, fix = explanation(output, result.returncode, log, logged)
    return fail(name, f"{asked} does not see GPU 0: {quoted}", fix)


def explanation(output: str, status: int, log: str | None, logged: Sequence[str]) -> tuple[str, str]:
    """The line that explains a failed start, and what to do: the hook's or runtime's own error line
    in the engine's output (from its program name on), else the engine's own error where no hook ran
    (its first line naming an error: docker's last line only says where its help is); the advice
    quotes the hook log's line for that start, or says there is none."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    ours = next(
        (line[line.index(p) :] for line in lines for p in ("nvc-py-hook:", "nvc-py-runtime:") if p in line), None
    )
    refusal = next((line for line in reversed(logged) if '"outcome":"error"' in line.replace(" ", "")), None)
    where = log or "no hook log (log.file is off)"
    if refusal:
        return ours or refusal, f"the hook refused it; {where} has its line for that start: {refusal}"
    if ours:
        return ours, f"the hook refused it ({where} has no line for that start)"
    engine = next((line for line in lines if "error" in line.lower()), lines[-1] if lines else f"exit status {status}")
    ran = f"; {where} has its line: {logged[-1]}" if logged else f" ({where} has no line for that start)"
    return engine, f"the engine's own error: no nvc-py hook refused that start{ran}; fix what the engine says"


def timed_out(result: Result) -> bool:
    """Whether a start gave no answer in :data:`TIMEOUT` (its engine was killed)."""
    return isinstance(result, str) and result.endswith(NO_ANSWER)


def _run(argv: list[str], stdin: bytes | None = None) -> Result:
    try:
        done = subprocess.run(
            argv, capture_output=True, timeout=TIMEOUT, input=stdin, stdin=subprocess.DEVNULL if stdin is None else None
        )
    except OSError as err:
        return f"{argv[0]}: {err.strerror}"
    except subprocess.TimeoutExpired:
        return f"{' '.join(argv[:3])}: {NO_ANSWER}"
    return subprocess.CompletedProcess(
        argv, done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")
    )


def _env_args(env: Mapping[str, str]) -> list[str]:
    return [arg for key, value in env.items() for arg in ("-e", f"{key}={value}")]


def _name() -> str:
    return f"{IMAGE}-{uuid.uuid4().hex[:12]}"


def podman_start(rootfs: str, command: Sequence[str], env: Mapping[str, str]) -> Result:
    """podman, with its own configuration (the hooks it reads), on the rootfs as it is (``--rootfs``:
    no image is stored); ``env`` goes into the container's spec as an image's would. A container
    whose podman was killed (taking too long, or Ctrl-C) is removed by its name."""
    name = _name()
    argv = [
        "podman",
        "run",
        "--rm",
        "--name",
        name,
        "--network",
        "none",
        *_env_args(env),
        "-e",
        ASK_GPU0,
        "--rootfs",
        rootfs,
        *command,
    ]
    try:
        result = _run(argv)
    except BaseException:  # Ctrl-C: podman was killed with this process's run
        _podman_remove(name)
        raise
    if timed_out(result):
        _podman_remove(name)
    return result


def _podman_remove(name: str) -> None:
    subprocess.run(["podman", "rm", "--force", "--time", "0", "--ignore", name], capture_output=True, timeout=TIMEOUT)


def _docker_ask(gpus_flag: bool) -> list[str]:
    return ["--gpus", "device=0"] if gpus_flag else ["--runtime", "nvc-py", "-e", ASK_GPU0]


def docker_start(
    rootfs: str, command: Sequence[str], env: Mapping[str, str], host: str | None, gpus_flag: bool
) -> Result:
    """docker (to the dockerd at ``host``, None: the client's default), with the rootfs imported as an
    image of a name of its own (``env`` its ``ENV``), removed afterwards: ``--gpus device=0`` where
    dockerd finds a hook for it, else nvc-py's runtime."""
    client = ["docker", *(["-H", host] if host else [])]
    image = name = _name()
    try:
        tar = subprocess.run(["tar", "-C", rootfs, "-c", "."], capture_output=True, timeout=TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"tar of {rootfs}: {err}"
    changes = [arg for key, value in env.items() for arg in ("--change", f"ENV {key}={value}")]
    imported = _run([*client, "import", *changes, "-", image], stdin=tar.stdout)
    if isinstance(imported, str) or imported.returncode != 0:
        return (
            f"docker import: {imported if isinstance(imported, str) else imported.stderr.strip()} (is dockerd running?)"
        )
    try:
        return _run(
            [*client, "run", "--rm", "--name", name, "--network", "none", *_docker_ask(gpus_flag), image, *command]
        )
    finally:
        subprocess.run([*client, "rm", "--force", name], capture_output=True, timeout=TIMEOUT)
        subprocess.run([*client, "rmi", "--force", image], capture_output=True, timeout=TIMEOUT)


def registered(podman: Check, docker: Sequence[Check], docker_host: str | None) -> list[Engine]:
    """The engines that doctor found nvc-py registered with (``podman``, ``docker``: their checks)."""
    found = []
    if podman.status == OK:
        found.append(Engine("podman run", "", podman_start, in_place=True))
    held = {c.name: c.status == OK for c in docker}
    if held.get("docker") or held.get("docker --gpus"):
        gpus_flag = held.get("docker --gpus", False)

        def start(rootfs: str, command: Sequence[str], env: Mapping[str, str]) -> Result:
            return docker_start(rootfs, command, env, docker_host, gpus_flag)

        found.append(Engine("docker run", f"docker run {' '.join(_docker_ask(gpus_flag))}", start, in_place=False))
    return found


def run_containers(engines: Sequence[Engine], log: str | None = None) -> list[Check]:
    """One container per engine of ``engines``, running ``nvidia-smi -L``; ``log``: the hook log
    (the configuration's log.file), whose lines written during a start explain a failed one."""
    if not engines:
        return [skip("containers", "no engine with nvc-py registered to start one through")]
    with tempfile.TemporaryDirectory(prefix="nvc-doctor-") as work:
        rootfs = os.path.join(work, "rootfs")
        why = make_rootfs(rootfs)
        if why:
            return [skip("containers", f"--run {why}")]
        found = []
        for engine in engines:
            start = _size(log)
            result = engine.start(rootfs, COMMAND, {})
            found.append(_verdict(engine.name, result, engine.how, log, _lines_since(log, start)))
        return found


def _size(log: str | None) -> int:
    try:
        return os.stat(log).st_size if log else 0
    except OSError:
        return 0


def _lines_since(log: str | None, offset: int) -> list[str]:
    """The lines ``log`` gained past ``offset`` (all of it where it was rotated since: it is shorter)."""
    if not log:
        return []
    try:
        with open(log, "rb") as f:
            f.seek(0 if os.fstat(f.fileno()).st_size < offset else offset)
            return f.read(1 << 20).decode(errors="replace").splitlines()
    except OSError:
        return []

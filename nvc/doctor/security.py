"""``nvc-py doctor --security``: the hostile-image cases (nvc/doctor/hostile.py) against the installed
hook, through each engine nvc-py is registered with, in throw-away containers.

Each case gets a directory of its own under one run directory: the canary, the image (doctor's
image, bent), the marker's place. The host is read before and after the container's start; the run
directory is removed afterwards, mounts under it detached first, also on failure, Ctrl-C, SIGTERM
or SIGHUP. Engines remove their containers (``--rm``, or by name where a start timed out) and
docker its image (run.py).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from nvc.doctor import FAIL, MARKS, OK, SKIP, Check, fail, hostile, ok, skip
from nvc.doctor.hostile import Case, Plant
from nvc.doctor.run import Engine, libdir, make_rootfs, timed_out

WORDS = {OK: "passed", FAIL: "failed", SKIP: "not applicable"}
FIX = (
    "an image can reach this host through that start: update nvc-py (and the runtime); docs/security.md names the case"
)
# Host places the classic attacks aim at (CVE-2024-0133: lib dir -> /etc): their driver-named entries.
HOST_DIRS = ("/etc", "/usr/bin", "/usr/lib/x86_64-linux-gnu", "/usr/local/cuda/compat", "/")
DRIVER_NAMES = ("libnvidia-", "libcuda.so", "nvidia-smi", "libGLX_indirect", "nvidia-persistenced")
MARKER_SO = r"""
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void mark(void) {
    char exe[256] = "?", line[400];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) exe[n] = 0;
    int fd = open(MARKER, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW, 0600);
    if (fd >= 0) { int m = snprintf(line, sizeof line, "%s (pid %d)\n", exe, (int)getpid());
                   if (write(fd, line, m) < 0) {} close(fd); }
}
"""
AT_FDCWD = -100
RENAME_EXCHANGE = 1 << 1


def run_cases(engines: Sequence[Engine], cases: Sequence[Case] = hostile.CASES) -> list[Check]:
    """Every case through every engine of ``engines``, after a plain start shows the engine gives GPU 0."""
    if not engines:
        return [skip("security", "no engine with nvc-py registered to start a container through")]
    with _signals_interrupt(), _work_dir("nvc-doctor-security-") as work:
        base = os.path.join(work, "base")
        why = make_rootfs(base)
        if why:
            return [skip("security", why)]
        found = []
        for engine in engines:
            plain = engine.start(base, hostile.COMMAND, {})
            if isinstance(plain, str) or not hostile.sees_gpu0(plain.stdout):
                seen = " ".join((plain if isinstance(plain, str) else plain.stdout + plain.stderr).split())[-200:]
                found += [
                    skip(
                        _name(engine, case),
                        f"a plain image does not see GPU 0 through `{engine.name}` "
                        f"({seen or 'no output'}): see `nvc-py doctor --run`",
                    )
                    for case in cases
                ]
                continue
            found += [_case(engine, case, work) for case in cases]
        return found


def text(found: Sequence[Check]) -> str:
    """One line per case, then the counts."""
    lines = [
        f"{MARKS[c.status]} {c.name}: {WORDS[c.status]}: {c.detail}" + (f"\n    → {c.fix}" if c.fix else "")
        for c in found
    ]
    counts = {status: sum(c.status == status for c in found) for status in WORDS}
    lines.append(", ".join(f"{counts[status]} {word}" for status, word in WORDS.items()))
    return "\n".join(lines) + "\n"


def _name(engine: Engine, case: Case) -> str:
    return f"{engine.name} {case.name}" + (f" ({', '.join(case.cves)})" if case.cves else "")


def _not_applicable(engine: Engine, case: Case) -> str | None:
    if case.race and not engine.in_place:
        return f"`{engine.name}` runs a copy of the image: nothing here can swap its directories during the start"
    if "cc" in case.needs and shutil.which("cc") is None:
        return "needs a C compiler (cc) to build the image's library"
    if "gpus" in case.needs and _gpu_count() < 2:
        return "one GPU on this host: no other GPU's node to keep out"
    return None


def _case(engine: Engine, case: Case, work: str) -> Check:
    name = _name(engine, case)
    why = _not_applicable(engine, case)
    if why:
        return skip(name, why)
    here = tempfile.mkdtemp(prefix=f"{case.name}-", dir=work)
    try:
        canary, rootfs, marker = (os.path.join(here, n) for n in ("host", "rootfs", "marks"))
        values = {"canary": canary, "marker": marker, "libdir": libdir()}
        shutil.copytree(os.path.join(work, "base"), rootfs, symlinks=True)
        try:
            _plant(canary, hostile.CANARY, values, rootfs)
            _plant(rootfs, case.plants, values, rootfs)
        except (OSError, subprocess.SubprocessError) as err:
            return skip(name, f"cannot build the image here: {err}")
        env = {key: hostile.fill(value, **values) for key, value in case.env.items()}
        before = _host(canary)
        with _racing(rootfs, case.race, canary):
            result = engine.start(rootfs, hostile.COMMAND, env)
        problems = _reached(before, _host(canary), marker, here)
        if not isinstance(result, str):
            problems += _container(case, result, canary)
        elif timed_out(result):
            problems.append(result)
        if problems:
            return fail(name, f"{case.attack}: {'; '.join(problems)}", FIX)
        if isinstance(result, str):
            return skip(name, f"{engine.name} did not run: {result}")
        return ok(name, f"{case.attack}: {_outcome(result)}; nothing reached the host")
    finally:
        _remove(here)


def _outcome(result: subprocess.CompletedProcess[str]) -> str:
    if result.returncode == 0:
        return "started, sees GPU 0" if hostile.sees_gpu0(result.stdout) else "started without GPU 0"
    lines = (result.stderr or result.stdout).strip().splitlines()
    return f"refused ({lines[-1][:200] if lines else f'exit status {result.returncode}'})"


def _container(case: Case, result: subprocess.CompletedProcess[str], canary: str) -> list[str]:
    """What the container's own view shows of the host: mounts of the canary or of the host's /."""
    if result.returncode != 0:
        return []
    places = {"the canary": (*fs_path(canary), True), "the host's /": (*fs_path("/"), False)}
    shown = hostile.mounts_of(hostile.parts(result.stdout)[2], places)
    problems = [f"the container's mount table shows {', '.join(shown)}"] if shown else []
    judged = hostile.JUDGES[case.judge](result.stdout) if case.judge else None
    return problems + ([judged] if judged else [])


def _reached(before: Mapping[str, Any], after: Mapping[str, Any], marker: str, here: str) -> list[str]:
    """What changed on the host between ``before`` and ``after`` (:func:`_host`), the marker, mounts left."""
    problems = []
    if os.path.lexists(marker):
        with open(marker, errors="replace") as f:
            problems.append(f"the image's code ran on the host: {', '.join(f.read(300).split(chr(10))).strip(', ')}")
    changed = sorted(set(before["canary"].items()) ^ set(after["canary"].items()))
    if changed:
        problems.append(f"the canary changed: {', '.join(sorted({p for p, _ in changed})[:5])}")
    problems += [
        f"{what} changed"
        for what in ("the host's /etc/ld.so.cache", "the host's core_pattern")
        if before[what] != after[what]
    ]
    if before["driver files"] != after["driver files"]:
        problems.append(
            f"driver files appeared on the host: {', '.join(sorted(after['driver files'] - before['driver files']))}"
        )
    left = _mounts_under(here)
    if left:
        problems.append(f"mounts left on the host: {', '.join(left)}")
    return problems


def _host(canary: str) -> dict[str, Any]:
    """What a case must not change on the host."""
    try:
        st = os.lstat("/etc/ld.so.cache")
        cache: tuple | None = (st.st_ino, st.st_size, st.st_mtime_ns)
    except FileNotFoundError:
        cache = None
    with open("/proc/sys/kernel/core_pattern") as f:
        pattern = f.read()
    return {
        "canary": _tree(canary),
        "the host's /etc/ld.so.cache": cache,
        "the host's core_pattern": pattern,
        "driver files": driver_files(),
    }


def _tree(top: str) -> dict[str, tuple]:
    """Every entry under ``top``, itself included: mode, owner, size, mtime, content hash or link target."""
    paths = [top]
    for directory, dirs, files in os.walk(top):  # links to directories are listed, not followed
        paths += [os.path.join(directory, name) for name in dirs + files]
    entries = {}
    for path in paths:
        st = os.lstat(path)
        extra = os.readlink(path) if stat.S_ISLNK(st.st_mode) else ""
        if stat.S_ISREG(st.st_mode):
            with open(path, "rb") as f:
                extra = hashlib.sha256(f.read()).hexdigest()
        entries[os.path.relpath(path, top)] = (st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_mtime_ns, extra)
    return entries


def driver_files() -> set[str]:
    """The driver-named entries of :data:`HOST_DIRS` (tests/harness/hostwatch.py watches them too)."""
    found = set()
    for directory in HOST_DIRS:
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        found |= {os.path.join(directory, n) for n in names if n.startswith(DRIVER_NAMES)}
    return found


def _gpu_count() -> int:
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0


def _mount_points() -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4].replace("\\040", " ") for line in f if len(line.split()) > 4]


def _mounts_under(top: str) -> list[str]:
    return [point for point in _mount_points() if point == top or point.startswith(top + "/")]


def fs_path(place: str | os.PathLike[str]) -> tuple[str, str]:
    """(device, path inside its filesystem) of a host path, as mountinfo's fields 3 and 4 name it."""
    path = os.fspath(place)
    best = ("", "/", "/")
    with open("/proc/self/mountinfo") as f:
        for line in f:
            dev, root, point = line.split()[2:5]
            if (path.rstrip("/") + "/").startswith(point.rstrip("/") + "/") and len(point) >= len(best[2]):
                best = (dev, root, point)
    dev, root, point = best
    rest = path.rstrip("/")[len(point.rstrip("/")) :]
    return dev, (root.rstrip("/") + rest) or "/"


def _plant(top: str, plants: Sequence[Plant], values: Mapping[str, str], image: str) -> None:
    """Make ``plants`` under ``top`` (``image``: where "copy" sources are read)."""
    for plant in plants:
        path = os.path.join(top, plant.path)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.unlink(path)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        value = hostile.fill(plant.value, **values)
        if plant.kind == "link":
            os.symlink(value, path)
        elif plant.kind == "file":
            with open(path, "w") as f:
                f.write(value)
            os.chmod(path, 0o755)
        elif plant.kind == "dir":
            os.makedirs(path)
        elif plant.kind == "fifo":
            os.mkfifo(path)
        elif plant.kind == "zero":
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 5))
        elif plant.kind == "copy":
            shutil.copy2(os.path.join(image, value), path)
        elif plant.kind == "marker-lib":
            _marker_library(path, values["marker"])
        else:
            raise ValueError(f"unknown plant kind {plant.kind!r} for {plant.path}")


def _marker_library(path: str, marker: str) -> None:
    source = path + ".c"
    with open(source, "w") as f:
        f.write(MARKER_SO)
    try:
        subprocess.run(
            [
                "cc",
                "-shared",
                "-fPIC",
                f'-DMARKER="{marker}"',
                f"-Wl,-soname,{os.path.basename(path)}",
                "-o",
                path,
                source,
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
    finally:
        os.unlink(source)


@contextmanager
def _racing(rootfs: str, race: str | None, canary: str) -> Iterator[None]:
    """While inside: the image's ``race`` directory swapped with a link to ``{canary}/lib`` as fast as
    can be (atomic exchanges: the path always exists, as the directory or as the link)."""
    if race is None:
        yield
        return
    from nvc.system import syscalls

    real = os.path.join(rootfs, race)
    other = real + ".swapped"
    os.symlink(os.path.join(canary, "lib"), other)
    stop = threading.Event()

    def flip() -> None:
        while not stop.is_set():
            try:
                syscalls.renameat2(AT_FDCWD, real, AT_FDCWD, other, RENAME_EXCHANGE)
            except OSError:
                return

    flipper = threading.Thread(target=flip, daemon=True)
    flipper.start()
    try:
        yield
    finally:
        stop.set()
        flipper.join()


@contextmanager
def _work_dir(prefix: str) -> Iterator[str]:
    work = tempfile.mkdtemp(prefix=prefix)
    try:
        yield work
    finally:
        _remove(work)


def _remove(top: str) -> None:
    """Remove ``top``, after detaching any mount under it (deepest first): rmtree never crosses into
    what a hostile start may have mounted there."""
    from nvc.system import syscalls

    for point in sorted(_mounts_under(top), key=len, reverse=True):
        try:
            syscalls.umount2(point, 2)  # MNT_DETACH
        except OSError:
            pass
    if _mounts_under(top):
        return  # left, rather than deleted through a mount; _reached has said so
    shutil.rmtree(top, ignore_errors=True)


@contextmanager
def _signals_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP end the run as Ctrl-C does: through the ``finally`` blocks that clean up."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    old = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)

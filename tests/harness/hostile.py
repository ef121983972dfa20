"""Hostile ldconfig files for images (device nodes, FIFOs) and the checks around them.

Shared by the fake-driver tests (tests/test_ldconfig_hostile.py) and the GPU run
(tests/test_hostile_gpu.py). The block device an image names is always a loop device over a
scratch file made here, never a host disk; its bytes are compared before and after.
"""

from __future__ import annotations

import hashlib
import os
import signal
import stat
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

SCRATCH_BYTES = 1 << 20


@dataclass(frozen=True)
class Case:
    """One hostile file: ``path`` in the image becomes ``kind`` ("block": the scratch loop
    device, "zero": the character device 1:5, "fifo"); ``refusal``: the line configure prints."""

    name: str
    path: str
    kind: str
    refusal: str


def _refusal(path: str, what: str) -> str:
    return f"ldcache error: {path} in the image is {what}, not a regular file"


CASES = (
    Case("block-cache-tmp", "/etc/ld.so.cache~", "block", _refusal("/etc/ld.so.cache~", "a block device")),
    Case("zero-conf", "/etc/ld.so.conf", "zero", _refusal("/etc/ld.so.conf", "a character device")),
    Case("fifo-conf", "/etc/ld.so.conf", "fifo", _refusal("/etc/ld.so.conf", "a FIFO")),
    Case("fifo-cache-tmp", "/etc/ld.so.cache~", "fifo", _refusal("/etc/ld.so.cache~", "a FIFO")),
)


@contextmanager
def scratch_block_device(workdir: Path) -> Iterator[Path]:
    """A loop device over a 1 MiB file of random bytes under ``workdir``; detached afterwards."""
    backing = workdir / "scratch-disk.img"
    backing.write_bytes(os.urandom(SCRATCH_BYTES))
    dev = subprocess.run(
        ["losetup", "--find", "--show", str(backing)], check=True, capture_output=True, text=True
    ).stdout.strip()
    try:
        yield Path(dev)
    finally:
        subprocess.run(["losetup", "-d", dev], check=False, capture_output=True)


def device_digest(dev: Path) -> str:
    """sha256 of the device's bytes, read through the device itself."""
    with open(dev, "rb", buffering=0) as f:
        return hashlib.sha256(f.read(SCRATCH_BYTES)).hexdigest()


def plant(rootfs: Path, case: Case, block: Path | None) -> None:
    """Replace ``case.path`` in ``rootfs`` by the hostile node."""
    where = rootfs / case.path.lstrip("/")
    if where.exists() or where.is_symlink():
        where.unlink()
    if case.kind == "fifo":
        os.mkfifo(where)
    elif case.kind == "zero":
        os.mknod(where, 0o666 | stat.S_IFCHR, os.makedev(1, 5))
    else:
        assert block is not None
        os.mknod(where, 0o600 | stat.S_IFBLK, os.stat(block).st_rdev)


def plant_fifo_include(rootfs: Path) -> Path:
    """An ld.so.conf that includes a FIFO (a file ldconfig's own checks cannot know): ldconfig
    blocks on it until the wall-time limit or its caller's death ends it."""
    (rootfs / "etc/fifo.d").mkdir()
    fifo = rootfs / "etc/fifo.d/evil.conf"
    os.mkfifo(fifo)
    (rootfs / "etc/ld.so.conf").write_text("include /etc/fifo.d/*.conf\n")
    return fifo


def tree(top: Path, times: bool = False) -> dict[str, tuple]:
    """Every entry under ``top`` (by path relative to it): type, mode, owner, size, mtime (with
    ``times``, else 0) and content hash, link target or device number. FIFOs and device nodes
    are never opened."""
    entries = {}
    for path in [top, *sorted(top.rglob("*"))]:
        st = path.lstat()
        if stat.S_ISREG(st.st_mode):
            extra = hashlib.sha256(path.read_bytes()).hexdigest()
        elif stat.S_ISLNK(st.st_mode):
            extra = os.readlink(path)
        elif stat.S_ISBLK(st.st_mode) or stat.S_ISCHR(st.st_mode):
            extra = f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
        else:
            extra = ""
        size = st.st_size if not stat.S_ISDIR(st.st_mode) else 0
        mtime = st.st_mtime_ns if times else 0
        entries[str(path.relative_to(top))] = (
            stat.S_IFMT(st.st_mode),
            st.st_mode,
            st.st_uid,
            st.st_gid,
            size,
            mtime,
            extra,
        )
    return entries


def _parents() -> dict[int, int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat_line = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat_line.rsplit(")", 1)[1].split()
        if fields[0] != "Z":  # a zombie is gone but for its parent's wait
            parents[int(entry)] = int(fields[1])
    return parents


def descendants(pid: int) -> set[int]:
    """The living processes below ``pid``."""
    parents = _parents()
    found, todo = set(), [pid]
    while todo:
        parent = todo.pop()
        children = {p for p, pp in parents.items() if pp == parent} - found
        found |= children
        todo.extend(children)
    return found


def alive(pids: set[int]) -> set[int]:
    """Those of ``pids`` that still run (zombies count as gone)."""
    return pids & set(_parents())


def nvc_processes(session_dir: str) -> list[str]:
    """Processes that only nvc-py starts, its helpers (``nvc:[...]``) and the sandboxed ldconfig (run
    from a memfd), among those this session started (hostcheck.own_processes: another nvc-py on the
    machine, a host hook server's helpers or a device plugin's, is not this test's to judge), in this
    PID namespace (the one-node cluster's hook server lives in its node's). What a test leaves of
    these is a leak."""
    from hostcheck import own_processes

    ours = os.readlink("/proc/self/ns/pid")
    found = []
    for pid in own_processes(session_dir):
        try:
            if os.readlink(f"/proc/{pid}/ns/pid") != ours:
                continue
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            exe = ""
        if comm.startswith("nvc:[") or exe.startswith("/memfd:nvc-ldconfig"):
            found.append(f"{pid} {comm} {exe}")
    return found


def wait_for_ldconfig(pid: int, deadline: float) -> set[int]:
    """The descendants of ``pid`` once its sandboxed ldconfig runs (blocked on the FIFO)."""
    while time.monotonic() < deadline:
        below = descendants(pid)
        for child in below:
            try:
                if os.readlink(f"/proc/{child}/exe").startswith("/memfd:nvc-ldconfig"):
                    return below
            except OSError:
                continue
        time.sleep(0.02)
    raise AssertionError(f"ldconfig never ran below {pid}")


def kill_during_ldconfig(argv: list[str], seconds: float) -> tuple[set[int], set[int]]:
    """Start ``argv`` (nvc-py configure on an image with a FIFO include), SIGKILL it once its
    sandboxed ldconfig runs, as a runtime's hook timeout would; return the processes that were
    below it and those of them still alive 3 s later."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        below = wait_for_ldconfig(proc.pid, time.monotonic() + seconds)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 3
    while alive(below) and time.monotonic() < deadline:
        time.sleep(0.02)
    return below, alive(below)


# A stand-in for an ldconfig that did part of its work and then failed: it replaces the cache
# (by rename, as ldconfig does), leaves its temporary file, adds a SONAME link in the library
# dir, then exits 1.
PARTIAL_LDCONFIG = r"""
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
int main(void) {
    int fd = open("/etc/ld.so.cache~", O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, 0600);
    if (fd < 0 || write(fd, "partial", 7) != 7) return 2;
    close(fd);
    if (rename("/etc/ld.so.cache~", "/etc/ld.so.cache") != 0) return 3;
    close(open("/etc/ld.so.cache~", O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, 0600));
    if (symlink("libcuda.so.580.95.05", "/usr/lib/x86_64-linux-gnu/libnvc-partial.so.1") != 0) return 4;
    return 1;
}
"""

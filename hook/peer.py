"""Whom the hook server serves: a caller that could do the call itself, with the same meaning.

A worker runs a call with the server's full power (root, every capability, the host's root
directory and namespaces). Lending that to a weaker caller would be an escalation, so a worker
compares the caller, as it stands at the time of the call, with the server:

- capabilities: the caller's permitted, effective and bounding sets each hold all of the
  server's. A uid-0 process that dropped capabilities (``capsh --drop=all``), or cannot regain
  them, would get EPERM running the program itself; it is told to fall back, and does. The
  inheritable and ambient sets are not compared: they only say what the caller's own exec'd
  programs get, and a worker's helpers get the server's, whatever the caller's are.
- seccomp: a caller under a seccomp filter while the server is under none is told to fall back
  (its filter may forbid what a call does: mount, ptrace...). Two filters cannot be compared: a
  server itself started under one serves filtered callers.
- root directory: the same directory (device and inode) as the server's; a chrooted caller would
  otherwise read and write outside its chroot through the paths it names.
- namespaces: mount (paths), pid (``--pid``, /proc), user (what uid 0 and capabilities mean) and
  cgroup (a container's /proc/PID/cgroup reads relative to the reader's cgroup namespace, so the
  device cgroup found would differ). Not net, ipc, uts or time: nothing a call does depends on
  them (no network, no System V IPC, no host name, no clock), so a caller there loses nothing.

The caller is the process that connected (SO_PEERCRED). Its pid may be reused between the
connection and the reading of /proc/PID: where the kernel has SO_PEERPIDFD (Linux 6.5), the
pidfd it gives stays bound to that very process, and after reading /proc/PID the worker checks,
through the pidfd, that the process still lives (then the pid was not reused). On older kernels
the worker opens /proc/PID once, reads everything through that descriptor (which keeps naming the
same process, or fails once it is gone) and checks it still lives at the end; the window left
there is a pid reused between the connect and that open, by a process as powerful as the server
(anything weaker is refused all the same).
"""

from __future__ import annotations

import os
import signal
from typing import NamedTuple

SO_PEERPIDFD = 77  # Linux's value; Python's socket module lacks the name before 3.13
CHECKED_NAMESPACES = ("mnt", "pid", "user", "cgroup")
CAPABILITY_SETS = ("CapPrm", "CapEff", "CapBnd")


class Standing(NamedTuple):
    """What a process can do and where: read from its /proc directory."""

    capabilities: tuple[int, ...]  # CAPABILITY_SETS, as bit masks
    seccomp: int  # the Seccomp mode: 0 none, 1 strict, 2 filter
    root: tuple[int, int]  # (st_dev, st_ino) of its root directory
    namespaces: tuple[tuple[int, int], ...]  # CHECKED_NAMESPACES' (st_dev, st_ino)


def parse_status(text: str) -> tuple[tuple[int, ...], int]:
    """(capability sets, seccomp mode) from a /proc/PID/status text (a missing line reads as
    nothing held: the caller is then refused, never served by mistake)."""
    fields = dict(line.partition(":")[::2] for line in text.splitlines())
    caps = tuple(int(fields.get(name, "0").strip() or "0", 16) for name in CAPABILITY_SETS)
    return caps, int(fields.get("Seccomp", "0").strip() or "0")


def read_standing(proc: int) -> Standing:
    """The standing of the process whose /proc directory is the descriptor ``proc`` (OSError
    when it is gone or out of reach)."""
    fd = os.open("status", os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc)
    try:
        text = os.read(fd, 1 << 16).decode("ascii", "replace")
    finally:
        os.close(fd)
    caps, seccomp = parse_status(text)
    root = os.stat("root", dir_fd=proc)
    spaces = tuple(os.stat(f"ns/{ns}", dir_fd=proc) for ns in CHECKED_NAMESPACES)
    return Standing(caps, seccomp, (root.st_dev, root.st_ino), tuple((s.st_dev, s.st_ino) for s in spaces))


def own_standing() -> Standing:
    """This process's standing (the server's, read once before it forks workers)."""
    proc = os.open("/proc/self", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return read_standing(proc)
    finally:
        os.close(proc)


def shortfall(theirs: Standing, ours: Standing) -> str | None:
    """Why a caller of standing ``theirs`` may not be served by a server of standing ``ours``
    (None: it may)."""
    for name, their, our in zip(CAPABILITY_SETS, theirs.capabilities, ours.capabilities):
        if our & ~their:
            return f"{name} lacks {our & ~their:#x}"
    if theirs.seccomp and not ours.seccomp:
        return "under seccomp"
    if theirs.root != ours.root:
        return "another root directory"
    for ns, their_ns, our_ns in zip(CHECKED_NAMESPACES, theirs.namespaces, ours.namespaces):
        if their_ns != our_ns:
            return f"another {ns} namespace"
    return None


def caller_shortfall(pid: int, pidfd: int | None, ours: Standing) -> str | None:
    """:func:`shortfall` of the process ``pid`` (the connected peer; ``pidfd`` its SO_PEERPIDFD,
    None where the kernel has none), or why it cannot be told (gone, out of reach)."""
    try:
        proc = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return "not visible in /proc"
    try:
        theirs = read_standing(proc)
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, 0)  # still alive: /proc/PID was the peer's
        else:
            os.close(os.open("stat", os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc))  # still alive
    except OSError:
        return "gone or out of reach"
    finally:
        os.close(proc)
    return shortfall(theirs, ours)

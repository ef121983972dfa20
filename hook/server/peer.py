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
- no_new_privs: set in the caller and not in the server (a sandbox's mark: the caller's
  programs may gain nothing on exec, the worker's helpers would).
- LSM labels (``attr/current``, and AppArmor's and Smack's own): each as the server's, byte for
  byte (a label confines whatever a profile says; labels are not ordered), but for AppArmor's
  profiles in unconfined mode (``runc (unconfined)``), which confine nothing and read as
  ``unconfined``. A kernel without such an LSM answers neither process, which counts as equal.
  So a server in another SELinux domain than the runtime's serves none of its hooks.
- Landlock, which shows in no /proc file: the caller proves it is not confined more than the
  server by opening, through /proc, the worker's own end of their connection (see
  :func:`reaches_worker`), after ``ready``; a worker accepts ``go`` only with that descriptor.
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

The Landlock proof. Opening ``/proc/PID/fd/N`` passes a ptrace read check (PTRACE_MODE_READ_FSCREDS,
with no bypass for CAP_PERFMON as /proc/PID/environ has on recent kernels), and Landlock refuses
that check to a process whose domain is not the target's or an ancestor of it, whatever its
capabilities; Yama restricts only attaching. The worker names its pid and the number of its
connection's descriptor in ``ready``; the caller opens it with O_PATH and attaches it to ``go``.
The accepted socket is the worker's alone (nothing forked before the accept holds it, nothing is
forked before ``go``, it is never sent): a descriptor of that very socket (same inode of
sockfs) can only come from the worker's descriptor table, through that check (or
pidfd_getfd(), a stricter one). So a caller in a Landlock domain the worker is not in cannot
bring it; other LSMs' ptrace rules refuse it too where they confine the caller.
"""

from __future__ import annotations

import os
import signal

from nvc.records import NamedTuple

SO_PEERPIDFD = 77  # Linux's value; Python's socket module lacks the name before 3.13
CHECKED_NAMESPACES = ("mnt", "pid", "user", "cgroup")
CAPABILITY_SETS = ("CapPrm", "CapEff", "CapBnd")
# The LSM labels compared: the one /proc/PID/attr/current shows (SELinux, or the first LSM of a
# stack that has one), and the per-LSM files of those that have their own (Linux 5.1+).
LSM_ATTRS = ("attr/current", "attr/apparmor/current", "attr/smack/current")
MAX_LABEL = 4096  # bytes read of one label
UNCONFINED_MODE = b" (unconfined)\n"  # the end of an AppArmor label whose profile confines nothing
UNCONFINED = b"unconfined\n"


class Standing(NamedTuple):
    """What a process can do and where: read from its /proc directory."""

    capabilities: tuple[int, ...]  # CAPABILITY_SETS, as bit masks
    seccomp: int  # the Seccomp mode: 0 none, 1 strict, 2 filter
    no_new_privs: bool
    labels: tuple[bytes | None, ...]  # LSM_ATTRS' contents, None where unreadable (no such LSM)
    root: tuple[int, int]  # (st_dev, st_ino) of its root directory
    namespaces: tuple[tuple[int, int], ...]  # CHECKED_NAMESPACES' (st_dev, st_ino)


def parse_status(text: str) -> tuple[tuple[int, ...], int, bool]:
    """(capability sets, seccomp mode, no_new_privs) from a /proc/PID/status text (a missing line
    reads as nothing held and no_new_privs set: the caller is then refused, never served by
    mistake)."""
    fields = dict(line.partition(":")[::2] for line in text.splitlines())
    caps = tuple(int(fields.get(name, "0").strip() or "0", 16) for name in CAPABILITY_SETS)
    return caps, int(fields.get("Seccomp", "0").strip() or "0"), fields.get("NoNewPrivs", "1").strip() != "0"


def read_label(proc: int, name: str) -> bytes | None:
    """The LSM attribute ``name`` of the process whose /proc directory is ``proc`` (None: no such
    file, or no LSM answers it)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc)
    except OSError:
        return None
    try:
        label = os.read(fd, MAX_LABEL)
    except OSError:
        return None
    finally:
        os.close(fd)
    return UNCONFINED if label.endswith(UNCONFINED_MODE) else label


def read_standing(proc: int) -> Standing:
    """The standing of the process whose /proc directory is the descriptor ``proc`` (OSError
    when it is gone or out of reach)."""
    fd = os.open("status", os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc)
    try:
        text = os.read(fd, 1 << 16).decode("ascii", "replace")
    finally:
        os.close(fd)
    labels = tuple(read_label(proc, name) for name in LSM_ATTRS)
    root = os.stat("root", dir_fd=proc)
    spaces = tuple(os.stat(f"ns/{ns}", dir_fd=proc) for ns in CHECKED_NAMESPACES)
    return Standing(
        *parse_status(text), labels, (root.st_dev, root.st_ino), tuple((s.st_dev, s.st_ino) for s in spaces)
    )


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
    for name, their, our in zip(CAPABILITY_SETS, theirs.capabilities, ours.capabilities, strict=True):
        if our & ~their:
            return f"{name} lacks {our & ~their:#x}"
    if theirs.seccomp and not ours.seccomp:
        return "under seccomp"
    if theirs.no_new_privs and not ours.no_new_privs:
        return "no_new_privs set"
    for name, their, our in zip(LSM_ATTRS, theirs.labels, ours.labels, strict=True):
        if their != our:
            return f"another LSM label ({name})"
    if theirs.root != ours.root:
        return "another root directory"
    for ns, their_ns, our_ns in zip(CHECKED_NAMESPACES, theirs.namespaces, ours.namespaces, strict=True):
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


def reaches_worker(proof: int, conn: int) -> bool:
    """Whether the descriptor ``proof`` a caller sent is the worker's connection ``conn`` itself
    (same socket inode): the caller opened /proc/WORKER/fd/N, so Landlock (or another LSM) does
    not confine it more than the worker (the module's docstring says why that holds)."""
    theirs, ours = os.fstat(proof), os.fstat(conn)
    return (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino)

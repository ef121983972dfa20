"""Running processes found in /proc by their command line (engine daemons, nvc-py's servers): their
arguments, PATH, start time and parent, for doctor's checks and setup's reload of a running dockerd."""

from __future__ import annotations

import os
from collections.abc import Callable

from nvc.records import NamedTuple


class Daemon(NamedTuple):
    """A running engine daemon, as its own command line and environment say."""

    pid: int
    argv: tuple[str, ...]
    path: str  # its PATH, where it looks for programs (dockerd: the --gpus hook)
    started: float  # epoch seconds
    parent: int = 0  # its parent's pid

    def flag(self, name: str) -> str | None:
        """The value of ``--name VALUE`` or ``--name=VALUE`` (the last one given)."""
        found = None
        for i, arg in enumerate(self.argv):
            if arg == name and i + 1 < len(self.argv):
                found = self.argv[i + 1]
            elif arg.startswith(name + "="):
                found = arg[len(name) + 1 :]
        return found


def running(name: str) -> list[Daemon]:
    """The processes whose program is ``name`` (by basename), oldest first."""
    return processes(lambda argv: os.path.basename(argv[0]) == name)


def processes(match: Callable[[tuple[str, ...]], bool]) -> list[Daemon]:
    """The processes whose command line ``match`` accepts, oldest first: only those in our root
    directory, since a dockerd or a hook server under another root (a chroot, a container) reads
    and serves that root's files, not ours."""
    from nvc.system.programs import FIXED_PATH

    boot, tick = boot_time(), os.sysconf("SC_CLK_TCK")
    ours = os.stat("/")
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = tuple(os.fsdecode(a) for a in f.read(1 << 16).split(b"\0")[:-1])
            if not argv or not match(argv):
                continue
            root = os.stat(f"/proc/{pid}/root")
            if (root.st_dev, root.st_ino) != (ours.st_dev, ours.st_ino):
                continue
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(e.partition(b"=")[::2] for e in f.read(1 << 20).split(b"\0") if e)
        except OSError:
            continue
        path = os.fsdecode(env.get(b"PATH", FIXED_PATH.split("=", 1)[1].encode()))
        found.append(Daemon(int(pid), argv, path, boot + int(fields[19]) / tick, int(fields[1])))
    return sorted(found, key=lambda d: d.started)


def docker_host(daemon: Daemon | None) -> str | None:
    """The unix socket the docker client reaches ``daemon`` on (None: the client's default)."""
    host = daemon.flag("-H") or daemon.flag("--host") if daemon else None
    return host if host and host.startswith("unix://") else None


def boot_time() -> float:
    with open("/proc/stat") as f:
        return float(next(line.split()[1] for line in f if line.startswith("btime ")))

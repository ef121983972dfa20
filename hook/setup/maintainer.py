"""What the Debian package's maintainer scripts and ``make uninstall`` ask of nvc-py itself:
``python -I -m nvc.hook.setup.maintainer stop-servers [--socket PATH]``, ``server-status [--socket PATH]``
(the package's /etc/init.d/nvc-py-hook), ``unregister [--packaged]`` and ``code-cache PATH``.

``stop-servers``: after an upgrade no server of the replaced code may stay (it would answer the next
call "fall back" and stop, see nvc.hook.server, but until then it holds the old files), and after a
removal none of deleted files. A server is found in /proc by its command line (LIBDIR's
nvc-py-hook-python ``serve``, however it was started) and sent SIGTERM through a pidfd (never a
reused pid), then waited for. Only a process that catches SIGTERM is sent it: the server, which stops
between calls. Its workers and spares share its command line but not its handler, and a worker that
outlives its server finishes a container's start; a server still starting (no handler yet) is
importing the files that are there now. A server that systemd's unit runs (its cgroup) is left to
systemd: the maintainer scripts restart or stop the unit.

``unregister``: every registration ``nvc-py setup`` and ``nvc-py cdi generate --output`` made names a
program in LIBDIR, and an engine told to run a program that is gone fails the containers it applies
it to (podman's hooks.d files apply to every container): on removal they are undone (hooks.d files
wherever podman and CRI-O read them, containerd's drop-in and imports entry, Docker's daemon.json runtime and
--gpus hook link (setup docker's defaults; a running dockerd reading that daemon.json is told to reload
it, SIGHUP, and drops the runtime, or is named with what to do), the units in
/etc/systemd/system, CDI specs naming the hook), and the MPS daemons no running container uses are
stopped (nvc.apply.mps). ``--packaged``: the hooks.d files in the package's
own directory are the package manager's to remove. The configuration and the no-server file stay.

``code-cache``: the compiled code of what the launchers' calls import (:mod:`nvc.system.codecache`),
written once the bytecode is (postinst, ``make install``). Run as ``python -I``: its sys.path is the
launchers' (they run ``-I -S`` and put back what site adds), which the cache must match.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import sys
from collections.abc import Callable, Iterable, Sequence

from nvc.errors import InputError
from nvc.hook.setup import engines, hooksdirs
from nvc.hook.setup import files as setupfiles
from nvc.records import NamedTuple
from nvc.system import programs

SERVER_ARGV = (os.path.join(programs.LIBDIR, engines.SERVER_PROGRAM), "serve")
STOP_WAIT = 5.0  # seconds for a server to exit after SIGTERM (it stops at once between calls)
MAX_CDI_SPEC = 4 << 20  # bytes of a CDI spec read to see whether it is ours
_MAX_PROC_FILE = 64 * 1024  # bytes of a /proc/PID file read


class Process(NamedTuple):
    """What /proc says of one process, as far as finding servers needs."""

    pid: int
    ppid: int
    argv: tuple[str, ...]
    catches_sigterm: bool
    cgroups: tuple[str, ...]  # the paths of /proc/PID/cgroup's lines


def is_server(argv: Sequence[str]) -> bool:
    """Whether ``argv`` runs ``nvc-py-hook serve`` from LIBDIR: the interpreter and its options
    (the #! line's), then the program and ``serve``."""
    return any(tuple(argv[i : i + 2]) == SERVER_ARGV for i in range(len(argv) - 1))


def serves_socket(argv: Sequence[str], socket: str) -> bool:
    """Whether the server ``argv`` runs listens on ``socket``: its ``--socket``, else the default
    (its environment's ``NVC_PY_HOOK_SOCKET`` aside: the front starts servers with ``--socket``)."""
    for i in range(len(argv) - 1):
        if tuple(argv[i : i + 2]) == SERVER_ARGV:
            given = list(argv[i + 2 : i + 4])
            return given == ["--socket", socket] if given else socket == programs.DEFAULT_SOCKET
    return False


def servers_to_stop(processes: Iterable[Process], socket: str | None = None) -> list[int]:
    """The pids of the servers ``stop-servers`` stops (see the module's docstring); those of
    ``socket`` alone where it is given."""
    servers = {p.pid: p for p in processes if is_server(p.argv) and (socket is None or serves_socket(p.argv, socket))}
    unit = "/" + engines.SERVER_UNIT
    return sorted(
        p.pid
        for p in servers.values()
        if p.ppid not in servers and p.catches_sigterm and not any(c.endswith(unit) for c in p.cgroups)
    )


def parse_process(pid: int, cmdline: bytes, stat: bytes, status: bytes, cgroup: bytes) -> Process:
    """A Process from the text of /proc/PID's cmdline, stat, status and cgroup."""
    ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])  # the name before ")" may hold spaces
    caught = 0
    for line in status.splitlines():
        if line.startswith(b"SigCgt:"):
            caught = int(line.split()[1], 16)
    return Process(
        pid,
        ppid,
        tuple(arg.decode(errors="replace") for arg in cmdline.split(b"\0")[:-1]),
        bool(caught & (1 << (signal.SIGTERM - 1))),
        tuple(line.split(b":", 2)[2].decode(errors="replace") for line in cgroup.splitlines() if line.count(b":") >= 2),
    )


def _read_proc(pid: int, name: str) -> bytes:
    from nvc.system.untrusted import read_file

    return read_file(f"/proc/{pid}/{name}", _MAX_PROC_FILE)[0]


def _process(pid: int) -> Process | None:
    """/proc's word on ``pid``, None for a process gone meanwhile (or not readable)."""
    try:
        return parse_process(pid, *(_read_proc(pid, name) for name in ("cmdline", "stat", "status", "cgroup")))
    except (OSError, InputError, ValueError, IndexError):
        return None


def _processes() -> list[Process]:
    found = (_process(int(name)) for name in os.listdir("/proc") if name.isdigit())
    return [p for p in found if p is not None]


def _own_mount_namespace(pid: int) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt") == os.readlink("/proc/self/ns/mnt")
    except OSError:
        return False


def server_status(socket: str) -> list[str]:
    """A line for each server of ``socket`` that stop-servers would stop (this mount namespace's): an
    init script's ``status``."""
    found = [pid for pid in servers_to_stop(_processes(), socket) if _own_mount_namespace(pid)]
    return [f"nvc-py-hook server {pid} serves {socket}" for pid in found]


def stop_servers(socket: str | None = None) -> tuple[list[str], list[str]]:
    """Stop the servers :func:`servers_to_stop` names (of ``socket`` alone where it is given: those
    of this mount namespace, where the path is that socket); returns (what was done, what failed)."""
    done: list[str] = []
    failed: list[str] = []
    found = servers_to_stop(_processes(), socket)
    for pid in found if socket is None else [pid for pid in found if _own_mount_namespace(pid)]:
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            again = _process(pid)  # the pidfd pins the process: still the server we found?
            if again is None or again.pid not in servers_to_stop([again], socket):
                continue
            signal.pidfd_send_signal(pidfd, signal.SIGTERM)
            if select.select([pidfd], [], [], STOP_WAIT)[0]:  # readable once the process has exited
                done.append(f"stopped nvc-py-hook server {pid}")
            else:
                failed.append(
                    f"nvc-py-hook server {pid}: still running {STOP_WAIT:g} s after SIGTERM "
                    '(it answers its next call "fall back" and stops then)'
                )
        except ProcessLookupError:
            done.append(f"stopped nvc-py-hook server {pid}")
        finally:
            os.close(pidfd)
    return done, failed


def remove_cdi_specs(dirs: Sequence[str] = hooksdirs.CDI_SPEC_DIRS) -> list[str]:
    """Remove the CDI specs in ``dirs`` that name nvc-py's hook, and a directory they leave empty
    (``cdi generate --output`` made it)."""
    from nvc.system.untrusted import read_file

    marker = os.path.join(programs.LIBDIR, programs.HOOK_SCRIPT).encode()
    ours = []
    for path in hooksdirs.spec_files(dirs):
        try:
            data, _ = read_file(path, MAX_CDI_SPEC, follow=False)
        except (OSError, InputError):  # not a regular file of a size we write: not ours
            continue
        if marker in data:
            ours.append(path)
    return setupfiles.remove_files_and_dirs(ours)


def unregister(packaged: bool, systemctl: str = "systemctl") -> tuple[list[str], list[str]]:
    """Undo every registration (see the module's docstring); returns (what was done, what failed):
    a step that fails is reported and the others still run."""
    keep = (hooksdirs.DEFAULT_HOOKS_DIR,) if packaged else ()
    steps: tuple[Callable[[], list[str]], ...] = (
        lambda: engines.remove_hooks(hooksdirs.PODMAN, keep=keep),
        lambda: engines.remove_hooks(hooksdirs.CRIO, keep=keep),
        engines.remove_containerd,
        _unregister_docker,
        lambda: engines.remove_units(systemctl=systemctl),
        remove_cdi_specs,
        _stop_mps_daemons,
    )
    done: list[str] = []
    failed: list[str] = []
    for step in steps:
        try:
            done += step()
        except InputError as err:
            failed.append(str(err))
    return done, failed


def _stop_mps_daemons() -> list[str]:
    """The MPS daemons nvc-py started (their control binary is the driver's, not the package's) and
    no running container uses, stopped; those of running containers named."""
    from nvc.apply import mps

    done, left = mps.stop_idle()
    return done + left


def _unregister_docker() -> list[str]:
    """daemon.json's runtime and the --gpus link removed, then a running dockerd that reads that file
    told to reload it (SIGHUP), so that it drops the runtime, whose program goes with the package."""
    from nvc.hook.setup import docker, dockerd

    plan = docker.plan_remove(docker.DAEMON_JSON, docker.RUNTIME_NAME, docker.GPUS_HOOK_DIR)
    done = docker.apply(plan)
    return done + dockerd.reload_running(plan, docker.RUNTIME_NAME) if plan.changes else done


def write_code_cache(path: str) -> int:
    """The cache of every module of nvc-py (but ``__main__``s) and all they import: whatever a
    launcher's call imports, lazily or in its helpers, is there."""
    import pkgutil

    import nvc
    from nvc.system import codecache

    modules = (m.name for m in pkgutil.walk_packages(nvc.__path__, "nvc.") if not m.name.endswith(".__main__"))
    print(f"{path}: {codecache.build(path, modules)} modules")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nvc.hook.setup.maintainer", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    stop = commands.add_parser("stop-servers", help="stop the hook servers not run by systemd")
    status = commands.add_parser("server-status", help="the servers of a socket (exit status 3: none, as LSB's)")
    for command in (stop, status):
        command.add_argument("--socket", help="those of this socket alone (and of this mount namespace)")
    registrations = commands.add_parser("unregister", help="undo every registration with the container engines")
    registrations.add_argument(
        "--packaged",
        action="store_true",
        help="leave the hooks.d files in the package's own directory (its package manager's)",
    )
    cache = commands.add_parser("code-cache", help="write the launchers' code cache")
    cache.add_argument("path", help="the cache file (replaced whole)")
    args = parser.parse_args(argv)
    if args.command == "code-cache":
        return write_code_cache(args.path)
    if args.command == "server-status":
        running = server_status(args.socket or programs.DEFAULT_SOCKET)
        print("\n".join(running) or f"no nvc-py-hook server serves {args.socket or programs.DEFAULT_SOCKET}")
        return 0 if running else 3
    done, failed = stop_servers(args.socket) if args.command == "stop-servers" else unregister(args.packaged)
    for line in done:
        print(line)
    for line in failed:
        print(f"nvc-py: {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

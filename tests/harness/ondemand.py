"""The hook server started on demand by the native front, as the served-by-default tests drive it
(tests/test_hook_served_*.py): a hook's environment that reaches a server in the test's own
directory, a bundle asking for no GPU, prestart through the installed front, the hook's log, and the
servers of a socket (killed at the end of the test)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path

import pytest

from harness.bundle import make_bundle
from harness.hookserver import LIBDIR
from nvc.hook.server import handover

STORM = 32


def servers(sock: Path) -> list[int]:
    """Pids of the ``nvc-py-hook serve`` processes of ``sock``: those holding a listening socket
    whose parent is none of them. Not their workers: a spare is the server's child, and a busy worker
    closed the listening socket (once its server is killed it is an orphan with the same command line)."""
    wanted = f"\0serve\0--socket\0{sock}\0".encode()
    listening = _listening_sockets()
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and wanted in (entry / "cmdline").read_bytes():
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                if listening & _descriptors(entry):
                    found[int(entry.name)] = parent
        except (OSError, IndexError, ValueError):
            continue
    return sorted(pid for pid, parent in found.items() if parent not in found)


def _descriptors(process: Path) -> set[str]:
    """What the descriptors of ``process`` link to (one closed meanwhile is left out)."""
    links = set()
    for fd in (process / "fd").iterdir():
        with suppress(OSError):
            links.add(os.readlink(fd))
    return links


def _listening_sockets() -> set[str]:
    """The listening Unix sockets (/proc/net/unix: Flags has __SO_ACCEPTCON), as a descriptor's link
    names them (the path there is the bind's, through /proc/self/fd)."""
    return {
        f"socket:[{line.split()[6]}]"
        for line in Path("/proc/net/unix").read_text().splitlines()[1:]
        if int(line.split()[3], 16) & 0x10000
    }


def kill_servers(sock: Path) -> None:
    """Every process of ``sock``'s servers killed: the servers, and their spares and workers too (a
    server that died first, or stopped mid-test, can leave them running, holding its socket)."""
    for pid in _processes_of(sock):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while _processes_of(sock) and time.monotonic() < deadline:
        time.sleep(0.05)


def _processes_of(sock: Path) -> list[int]:
    """Pids whose command line is ``nvc-py-hook serve --socket SOCK`` (a server, its spares and workers)
    and that have not exited (zombies aside)."""
    wanted = f"\0serve\0--socket\0{sock}\0".encode()
    found = []
    for entry in Path("/proc").iterdir():
        with suppress(OSError, IndexError):
            if entry.name.isdigit() and wanted in (entry / "cmdline").read_bytes():
                if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(int(entry.name))
    return found


@pytest.fixture
def no_gpu_state(active_2gpu, debian_rootfs: Path, tmp_path: Path) -> Iterator[tuple[dict[str, str], Path]]:
    """The environment of a hook that reaches an on-demand server in tmp_path/run (this process's
    namespaces and cgroups stand for the host's), and a bundle asking for no GPU; servers that
    the test's calls started are killed at the end."""
    sock = tmp_path / "run" / "hook.sock"
    config = tmp_path / "config.yaml"
    config.write_text(f"root: {active_2gpu.root}\nload-kmods: false\nlog: {{file: {tmp_path / 'hook.log'}}}\n")
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "NVC_PY_CONFIG": str(config),
        handover.SOCKET_ENV: str(sock),
        "NVC_PY_HOST_PID": str(os.getpid()),
    }
    bundle = make_bundle(tmp_path / "bundle", debian_rootfs, ["true"])
    try:
        yield env, bundle
    finally:
        kill_servers(sock)


def prestart(env: dict[str, str], bundle: Path, name: str, *wrapper: str, **popen) -> subprocess.CompletedProcess[str]:
    """``nvc-py-hook prestart`` through the installed front, as a runtime runs it (through ``wrapper``)."""
    state = json.dumps(
        {"ociVersion": "1.0.2", "id": name, "pid": os.getpid(), "bundle": str(bundle), "status": "creating"}
    )
    return subprocess.run(
        [*wrapper, str(LIBDIR / "nvc-py-hook"), "prestart"],
        input=state,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        **popen,
    )


def log_lines(env: dict[str, str]) -> list[dict]:
    """The hook log's whole lines: a storm's calls append while a test reads, and a line still being written
    has no newline yet."""
    path = Path(env["NVC_PY_CONFIG"]).with_name("hook.log")
    return [json.loads(line) for line in path.read_text().split("\n")[:-1] if line] if path.exists() else []

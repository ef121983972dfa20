"""A Debian root booted with systemd as its PID 1 (systemd-nspawn), for the package's walk on a host
with systemd (tests/test_deb.py): commands run in it through nsenter, as root in all its namespaces.

nspawn runs with ``--register=no --keep-unit``: this machine runs no systemd (no machined to register
with, no scope to move to); ``SYSTEMD_SECCOMP=0`` and ``--capability=all``: the container's systemd
and nvc-py's server set their own filters and need the capabilities a host's root has (mount
namespaces, the device cgroup). The machine's cgroups are mounted side by side (v1 and v2), which
nspawn 252 gives the container as they are: its v1 controllers read-only, so its systemd manages none
of them. With ``unified``, nspawn gives the container the v2 hierarchy alone, a cgroup namespace of
its own and that subtree writable (``SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1``): its systemd then manages
its units' cgroups, device access included (v2 filters device access by eBPF, which needs no
controller), as on a host with cgroup v2.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

BOOT_WAIT = 60.0  # seconds for the container's systemd to finish its start-up
STOP_WAIT = 60.0  # seconds for it to power off
PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class Booted:
    """The container: its init's pid on this machine, and commands run in it."""

    def __init__(self, init: int) -> None:
        self.init = init

    def run(self, script: str, timeout: float) -> subprocess.CompletedProcess[str]:
        """``script`` (sh) in the container with a clean environment: its result (stderr into stdout)."""
        argv = [
            "nsenter",
            "-t",
            str(self.init),
            "-a",
            "env",
            "-i",
            PATH,
            "HOME=/root",
            "LANG=C.UTF-8",
            "sh",
            "-c",
            script,
        ]
        return subprocess.run(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )


@contextmanager
def booted(root: Path, binds: Sequence[tuple[Path, str]], console: Path, unified: bool = False) -> Iterator[Booted]:
    """``root`` booted (its console's output in ``console``) until the block ends, then powered off;
    ``unified``: on cgroup v2 alone, its cgroups managed by its systemd."""
    import shutil

    nspawn = shutil.which("systemd-nspawn")
    assert nspawn is not None, "systemd-nspawn is missing: make deps installs systemd-container"
    argv = [
        nspawn,
        "-q",
        "-D",
        str(root),
        "-b",
        "--register=no",
        "--keep-unit",
        "--capability=all",
        f"--machine=nvc-test-{os.getpid()}",
        *(f"--bind={host}:{inside}" for host, inside in binds),
    ]
    with open(console, "w") as out:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={
                **os.environ,
                "SYSTEMD_SECCOMP": "0",
                **({"SYSTEMD_NSPAWN_UNIFIED_HIERARCHY": "1"} if unified else {}),
            },
            start_new_session=True,
        )
    try:
        machine = Booted(_init(proc))
        deadline = time.monotonic() + BOOT_WAIT
        while True:
            state = machine.run("systemctl is-system-running --wait", BOOT_WAIT).stdout.strip()
            if state in ("running", "degraded"):
                break
            assert time.monotonic() < deadline, (
                f"the container's systemd did not start: {state}\n{console.read_text()[-3000:]}"
            )
            time.sleep(0.2)
        yield machine
        machine.run("systemctl poweroff", 30)
        proc.wait(timeout=STOP_WAIT)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _init(proc: subprocess.Popen[bytes]) -> int:
    """The container's PID 1 as this machine sees it: nspawn's child running systemd."""
    deadline = time.monotonic() + BOOT_WAIT
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"systemd-nspawn exited ({proc.returncode})"
        for pid in _children(proc.pid):
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == "systemd":
                    return pid
            except OSError:
                continue
        time.sleep(0.05)
    raise AssertionError("systemd-nspawn started no systemd")


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []

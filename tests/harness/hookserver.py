"""A running ``nvc-py-hook serve`` for tests and benchmarks, the hook entry that reaches it, and the
interpreter of an installed command (make install replaces the console scripts by the native front)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from . import native

REPO = Path(__file__).resolve().parent.parent.parent
LIBDIR = Path("/usr/lib/nvc-py")  # as the Makefile's
INSTALLED_CLIENT = LIBDIR / "nvc-py-hook-client"
BUILT_CLIENT = native.HOOK_CLIENT  # native/'s, or its sanitized build (make sanitize)


def client_path() -> Path:
    """nvc-py-hook-client as installed (make install), else as built in native/."""
    return INSTALLED_CLIENT if INSTALLED_CLIENT.is_file() else BUILT_CLIENT


def program_interpreter(command: str | Path) -> str | None:
    """The interpreter in the ``#!`` line of the Python program behind an installed ``nvc-py`` or
    ``nvc-py-hook`` (None: none found), so a benchmark measures its floor with the same one. The
    program is the command itself where it is pip's console script, else what the native front
    runs without a server (LIBDIR/NAME-python)."""
    command = Path(command)
    for program in (command, LIBDIR / f"{command.name}-python"):
        try:
            with open(program, "rb") as f:
                first = f.readline().decode(errors="replace").strip()
        except OSError:
            continue
        if first.startswith("#!") and "python" in first:
            return first[2:].split()[0]
    return None


@contextmanager
def hook_server(
    hook_script: str | Path,
    sock: Path,
    wrapper: Sequence[str] = (),
    pass_fds: Sequence[int] = (),
    stats: Path | None = None,
) -> Iterator[subprocess.Popen[str]]:
    """``nvc-py-hook serve --socket SOCK``, started in the caller's mount namespace (where a fake
    driver may be active), until the block ends; then stopped with SIGTERM, as systemd does.
    ``wrapper``: a command that executes the server's command line it is given (systemd's part);
    ``stats``: the file its workers append their calls' figures to ($NVC_PY_SERVE_STATS)."""
    env = {**os.environ, "NVC_PY_SERVE_STATS": str(stats)} if stats is not None else None
    proc = subprocess.Popen(
        [*wrapper, str(hook_script), "serve", "--socket", str(sock)],
        stderr=subprocess.PIPE,
        text=True,
        pass_fds=pass_fds,
        env=env,
    )
    try:
        assert proc.stderr is not None
        import time

        deadline, line = time.monotonic() + 30, ""
        while "listening" not in line:  # after what it says of its warm-up (no driver: skipped)
            ready, _, _ = select.select([proc.stderr], [], [], max(0.0, deadline - time.monotonic()))
            line = proc.stderr.readline() if ready else ""
            if not line or ("listening" not in line and "warm-up skipped" not in line):
                raise RuntimeError(f"nvc-py-hook serve did not start: {line.strip() or 'no answer in 30 s'}")
        yield proc
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"nvc-py-hook serve did not stop on SIGTERM in 30 s: {_where(proc.pid)}") from None
    finally:
        proc.kill()
        proc.wait()


def _where(pid: int) -> str:
    """What a process is doing, for a failure message: its state, kernel wait channel and threads."""
    proc = Path(f"/proc/{pid}")
    try:
        state = next(line for line in (proc / "status").read_text().splitlines() if line.startswith("State:"))
        return f"{state}, wchan {(proc / 'wchan').read_text()!r}, {len(list((proc / 'task').iterdir()))} thread(s)"
    except (OSError, StopIteration) as err:
        return f"unknown ({err})"


def client_hook(hook_script: str | Path, sock: Path, env: list[str], stage: str = "prestart") -> dict:
    """An OCI hook entry running ``stage`` through nvc-py-hook-client and the server at ``sock``."""
    return {
        "path": str(client_path()),
        "args": ["nvc-py-hook-client", str(hook_script), stage],
        "env": [*env, f"NVC_PY_HOOK_SOCKET={sock}"],
    }


def umount_when_free(target: Path, timeout: float = 5.0) -> None:
    """Unmounts a run directory the test mounted, once what a server left running there has let go of
    it (a server stopped at the end of a test may still be exiting, its lock file open: "target is
    busy"); after timeout, fails naming the processes that hold files in it."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        done = subprocess.run(["umount", str(target)], capture_output=True, text=True)
        if done.returncode == 0:
            return
        if time.monotonic() > deadline:
            holders = sorted({pid for pid, path in _open_paths() if Path(path).is_relative_to(target)})
            held = [f"{pid}: {_where(pid)}" for pid in holders]
            raise AssertionError(f"umount {target}: {done.stderr.strip()}; held by {held}")
        time.sleep(0.05)


def _open_paths() -> list[tuple[int, str]]:
    """(pid, path) of every open file and working directory this namespace can see."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            links = [proc / "cwd", *(proc / "fd").iterdir()]
            found += [(int(proc.name), os.readlink(link)) for link in links]
        except OSError:
            continue
    return found

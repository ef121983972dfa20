"""bench/hook_load.py's choice of rows (``--row``), without running a storm."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from contextlib import closing
from pathlib import Path

from harness.benchscript import REPO, load
from harness.installed import FRONT
from nvc.hook.server import handover


def test_chosen_rows_keep_the_baseline_and_a_fault_rows_healthy_storm_in_order() -> None:
    bench = load("hook_load")
    labels = [row.label for row in bench.chosen(bench.ROWS, {"server, GPU 0, killed", "installed, setup's server"})]
    assert labels == ["no hook", "installed, setup's server", "server, GPU 0", "server, GPU 0, killed"]
    assert bench.chosen(bench.ROWS, set()) == bench.ROWS


def test_an_its_server_row_comes_with_the_storm_that_starts_its_server() -> None:
    bench = load("hook_load")
    for wanted, before in (
        ("socket unit, its server", "socket unit, no server"),
        ("installed, its server", "installed, no server"),
    ):
        labels = [row.label for row in bench.chosen(bench.ROWS, {wanted})]
        assert labels == ["no hook", before, wanted]


def test_an_unknown_row_is_refused_before_anything_runs() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "hook_load.py"), "--row", "server, GPU 9"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--row: no such row: server, GPU 9" in done.stderr, done.stderr


def test_the_socket_unit_starts_a_server_on_a_waiting_connection_and_keeps_its_socket(
    active_2gpu, tmp_path: Path
) -> None:
    """The bench's stand-in for systemd's socket unit: the call that finds no server waits in the
    socket's queue, is served by the server it started (handed the socket, as systemd hands it), and
    after ``systemctl stop`` the same socket starts the next server; nothing is left once closed."""
    bench = load("hook_load")
    unit = bench.SocketUnit(tmp_path / "unit" / "hook.sock", [f"PATH={os.environ['PATH']}"], tmp_path / "stats.jsonl")
    inode = unit.path.stat().st_ino
    servers = []
    with closing(unit):
        for turn in range(2):
            over = threading.Event()
            watcher = threading.Thread(target=unit.activate, args=(over,))
            watcher.start()
            try:
                log = tmp_path / f"debug-{turn}.log"
                result = subprocess.run(
                    [str(FRONT), "--root", str(active_2gpu.root), "--debug", str(log), "list"],
                    capture_output=True,
                    text=True,
                    env={handover.SOCKET_ENV: str(unit.path)},
                    timeout=60,
                )
            finally:
                over.set()
                watcher.join()
            assert result.returncode == 0, result.stderr
            assert unit.server is not None and unit.started == turn + 1
            servers.append(unit.server.pid)
            pids = {int(line.split()[2]) for line in log.read_text().splitlines() if line[:1] in "DI"}
            assert pids and os.getpid() not in pids and unit.server.pid not in pids  # a worker of that server's
            unit.stop()
            assert unit.server is None and unit.path.stat().st_ino == inode  # stopped; the socket stays
    said = (unit.path.parent / "server.log").read_text()
    assert said.count(f"listening on {unit.path} (from systemd)") == 2, said
    assert servers[0] != servers[1]
    assert not any(Path(f"/proc/{pid}").exists() for pid in servers)

"""bench/configure.py without running containers: its ``--userns`` rows differ from their pair only in the
maps, its bundles only in the user namespace, and its table's figures are the hook's cost (its start over the
no-hook start of the same kind) and its own log's ``duration_ms``, by row; each container's root is an overlay
of one rootfs, or in a ``--userns`` run a copy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

import pytest

from harness import benchscript
from harness.bundle import make_config
from harness.sharedirs import mountpoints

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():  # noqa: ANN201
    return benchscript.load("configure")


def test_each_userns_row_is_its_pair_with_the_maps(bench) -> None:
    rows = bench.USERNS_ROWS
    assert [row.userns for row in rows] == [False, True] * 3
    for plain, mapped in zip(rows[::2], rows[1::2], strict=True):
        assert mapped == plain._replace(label=plain.label + bench.USERNS, userns=True)
    assert {row.kind for row in rows} == {"none", "hook"} and all(row.gpu and not row.tuned for row in rows)


def test_a_mapped_bundle_differs_only_in_its_user_namespace(bench, tmp_path: Path) -> None:
    """What the bench writes for a row and its mapped pair: the same but the user namespace and its maps."""
    plain, mapped = (
        make_config(tmp_path, tmp_path / "rootfs", ["true"], id_map=id_map, host_proc_sys=True)
        for id_map in (None, bench.ID_MAP)
    )
    assert {"type": "user"} in mapped["linux"]["namespaces"]
    assert mapped["linux"].pop("uidMappings") == [{"containerID": 0, "hostID": 100000, "size": 65536}]
    assert mapped["linux"].pop("gidMappings") == [{"containerID": 0, "hostID": 100000, "size": 65536}]
    mapped["linux"]["namespaces"].remove({"type": "user"})
    assert mapped == plain
    assert {m["destination"]: m["type"] for m in plain["mounts"]}["/proc"] == "bind"


def _mounted(path: Path) -> bool:
    return str(path) in mountpoints()


def test_a_containers_root_is_an_overlay_whose_writes_leave_the_base_as_it_was(bench, tmp_path: Path) -> None:
    """A start writes into its own upper layer; the shared base (every container's lower) stays as it was, and
    nothing stays mounted once the container is done."""
    base = tmp_path / "base"
    (base / "etc").mkdir(parents=True)
    (base / "etc" / "ld.so.cache").write_text("base")
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    with ExitStack() as roots:
        rootfs = bench.container_root(base, bundle, roots, userns_run=False, mapped=False)
        assert rootfs == bundle / "rootfs" and _mounted(rootfs)
        (rootfs / "etc" / "ld.so.cache").write_text("the container's")
        (rootfs / "libcuda.so.1").touch()
    assert not _mounted(rootfs)
    assert (base / "etc" / "ld.so.cache").read_text() == "base" and not (base / "libcuda.so.1").exists()
    assert (bundle / "upper" / "etc" / "ld.so.cache").read_text() == "the container's"


def test_a_userns_run_copies_each_rows_root_and_chowns_only_the_mapped_ones(bench, tmp_path: Path) -> None:
    """With --userns every row has a copy (a chown through an overlay would copy every file up, so the mapped
    rows could not have one): the maps stay the rows' only difference."""
    base = tmp_path / "base"
    (base / "usr" / "bin").mkdir(parents=True)
    roots = {}
    for mapped in (False, True):
        bundle = tmp_path / f"bundle-{mapped}"
        bundle.mkdir()
        with ExitStack() as stack:
            roots[mapped] = bench.container_root(base, bundle, stack, userns_run=True, mapped=mapped)
        assert not _mounted(roots[mapped])
    assert os.stat(roots[False] / "usr" / "bin").st_uid == 0
    assert os.stat(roots[True] / "usr" / "bin").st_uid == bench.ID_MAP[0]


def test_hook_cost_is_over_the_no_hook_start_of_the_same_kind(bench) -> None:
    labels = [row.label for row in bench.USERNS_ROWS]
    medians = dict(zip(labels, (100.0, 104.0, 130.0, 140.0, 250.0, 258.0), strict=True))
    times = {label: [m - 1, m, m + 50] for label, m in medians.items()}  # medians, whatever the spread
    assert bench.userns_costs(bench.USERNS_ROWS, times) == [
        ("nvc-py-hook, GPU 0, served", 30.0, 36.0),
        ("nvc-py-hook, GPU 0, no server", 150.0, 154.0),
    ]


def test_hook_durations_are_read_by_row_from_the_container_id(bench) -> None:
    """Round 0 (the warm-up), failures and other containers' lines left out."""
    rows = bench.USERNS_ROWS

    def line(container: str, outcome: str = "configured", ms: float = 10.0) -> str:
        return json.dumps({"container": container, "outcome": outcome, "duration_ms": ms})

    log = "\n".join(
        [
            line("nvc-bench-0-1", ms=99.0),
            line("nvc-bench-1-1", ms=20.0),
            line("nvc-bench-2-1", ms=22.0),
            line("nvc-bench-1-3", ms=30.0),
            line("nvc-bench-1-2", outcome="error"),
            line("other"),
            "I1125 15:00:00.000000 1 x] timing mounts 1.0 ms",
        ]
    )
    found = bench.hook_durations(log, rows)
    assert found[rows[1].label] == [20.0, 22.0] and found[rows[3].label] == [30.0]
    assert found[rows[2].label] == [] and found[rows[0].label] == []


def test_each_cold_row_comes_right_before_its_warm_pair(bench) -> None:
    """--cold: every row of the default table started once right after the page cache is dropped, then warm."""
    rows = bench.cold_rows(bench.ROWS)
    assert [row.cold for row in rows] == [True, False] * len(bench.ROWS)
    assert list(rows[1::2]) == list(bench.ROWS)
    for cold, warm in zip(rows[::2], rows[1::2], strict=True):
        assert cold == warm._replace(label=warm.label + bench.COLD, cold=True)


def test_a_hook_s_stages_are_read_by_kind_cold_or_warm(bench) -> None:
    """Each kind's runs of the hook with no server (its JSON lines, by the row in the container id), round 0
    (the warm-up) left out; a server's runs and other rows' are not theirs."""
    rows = bench.cold_rows(bench.ROWS)
    cold, warm = (
        next(i for i, r in enumerate(rows) if r.label == f"nvc-py-hook, GPU 0, no server{suffix}")
        for suffix in (bench.COLD, "")
    )
    served = next(i for i, r in enumerate(rows) if r.label == "nvc-py-hook, GPU 0, served")

    def line(round_no: int, row_no: int, ms: float, via: str | None = None) -> str:
        record = {"container": f"nvc-bench-{round_no}-{row_no}", "pid": 1, "outcome": "configured", "devices": ["0"]}
        return json.dumps({**record, "duration_ms": ms, **({"via": via} if via else {})})

    log = "\n".join(
        [
            line(0, cold, 99.0),
            line(0, warm, 98.0),
            line(1, cold, 60.0),
            line(1, warm, 30.0),
            line(1, served, 10.0, "server"),
            line(2, cold, 62.0),
            line(2, warm, 31.0),
        ]
    )
    assert [r["duration_ms"] for r in bench.hook_stages(log, None, True, rows)] == [60.0, 62.0]
    assert [r["duration_ms"] for r in bench.hook_stages(log, None, False, rows)] == [30.0, 31.0]
    assert [r["duration_ms"] for r in bench.hook_stages(log, None)] == [98.0, 60.0, 30.0, 62.0, 31.0]


V2_ONLY = "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
V1_ONLY = "35 31 0:32 / /sys/fs/cgroup/devices rw,nosuid,nodev,noexec shared:13 - cgroup cgroup rw,devices\n"
HYBRID = V1_ONLY + "32 31 0:29 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw,nsdelegate\n"


def test_a_bench_starts_runc_where_crun_refuses_the_hosts_hybrid_cgroups(monkeypatch) -> None:
    """crun 1.8 refuses a host that mounts v1 hierarchies beside the v2 one, so the benches' default there is
    runc, and they print why; a runtime asked for is taken as it is, and one not installed stops the bench."""
    from harness import timing

    assert timing.hybrid_cgroups(HYBRID)
    assert not timing.hybrid_cgroups(V2_ONLY) and not timing.hybrid_cgroups(V1_ONLY)
    monkeypatch.setattr(timing.shutil, "which", {"crun": "/usr/bin/crun", "runc": "/usr/sbin/runc"}.get)
    monkeypatch.setattr(timing.Path, "read_text", lambda self: V2_ONLY)
    assert timing.bench_runtime(None) == ("/usr/bin/crun", "the default")
    monkeypatch.setattr(timing.Path, "read_text", lambda self: HYBRID)
    runtime, why = timing.bench_runtime(None)
    assert runtime == "/usr/sbin/runc" and "hybrid cgroups" in why
    assert timing.bench_runtime("crun") == ("/usr/bin/crun", "asked for")
    monkeypatch.setattr(timing.shutil, "which", {"runc": "/usr/sbin/runc"}.get)
    assert timing.bench_runtime(None) == ("/usr/sbin/runc", "crun is not installed")
    with pytest.raises(SystemExit, match="crun is not installed"):
        timing.bench_runtime("crun")


def test_a_spacing_out_of_range_is_refused_before_anything_starts() -> None:
    """``--spacing`` is seconds from 0 to 10; anything else stops the bench at its arguments."""
    for spacing in ("-1", "11", "x"):
        run = subprocess.run(
            [sys.executable, str(REPO / "bench/configure.py"), "--runs", "10", "--spacing", spacing],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode == 2 and "--spacing" in run.stderr and not run.stdout, (spacing, run)


def test_a_benchs_work_is_on_a_tmpfs_of_its_own_gone_with_it() -> None:
    """The bundles and rootfs of a bench are on a tmpfs mounted for it (a file's creation costs every row the
    same), and nothing of it stays: neither the mount nor the directory."""
    from harness import timing

    with timing.bench_workdir("nvc-test-bench-") as work:
        assert _mounted(work)
        assert (
            subprocess.run(["stat", "-f", "-c", "%T", work], capture_output=True, text=True).stdout.strip() == "tmpfs"
        )
        (work / "bundle").mkdir()
    assert not work.exists() and not _mounted(work)

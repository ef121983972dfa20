"""bench/reference.py: how the benches run NVIDIA's nvidia-container-cli beside nvc-py. No reference here:
a stand-in program records the arguments and environment it was run with, which is what is checked."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from harness.benchscript import load

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def reference():
    return load("reference")


STAND_IN = """#!/bin/sh
# what nvidia-container-cli was given, one line each: its arguments, then its LD_LIBRARY_PATH
for arg in "$@"; do echo "$arg"; done > {out}
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" >> {out}
"""


def stand_in(tmp_path: Path, with_lib: bool) -> tuple[Path, Path]:
    """A stand-in nvidia-container-cli in PREFIX/bin (a PREFIX/lib beside it where asked), and the file it
    writes."""
    out = tmp_path / "argv"
    cli = tmp_path / "prefix" / "bin" / "nvidia-container-cli"
    cli.parent.mkdir(parents=True)
    cli.write_text(STAND_IN.format(out=out))
    cli.chmod(0o755)
    if with_lib:
        (tmp_path / "prefix" / "lib").mkdir()
    return cli, out


@pytest.mark.parametrize("spacing", ["", " "])
def test_the_hook_configures_the_containers_pid_and_rootfs_as_nvidias_hook_would(
    reference, tmp_path, spacing, monkeypatch
):
    """The OCI state on stdin (crun's spacing or runc's) gives the pid and the bundle; the CLI (named by a path
    relative to the bench's directory, run from the bundle's) gets the driver root, --load-kmods and
    configure's flags for GPU 0, compute and utility, and the bundle's rootfs; its own lib directory comes
    first in its LD_LIBRARY_PATH."""
    cli, out = stand_in(tmp_path, with_lib=True)
    monkeypatch.chdir(tmp_path)
    entry = reference.write_hook(cli.relative_to(tmp_path), "/drivers root", tmp_path / "hook.sh")
    state = json.dumps(
        {"ociVersion": "1.0.2", "id": "c", "pid": 4242, "bundle": "/b/c 1"}, separators=(",", ":" + spacing)
    )
    env = dict(e.split("=", 1) for e in entry["env"])
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    subprocess.run([entry["path"], *entry["args"][1:]], input=state, text=True, env=env, check=True, cwd=bundle)
    argv = out.read_text().splitlines()
    assert argv[:-1] == [
        "--root",
        "/drivers root",
        "--load-kmods",
        "configure",
        f"--ldconfig=@{reference.ldconfig()}",
        "--no-cgroups",
        "--device=0",
        "--compute",
        "--utility",
        "--pid=4242",
        "/b/c 1/rootfs",
    ]
    assert argv[-1].split("=", 1)[1].split(":")[0] == str(tmp_path / "prefix" / "lib")


def test_the_hook_fails_without_a_pid_and_runs_nothing(reference, tmp_path):
    cli, out = stand_in(tmp_path, with_lib=False)
    entry = reference.write_hook(cli, "/", tmp_path / "hook.sh")
    done = subprocess.run([entry["path"]], input=json.dumps({"bundle": "/b"}), text=True)
    assert done.returncode == 1 and not out.exists()


def test_its_libraries_come_first_only_where_a_lib_directory_is_beside_it(reference, tmp_path, monkeypatch):
    monkeypatch.setenv("LD_LIBRARY_PATH", "/elsewhere")
    cli, _ = stand_in(tmp_path, with_lib=False)
    assert reference.environment(cli) == {}
    (tmp_path / "prefix" / "lib").mkdir()
    assert reference.environment(cli) == {"LD_LIBRARY_PATH": f"{tmp_path / 'prefix' / 'lib'}:/elsewhere"}


def test_the_configure_bench_starts_the_reference_right_after_the_baseline(tmp_path):
    """``--reference`` adds its row after the no-hook start, so every round starts it beside nvc-py's; with
    ``--cold`` it has a cold start too."""
    bench = load("configure")
    rows = bench.with_reference(bench.ROWS)
    assert [row.kind for row in rows[:2]] == ["none", "reference"] and rows[:1] + rows[2:] == bench.ROWS
    cold = bench.cold_rows(rows)
    assert [(row.kind, row.cold) for row in cold[:4]] == [("none", True), ("none", False)] + [
        ("reference", True),
        ("reference", False),
    ]


def test_a_multiple_of_the_reference_only_where_the_run_has_one(reference):
    assert reference.ratio(77.0, 51.3) == "1.50x" and reference.ratio(10.0, None) == "-"
    assert os.path.basename(reference.ldconfig()).startswith("ldconfig")

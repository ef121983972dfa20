"""Running the fuzz targets: `make fuzz` (``python -m harness.fuzzing`` from tests/) and
tests/test_fuzz.py.

A target is a Python module tests/fuzz/fuzz_<name>.py (atheris; tests/fuzz/target.py) or the
libFuzzer program of the shim's limit parsing (native/fuzz/limits_fuzz.c, built with clang by
native/Makefile's ``fuzz``). Each runs for a bounded time over its seed corpus,
tests/fuzz/corpus/<name>/, which it only reads: the inputs it finds that reach new code go to a
corpus of the run's own in its work directory, where a crash's input is written too. The tree's
corpus is kept by hand: the seeds, and each input that ever crashed a parser (fixed since).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parent.parent.parent
TARGETS = REPO / "tests" / "fuzz"
CORPUS = TARGETS / "corpus"
NATIVE = REPO / "native"
NATIVE_TARGET = "shim_limits"  # native/fuzz/limits_fuzz.c
FINDINGS = ("crash-", "timeout-", "oom-", "leak-", "slow-unit-")
PER_INPUT_TIMEOUT_S = 10  # an input that takes longer is a finding (libFuzzer's -timeout)
RSS_LIMIT_MB = 2048


class Outcome(NamedTuple):
    """One target's run: how many inputs it ran, the input that crashed it (None: none did), and
    the end of libFuzzer's output."""

    target: str
    seconds: int
    runs: int
    crash: Path | None
    output: str


def targets() -> list[str]:
    """Every target's name: the Python modules', then the shim's."""
    return [path.stem.removeprefix("fuzz_") for path in sorted(TARGETS.glob("fuzz_*.py"))] + [NATIVE_TARGET]


def build_native(work: Path) -> Path:
    """The shim's fuzzer, built into ``work`` (make's output goes to the caller's on a failure)."""
    work.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["make", "-s", "-C", str(NATIVE), "fuzz", f"FUZZ_DIR={work.resolve()}"], check=True, stdout=subprocess.DEVNULL
    )
    return work / "limits-fuzzer"


def command(target: str, work: Path) -> list[str]:
    """The program that runs ``target``, before libFuzzer's options."""
    if target == NATIVE_TARGET:
        return [str(build_native(work))]
    return [sys.executable, str(TARGETS / f"fuzz_{target}.py")]


def run(target: str, seconds: int, work: Path) -> Outcome:
    """Run ``target`` for ``seconds`` over its seed corpus; its findings and new inputs go under
    ``work``/<target>."""
    own = work / target
    (own / "corpus").mkdir(parents=True, exist_ok=True)
    seeds = CORPUS / target
    args = [
        *command(target, work),
        f"-max_total_time={seconds}",
        f"-timeout={PER_INPUT_TIMEOUT_S}",
        f"-rss_limit_mb={RSS_LIMIT_MB}",
        f"-artifact_prefix={own}/",
        "-print_final_stats=1",
        str(own / "corpus"),
        *([str(seeds)] if seeds.is_dir() else []),
    ]
    done = subprocess.run(
        args,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=seconds + 120,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    output = done.stdout.decode(errors="replace")
    found = sorted(p for p in own.iterdir() if p.name.startswith(FINDINGS))
    runs = re.findall(r"stat::number_of_executed_units:\s*(\d+)", output)
    if done.returncode != 0 and not found:
        raise RuntimeError(
            f"fuzz target {target} failed (status {done.returncode}) and left no input:\n{output[-4000:]}"
        )
    return Outcome(target, seconds, int(runs[-1]) if runs else 0, found[0] if found else None, output[-6000:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make fuzz", description="Run the fuzz targets, one after another.")
    parser.add_argument("--seconds", type=int, default=60, help="each target's time (default 60)")
    parser.add_argument(
        "--work", type=Path, default=REPO / ".make" / "fuzz", help="the runs' corpora and findings (default .make/fuzz)"
    )
    parser.add_argument("target", nargs="*", help=f"the targets to run (default all: {' '.join(targets())})")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.target) - set(targets()))
    if unknown:
        parser.error(f"no fuzz target {unknown[0]} (there are: {' '.join(targets())})")
    crashed = []
    for target in args.target or targets():
        outcome = run(target, args.seconds, args.work)
        if outcome.crash is None:
            print(f"fuzz: {target}: {outcome.runs} inputs in {outcome.seconds} s, no crash", flush=True)
        else:
            crashed.append(outcome)
            print(f"fuzz: {target}: CRASHED on {outcome.crash}; libFuzzer said:\n{outcome.output[-3000:]}", flush=True)
    if crashed:
        print(
            f"fuzz: {len(crashed)} target(s) crashed: fix the parser, and keep each input in "
            f"tests/fuzz/corpus/<target>/ as a seed",
            file=sys.stderr,
        )
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())

"""What the one line says: a lost output, a debug log that cannot be written, a usage error.

Test double: the GPUs are the fake driver's (tests/fakedriver); nothing here is a GPU result.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from harness.clihostile import BOUND_S, HOOK, NVC_PY, OUTPUT_CODE, RUNTIME, write_base_config
from nvc import errors

# ---- what the lines say ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [[NVC_PY, "--version"], [HOOK, "--help"], [RUNTIME, "--version"]],
    ids=["nvc-py", "nvc-py-hook", "nvc-py-runtime"],
)
@pytest.mark.parametrize(("mode", "reason"), [("full", "No space left on device"), ("closed", "Bad file descriptor")])
def test_lost_output_says_so(tmp_path: Path, argv: list[str], mode: str, reason: str) -> None:
    """stdout full or closed: OutputError's line and status (see nvc/system/stdio.py), for each program."""
    write_base_config(tmp_path, tmp_path)
    prog = Path(argv[0]).name
    with open("/dev/full", "wb") as full:
        result = subprocess.run(
            ["/bin/sh", "-c", 'exec "$@" >&-', "sh", *argv] if mode == "closed" else argv,
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=BOUND_S,
            env={**os.environ, "NVC_PY_CONFIG": str(tmp_path / "config.yaml")},
        )
    assert (result.returncode, result.stderr) == (
        OUTPUT_CODE,
        f"{prog}: output error: cannot write standard output: {reason}\n",
    )


def test_a_debug_log_that_cannot_be_written(active_2gpu, tmp_path: Path) -> None:
    """The command's work and output stand; its status says the log was lost, in one line. A FIFO
    without a reader is refused at once."""
    listed = subprocess.run(
        [NVC_PY, "--root", str(active_2gpu.root), "list"], capture_output=True, text=True, timeout=BOUND_S
    )
    result = subprocess.run(
        [NVC_PY, "--root", str(active_2gpu.root), "--debug", "/dev/full", "list"],
        capture_output=True,
        text=True,
        timeout=BOUND_S,
    )
    assert (result.returncode, result.stdout, result.stderr) == (
        OUTPUT_CODE,
        listed.stdout,
        "nvc-py: output error: /dev/full: debug log not written: No space left on device\n",
    )
    os.mkfifo(tmp_path / "fifo")
    result = subprocess.run(
        [NVC_PY, "--debug", str(tmp_path / "fifo"), "config", "show"], capture_output=True, text=True, timeout=BOUND_S
    )
    assert (result.returncode, result.stderr) == (
        errors.InputError.exit_code,
        f"nvc-py: input error: {tmp_path}/fifo: cannot open debug log: No such device or address\n",
    )


def test_a_usage_error_is_one_line() -> None:
    """click's words, with where to read more instead of its usage lines."""
    result = subprocess.run([NVC_PY, "list", "--bogus"], capture_output=True, text=True, timeout=BOUND_S)
    assert result.returncode == errors.InputError.exit_code
    assert re.fullmatch(r"nvc-py: input error: [^\n]*--bogus[^\n]* \(see 'nvc-py list --help'\)\n", result.stderr)

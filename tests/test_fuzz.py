"""Every parser of untrusted input under a coverage-guided fuzzer for 5 s (tests/harness/fuzzing.py;
`make fuzz` runs them longer): the OCI state and spec, the device-list, capability and requirement
grammars, the NVIDIA_* and sharing variables, the configuration file, the hook server's wire
protocol, the helpers' framed protocol, the device plugin's Allocate and GetPreferredAllocation, and
the shim's limit parsing (C, under ASan and UBSan). A run first replays the seed corpus in the tree,
where each input that once crashed a parser is kept: a crash fails the test with the input's path.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness.fuzzing import CORPUS, NATIVE_TARGET, run, targets

SECONDS = 5  # per target: nine targets of 10 s took 104 s of a 1042 s suite, near the 20 minutes CI allows


def test_every_parser_has_a_target_and_seeds() -> None:
    assert targets() == [
        "config",
        "container_env",
        "device_plugin",
        "devices",
        "hook_call",
        "oci_spec",
        "oci_state",
        "rpc_frame",
        NATIVE_TARGET,
    ]
    assert all(len(list((CORPUS / name).iterdir())) >= 3 for name in targets())


@pytest.mark.parametrize("target", targets())
def test_fuzz_target_finds_no_crash(target: str, tmp_path: Path) -> None:
    if target == NATIVE_TARGET and shutil.which("clang") is None:
        pytest.fail("clang is missing: `make deps` installs it (the Makefile's APT_PACKAGES)")
    outcome = run(target, SECONDS, tmp_path)
    assert outcome.crash is None, (
        f"{target} crashed on {outcome.crash} (keep it in tests/fuzz/corpus/{target}/ once fixed):\n{outcome.output}"
    )
    assert outcome.runs > 100, outcome.output

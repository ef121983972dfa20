"""`make try`: nvc-py on the fake driver (a test double) in a private mount namespace, driven here
without a terminal: by CMD, and by a shell reading commands from stdin. ``-o build``: the suite runs
against the installation it was started with, which a rebuild in the middle must not replace."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MAKE_TRY = ["make", "-s", "--no-print-directory", "-C", str(REPO), "-o", "build", "try"]
BANNER = "== nvc-py try: FAKE NVIDIA driver (a test double"


def _names_under_tmp() -> set[str]:
    return {p.name for p in Path("/tmp").glob("nvc-try-*")}


def test_make_try_cmd_answers_from_the_fake_driver() -> None:
    before = _names_under_tmp()
    command = (
        "nvc-py info --csv && nvc-py list -b && nvc-py cdi generate --format json "
        "&& nvc-py configure --dry-run -c -u $ROOTFS && cat /proc/driver/nvidia/version"
    )
    result = subprocess.run([*MAKE_TRY, f"CMD={command}"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith(BANNER)
    assert "NVIDIA H100 80GB HBM3" in out and "NVIDIA A100-SXM4-40GB" in out  # info: the fake machine's GPUs
    assert "/fake/root/usr/bin/nvidia-smi\n" in out  # list: the fake root's binaries, no --root given
    assert '"kind": "nvidia.com/gpu"' in out and '"name": "all"' in out
    assert "rootfs  /tmp/nvc-try-" in out and "nvidia-smi -> /usr/bin/nvidia-smi" in out
    assert "NVRM version:" in out  # the fake /proc/driver, seen only inside
    assert _names_under_tmp() == before  # its directory is removed again


def test_make_try_shell_reads_commands_from_stdin() -> None:
    result = subprocess.run(MAKE_TRY, input="nvc-py info --csv\nexit 3\n", capture_output=True, text=True, timeout=120)
    assert result.returncode != 0  # the shell's exit status 3 comes back through make
    assert result.stdout.startswith(BANNER) and "NVIDIA H100 80GB HBM3" in result.stdout

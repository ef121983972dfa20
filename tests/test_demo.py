"""`make demo`'s program (demo/run.py) on the fake driver: real podman containers through the hook,
each seeing the GPUs it asked for, and nothing of it left behind (its /run directories are private
tmpfs, its directory removed; the session's host check covers the rest)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_demo_on_the_fake_driver() -> None:
    before = {p.name for p in Path("/tmp").glob("nvc-demo-*")}
    result = subprocess.run(
        [sys.executable, str(REPO / "demo" / "run.py")], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    out = result.stdout
    assert out.startswith("== nvc-py demo: no NVIDIA driver on this host; using the built-in FAKE driver")
    runs = out.split("$ podman run")[1:]
    assert "GPU 0: NVIDIA H100 80GB HBM3" in runs[0] and "A100" not in runs[0]
    assert "GPU 0: NVIDIA A100-SXM4-40GB" in runs[1] and "H100" not in runs[1]
    assert "GPU 1: NVIDIA A100-SXM4-40GB" in runs[2] and "MIG 3g.20gb" in runs[2]
    assert '"outcome":"no-gpu"' in out and "`make try` opens a shell" in out
    # its podman commands say they are not the host's (issue #49, finding 8), and what is
    assert "this demo's own store" in out and "podman run --rm -e NVIDIA_VISIBLE_DEVICES=0 IMAGE nvidia-smi -L" in out
    assert {p.name for p in Path("/tmp").glob("nvc-demo-*")} == before

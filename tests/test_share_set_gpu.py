"""`nvc-py share set` on a real GPU (H100): a running PyTorch training job's throughput follows a compute
change within a second. Run by `make test-gpu` on the GPU machine; deselected elsewhere.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harness.installed import SCRIPTS

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
import sharegpu  # noqa: E402

pytestmark = pytest.mark.gpu
WINDOW_S = 0.25  # throughput measured over windows this long
FOLLOW_S = 1.0  # the bound: the new cap's throughput within a second


def _rate(steps: list[float], start: float, end: float) -> float:
    """Iterations per second that ended in [start, end)."""
    return sum(start <= t < end for t in steps) / (end - start)


def _followed(steps: list[float], changed: float, before: float, after: float) -> float:
    """Seconds after ``changed`` until a window's rate is 90 % of the way from ``before`` to ``after``."""
    target = before + 0.9 * (after - before)
    reached = (lambda r: r >= target) if after > before else (lambda r: r <= target)
    at = changed
    while at < changed + 5:
        if reached(_rate(steps, at, at + WINDOW_S)):
            return at + WINDOW_S - changed
        at += WINDOW_S / 5
    return float("inf")


def test_a_training_job_follows_a_compute_change_within_a_second(tmp_path):
    """A transformer training step under cap 25 (a sharing directory as the hook makes it, the job
    preloaded with the shim) is raised to 75 and lowered back by `share set` while it runs: its
    throughput reaches 90 % of the way to its new level within a second each time. `share top --once`
    shows it meanwhile (the frame docs/sharing.md quotes)."""
    from nvc.commands import shareset
    from nvc.plan.share import Change

    if not Path(sharegpu.TORCH_PYTHON).exists():
        pytest.skip("no PyTorch interpreter")
    state = tmp_path / "state"
    sharegpu.limits_dir(state / "trainer", {"NVC_SHARE_COMPUTE": "25", "NVC_SHARE_MEMORY_LIMIT": "16Gi"})
    env = sharegpu.shim_env(state / "trainer", TORCH_LOAD_STEPS="1")
    job = sharegpu.torch_run("transformer", env, 60)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(job.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120
        while not any(line.startswith("step ") for line in lines) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(4)  # 4 s at cap 25
        raised = time.time()
        print(shareset.change("trainer", Change(compute=75), str(state))[0])
        time.sleep(5)
        frame = subprocess.run(
            [str(SCRIPTS / "nvc-py"), "share", "top", "--once", "--interval", "1", "--state-dir", str(state)],
            capture_output=True,
            text=True,
        )
        print(frame.stdout + frame.stderr)
        lowered = time.time()
        print(shareset.change("trainer", Change(compute=25), str(state))[0])
        time.sleep(5)
    finally:
        job.kill()
        job.wait()
        reader.join(10)
    out = "".join(lines)
    steps = [float(line.split()[1]) for line in out.splitlines() if line.startswith("step ")]
    at_25 = _rate(steps, raised - 4, raised)
    at_75 = statistics.median(_rate(steps, t, t + 1) for t in (raised + 2, raised + 3, raised + 4))
    back = _rate(steps, lowered + 2, lowered + 4)
    up, down = _followed(steps, raised, at_25, at_75), _followed(steps, lowered, at_75, back)
    print(
        f"transformer step: cap 25 {at_25:.1f} it/s; share set --compute 75: {at_75:.1f} it/s "
        f"(x{at_75 / at_25:.2f}), 90 % there {1000 * up:.0f} ms after; share set --compute 25: "
        f"{back:.1f} it/s, 90 % there {1000 * down:.0f} ms after"
    )
    assert at_75 >= 2.2 * at_25 and back <= 1.3 * at_25
    assert up <= FOLLOW_S and down <= FOLLOW_S

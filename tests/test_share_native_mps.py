"""libnvc-share (native/) against the fake driver as a client of nvc-py's MPS backend with a weight: a lighter
weight's duty cycle (its compute cap) holds only while a heavier client keeps work queued, so a heavier
client that leaves the GPU idle between its launches, or none at all, leaves the lighter one the GPU.

Each tenant gets the limits file the hook writes for an MPS client (its weight, the lighter one's duty
cycle, an MPS line: the fake libcuda finds no daemon there and runs it on the fake GPU shared by the
tenants, FAKE_CUDA_SHARED_GPU) and a scheduler file in one directory. Test double only: nothing here is
a GPU result.
"""

from __future__ import annotations

import struct
import time
from pathlib import Path

from harness.shim import probe_started, share  # noqa: F401  (fixtures)

LIGHT_KERNELS = 300  # of 1 ms: 0.3 s alone


def mps_tenant(share, programs, tmp_path: Path, name: str, weight: int, duty: int | None, *work: str):  # noqa: F811
    """cuda_probe doing `work` on fake GPU 0 as an MPS client of weight `weight` with duty cycle `duty`."""
    directory = tmp_path / name
    directory.mkdir(parents=True)
    lines = ["version=1", f"compute_weight={weight}", *([f"compute_percent={duty}"] if duty else [])]
    lines.append("mps.CUDA_MPS_PIPE_DIRECTORY=/nonexistent/mps-pipe")  # no daemon there
    (directory / "limits").write_text("\n".join(lines) + "\n")
    (tmp_path / "sched").mkdir(exist_ok=True)
    fake = {"FAKE_CUDA_KERNEL_US": "1000", "FAKE_CUDA_SHARED_GPU": str(tmp_path / "gpu")}
    env = {
        **share.env({**fake, "NVC_SHARE_SCHED_DIR": str(tmp_path / "sched"), "NVC_SHARE_TENANT": name}),
        "NVC_SHARE_DIR": str(directory),
    }
    return probe_started(programs, env, *work)


def light_wall(share, programs, tmp_path: Path, heavy: tuple[str, ...] | None) -> float:  # noqa: F811
    """Seconds the weight-1 client (duty cycle 40 %, 1:3) takes for its kernels back to back, beside a
    weight-3 client doing `heavy` (None: none)."""
    others = [mps_tenant(share, programs, tmp_path, "heavy", 3, None, *heavy)] if heavy else []
    if heavy:
        _until_launching(tmp_path / "sched" / "heavy")
    light = mps_tenant(share, programs, tmp_path, "light", 1, 40, "launch", str(LIGHT_KERNELS), "264", "128", "sync")
    out, err = light.communicate(timeout=60)
    for other in others:
        other.kill()
        other.communicate()
    assert light.returncode == 0, err
    timed = {f[0]: f for f in (line.split() for line in out.splitlines()) if f[0] in ("launch", "sync")}
    assert timed["launch"][1] == timed["sync"][1] == "CUDA_SUCCESS", out
    return (float(timed["launch"][2]) + float(timed["sync"][2])) / 1e6


def _until_launching(sched_file: Path) -> None:
    """Until the heavier client's scheduler file says it launched (its first device entry's last launch,
    native/shim/scheduling/sched.c's layout), and 0.1 s more: a few dozen looks at its backlog."""
    deadline = time.monotonic() + 20
    while True:
        data = sched_file.read_bytes() if sched_file.exists() else b""
        if len(data) >= 64 + 128 and struct.unpack_from("<Q", data, 64 + 48)[0]:
            break
        assert time.monotonic() < deadline, "the heavier client never launched"
        time.sleep(0.01)
    time.sleep(0.1)


def test_a_lighter_clients_duty_cycle_holds_only_beside_a_backlogged_heavier_one(share, programs, tmp_path):  # noqa: F811
    """Alone (no heavier client) the lighter one runs free; beside a heavier one that keeps the GPU busy
    (1 ms kernels back to back: its work queued at every look) its duty cycle holds, and it takes several
    times as long; beside a heavier one that waits for each kernel and then spends 2 ms on its host (the
    GPU idle two thirds of the time, nothing queued at its looks) it runs free again, slowed only where
    their kernels meet on the GPU. A heavier client the machine starves of CPU keeps nothing queued and
    holds no one: the busy case runs again (three times at most) where it was not several times as long."""
    alone = light_wall(share, programs, tmp_path / "alone", None)
    for attempt in range(3):  # a machine busy enough to starve the heavier one of its backlog: again
        busy = light_wall(share, programs, tmp_path / f"busy{attempt}", ("launch", "20000", "264", "128", "sync"))
        if busy >= 2.5 * alone:
            break
    idle_between = light_wall(share, programs, tmp_path / "launch-bound", ("steps", "5000", "264", "128", "2000"))
    print(
        f"the lighter client's {LIGHT_KERNELS} kernels: alone {alone:.3f} s, beside a busy heavier one {busy:.3f} s, "
        f"beside a launch-bound one {idle_between:.3f} s"
    )
    assert alone <= 1.5 * LIGHT_KERNELS / 1000, alone
    assert busy >= 2.5 * alone, (busy, alone)
    assert idle_between <= 1.8 * alone, (idle_between, alone)


def _duty(limits: Path, duty: int | None) -> None:
    """The lighter client's limits file as a start or poststop of another container on its daemon rewrites it
    (nvc.plan.mps.rebalanced): with the duty cycle `duty`, or none; replaced whole, as the hook replaces it."""
    lines = [line for line in limits.read_text().splitlines() if not line.startswith("compute_percent=")]
    new = limits.with_name("limits.new")
    new.write_text("\n".join([*lines[:2], *([f"compute_percent={duty}"] if duty else []), *lines[2:]]) + "\n")
    new.replace(limits)


def test_a_lighter_client_given_its_duty_cycle_mid_run_and_freed_again_is_never_stalled(share, programs, tmp_path):  # noqa: F811
    """As the lighter container that started first on the H100 (make test-gpu, the lighter-first MPS pair): it
    runs free, goes idle on its host, gets its duty cycle while a heavier client keeps the GPU busy, runs
    under it, and loses it when the heavier one goes (killed). Its 3000 kernels of 1 ms then finish within
    twice the time they take alone (3 s; 2.7 s measured): nothing left it behind a gate nobody opens."""
    light = mps_tenant(
        share,
        programs,
        tmp_path,
        "light",
        1,
        None,
        *("launch", "100", "264", "128", "sync"),
        *("steps", "1", "264", "128", "800000"),  # 0.8 s on its host, the GPU idle
        *("launch", "3000", "264", "128", "sync"),
    )
    time.sleep(0.2)
    heavy = mps_tenant(share, programs, tmp_path, "heavy", 3, None, "launch", "20000", "264", "128", "sync")
    _until_launching(tmp_path / "sched" / "heavy")
    _duty(tmp_path / "light" / "limits", 40)
    time.sleep(2.0)
    heavy.kill()
    heavy.communicate()
    _duty(tmp_path / "light" / "limits", None)
    freed = time.monotonic()
    out, err = light.communicate(timeout=60)
    after = time.monotonic() - freed
    assert light.returncode == 0, err
    assert all(line.split()[1] == "CUDA_SUCCESS" for line in out.splitlines()), out
    assert after <= 2 * 3.0, (after, out)

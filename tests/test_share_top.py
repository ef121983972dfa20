"""``nvc-py share top`` (nvc.commands.sharetop): the frame two readings make (pure), ``--once`` over live
regions of the real shim on the fake driver, and the curses view under a pseudo-terminal.
Test double only: nothing here is a GPU result.
"""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import termios
import time

from harness.fakegpus import H100 as GPU0
from harness.sharedirs import prepared
from harness.shim import GIB, MIB  # noqa: F401  (fixtures)
from harness.shim import share as shim  # noqa: F401  (a fixture)
from nvc.commands import sharestatus, sharetop
from nvc.commands.sharestatus import ContainerShare, Device, Process

KEY = GPU0[4:]


def _container(cid: str, busy_s: float, **device: object) -> ContainerShare:
    fields = {"memory_limit": 4 * GIB, "memory_used": 600 * MIB, "compute_percent": 50, "sm_count": 132}
    fields |= {"busy_s": busy_s, "throttled_s": 1.5, "launches": 10, **device}
    return ContainerShare(
        cid,
        f"/x/{cid}",
        {},
        "ok",
        (Device(KEY, **fields),),
        (Process(7, None, {KEY: 600 * MIB}),),  # type: ignore[arg-type]
    )


def test_a_frame_is_the_compute_used_between_two_readings() -> None:
    """Compute is the GPU time used between the readings over the time between them (the region's
    measure, for a cap and for a weight alike); a first reading (or a restarted counter) has none
    or counts from zero; a container without a region yet is listed apart."""
    waiting = ContainerShare("new", "/x/new", {}, "not initialised: no CUDA process has initialised it yet")
    before = sharetop.Reading(10.0, [_container("capped", 1.0), _container("weighted", 4.0)])
    after = sharetop.Reading(
        12.0,
        [
            _container("capped", 2.0),
            _container("restarted", 0.5),
            _container("weighted", 5.0, compute_percent=100, weight=3, latency_class="latency"),
            waiting,
        ],
    )
    assert sharetop.frame(None, after).rows[0].compute_percent is None
    rows = sharetop.frame(before, after).rows
    assert [(r.container, r.device, r.compute_percent, r.cap, r.weight, r.latency_class) for r in rows] == [
        ("capped", KEY, 50.0, 50, None, None),
        ("restarted", KEY, 25.0, 50, None, None),
        ("weighted", KEY, 50.0, 100, 3, "latency"),
        ("new", "-", None, 100, None, None),
    ]
    shown = sharetop.text(sharetop.frame(before, after))
    assert shown.startswith("nvc-py share top: 4 containers, compute over the last 2.0 s\n")
    assert f"\nGPU {KEY}: 3 containers, 1.8 GiB used, compute 125.0%\n" in shown
    assert (
        "\ncapped                 600 MiB     4 GiB    50.0%    cap 50% -        timeslice      1.5s     1\n" in shown
    )
    assert (
        "\nweighted               600 MiB     4 GiB    50.0%        w 3 latency  timeslice      1.5s     1\n" in shown
    )
    assert shown.endswith("\nnot yet on a GPU\n" + sharetop._COLUMNS + "\nnew                  no CUDA process yet\n")


def test_the_latency_class_and_backend_are_the_limits_per_device() -> None:
    """The limits' ``priority`` and ``backend``, a device's own (by UUID) before the default; none given:
    no latency class and the shim's time slicing."""
    limits = {"priority": "batch", f"priority.{GPU0}": "latency", "backend.GPU-other": "mps"}
    assert sharestatus._per_device(limits, "priority", KEY) == "latency"
    assert sharestatus._per_device(limits, "priority", "other") == "batch"
    assert sharestatus._per_device(limits, "backend", "other") == "mps"
    assert sharestatus._per_device({}, "backend", KEY) is None


def test_an_mps_client_shows_its_backend_and_class() -> None:
    """A container shared through MPS has MPS's client variables in its limits file (nvc.plan.mps):
    its backend is mps and its class the one its priority stands for."""
    client = {"memory_limit": "1", "mps.CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "75", "mps.CUDA_MPS_CLIENT_PRIORITY": "1"}
    assert sharestatus._mps_client(client) and not sharestatus._mps_client({"memory_limit": "1"})
    assert sharestatus._mps_class(client) == "batch"
    assert sharestatus._mps_class({**client, "mps.CUDA_MPS_CLIENT_PRIORITY": "0"}) == "latency-critical"
    assert sharestatus._mps_class({"mps.CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "75"}) is None


def test_share_top_once_shows_each_container_on_the_fake_gpu(shim, programs, tmp_path):
    """Three containers on the fake GPU: one holding memory, one launching kernels under a 50 % cap,
    one launching them with a weight (its scheduler file beside the others');
    ``share top --once`` lists them under the GPU with their limits, and compute for the busy ones only."""
    state = tmp_path / "state"
    shim.dir = prepared(state, "holder", {"NVC_SHARE_MEMORY_LIMIT": "4Gi"}, os.getpid())
    started = [shim.holder("alloc", 600 * MIB, limits={})]
    launching = [str(programs["cuda_probe"]), "init", "ctx", "0", "launch", "100000", "264", "128", "sync"]
    kernels = {"FAKE_CUDA_KERNEL_US": "1000"}
    shim.dir = prepared(state, "capped", {"NVC_SHARE_MEMORY_LIMIT": "2Gi", "NVC_SHARE_COMPUTE": "50"}, os.getpid())
    started.append(subprocess.Popen(launching, env=shim.env(kernels), stdout=subprocess.DEVNULL))
    shim.dir = prepared(state, "weighted", {"NVC_SHARE_MEMORY_LIMIT": "1Gi", "NVC_SHARE_WEIGHT": "2"}, os.getpid())
    scheduler = {"NVC_SHARE_SCHED_DIR": str(tmp_path / "gpu-sched"), "NVC_SHARE_TENANT": "weighted"}
    started.append(subprocess.Popen(launching, env=shim.env(kernels | scheduler), stdout=subprocess.DEVNULL))
    try:
        deadline = time.monotonic() + 20
        while _busy(state) != {"capped", "weighted"} and time.monotonic() < deadline:
            time.sleep(0.1)
        result = subprocess.run(
            ["nvc-py", "share", "top", "--once", "--interval", "1", "--state-dir", str(state)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    finally:
        for proc in started:
            proc.kill()
            proc.wait()
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "nvc-py share top: 3 containers, compute over the last 1.0 s", result.stdout
    assert lines[2].startswith(f"GPU {KEY}: 3 containers, 600 MiB used, compute "), result.stdout
    capped, holder, weighted = (line.split() for line in lines[4:7])
    assert capped[:5] == ["capped", "0", "B", "2", "GiB"] and capped[6:10] == ["cap", "50%", "-", "timeslice"]
    assert weighted[:5] == ["weighted", "0", "B", "1", "GiB"] and weighted[6:9] == ["w", "2", "-"]
    assert 0 < float(capped[5].rstrip("%")) <= 100 and 0 < float(weighted[5].rstrip("%")) <= 100, result.stdout
    assert holder == ["holder", "600", "MiB", "4", "GiB", "0.0%", "-", "-", "timeslice", "0.0s", "1"]


def _busy(state) -> set[str]:  # noqa: ANN001 - a Path
    """The containers whose GPU time has been measured."""
    return {c.id for c in sharestatus.status(str(state)) for d in c.devices if d.busy_s > 0}


def test_share_top_redraws_in_a_terminal_until_q(tmp_path):
    """The curses view under a pseudo-terminal: it draws a frame, and ``q`` ends it with exit 0."""
    (tmp_path / "state").mkdir()
    main, side = pty.openpty()
    fcntl.ioctl(side, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))
    proc = subprocess.Popen(
        ["nvc-py", "share", "top", "--interval", "0.2", "--state-dir", str(tmp_path / "state")],
        stdin=side,
        stdout=side,
        stderr=side,
        env={**os.environ, "TERM": "xterm"},
        start_new_session=True,
    )
    os.close(side)
    seen = b""
    try:
        while b"no container shares a GPU" not in seen:
            ready, _, _ = select.select([main], [], [], 30)
            assert ready, seen
            seen += os.read(main, 65536)
        os.write(main, b"q")
        assert proc.wait(timeout=30) == 0, seen
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(main)
    assert b"share top (every 0.2 s, q quits)" in seen
    assert b"\x1b[?1049h" in seen  # curses switched to the alternate screen (and back: the view is gone)

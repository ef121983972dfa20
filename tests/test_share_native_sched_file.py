"""libnvc-share (native/) against the fake driver: what a hostile tenant can do with its own scheduler file
(weights, sched.c) and what it cannot: hurt anyone but itself, or claim a weight the hook did not grant.

Programs run with LD_PRELOAD=native/libnvc-share.so and the fake driver's libraries (tests/harness/shim.py).
Test double only: nothing here is a GPU result.
"""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest

from harness.fakegpus import H100 as GPU0
from harness.shim import WAITS_LOG, share, tenant, wall_and_log, wall_s  # noqa: F401  (fixtures)

ENTRY = struct.Struct("<40sQQQQQQIIIIIIqQ")  # native/shim/scheduling/sched.c struct nvc_sched_entry


def lying_sched_file() -> bytes:
    """A scheduler file as a hostile tenant writes it: 2**32 - 1 devices claimed, fifteen entries of
    0xff with keys that never end, then the honest tenants' GPU held for ever: holding the turn, busy
    now with 5 s of work queued, vtime 0, weight 1000."""
    now = time.monotonic_ns()
    junk = ENTRY.pack(b"A" * 40, *[2**64 - 1] * 6, *[2**32 - 1] * 6, -1, 2**64 - 1)
    lie = ENTRY.pack(GPU0[4:].encode(), 0, now, now + 5 * 10**9, 0, 0, 0, 1000, 100, 1, 0, 1000, 0, 0, 0)
    return (struct.pack("<8sII48x", b"NVCSCHD\0", 1, 2**32 - 1) + junk * 15 + lie).ljust(4096, b"\xff")


def attack(how: str, path: Path) -> None:
    """What a container may do to its own scheduler file (plain LD_PRELOAD use may also replace it)."""
    if how == "truncate":
        os.truncate(path, 0)
    elif how == "extend":
        os.truncate(path, 1 << 20)
    elif how == "sparse":
        subprocess.run(["fallocate", "--punch-hole", "--offset", "0", "--length", "4096", str(path)], check=True)
    elif how == "replace":
        new = path.with_name(".replacing")
        new.write_bytes(lying_sched_file())
        os.rename(new, path)
    else:  # garbage, written over it (never truncating it)
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.pwrite(fd, lying_sched_file(), 0)
        finally:
            os.close(fd)


@pytest.fixture
def hook_sched(tmp_path):
    """The scheduler directory as the hook makes it (nvc.apply.sharefiles: its tmpfs, each tenant's file
    and the limits granted to it); unmounted afterwards. Yields it and ``grant(name, ShareRequest)``."""
    from nvc.apply import sharefiles
    from nvc.plan.share import granted_text, limits_text

    sched = tmp_path / "sched"

    def grant(name: str, request) -> None:
        sharefiles._write_sched_file(str(sched), name, granted_text(limits_text(request)).encode())

    yield sched, grant
    if os.path.ismount(sched):
        subprocess.run(["umount", "-l", str(sched)], check=True)


@pytest.fixture
def started():
    """Processes a test starts, killed at its end (a hostile tenant runs until then)."""
    procs: list[subprocess.Popen] = []
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("how", ["truncate", "extend", "garbage", "sparse", "replace"])
def test_a_tenant_can_hurt_only_itself(share, programs, hook_sched, started, how):
    """Two honest tenants (weights 1 and 3) and a hostile one (granted weight 1, claiming 1000), each
    a process busy with 1 ms kernels, the scheduler directory made as the hook makes it. While they
    run, the test truncates, extends, keeps writing garbage over, punches a hole in or replaces the
    hostile tenant's file. No honest process crashes or hangs, and each gets at least its weight's
    share (1/5 and 3/5 of the time with the hostile one busy: 800 and 2400 kernels in 4 s at most, 5 s
    with the time the attack takes). Truncating its own file kills the hostile tenant's own process
    (SIGBUS), and only that. (Each process's fake GPU is its own.)"""
    from nvc.plan.request import ShareRequest

    sched, grant = hook_sched
    for name, weight in (("t0", 1), ("t1", 3), ("hostile", 1)):
        grant(name, ShareRequest(weight=(("", weight),)))
    started += [
        tenant(share, programs, sched, "t0", 1, 800),
        tenant(share, programs, sched, "t1", 3, 2400),
        tenant(share, programs, sched, "hostile", 1000, 1_000_000),
    ]
    time.sleep(0.3)
    attack(how, sched / "hostile")
    stop = threading.Event()

    def rewrite() -> None:  # the garbage again, fresh, every 2 ms while the honest ones run
        while not stop.wait(0.002):
            attack(how, sched / "hostile")

    rewriter = threading.Thread(target=rewrite)
    if how == "garbage":
        rewriter.start()
    try:
        walls = [wall_s(proc, timeout=20) for proc in started[:2]]
    finally:
        stop.set()
        if rewriter.is_alive():
            rewriter.join()
    print(f"walls {walls}")
    assert walls[0] <= 5 and walls[1] <= 5, walls
    assert started[2].poll() == (-signal.SIGBUS if how == "truncate" else None)


@pytest.mark.parametrize(
    ("granted", "held"),
    [
        ((("", 1),), False),  # granted 1 for every device
        ((("", 1000), (GPU0, 1)), False),  # 1 for this GPU, by UUID
        ((("0", 1), ("1", 3)), True),  # by NVML index, unknown here: at most 3
    ],
)
def test_a_peers_weight_is_the_one_the_hook_granted(share, programs, hook_sched, started, granted, held):
    """A peer claiming weight 1000 (its own env, its own file) runs a loop that keeps the GPU busy about
    62 % of the time (1 ms kernels, 0.6 ms of host work after each), and the honest tenant (weight 1,
    400 kernels of 1 ms back to back) is held while the peer has work only if the peer is under what
    the hook granted it, read with the limits grammar from the peer's granted limits for this GPU: with
    1 (for all devices, or by UUID over a default of 1000) half, which its 62 % is over, so the honest
    one runs free (0.45 s; its shim waits under 0.1 s for the peer's share, until the peer's first
    kernels make its use known); where the peer's weights are by NVML index, which is the peer's own
    numbering, the largest of them (3: three quarters), under which it stays, so the honest one is held
    to its quarter of the useful work while the peer has work (1.6-1.7 s, over 1.3 s of it waiting for
    the peer's share: the peer publishes itself busy into its host gaps). Taken at its word (1000), the
    peer would hold it to a thousandth (5.5 s). What the honest one's shim says it waited for decides,
    more than its wall time, which a busy machine stretches."""
    from nvc.plan.request import ShareRequest

    sched, grant = hook_sched
    grant("honest", ShareRequest(weight=(("", 1),)))
    grant("peer", ShareRequest(weight=granted))
    started += [
        tenant(share, programs, sched, "honest", 1, 400, log=True),
        tenant(share, programs, sched, "peer", 1000, 1_000_000, host_us=600),
    ]
    wall, log = wall_and_log(started[0], timeout=20)
    logged = WAITS_LOG.search(log)
    assert logged, log
    shares_s = float(logged.group(5)) / 1000
    print(f"wall {wall} s, waited {shares_s} s for the peer's share")
    if held:
        assert 0.8 <= wall <= 2.5 and shares_s >= 0.6, (wall, log)
    else:
        assert wall <= 1.5 and shares_s <= 0.2, (wall, log)  # held to half: 0.4 s

"""The weighted scheduler's decision (native/shim/scheduling/schedpolicy.c) at its boundaries, on views built by hand:
the pure function the shim asks before each launch, loaded from a shared object built from the shim's
own source. No clock, no GPU: the simulated runs of test_share_sched_sim.py show what the rule
does over time; these pin the rule itself and its point of slack each way: a tenant more than a point
(10 permille) over its entitlement waits while another more than a point under its own has work on the
GPU. Entitlements are parts of the GPU's useful work, the tenants' shares summed, taken as no less than
70 %.
"""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
WAIT, RUN, RUN_WITHIN = 0, 1, 2
NOW = 10_000_000_000


class View(ctypes.Structure):
    """struct nvc_sched_view (native/shim/scheduling/schedpolicy.h)."""

    _fields_ = [
        ("id", ctypes.c_uint64),
        ("seen_ns", ctypes.c_uint64),
        ("busy_until_ns", ctypes.c_uint64),
        ("capped", ctypes.c_uint32),
        ("weight", ctypes.c_uint32),
        ("cap", ctypes.c_uint32),
        ("share_permille", ctypes.c_uint32),
    ]


@pytest.fixture(scope="module")
def decide(tmp_path_factory: pytest.TempPathFactory):
    """nvc_sched_decide(self, others, n, now) from schedpolicy.c, built as it is into the shim."""
    lib = tmp_path_factory.mktemp("schedpolicy") / "libschedpolicy.so"
    subprocess.run(
        [
            "gcc",
            "-O1",
            "-Wall",
            "-Werror",
            "-shared",
            "-fPIC",
            "-iquote",
            str(REPO / "native/shim"),
            "-o",
            str(lib),
            str(REPO / "native/shim/scheduling/schedpolicy.c"),
        ],
        check=True,
    )
    fn = ctypes.CDLL(str(lib)).nvc_sched_decide
    fn.argtypes = [ctypes.POINTER(View), ctypes.POINTER(View), ctypes.c_int, ctypes.c_uint64]
    fn.restype = ctypes.c_int

    def run(own_share: int, peer_share: int, peer_busy: bool = True) -> int:
        """A weight-1 tenant asking while a weight-3 peer, seen launching just now, is busy or not."""
        own = View(1, NOW, NOW + 1_000_000, 0, 1, 100, own_share)
        peer = View(2, NOW, NOW + 1_000_000 if peer_busy else 0, 0, 3, 100, peer_share)
        return fn(ctypes.byref(own), ctypes.byref(peer), 1, NOW)

    return run


def test_a_tenant_within_a_point_of_its_entitlement_launches_within_it(decide):
    # shares 250 + 750 = the GPU's useful work: a quarter of it is exactly 250
    assert decide(250, 750) == RUN_WITHIN
    assert decide(260, 740) == RUN_WITHIN


def test_more_than_a_point_over_waits_while_a_peer_more_than_a_point_under_has_work_on_the_gpu(decide):
    assert decide(261, 739) == WAIT


def test_over_its_entitlement_it_still_launches_when_nobody_under_theirs_competes(decide):
    assert decide(261, 740) == RUN  # the peer is a point under its entitlement, no more
    assert decide(261, 739, peer_busy=False) == RUN  # under it, but nothing of it on the GPU now


def test_entitlements_are_parts_of_the_useful_work_the_shares_sum_to(decide):
    # 200 + 500: the GPU's useful work is 70 % of its time (real pairs measure about that): a quarter of
    # it is 175, so the light tenant at 200 is over it while the heavy one is under its 525
    assert decide(200, 500) == WAIT
    assert decide(185, 515) == RUN_WITHIN


def test_a_peer_claiming_little_share_lowers_an_entitlement_no_further_than_the_floor(decide):
    # 185 + 20 sum to about 20 % of the GPU, taken as 70 %: the light tenant's quarter is still 175 (+ a point)
    assert decide(185, 20) == RUN_WITHIN
    assert decide(186, 20) == WAIT

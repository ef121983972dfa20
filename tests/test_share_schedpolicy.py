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

import pytest

from harness import native

WAIT, RUN, RUN_WITHIN, RUN_FREE = 0, 1, 2, 3
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
        ("klass", ctypes.c_uint32),
        ("mps", ctypes.c_uint32),
        ("backlog_permille", ctypes.c_uint32),
        ("steady_permille", ctypes.c_uint32),
    ]


def test_the_view_mirror_is_laid_out_as_the_c_struct(tmp_path):
    """View is how every test here hands views to the policy: a field the C struct gains and the mirror lacks would
    have the policy read past the end of each view (the peers' array too), whatever the test meant."""
    names = [name for name, _ in View._fields_]
    laid_out = native.c_layout("scheduling/schedpolicy.h", "nvc_sched_view", names, tmp_path / "layout")
    assert laid_out == [ctypes.sizeof(View), *(getattr(View, name).offset for name in names)], laid_out


@pytest.fixture(scope="module")
def decide(tmp_path_factory: pytest.TempPathFactory):
    """nvc_sched_decide(self, others, n, now) from schedpolicy.c, built as it is into the shim."""
    lib = native.build_pure("scheduling/schedpolicy.c", tmp_path_factory.mktemp("schedpolicy") / "libschedpolicy.so")
    built = ctypes.CDLL(str(lib))
    fn = built.nvc_sched_decide
    for pure in (fn, built.nvc_sched_duty_holds):
        pure.argtypes = [ctypes.POINTER(View), ctypes.POINTER(View), ctypes.c_int, ctypes.c_uint64]
        pure.restype = ctypes.c_int
    decide_views.fn = fn
    duty_holds.fn = built.nvc_sched_duty_holds
    built.nvc_sched_duty.argtypes = [ctypes.POINTER(View), ctypes.POINTER(View), ctypes.c_int, ctypes.c_uint64]
    built.nvc_sched_duty.restype = ctypes.c_uint
    duty.fn = built.nvc_sched_duty
    built.nvc_sched_steady_after.argtypes = [ctypes.c_uint32, ctypes.c_int]
    built.nvc_sched_steady_after.restype = ctypes.c_uint32
    steady_after.fn = built.nvc_sched_steady_after
    built.nvc_sched_backlog_after.argtypes = [ctypes.c_uint32, ctypes.c_int]
    built.nvc_sched_backlog_after.restype = ctypes.c_uint32
    backlog_after.fn = built.nvc_sched_backlog_after

    def run(own_share: int, peer_share: int, peer_busy: bool = True, peer_backlog: int = 1000) -> int:
        """A weight-1 tenant asking while a weight-3 peer, seen launching just now, is busy or not, its
        work backlogged at peer_backlog ‰ of its looks."""
        own = View(1, NOW, NOW + 1_000_000, 0, 1, 100, own_share)
        peer = View(2, NOW, NOW + 1_000_000 if peer_busy else 0, 0, 3, 100, peer_share, 0, 0, peer_backlog)
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


def test_over_its_entitlement_it_still_launches_beside_a_peer_that_is_not_backlogged(decide):
    """Work-conserving for a peer that does not keep the GPU busy: under its share and with work on the
    GPU, but its work was still queued at fewer than half of its recent looks (a decode loop waits for
    every token), it holds no one: holding for it would leave the GPU idle between its launches. As nothing
    can hold it and no decision depends on its share, it runs as if alone (its queue as far ahead, its
    launches measured in long groups)."""
    assert decide(261, 739, peer_backlog=500) == WAIT
    assert decide(261, 739, peer_backlog=499) == RUN_FREE  # nothing can hold it: it runs as if alone
    assert decide(261, 739, peer_backlog=0) == RUN_FREE
    assert decide(200, 800, peer_backlog=0) == RUN_FREE  # within its share too


def test_entitlements_are_parts_of_the_useful_work_the_shares_sum_to(decide):
    # 200 + 500: the GPU's useful work is 70 % of its time (real pairs measure about that): a quarter of
    # it is 175, so the light tenant at 200 is over it while the heavy one is under its 525
    assert decide(200, 500) == WAIT
    assert decide(185, 515) == RUN_WITHIN


def test_a_peer_claiming_little_share_lowers_an_entitlement_no_further_than_the_floor(decide):
    # 185 + 20 sum to about 20 % of the GPU, taken as 70 %: the light tenant's quarter is still 175 (+ a point)
    assert decide(185, 20) == RUN_WITHIN
    assert decide(186, 20) == WAIT


# ---------------------------------------------------------------- latency classes

NONE, BATCH, LATENCY_CRITICAL = 0, 1, 2
MS = 1_000_000


def decide_views(own: View, *others: View) -> int:
    """nvc_sched_decide on these views at NOW (the decide fixture loads it)."""
    peers = (View * len(others))(*others)
    return decide_views.fn(ctypes.byref(own), peers, len(others), NOW)


def tenant(
    klass: int, share: int = 100, seen_ago: int = 0, busy: bool = False, weight: int = 1, capped: int = 0
) -> View:
    """A time-sliced tenant's view; busy: work on the GPU, queued at every look (backlogged)."""
    backlog = 1000 if busy else 0
    return View(
        1000 * klass + share, NOW - seen_ago, NOW + MS if busy else 0, capped, weight, 100, share, klass, 0, backlog
    )


def test_every_other_tenant_holds_while_a_latency_critical_one_serves(decide):
    """A batch tenant, or one with no class, waits while a latency-critical tenant launched within the
    last 2 ms or has work queued, however far under its own share it is; once that one has been idle
    2 ms with nothing queued, it runs (work-conserving)."""
    for klass in (BATCH, NONE):
        assert decide_views(tenant(klass, share=0), tenant(LATENCY_CRITICAL, seen_ago=1 * MS)) == WAIT
        assert decide_views(tenant(klass, share=0), tenant(LATENCY_CRITICAL, seen_ago=50 * MS, busy=True)) == WAIT
        assert decide_views(tenant(klass, share=0), tenant(LATENCY_CRITICAL, seen_ago=2 * MS + 1)) == RUN_FREE
    # held back by its own cap, it is not serving: nobody waits for it
    assert decide_views(tenant(BATCH, share=0), tenant(LATENCY_CRITICAL, capped=1, busy=True)) == RUN_FREE


def test_a_latency_critical_tenant_never_waits_for_the_others(decide):
    """Over its weight's share, while a batch tenant far under its own is busy: it launches, and the
    batch tenant counts for nothing in its weighing."""
    urgent = tenant(LATENCY_CRITICAL, share=900)
    assert decide_views(urgent, tenant(BATCH, share=0, busy=True, weight=1000)) == RUN_FREE
    assert decide_views(urgent, tenant(NONE, share=0, busy=True, weight=1000)) == RUN_FREE


def test_weights_still_divide_each_class(decide):
    """Two latency-critical tenants weigh among themselves as any two tenants do (1:3: the light one over
    its quarter waits while the heavy one under its share is busy); two batch tenants likewise while no
    latency-critical tenant serves."""
    for klass in (LATENCY_CRITICAL, BATCH):
        light = tenant(klass, share=261, weight=1)
        assert decide_views(light, tenant(klass, share=739, busy=True, weight=3)) == WAIT
        assert (
            decide_views(
                light,
                tenant(klass, share=739, busy=True, weight=3),
                tenant(LATENCY_CRITICAL if klass == BATCH else BATCH, seen_ago=10 * MS),
            )
            == WAIT
        )


# ---------------------------------------------------------------- MPS clients


def mps_client(weight: int, backlog: int, seen_ago: int = 0) -> View:
    return View(weight * 10_000 + backlog, NOW - seen_ago, 0, 0, weight, 100, 0, NONE, 1, backlog)


def duty_holds(own: View, *others: View) -> int:
    """nvc_sched_duty_holds on these views at NOW (the decide fixture loads it)."""
    peers = (View * len(others))(*others)
    return duty_holds.fn(ctypes.byref(own), peers, len(others), NOW)


def backlog_after(permille: int, backlogged: bool) -> int:
    return backlog_after.fn(permille, int(backlogged))


def test_a_lighter_mps_clients_duty_cycle_holds_while_a_heavier_one_is_backlogged(decide):
    """A weight-1 MPS client's duty cycle holds while a heavier MPS client, seen launching within 5 ms, found
    its work still queued at half or more of its recent looks; not beside one backlogged less often (a
    launch-bound service), an idle one, one no heavier, or a tenant of the time slices."""
    light = mps_client(1, 0)
    assert duty_holds(light, mps_client(3, 500)) == 1
    assert duty_holds(light, mps_client(3, 499)) == 0
    assert duty_holds(light, mps_client(3, 1000, seen_ago=5 * MS + 1)) == 0
    assert duty_holds(light, mps_client(1, 1000)) == 0
    assert duty_holds(light, tenant(NONE, busy=True, weight=3)) == 0
    assert duty_holds(light, mps_client(1, 1000), mps_client(2, 0), mps_client(9, 800)) == 1
    # and the time slices' weighing leaves MPS clients out: a busy heavy one under its share holds no one
    heavy = mps_client(3, 1000)
    heavy.busy_until_ns, heavy.share_permille = NOW + MS, 0
    assert decide_views(tenant(NONE, share=900, weight=1), heavy) == RUN_FREE


def test_the_backlog_is_the_decaying_part_of_the_looks_that_found_work_queued(decide):
    """An eighth of the way to 1000 at each backlogged look, an eighth of the way to 0 at each other one:
    six backlogged looks in a row from none cross half; 1000 stays 1000."""
    permille = 0
    for _ in range(5):
        permille = backlog_after(permille, True)
    assert permille < 500 <= backlog_after(permille, True)
    assert backlog_after(1000, True) == 1000 and backlog_after(1000, False) == 875


# ---------------------------------------------------------------- a time-sliced weight's duty cycle


def duty(own: View, *others: View) -> int:
    """nvc_sched_duty on these views at NOW (the decide fixture loads it): percent, 0 for none."""
    peers = (View * len(others))(*others)
    return duty.fn(ctypes.byref(own), peers, len(others), NOW)


def steady(weight: int, steadiness: int = 1000, share: int = 525, seen_ago: int = 0) -> View:
    """A busy time-sliced tenant whose looks found the previous look's work still queued at steadiness ‰."""
    view = tenant(NONE, share=share, busy=seen_ago == 0, weight=weight, seen_ago=seen_ago)
    view.steady_permille = steadiness
    return view


def test_a_lighter_weight_beside_one_steady_heavier_tenant_takes_a_duty_of_the_pairs_time(decide):
    """2w / (w + W) of the wall time: 1:3 50 %, 1:9 20 %, 2:3 80 %; while its share is within its entitlement
    (a quarter of the useful work, the shares summed and taken as no less than 70 %: 175 ‰ of 700)."""
    assert duty(steady(1, share=175), steady(3)) == 50
    assert duty(steady(1, share=70), steady(9, share=630)) == 20
    assert duty(steady(2, share=280), steady(3, share=420)) == 80


def test_a_lighter_tenant_that_its_host_bounds_takes_no_duty(decide):
    """A loop of small kernels that waits for them (less than half of its looks find work queued) uses less than
    its share beside a steady heavier tenant: it runs free within its share, as the holds let it, never in a
    duty's slices."""
    loop, held = steady(1, share=20), steady(1, steadiness=0, share=175)
    loop.backlog_permille, held.backlog_permille = 499, 500
    assert duty(loop, steady(3)) == 0
    assert duty(held, steady(3)) == 50  # held a launch at a time, its own queue is short: not steady, backlogged


def test_the_duty_rises_two_points_for_each_point_its_share_is_short(decide):
    """A lighter tenant whose work needs more of the time than the heavier's does for its part: 100 ‰ where 175
    are its due is 7.5 points short, and the duty is 15 points over its start; never past the whole time
    (then there is no duty, and the holds of nvc_sched_decide rule)."""
    assert duty(steady(1, share=100), steady(3)) == 65
    assert duty(steady(1, share=400), steady(3, share=500)) == 50
    assert duty(steady(1, share=0), steady(3, share=1000)) == 0


def test_no_duty_without_exactly_one_steady_heavier_peer_of_its_tier(decide):
    """Not beside a heavier tenant whose looks found earlier work queued less than 90 % of the time (its host
    gaps are the lighter one's to fill), one idle for over 5 ms, one no heavier, two peers (their slices
    need not line up), an MPS client or a tenant of the other class; and not for a tenant with a cap of its
    own, a latency-critical one or an MPS client."""
    light = steady(1, share=175)
    assert duty(light, steady(3, steadiness=900)) == 50
    assert duty(light, steady(3, steadiness=899)) == 0
    assert duty(light, steady(3, seen_ago=5 * MS + 1)) == 0
    assert duty(light, steady(1)) == 0
    assert duty(light, steady(3), steady(3)) == 0
    assert duty(light, steady(3), steady(3, seen_ago=6 * MS)) == 50  # an idle second peer is no peer
    client = steady(3)
    client.mps = 1
    urgent = steady(3)
    urgent.klass = LATENCY_CRITICAL
    assert duty(light, client) == 0 and duty(light, urgent) == 0
    capped, critical, own_client = steady(1, share=175), steady(1, share=175), steady(1, share=175)
    capped.cap, critical.klass, own_client.mps = 50, LATENCY_CRITICAL, 1
    assert duty(capped, steady(3)) == 0 and duty(own_client, steady(3)) == 0
    assert duty(critical, steady(3)) == 0


def steady_after(permille: int, pending: bool) -> int:
    return steady_after.fn(permille, int(pending))


def test_steadiness_is_the_slowly_decaying_part_of_the_looks_that_found_earlier_work_queued(decide):
    """A 32nd of the way at each look: a host that waits for its work once in 37 looks (a training step that
    reads its loss back) stays steady, one whose looks find earlier work queued at one in two does not, and
    one at nine in ten is just over the line; from none, some 70 looks (70 ms of launches) to get there."""

    def after(pattern, looks: int = 400, permille: int = 0) -> int:
        for i in range(looks):
            permille = steady_after(permille, pattern(i))
        return permille

    assert after(lambda i: i % 37 != 0, permille=1000) >= 900
    assert after(lambda i: i % 2 == 0) < 600
    assert 900 <= after(lambda i: i % 10 != 0) < 950
    assert after(lambda i: True, looks=60) < 900 <= after(lambda i: True, looks=80)
    assert steady_after(1000, True) == 1000 and steady_after(1000, False) < 1000

"""When a measured launch's work ended on the GPU (native/shim/accounting/launchend.c): the reconstruction the
launch queue makes as each launch's end event is seen complete, and that a cap charges its slices by. Loaded from a
shared object built from the shim's own source; the times are made by hand.

An MPS client's kernels on several streams complete out of launch order on a real GPU, which is what the simulated
streams below stand for; test_share_native_compute.py runs the shim on such streams of the fake driver
(FAKE_CUDA_CONCURRENT_STREAMS).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import pytest

from harness import native

MS = 1_000_000
NEVER = 2**63  # a settling time no estimate reaches: the reconstruction unbounded by the clock

End = Callable[..., int]


@pytest.fixture(scope="module")
def end(tmp_path_factory: pytest.TempPathFactory) -> End:
    """nvc_launch_end_ns(done, launched, opened, full, between, settled), built as it is into the shim."""
    built = ctypes.CDLL(str(native.build_pure("accounting/launchend.c", tmp_path_factory.mktemp("end") / "end.so")))
    fn = built.nvc_launch_end_ns
    u64 = ctypes.c_uint64
    fn.argtypes = [u64, u64, u64, u64, ctypes.c_int64, u64]
    fn.restype = u64

    def call(done: int, launched: int, full: int, settled: int, opened: int = 0, between: int = -1) -> int:
        return int(fn(done, launched, opened, full, between, settled))

    return call


def test_a_launch_to_an_idle_queue_ends_its_time_after_its_launch(end: End) -> None:
    assert end(done=2 * MS, launched=5 * MS, full=3 * MS, settled=20 * MS) == 8 * MS


def test_a_launch_behind_queued_work_ends_the_time_between_the_end_events_after_the_previous_end(end: End) -> None:
    assert end(done=9 * MS, launched=5 * MS, full=3 * MS, between=2 * MS, settled=20 * MS) == 11 * MS
    # the time between unknown (another context's event, or an end before the previous one): queued behind it
    assert end(done=9 * MS, launched=5 * MS, full=3 * MS, settled=20 * MS) == 12 * MS


def test_a_gated_launch_starts_no_earlier_than_its_gate_opened(end: End) -> None:
    assert end(done=2 * MS, launched=5 * MS, full=3 * MS, opened=10 * MS, settled=20 * MS) == 13 * MS


def test_no_launch_ends_after_its_end_event_was_seen_complete(end: End) -> None:
    assert end(done=30 * MS, launched=5 * MS, full=3 * MS, settled=20 * MS) == 20 * MS
    assert end(done=19 * MS, launched=5 * MS, full=3 * MS, between=4 * MS, settled=20 * MS) == 20 * MS
    assert end(done=2 * MS, launched=5 * MS, full=3 * MS, opened=18 * MS, settled=20 * MS) == 20 * MS


def settle_two_streams(end: End, kernels: int, clocked: bool) -> list[tuple[int, int, int]]:
    """Two streams launched to in turn every 5 ms, one's kernels 12 ms long and the other's 4 (the short ones end
    before the long one launched before them), settled in launch order as the queue harvests them: each when it
    and every earlier one have ended, 50 us later. (estimate, true end, settled) per launch."""
    done, previous, latest, out = 0, None, 0, []
    for k in range(kernels):
        launched = k * 5 * MS
        full = 12 * MS if k % 2 == 0 else 4 * MS
        ended = launched + full
        latest = max(latest, ended)
        settled = latest + 50_000
        between = ended - previous if previous is not None and launched < done and ended >= previous else -1
        done = end(done=done, launched=launched, full=full, between=between, settled=settled if clocked else NEVER)
        previous = ended
        out.append((done, ended, settled))
    return out


def test_ends_out_of_order_do_not_run_the_estimate_ahead_of_the_clock(end: End) -> None:
    """An MPS client's streams, a cap on it: every moment between its slice's end and its estimated end is
    charged as its work, so an estimate ahead of the clock charges time that has not come, and its credit never
    refills (the H100's lighter MPS tenant: 77 s charged past its slices, no step after its first second)."""
    unbounded = settle_two_streams(end, 400, clocked=False)
    assert unbounded[-1][0] - unbounded[-1][2] > 1000 * MS  # what the reconstruction alone drifts to

    for done, ended, settled in settle_two_streams(end, 400, clocked=True):
        assert ended <= settled
        assert done <= settled
        assert done >= ended - 12 * MS  # still the work's end, not the clock's: never behind by more than a kernel

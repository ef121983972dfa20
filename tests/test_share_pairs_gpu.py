"""Weighted pairs of real training steps on a real GPU (H100, driver 580): two transformer steps 1:3, as
processes under LD_PRELOAD and as crun containers through the hook, against the same pair with no shim.
Run by `make test-gpu` on the GPU machine; deselected elsewhere.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.bundle import make_bundle
from harness.gpufixtures import crun, gpu_driver, hook_with_log, started_together, torch_rootfs  # noqa: F401  (fixtures)

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
import sharegpu  # noqa: E402

pytestmark = pytest.mark.gpu


def test_weighted_transformer_steps_share_by_weight_and_keep_the_gpu_busy(tmp_path):
    """Two transformer training steps (tests/gpu/torch_models.py) started together, weights 1 and 3, against
    the same two with no shim in the same test, two runs of each interleaved: issue #27's contract, as
    _pair_contract states it."""
    alone = _transformer_alone()
    native, shared = sharegpu.interleaved(
        _without_shim(tmp_path),
        lambda k: sharegpu.tenants_together(tmp_path / f"nvc{k}", TRANSFORMER_PAIR, True, PAIR_SECONDS),
    )
    _pair_contract("transformer 1:3", alone, native, shared)


TRANSFORMER_PAIR, PAIR_SECONDS, HOST_BOUND_SUM = [("transformer", 1), ("transformer", 3)], 11, 0.80


def _transformer_alone() -> float:
    """The transformer step's steady rate alone, with no shim: what the pairs' rates are a part of."""
    if not Path(sharegpu.TORCH_PYTHON).exists():
        pytest.skip("no PyTorch interpreter")
    alone_run = sharegpu.torch_run("transformer", sharegpu.shim_env(None), PAIR_SECONDS)
    return sharegpu.steady_rate(sharegpu.torch_result(alone_run)[1])


def _without_shim(tmp_path: Path) -> Callable[[int], sharegpu.Together]:
    """The pair's run with no shim, the GPU's own time-slicing: the baseline of its sum."""
    return lambda k: sharegpu.tenants_together(tmp_path / f"native{k}", TRANSFORMER_PAIR, False, PAIR_SECONDS)


def _pair_contract(
    what: str, alone: float, native_runs: list[sharegpu.Together], shared_runs: list[sharegpu.Together]
) -> None:
    """The weights divide the GPU's time: the light tenant's part of the time charged to the two is its
    weight's within 5 points. Where the steps are bound by the GPU (with no shim the pair's sum is at most
    one alone), that is their throughput: the light tenant's part of the summed steady rates (each as a share
    of one alone's; sharegpu.steady_rate) within 5 points of its weight's, and the sum at least 95 % of the
    no-shim pair's. Where they are bound by their host side (the no-shim pair overlaps, above one alone), the
    measured limit: a tenant cannot use more of the GPU than its host side feeds it and the other gets what it
    leaves (throughput parts up to 43 % for the weight-1 step), and the sum is at least 80 % of the no-shim
    pair's (H100, 2026-11-24: 83-94 %; docs/performance.md). Each figure is the mean of the runs (the pair
    with no shim and under it, sharegpu.interleaved)."""
    native_pair, shared_pair = sharegpu.mean_together(native_runs), sharegpu.mean_together(shared_runs)
    native, shared = ([100 * r / alone for r in pair.rates] for pair in (native_pair, shared_pair))
    gpu, parts = shared_pair.gpu_parts, [100 * s / sum(shared) for s in shared]
    figures = (
        f"{what}: no shim {native[0]:.1f} + {native[1]:.1f} = {sum(native):.1f} %; nvc {shared[0]:.1f} + "
        f"{shared[1]:.1f} = {sum(shared):.1f} % (parts {parts[0]:.1f} / {parts[1]:.1f}, sum "
        f"{100 * sum(shared) / sum(native):.0f} % of the no-shim pair's; GPU time "
        f"{' / '.join(f'{p:.1f}' for p in gpu)}, charged {shared_pair.charged:.1f} % of the wall time); runs, "
        f"sums of the no-shim pair {_sums(native_runs, alone)} and under the shim {_sums(shared_runs, alone)}"
    )
    print(figures)
    assert len(gpu) == 2 and abs(gpu[0] - 25) <= 5, figures
    if sum(native) <= 100:
        assert abs(parts[0] - 25) <= 5, figures
        assert sum(shared) >= 0.95 * sum(native), figures
    else:
        assert sum(shared) >= HOST_BOUND_SUM * sum(native), figures


def _sums(runs: list[sharegpu.Together], alone: float) -> str:
    return " / ".join(f"{100 * sum(run.rates) / alone:.1f}" for run in runs)


def test_weighted_transformer_containers_through_the_hook(crun, torch_rootfs, tmp_path):
    """Two crun containers through nvc-py-hook, weights 1 and 3 in their env, running the transformer step from
    one moment on, against the step alone and the no-shim pair on the host, two runs of each interleaved: the
    weights reach the scheduler through the hook, so the pair keeps _pair_contract. Over whole 6 s runs
    (sessions 19-33) the light one's part ran 24.5-30.3 %, its GPU time 25.9-27.9 %; after the first second
    27.7 % in one run and 27.9 % over two, the sum 93 % and 97 % of the no-shim pair's (H100, 2026-11-27;
    docs/performance.md)."""
    from nvc.plan import share as share_plan

    def in_containers(k: int) -> sharegpu.Together:
        start_at = time.time() + 60  # both containers up, PyTorch imported and warmed up by then
        bundles = {}
        for _, weight in TRANSFORMER_PAIR:
            (tmp_path / f"log{weight}-{k}").mkdir()
            env = {"NVIDIA_VISIBLE_DEVICES": "0", "NVC_SHARE_WEIGHT": str(weight), "HOME": "/tmp"}
            argv = [
                "/opt/torch/.venv/bin/python3",
                "/gpu/torch_load.py",
                "transformer",
                str(PAIR_SECONDS),
                str(start_at),
            ]
            bundles[weight] = make_bundle(
                tmp_path / f"bundle{weight}-{k}",
                torch_rootfs(f"rootfs-weight{weight}-{k}"),
                argv,
                env=env,
                hooks=hook_with_log(tmp_path / f"log{weight}-{k}"),
            )
        with started_together(crun, bundles, timeout=300) as results:
            charged = sharegpu.charged_between(
                Path(share_plan.sched_dir_for(share_plan.STATE_DIR)), start_at + 1, start_at + PAIR_SECONDS - 0.5
            )
        gpu_parts, charged_part = sharegpu.split_by_weight(
            charged, [w for _, w in TRANSFORMER_PAIR], PAIR_SECONDS - 1.5
        )
        rates = []
        for _weight, result in sorted(results.items()):
            assert result.returncode == 0, result.stderr
            assert "late" not in result.stdout, result.stdout  # its warm-up ended before the common start
            rates.append(sharegpu.steady_rate(sharegpu.torch_output_of(result.stdout)[1]))
        return sharegpu.Together(rates, gpu_parts, charged_part)

    alone = _transformer_alone()
    native, shared = sharegpu.interleaved(
        _without_shim(tmp_path),
        in_containers,
    )
    _pair_contract("transformer 1:3 in two crun containers", alone, native, shared)

"""GPU sharing's MPS backend, planned (pure): the configuration's ``sharing.backend`` and
``k8s.share-backend``, the container's NVC_SHARE_BACKEND and NVC_SHARE_PRIORITY, which device a
container shares through MPS and what its processes get, and the shim reading those lines.
Test double only: nothing here is a GPU result.
"""

from __future__ import annotations

import subprocess

import pytest

from nvc import config
from nvc.containerenv import sharing
from nvc.errors import ContainerError, InputError
from nvc.plan import fromenv, mps, share
from nvc.plan.request import ShareRequest

GPU0 = "GPU-4f6a2c1e-8b3d-5e7f-9a1b-2c3d4e5f6a7b"
GPU1 = "GPU-0d1e2f3a-4b5c-6d7e-8f90-a1b2c3d4e5f6"
BINARIES = ("/drv/usr/bin/nvidia-smi", f"/drv/usr/bin/{mps.CONTROL}", f"/drv/usr/bin/{mps.SERVER}")


def test_the_configured_backend_one_for_all_or_per_gpu() -> None:
    """``sharing.backend``: one backend for every GPU or a mapping of GPUs (all, UUIDs, indices) to
    backends, timeslice by default; ``config show`` writes it back as it was given."""
    assert config.defaults().sharing.backend == (("all", "timeslice"),)
    assert config.parse("sharing: {backend: mps}\n", "c").sharing.backend == (("all", "mps"),)
    mapped = config.parse(f"sharing:\n  backend: {{1: mps, {GPU0}: mps}}\n", "c")
    assert mapped.sharing.backend == (("all", "timeslice"), ("1", "mps"), (GPU0, "mps"))
    assert mapped.as_dict()["sharing"]["backend"] == {"all": "timeslice", "1": "mps", GPU0: "mps"}
    assert config.parse("sharing: {backend: mps}\n", "c").as_dict()["sharing"]["backend"] == "mps"
    assert config.parse("k8s: {share-backend: mps}\n", "c").k8s.share_backend == "mps"
    assert config.SHARE_BACKENDS == sharing.BACKENDS  # the config layer's copy of the list


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("sharing: {backend: cuda}\n", "c.yaml: sharing.backend: all: expected one of timeslice, mps"),
        ("sharing: {backend: {gpu0: mps}}\n", "c.yaml: sharing.backend: 'gpu0': not a GPU"),
        ("sharing: {backend: {0: fast}}\n", "c.yaml: sharing.backend: 0: expected one of timeslice, mps"),
        ("sharing: {backend: [mps]}\n", "c.yaml: sharing.backend: expected one of timeslice, mps, or a mapping"),
        ("k8s: {share-backend: MPS}\n", "c.yaml: k8s.share-backend: expected one of timeslice, mps"),
    ],
)
def test_a_bad_configured_backend_is_refused_naming_the_key(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message.replace("(", r"\(")):
        config.parse(text, "c.yaml")


def test_the_container_chooses_its_backend_and_class_per_gpu() -> None:
    """NVC_SHARE_BACKEND and NVC_SHARE_PRIORITY, for all GPUs, one index or one UUID, read as the
    limits are; the container's own backend rules replace the configuration's whole."""
    env = {
        "NVC_SHARE_BACKEND": "timeslice",
        f"NVC_SHARE_BACKEND_{GPU0}": "mps",
        "NVC_SHARE_PRIORITY_0": "batch",
        "NVC_SHARE_MEMORY_LIMIT": "1Gi",
    }
    asked = fromenv.parse_share_env(env)
    assert asked is not None
    assert asked.backend == (("", "timeslice"), (GPU0, "mps"))
    assert asked.priority == (("0", "batch"),)
    assert fromenv.parse_share_env({"NVC_SHARE_BACKEND": "mps"}) == ShareRequest(backend=(("", "mps"),))
    configured = (("all", "timeslice"), (GPU1, "mps"))
    assert mps.with_configured((), configured) == (("", "timeslice"), (GPU1, "mps"))
    assert mps.with_configured(asked.backend, configured) == asked.backend
    # sharing.enabled's defaults keep the container's backend and class
    assert fromenv.with_defaults(asked, "2g", 50).backend == asked.backend


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"NVC_SHARE_BACKEND": "MPS"}, "NVC_SHARE_BACKEND='MPS': not one of timeslice, mps"),
        ({f"NVC_SHARE_BACKEND_{GPU0}": ""}, f"NVC_SHARE_BACKEND_{GPU0}='': not one of timeslice, mps"),
        ({"NVC_SHARE_PRIORITY": "realtime"}, "NVC_SHARE_PRIORITY='realtime': not one of latency-critical, batch"),
        ({"NVC_SHARE_BACKEND_x": "mps"}, "NVC_SHARE_BACKEND_x: unknown sharing variable"),
    ],
)
def test_a_bad_backend_or_class_in_the_env_is_refused_naming_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(InputError, match=message.replace("(", r"\(")):
        fromenv.parse_share_env(env)


def _request(**rules: tuple[tuple[str, object], ...]) -> dict[str, tuple[tuple[str, object], ...]]:
    return ShareRequest(**rules)._asdict()  # type: ignore[arg-type]


def test_which_device_a_container_shares_through_mps() -> None:
    """The device's backend by its UUID, else its index, else the rule for all; none mps: no client.
    A container with several devices, one of them mps, and a driver without the MPS binaries are
    refused in one line naming the device and what is missing."""
    assert mps.client(_request(backend=(("", "timeslice"),)), (GPU0,), BINARIES, "c", 0) is None
    assert mps.client(_request(backend=((GPU1, "mps"),)), (GPU0,), BINARIES, "c", 0) is None
    found = mps.client(
        _request(backend=(("0", "mps"),), memory=(("", 3 << 30),), weight=((GPU0, 2),), priority=(("", "batch"),)),
        (GPU0,),
        BINARIES,
        "ctr",
        1000,
    )
    assert found == mps.MpsClient("ctr", GPU0, f"/drv/usr/bin/{mps.CONTROL}", 1000, None, 2, 3 << 30, 1)
    assert found.pipe_dir == f"{mps.MPS_DIR}/{GPU0}/pipe" and found.log_dir == f"{mps.MPS_DIR}/{GPU0}/log"
    with pytest.raises(ContainerError, match=f"{GPU1}: sharing backend mps serves a container one device .* has 2: "):
        mps.client(_request(backend=((GPU1, "mps"),)), (GPU0, GPU1), BINARIES, "c", 0)
    for missing in (mps.CONTROL, mps.SERVER):
        with pytest.raises(
            ContainerError, match=f"error: {GPU0}: sharing backend mps, but the driver has no {missing} "
        ):
            mps.client(_request(backend=(("", "mps"),)), (GPU0,), [b for b in BINARIES if missing not in b], "c", 0)


def test_the_share_becomes_mps_client_limits() -> None:
    """A cap is the active thread percentage; the memory limit, with a context's room on top, the
    pinned limit of device 0 in MiB; the latency class MPS's client priority (latency-critical 0,
    batch 1); the pipe directory always CUDA's default, where the hook mounts it. A weight below the
    heaviest of the device's clients as it starts is a duty cycle, the shim's compute cap: the part of
    the time that splits a pair with an overlap of 150 % by their weights (the heaviest, one alone and
    a container with a cap: none)."""
    base = mps.MpsClient("c", GPU0, "/bin/ctl", 0)
    assert mps.client_env(base) == {mps.PIPE: "/tmp/nvidia-mps"}
    capped = base._replace(compute=30, weight=1, memory=(4 << 30) + 1, priority=0)
    assert mps.client_env(capped) == {
        mps.PIPE: "/tmp/nvidia-mps",
        mps.THREADS: "30",
        mps.PINNED: "0=5120M",
        mps.CLIENT_PRIORITY: "0",
    }
    assert mps.duty_cycle(capped, [3]) is None  # its cap holds it: no duty cycle
    weighted = base._replace(weight=1)
    assert mps.client_env(weighted) == {mps.PIPE: "/tmp/nvidia-mps"}  # every SM
    assert mps.duty_cycle(weighted, []) is None
    assert mps.duty_cycle(weighted, [3]) == 40  # 100 / (100 + 150)
    assert mps.duty_cycle(weighted, [9]) == 15  # 14.3, rounded up
    assert mps.duty_cycle(base._replace(weight=2), [3]) == 73  # 72.7
    assert mps.duty_cycle(base._replace(weight=3), [1]) is None  # the heaviest: always
    assert mps.duty_cycle(base._replace(weight=1), [1, 1]) is None  # equal weights: no duty cycles
    assert mps.duty_cycle(base._replace(compute=100, weight=1), [3]) == 40  # a cap of 100 is none
    assert mps.client_lines(weighted, [3]) == "compute_percent=40\nmps.CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps\n"
    assert mps.PRIORITY_OF_CLASS.keys() == set(sharing.PRIORITY_CLASSES)


def test_a_duty_cycle_follows_the_clients_of_the_device() -> None:
    """A running client's limits file gets its duty cycle among the device's clients now: a lighter one
    that started alone is held once a heavier one comes, runs free again once it is gone, and a heavier
    one of 9 takes it from 40 % to 15 %. Its memory limit and MPS lines stay as they were; a client with
    a thread percentage (a cap) or no weight gets none; an unchanged file is None (nothing to write)."""
    lighter = mps.MpsClient("b", GPU0, "/bin/ctl", 0, weight=1, memory=1 << 30)
    memory = share.mps_limits_text(ShareRequest(memory=(("", 1 << 30),)), "container b")
    alone = memory + mps.client_lines(lighter, [])
    assert "compute_percent" not in alone
    held = mps.rebalanced(alone, 1, [3], "container b")
    assert held == memory + mps.client_lines(lighter, [3])
    assert held.splitlines()[2:] == [
        "memory_limit=1073741824",
        "compute_percent=40",
        "mps.CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
        "mps.CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2048M",
    ]
    assert mps.rebalanced(held, 1, [3, 1], "container b") is None  # still 40 %
    assert "compute_percent=15\n" in mps.rebalanced(held, 1, [9], "container b")
    assert mps.rebalanced(held, 1, [], "container b") == alone  # the heavier one gone
    assert mps.rebalanced(held, 0, [3], "container b") == alone  # no weight, no duty cycle
    capped = mps.client_lines(lighter._replace(compute=30), [3])
    capped_text = share.mps_limits_text(ShareRequest(), "container b") + capped
    assert mps.rebalanced(capped_text, 1, [3], "container b") is None  # its thread percentage holds it


def test_an_mps_container_is_out_of_the_time_slices() -> None:
    """Its limits file keeps the memory limit and the weight and loses the cap; a scheduler file only with a
    weight (its granted weight the others trust), where its shim says whether it keeps work queued."""
    request = ShareRequest(memory=(("", 1 << 30),), compute=(("", 50),), weight=(("", 2),))
    planned = share.files(request, "ctr", "", library="/lib/shim.so", state_dir="/st")
    assert planned.scheduled and "compute_percent=50" in planned.limits
    out = share.without_time_slices(planned, request)
    assert out.scheduled and out.granted == "version=1\ncompute_weight=2\n"
    assert out.limits.splitlines()[1:] == ["version=1", "memory_limit=1073741824", "compute_weight=2"]
    capped = request._replace(weight=())
    out = share.without_time_slices(share.files(capped, "ctr", "", state_dir="/st"), capped)
    assert not out.scheduled and not out.granted
    assert out.limits.splitlines()[1:] == ["version=1", "memory_limit=1073741824"]


def test_the_shim_reads_the_mps_lines(programs) -> None:  # noqa: F811
    """native/shim/base/config.c takes the mps.NAME lines the hook writes, for its four variables
    only, values of letters, digits and =-_/., only; anything else refuses the file (the shim then
    fails as for any junk line)."""

    def shim_reads(text: str) -> list[str]:
        return subprocess.run(
            [str(programs["limits_parse"]), "file"], input=text, capture_output=True, text=True, timeout=10, check=True
        ).stdout.splitlines()

    env = mps.client_env(mps.MpsClient("c", GPU0, "/bin/ctl", 0, 40, None, 1 << 30, 1))
    text = share.limits_text(ShareRequest(memory=(("", 1 << 30),))) + mps.limits_lines(env)
    assert shim_reads(text) == [
        "default memory=1073741824 compute=100 weight=0 priority=-",
        *(f"mps {name}={env[name]}" for name in mps.CLIENT_VARIABLES),
    ]
    for junk in ("mps.LD_PRELOAD=/x.so", "mps.CUDA_MPS_CLIENT_PRIORITY=1 2", "mps=1", f"mps.{mps.THREADS}=" + "9" * 64):
        assert shim_reads(f"version=1\n{junk}\n")[0].startswith("error limits line 2: invalid"), junk

"""GPU sharing's request grammar (nvc.containerenv.sharing: sizes, percentages, HAMi's names, the
host's defaults) and the limits file the hook writes, as the real shim reads it on the fake driver.
Test double only: nothing here is a GPU result.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess

import pytest

from harness.sharedirs import prepared
from harness.shim import GIB, MIB, meminfo  # noqa: F401  (fixtures)
from harness.shim import share as shim  # noqa: F401  (a fixture)
from nvc.apply import sharefiles
from nvc.containerenv import sharing
from nvc.errors import InputError
from nvc.plan import fromenv, share
from nvc.plan.request import ShareRequest
from nvc.share.region import SIZE as REGION_SIZE

# ---------------------------------------------------------------- the env grammar

SIZES = [
    ("1073741824", GIB),
    ("1g", GIB),
    ("1G", GIB),
    ("1Gi", GIB),
    ("1024m", GIB),
    ("1024Mi", GIB),
    ("1048576K", GIB),
    ("1048576Ki", GIB),
    ("4096", 4096),
    ("2T", 2 << 40),
    ("1ti", 1 << 40),
]
JUNK_SIZES = [
    "",
    "abc",
    "0",
    "00",
    "1.5G",
    "0x10",
    "1 G",
    " 1G",
    "-1",
    "1GiB",
    "1gb",
    "1B",
    "1iG",
    "G",
    "1e9",
    "+5",
    "99999999999999999999",
    "16777216T",
    "١٢",
]


@pytest.mark.parametrize(("text", "value"), SIZES)
def test_sizes(text, value):
    assert sharing.parse_size("NVC_SHARE_MEMORY_LIMIT", text) == value


@pytest.mark.parametrize("text", JUNK_SIZES)
def test_junk_sizes_are_refused_naming_the_variable(text):
    with pytest.raises(InputError, match=re.escape(f"NVC_SHARE_MEMORY_LIMIT={text!r}: not a size")):
        sharing.parse_size("NVC_SHARE_MEMORY_LIMIT", text)


@pytest.mark.parametrize(
    ("env", "memory", "compute"),
    [
        ({}, None, None),
        ({"NVC_SHARE_MEMORY_LIMIT": "4Gi"}, (("", 4 * GIB),), ()),
        ({"NVC_SHARE_COMPUTE": "50"}, (), (("", 50),)),
        # HAMi's names; NVC_SHARE_* win at the same scope; per-device entries are kept by index
        (
            {"CUDA_DEVICE_MEMORY_LIMIT": "3g", "NVC_SHARE_MEMORY_LIMIT": "1Gi", "CUDA_DEVICE_MEMORY_LIMIT_1": "2048m"},
            (("", GIB), ("1", 2 * GIB)),
            (),
        ),
        ({"CUDA_DEVICE_SM_LIMIT": "0"}, (), (("", 100),)),  # HAMi: 0 = unlimited
        ({"CUDA_DEVICE_SM_LIMIT": "30", "NVC_SHARE_COMPUTE_0": "70"}, (), (("", 30), ("0", 70))),
        ({"NVC_SHARE_MEMORY_LIMIT_007": "1M"}, (("7", MIB),), ()),
        # by UUID, as the device plugin names them: the shim applies them to that device whatever its index
        (
            {
                "NVC_SHARE_MEMORY_LIMIT_GPU-4f6a2c1e-8b3d-5e7f-9a1b-2c3d4e5f6a7b": "1M",
                "CUDA_DEVICE_SM_LIMIT_MIG-5a6b7c8d-9e0f-5a1b-8c2d-3e4f5a6b7c8d": "20",
            },
            (("GPU-4f6a2c1e-8b3d-5e7f-9a1b-2c3d4e5f6a7b", MIB),),
            (("MIG-5a6b7c8d-9e0f-5a1b-8c2d-3e4f5a6b7c8d", 20),),
        ),
        # other HAMi variables sharing a prefix are not limits
        ({"CUDA_DEVICE_MEMORY_SHARED_CACHE": "/tmp/x", "CUDA_DEVICE_SM_LIMIT_POLICY": "force"}, None, None),
    ],
)
def test_env_requests(env, memory, compute):
    request = fromenv.parse_share_env({"PATH": "/bin", **env})
    if memory is None:
        assert request is None
    else:
        assert (request.memory, request.compute) == (memory, compute)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"NVC_SHARE_MEMORY_LIMIT": "lots"}, "NVC_SHARE_MEMORY_LIMIT='lots': not a size"),
        ({"CUDA_DEVICE_MEMORY_LIMIT_0": "0x100"}, "CUDA_DEVICE_MEMORY_LIMIT_0='0x100': not a size"),
        ({"NVC_SHARE_COMPUTE": "0"}, "NVC_SHARE_COMPUTE='0': not a percentage"),
        ({"NVC_SHARE_COMPUTE": "101"}, "not a percentage"),
        ({"CUDA_DEVICE_SM_LIMIT": "50%"}, "CUDA_DEVICE_SM_LIMIT='50%': not a percentage"),
        ({"NVC_SHARE_MEMORY_LIMIT_GPU0": "1G"}, "NVC_SHARE_MEMORY_LIMIT_GPU0: unknown sharing variable"),
        ({"NVC_SHARE_MEMORY_LIMIT_1234": "1G"}, "unknown sharing variable"),
        ({"NVC_SHARE_WEIGHT_GPU-12/gi": "1"}, "NVC_SHARE_WEIGHT_GPU-12/gi: unknown sharing variable"),
    ],
)
def test_junk_env_is_refused(env, message):
    with pytest.raises(InputError, match=message):
        fromenv.parse_share_env(env)


def test_host_defaults_fill_in_what_the_container_left_out():
    own = fromenv.parse_share_env({"NVC_SHARE_COMPUTE": "30", "NVC_SHARE_MEMORY_LIMIT_1": "1G"})
    merged = fromenv.with_defaults(own, "8g", 50)
    assert (merged.memory, merged.compute) == ((("", 8 * GIB), ("1", GIB)), (("", 30),))
    assert fromenv.with_defaults(None, None, 25) == ShareRequest(compute=(("", 25),))
    assert fromenv.with_defaults(None, None, None) == ShareRequest()  # the shim, unlimited
    with pytest.raises(InputError, match="sharing.device-memory-limit='8 g'"):
        fromenv.with_defaults(None, "8 g", None)


# ---------------------------------------------------------------- the limits file, as the shim reads it


def test_limits_file_round_trip_through_the_shim(shim, tmp_path):
    shared = prepared(
        tmp_path / "state",
        "ctr",
        {"CUDA_DEVICE_MEMORY_LIMIT_1": "2048m", "NVC_SHARE_MEMORY_LIMIT": "1536Mi", "NVC_SHARE_COMPUTE": "50"},
    )
    assert stat.S_IMODE(os.stat(shared / "limits").st_mode) == 0o444
    assert stat.S_IMODE(os.stat(shared / "region").st_mode) == 0o666
    assert os.stat(shared / "region").st_size == REGION_SIZE
    shim.dir = shared
    # The file is the authority: the environment's (larger) limit is ignored, junk in it too.
    out, err = shim.run(
        "cuda_probe",
        "init",
        "ctx",
        0,
        "meminfo",
        "alloc",
        1536 * MIB + 1,
        "ctx",
        1,
        "meminfo",
        limits={"NVC_SHARE_MEMORY_LIMIT": "60G", "NVC_SHARE_COMPUTE": "junk"},
    )
    assert "FAILED" not in err
    assert meminfo(out[2]) == (1536 * MIB, 1536 * MIB)
    assert out[3] == ["alloc", "CUDA_ERROR_OUT_OF_MEMORY", "-1"]
    assert meminfo(out[5])[1] == 2 * GIB  # memory_limit.1: by NVML index


def test_fake_nvidia_smi_reports_the_written_limit(shim, tmp_path):
    # a plain directory, as bench/share.py and the GPU tests use through NVC_SHARE_DIR
    limits = share.limits_text(fromenv.parse_share_env({"NVC_SHARE_MEMORY_LIMIT": "4Gi"}))
    shim.dir = sharefiles.write_share_dir(tmp_path, limits)
    assert os.stat(shim.dir / "region").st_size == REGION_SIZE
    holder = shim.holder("alloc", GIB, limits={})
    try:
        result = subprocess.run(
            [
                str(shim.root / "usr" / "bin" / "nvidia-smi"),
                "--query-gpu=memory.total,memory.used",
                "--format=csv,noheader",
            ],
            env=shim.env({}),
            capture_output=True,
            text=True,
            timeout=20,
        )
    finally:
        holder.kill()
        holder.wait()
    assert result.stdout.splitlines()[0] == "4096 MiB, 1024 MiB", result.stderr


def test_concurrent_allocations_never_exceed_the_budget(shim, programs):
    """Four processes race 4 MiB allocations into a 1 GiB budget (the lock-free charge path) and
    hold them: together they get exactly 256, never more, and all of it once the budget is full."""
    env = shim.env({"NVC_SHARE_MEMORY_LIMIT": "1Gi"})
    ops = ["init"] + ["alloc", str(4 * MIB)] * 200 + ["hold"]
    procs = [
        subprocess.Popen([str(programs["share_app"]), *ops], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    results = []
    try:
        for proc in procs:
            for line in proc.stdout:
                if line.startswith("holding"):
                    break
                results.append(line.split()[:2])
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert results.count(["alloc", "0"]) == 256
    assert results.count(["alloc", "2"]) == 4 * 200 - 256

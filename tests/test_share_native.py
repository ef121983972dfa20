"""libnvc-share (native/) against the fake driver: how it reads its limits (sizes, HAMi's names,
per-device names, the limits file as the authority) and the one grammar it shares with the hook
(native/shim/base/config.c and nvc.containerenv.sharing with nvc.plan.share's limits file, fed one table of
values).

Programs run with LD_PRELOAD=native/libnvc-share.so and the fake driver's libraries
(tests/harness/shim.py); the fake libcuda charges every path against its own capacity, so the shim's
numbers are checked against an independent implementation. Test double only: nothing here is a GPU
result.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from harness.fakegpus import H100 as GPU0
from harness.shim import GIB, MIB, meminfo, share  # noqa: F401  (fixtures)
from nvc.errors import InputError
from nvc.plan.fromenv import parse_share_env
from nvc.plan.request import ShareRequest
from nvc.plan.share import limits_text

# ---------------------------------------------------------------- limit parsing


@pytest.mark.parametrize("text", ["1073741824", "1g", "1G", "1Gi", "1024m", "1024Mi", "1048576K", "1048576ki"])
def test_sizes_all_mean_one_gib(share, text):
    free, total = meminfo(share.probe("meminfo", limits={"NVC_SHARE_MEMORY_LIMIT": text})[0])
    assert (free, total) == (GIB, GIB)


@pytest.mark.parametrize("text", ["abc", "1.5G", "0x10", "010x", "1 G", "-1", "1GiB", "0", "", "99999999999999999999"])
def test_junk_size_is_loud_and_passes_through(share, text):
    out, err = share.run("cuda_probe", "init", "ctx", 0, "meminfo", limits={"NVC_SHARE_MEMORY_LIMIT": text})
    assert "FAILED" in err and "NVC_SHARE_MEMORY_LIMIT" in err and "NOT enforced" in err
    assert meminfo(out[2])[1] == 80 * GIB


def test_junk_size_fails_closed_when_asked(share):
    out, err = share.run(
        "cuda_probe", "init", limits={"NVC_SHARE_MEMORY_LIMIT": "lots", "NVC_SHARE_ON_ERROR": "fail-closed"}
    )
    assert out == [["init", "CUDA_ERROR_NOT_INITIALIZED"]] and "fail-closed" in err


def test_per_device_and_hami_names(share):
    limits = {"CUDA_DEVICE_MEMORY_LIMIT": "3g", "CUDA_DEVICE_MEMORY_LIMIT_1": "2048m", "NVC_SHARE_MEMORY_LIMIT": "1Gi"}
    out = share.probe("meminfo", "ctx", 1, "meminfo", limits=limits)
    # NVC_SHARE_MEMORY_LIMIT beats HAMi's global; the per-index HAMi limit beats both globals.
    assert meminfo(out[0])[1] == GIB
    assert meminfo(out[2])[1] == 2 * GIB


def test_per_device_names_by_uuid(share):
    """The device plugin's names: a limit keyed by one GPU's UUID applies to it alone; the other
    device keeps the default (nvc/containerenv/sharing.py reads the same names)."""
    limits = {f"NVC_SHARE_MEMORY_LIMIT_{GPU0}": "512Mi", "NVC_SHARE_MEMORY_LIMIT": "1Gi"}
    out = share.probe("meminfo", "ctx", 1, "meminfo", limits=limits)
    assert meminfo(out[0])[1] == 512 * MIB
    assert meminfo(out[2])[1] == GIB


def test_without_limit_sizes_are_physical(share):
    out = share.probe("meminfo", limits={"NVC_SHARE_COMPUTE": "50"})
    assert meminfo(out[0]) == (80 * GIB, 80 * GIB)


def test_limits_file_is_the_authority(share):
    share.dir.mkdir()
    (share.dir / "limits").write_text(
        f"# written by the hook\nversion=1\nmemory_limit=4Gi\nmemory_limit.{GPU0}=512Mi\ncompute_percent=100\n"
    )
    out = share.probe("meminfo", "ctx", 1, "meminfo", limits={"NVC_SHARE_MEMORY_LIMIT": "60G"})
    assert meminfo(out[0])[1] == 512 * MIB  # by UUID
    assert meminfo(out[2])[1] == 4 * GIB  # default; the environment is ignored


@pytest.mark.parametrize(
    "text",
    [
        "memory_limit=1G\n",
        "version=2\nmemory_limit=1G\n",
        "version=1\nmemory=1G\n",
        "version=1\nmemory_limit.GPU-zz!=1G\n",
        "version=1\ncompute_percent=101\n",
    ],
)
def test_junk_limits_file_is_loud(share, text):
    share.dir.mkdir()
    (share.dir / "limits").write_text(text)
    out, err = share.run("cuda_probe", "init", "ctx", 0, "meminfo")
    assert "FAILED" in err and "limits" in err
    assert meminfo(out[2])[1] == 80 * GIB


def test_mps_lines_of_a_plain_limits_file_reach_cuinit(share, tmp_path):
    """Outside a container (NVC_SHARE_DIR's limits file, as bench/share.py runs nvc-py's MPS backend) the
    shim puts the file's MPS client variables in the environment before cuInit, as it does with the
    hook's file: the fake libcuda tells the fake daemon's control FIFO what it saw."""
    share.dir.mkdir()
    (share.dir / "limits").write_text(
        "version=1\nmps.CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25\nmps.CUDA_MPS_CLIENT_PRIORITY=1\n"
    )
    pipe = tmp_path / "pipe"
    pipe.mkdir()
    os.mkfifo(pipe / "control")
    reader = os.open(pipe / "control", os.O_RDONLY | os.O_NONBLOCK)
    try:
        share.run("cuda_probe", "init", limits={"CUDA_MPS_PIPE_DIRECTORY": str(pipe)})
        said = os.read(reader, 4096).decode()
    finally:
        os.close(reader)
    assert said.startswith("client ") and said.split(" ", 3)[3] == (
        f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25 CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=- CUDA_MPS_CLIENT_PRIORITY=1 "
        f"CUDA_MPS_PIPE_DIRECTORY={pipe}\n"
    ), said


# ---------------------------------------------------------------- one grammar for the hook and the shim

READ, REFUSED, STRICTER = "read", "refused", "stricter"
MIG0 = "MIG-5a6b7c8d-9e0f-5a1b-8c2d-3e4f5a6b7c8d"
# (variable, value, verdict) for the hook (nvc.containerenv.sharing, then nvc.plan.share's limits file)
# and the shim (native/shim/base/config.c: the environment, and the limits file the hook wrote). READ: both read
# the same limits; REFUSED: both refuse it, naming the variable; STRICTER: the hook refuses what the
# shim's plain-env reader takes (zeros past the hook's digit bound) or leaves alone as no variable of
# its own (a suffix that names no device), so a container never starts on what the two would read apart.
CONFIG_TABLE = [
    # sizes: decimal bytes with K, M, G or T and an optional i, all powers of 1024; not 0, below 2^64
    *[
        ("NVC_SHARE_MEMORY_LIMIT", text, READ)
        for text in (
            "1073741824",
            "1g",
            "1G",
            "1Gi",
            "1024m",
            "1024Mi",
            "1048576K",
            "1048576ki",
            "4096",
            "2T",
            "1ti",
            "18446744073709551615",
            "16777215T",
            "00000000000000000001",
        )
    ],
    *[
        ("NVC_SHARE_MEMORY_LIMIT", text, REFUSED)
        for text in (
            "",
            "abc",
            "0",
            "00",
            "1.5G",
            "0x10",
            "1 G",
            " 1G",
            "1G ",
            "-1",
            "+5",
            "1GiB",
            "1gb",
            "1B",
            "1iG",
            "1Gii",
            "G",
            "1e9",
            "18446744073709551616",
            "99999999999999999999",
            "16777216T",
            "١٢",
        )
    ],
    ("NVC_SHARE_MEMORY_LIMIT", "000000000000000000001", STRICTER),
    ("CUDA_DEVICE_MEMORY_LIMIT", "3g", READ),
    ("CUDA_DEVICE_MEMORY_LIMIT", "0", REFUSED),
    # percents: 1..100; HAMi's 0 is unlimited
    *[("NVC_SHARE_COMPUTE", text, READ) for text in ("1", "50", "100", "050")],
    *[
        ("NVC_SHARE_COMPUTE", text, REFUSED)
        for text in ("0", "101", "1000", "", "abc", "+5", " 5", "5 ", "5%", "1e2", "١", "99999999999999999999")
    ],
    ("NVC_SHARE_COMPUTE", "0000000000000000050", STRICTER),
    ("CUDA_DEVICE_SM_LIMIT", "0", READ),
    ("CUDA_DEVICE_SM_LIMIT", "30", READ),
    ("CUDA_DEVICE_SM_LIMIT", "101", REFUSED),
    # weights: 1..1000
    *[("NVC_SHARE_WEIGHT", text, READ) for text in ("1", "1000", "0001")],
    *[
        ("NVC_SHARE_WEIGHT", text, REFUSED)
        for text in ("0", "1001", "", "x", "+1", "1 ", "١", "99999999999999999999999")
    ],
    # device keys: an NVML index of 1 to 3 digits, or a GPU- or MIG- UUID (its case and prefix not counted)
    *[
        (f"NVC_SHARE_MEMORY_LIMIT_{key}", "1G", READ)
        for key in ("0", "7", "007", "999", GPU0, GPU0.upper(), MIG0, "GPU-ABCDEF", "GPU-" + "a" * 36)
    ],
    *[(f"NVC_SHARE_COMPUTE_{key}", "50", READ) for key in ("1", GPU0)],
    *[(f"NVC_SHARE_WEIGHT_{key}", "3", READ) for key in ("2", MIG0)],
    *[
        (f"NVC_SHARE_WEIGHT_{key}", "3", STRICTER)
        for key in ("1234", "gpu-abc", "GPU0", "GPU-", "GPU-" + "a" * 37, "GPU-zz", "GPU-12/gi", "x", "", "_0", "-1")
    ],
    # latency classes: latency-critical or batch, exactly
    *[("NVC_SHARE_PRIORITY", text, READ) for text in ("latency-critical", "batch")],
    *[(f"NVC_SHARE_PRIORITY_{key}", "batch", READ) for key in ("1", GPU0)],
    *[("NVC_SHARE_PRIORITY", text, REFUSED) for text in ("", "urgent", "Batch", "batch ", "0")],
    (f"CUDA_DEVICE_SM_LIMIT_{GPU0}", "0", READ),
    ("CUDA_DEVICE_SM_LIMIT_POLICY", "force", READ),  # another HAMi variable: a limit to neither
]
# Several variables at once: NVC_SHARE_* beat HAMi's at the same device, a device's own beat the
# default, whatever their names; the device plugin's (by UUID) beside a default.
CONFIG_ENVS = [
    {"CUDA_DEVICE_MEMORY_LIMIT": "3g", "NVC_SHARE_MEMORY_LIMIT": "1Gi", "CUDA_DEVICE_MEMORY_LIMIT_1": "2048m"},
    {
        "CUDA_DEVICE_MEMORY_LIMIT_001": "3g",
        "NVC_SHARE_MEMORY_LIMIT_1": "1Gi",
        "CUDA_DEVICE_SM_LIMIT": "30",
        "NVC_SHARE_COMPUTE_0": "70",
        "NVC_SHARE_WEIGHT": "5",
    },
    {
        f"NVC_SHARE_MEMORY_LIMIT_{GPU0}": "512Mi",
        f"NVC_SHARE_COMPUTE_{GPU0}": "25",
        f"NVC_SHARE_WEIGHT_{GPU0}": "3",
        f"CUDA_DEVICE_SM_LIMIT_{MIG0}": "0",
        "NVC_SHARE_MEMORY_LIMIT_1": "1G",
        "NVC_SHARE_MEMORY_LIMIT": "4G",
    },
]


def shim_reads(programs, *args: str, text: str | None = None) -> list[str]:
    """What native/shim/base/config.c reads (tests/share_programs/limits_parse.c's lines)."""
    return subprocess.run(
        [str(programs["limits_parse"]), *args], input=text, capture_output=True, text=True, timeout=10, check=True
    ).stdout.splitlines()


def as_the_shim_keys(request: ShareRequest | None) -> list[str]:
    """``request`` in limits_parse's words: its defaults (100 % compute, no memory limit or weight when
    unset) and one rule per device, keyed as the shim keys them (an index as a number, a UUID without
    its GPU-/MIG- prefix, lower case), in the shim's order."""
    defaults: dict[str, int | str] = {"memory": 0, "compute": 100, "weight": 0, "priority": "-"}
    rules: dict[tuple[int, str], dict[str, int | str]] = {}
    for field in defaults:
        for scope, value in getattr(request or ShareRequest(), field):
            if not scope:
                defaults[field] = value
                continue
            key = (int(scope), "-") if scope.isdigit() else (-1, scope[4:].lower())  # the hook's: GPU-/MIG- UUIDs
            rules.setdefault(key, {"memory": 0, "compute": 0, "weight": 0, "priority": "-"})[field] = value
    return [
        " ".join(["default", *(f"{f}={v}" for f, v in defaults.items())]),
        *(
            " ".join([f"rule index={index} key={key}", *(f"{f}={v}" for f, v in rule.items())])
            for (index, key), rule in sorted(rules.items())
        ),
    ]


def hook_and_shim_agree(programs, env: dict[str, str]) -> None:
    """What the hook reads of ``env`` is what the shim reads of it, and of the limits file the hook
    writes from it."""
    request = parse_share_env(env)
    want = as_the_shim_keys(request)
    assert shim_reads(programs, "env", *(f"{name}={value}" for name, value in env.items())) == want
    assert shim_reads(programs, "file", text=limits_text(request or ShareRequest())) == want


@pytest.mark.parametrize(("name", "value", "verdict"), CONFIG_TABLE)
def test_config_agrees_with_the_hook(programs, name, value, verdict):
    if verdict == READ:
        hook_and_shim_agree(programs, {name: value})
        return
    with pytest.raises(InputError, match=re.escape(name)):
        parse_share_env({name: value})
    read = shim_reads(programs, "env", f"{name}={value}")
    if verdict == REFUSED:
        assert read[0].startswith(f"error invalid {name}="), read
    else:
        assert not read[0].startswith("error"), read


@pytest.mark.parametrize("env", CONFIG_ENVS)
def test_config_agrees_with_the_hook_on_precedence(programs, env):
    hook_and_shim_agree(programs, env)


def test_config_agrees_with_the_hook_on_how_many_devices(programs):
    """The shim keeps limits for 32 devices and refuses a limits file naming more (the container
    would run unlimited): the hook refuses such an env before it writes one; 32 are read alike."""
    many = {f"NVC_SHARE_WEIGHT_{index}": "1" for index in range(33)}
    with pytest.raises(InputError, match="sharing variables name 33 devices"):
        parse_share_env(many)
    assert shim_reads(programs, "env", *(f"{name}={value}" for name, value in many.items()))[0].startswith("error ")
    del many["NVC_SHARE_WEIGHT_32"]
    hook_and_shim_agree(programs, {**many, "NVC_SHARE_MEMORY_LIMIT": "1G"})


def test_a_limits_file_scope_that_names_no_device_is_refused(programs):
    """``memory_limit.GPU-``: a UUID scope that is empty without its prefix was read as a rule no device
    matches, so the limit was silently not applied (found by native/fuzz/limits_fuzz.c); the file is refused."""
    for scope in ("GPU-", "MIG-"):
        read = shim_reads(programs, "file", text=f"version=1\nmemory_limit.{scope}=2101\n")
        assert read[0] == f"error limits line 2: invalid memory_limit.{scope}=2101", read
    assert shim_reads(programs, "file", text="version=1\nmemory_limit.GPU-a=2101\n")[0].startswith("default ")

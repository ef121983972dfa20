"""libnvc-share (native/) against the fake driver: limits parsing, accounting of every allocation
path, one budget per container across processes, dead-process reclaim, lock robustness, stale
regions, cuGetProcAddress interception, NVML virtualisation and the compute share.

Programs run with LD_PRELOAD=native/libnvc-share.so and the fake driver's libraries; the fake
libcuda charges every path against its own capacity, so the shim's numbers are checked against an
independent implementation. Test double only: nothing here is a GPU result.
"""

from __future__ import annotations

import os
import re
import signal
import struct
import subprocess
import threading
import time
from pathlib import Path
from typing import NamedTuple

import pytest
from fakedriver.build import INCLUDES

from nvc.containerenv.sharing import parse_share_env
from nvc.errors import InputError
from nvc.plan.request import ShareRequest
from nvc.plan.share import limits_text
from nvc.share.region import SIZE as REGION_SIZE

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
FAKE_SRC = TESTS / "fakedriver" / "src"
PROGRAMS = TESTS / "share_programs"
SHIM = REPO / "native" / "libnvc-share.so"
MIB = 1 << 20
GIB = 1 << 30
GPU0 = "GPU-4f6a2c1e-8b3d-5e7f-9a1b-2c3d4e5f6a7b"
GPU1_MEMORY = 40 * GIB


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The shim (built by its Makefile) and the test programs."""
    subprocess.run(["make", "-s", "-C", str(REPO / "native")], check=True)
    out = tmp_path_factory.mktemp("share_programs")
    built = {"cuda_probe": [FAKE_SRC / "cuda_probe.c"], "share_app": [PROGRAMS / "share_app.c"],
             "hold_lock": [PROGRAMS / "hold_lock.c"],
             "sched_sim": [PROGRAMS / "sched_sim.c", REPO / "native" / "schedpolicy.c"],
             "limits_parse": [PROGRAMS / "limits_parse.c", REPO / "native" / "config.c"]}
    for name, sources in built.items():
        subprocess.run(["gcc", "-O1", "-Wall", "-Werror", *INCLUDES, "-o",
                        str(out / name), *map(str, sources), "-ldl"], check=True)
    return {name: out / name for name in built}


@pytest.fixture
def share(programs, active_2gpu, tmp_path):
    """Runs programs under the shim with a private region directory; env is the limits."""
    libdir = active_2gpu.root / "usr" / "lib" / "x86_64-linux-gnu"

    class Share:
        dir = tmp_path / "share"
        root = active_2gpu.root

        def env(self, limits: dict[str, str]) -> dict[str, str]:
            self.dir.mkdir(exist_ok=True)
            return {"PATH": os.environ["PATH"], "LD_LIBRARY_PATH": str(libdir), "LD_PRELOAD": str(SHIM),
                    "NVC_SHARE_DIR": str(self.dir), "FAKE_CUDA_CONTEXT_MIB": "0", **limits}

        def run(self, program: str, *ops: object, limits: dict[str, str] | None = None,
                timeout: float = 20) -> tuple[list[list[str]], str]:
            result = subprocess.run([str(programs[program]), *map(str, ops)], env=self.env(limits or {}),
                                    capture_output=True, text=True, timeout=timeout)
            assert result.returncode == 0, result.stderr
            return [line.split() for line in result.stdout.splitlines()], result.stderr

        def probe(self, *ops: object, limits: dict[str, str] | None = None) -> list[list[str]]:
            return self.run("cuda_probe", "init", "ctx", 0, *ops, limits=limits)[0][2:]

        def holder(self, *ops: object, limits: dict[str, str]) -> subprocess.Popen:
            """share_app doing ops, then holding its allocations until killed."""
            proc = subprocess.Popen([str(programs["share_app"]), "init", *map(str, ops), "hold"],
                                    env=self.env(limits), stdout=subprocess.PIPE, text=True)
            for line in proc.stdout:
                if line.startswith("holding"):
                    return proc
                assert line.split()[1] == "0", line
            raise AssertionError("holder exited early")

    return Share()


def meminfo(line: list[str]) -> tuple[int, int]:
    assert line[:2] == ["meminfo", "CUDA_SUCCESS"], line
    return int(line[2]), int(line[3])


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
    out, err = share.run("cuda_probe", "init", limits={"NVC_SHARE_MEMORY_LIMIT": "lots",
                                                       "NVC_SHARE_ON_ERROR": "fail-closed"})
    assert out == [["init", "CUDA_ERROR_NOT_INITIALIZED"]] and "fail-closed" in err


def test_per_device_and_hami_names(share):
    limits = {"CUDA_DEVICE_MEMORY_LIMIT": "3g", "CUDA_DEVICE_MEMORY_LIMIT_1": "2048m",
              "NVC_SHARE_MEMORY_LIMIT": "1Gi"}
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
    (share.dir / "limits").write_text(f"# written by the hook\nversion=1\nmemory_limit=4Gi\n"
                                      f"memory_limit.{GPU0}=512Mi\ncompute_percent=100\n")
    out = share.probe("meminfo", "ctx", 1, "meminfo", limits={"NVC_SHARE_MEMORY_LIMIT": "60G"})
    assert meminfo(out[0])[1] == 512 * MIB       # by UUID
    assert meminfo(out[2])[1] == 4 * GIB         # default; the environment is ignored


@pytest.mark.parametrize("text", ["memory_limit=1G\n", "version=2\nmemory_limit=1G\n", "version=1\nmemory=1G\n",
                                  "version=1\nmemory_limit.GPU-zz!=1G\n", "version=1\ncompute_percent=101\n"])
def test_junk_limits_file_is_loud(share, text):
    share.dir.mkdir()
    (share.dir / "limits").write_text(text)
    out, err = share.run("cuda_probe", "init", "ctx", 0, "meminfo")
    assert "FAILED" in err and "limits" in err
    assert meminfo(out[2])[1] == 80 * GIB


# ---------------------------------------------------------------- one grammar for the hook and the shim

READ, REFUSED, STRICTER = "read", "refused", "stricter"
MIG0 = "MIG-5a6b7c8d-9e0f-5a1b-8c2d-3e4f5a6b7c8d"
# (variable, value, verdict) for the hook (nvc.containerenv.sharing, then nvc.plan.share's limits file)
# and the shim (native/config.c: the environment, and the limits file the hook wrote). READ: both read
# the same limits; REFUSED: both refuse it, naming the variable; STRICTER: the hook refuses what the
# shim's plain-env reader takes (zeros past the hook's digit bound) or leaves alone as no variable of
# its own (a suffix that names no device), so a container never starts on what the two would read apart.
CONFIG_TABLE = [
    # sizes: decimal bytes with K, M, G or T and an optional i, all powers of 1024; not 0, below 2^64
    *[("NVC_SHARE_MEMORY_LIMIT", text, READ) for text in (
        "1073741824", "1g", "1G", "1Gi", "1024m", "1024Mi", "1048576K", "1048576ki", "4096", "2T", "1ti",
        "18446744073709551615", "16777215T", "00000000000000000001")],
    *[("NVC_SHARE_MEMORY_LIMIT", text, REFUSED) for text in (
        "", "abc", "0", "00", "1.5G", "0x10", "1 G", " 1G", "1G ", "-1", "+5", "1GiB", "1gb", "1B", "1iG", "1Gii",
        "G", "1e9", "18446744073709551616", "99999999999999999999", "16777216T", "١٢")],
    ("NVC_SHARE_MEMORY_LIMIT", "000000000000000000001", STRICTER),
    ("CUDA_DEVICE_MEMORY_LIMIT", "3g", READ), ("CUDA_DEVICE_MEMORY_LIMIT", "0", REFUSED),
    # percents: 1..100; HAMi's 0 is unlimited
    *[("NVC_SHARE_COMPUTE", text, READ) for text in ("1", "50", "100", "050")],
    *[("NVC_SHARE_COMPUTE", text, REFUSED) for text in (
        "0", "101", "1000", "", "abc", "+5", " 5", "5 ", "5%", "1e2", "١", "99999999999999999999")],
    ("NVC_SHARE_COMPUTE", "0000000000000000050", STRICTER),
    ("CUDA_DEVICE_SM_LIMIT", "0", READ), ("CUDA_DEVICE_SM_LIMIT", "30", READ), ("CUDA_DEVICE_SM_LIMIT", "101", REFUSED),
    # weights: 1..1000
    *[("NVC_SHARE_WEIGHT", text, READ) for text in ("1", "1000", "0001")],
    *[("NVC_SHARE_WEIGHT", text, REFUSED) for text in (
        "0", "1001", "", "x", "+1", "1 ", "١", "99999999999999999999999")],
    # device keys: an NVML index of 1 to 3 digits, or a GPU- or MIG- UUID (its case and prefix not counted)
    *[(f"NVC_SHARE_MEMORY_LIMIT_{key}", "1G", READ) for key in (
        "0", "7", "007", "999", GPU0, GPU0.upper(), MIG0, "GPU-ABCDEF", "GPU-" + "a" * 36)],
    *[(f"NVC_SHARE_COMPUTE_{key}", "50", READ) for key in ("1", GPU0)],
    *[(f"NVC_SHARE_WEIGHT_{key}", "3", READ) for key in ("2", MIG0)],
    *[(f"NVC_SHARE_WEIGHT_{key}", "3", STRICTER) for key in (
        "1234", "gpu-abc", "GPU0", "GPU-", "GPU-" + "a" * 37, "GPU-zz", "GPU-12/gi", "x", "", "_0", "-1")],
    (f"CUDA_DEVICE_SM_LIMIT_{GPU0}", "0", READ),
    ("CUDA_DEVICE_SM_LIMIT_POLICY", "force", READ),     # another HAMi variable: a limit to neither
]
# Several variables at once: NVC_SHARE_* beat HAMi's at the same device, a device's own beat the
# default, whatever their names; the device plugin's (by UUID) beside a default.
CONFIG_ENVS = [
    {"CUDA_DEVICE_MEMORY_LIMIT": "3g", "NVC_SHARE_MEMORY_LIMIT": "1Gi", "CUDA_DEVICE_MEMORY_LIMIT_1": "2048m"},
    {"CUDA_DEVICE_MEMORY_LIMIT_001": "3g", "NVC_SHARE_MEMORY_LIMIT_1": "1Gi", "CUDA_DEVICE_SM_LIMIT": "30",
     "NVC_SHARE_COMPUTE_0": "70", "NVC_SHARE_WEIGHT": "5"},
    {f"NVC_SHARE_MEMORY_LIMIT_{GPU0}": "512Mi", f"NVC_SHARE_COMPUTE_{GPU0}": "25", f"NVC_SHARE_WEIGHT_{GPU0}": "3",
     f"CUDA_DEVICE_SM_LIMIT_{MIG0}": "0", "NVC_SHARE_MEMORY_LIMIT_1": "1G", "NVC_SHARE_MEMORY_LIMIT": "4G"},
]


def shim_reads(programs, *args: str, text: str | None = None) -> list[str]:
    """What native/config.c reads (tests/share_programs/limits_parse.c's lines)."""
    return subprocess.run([str(programs["limits_parse"]), *args], input=text, capture_output=True, text=True,
                          timeout=10, check=True).stdout.splitlines()


def as_the_shim_keys(request: ShareRequest | None) -> list[str]:
    """``request`` in limits_parse's words: its defaults (100 % compute, no memory limit or weight when
    unset) and one rule per device, keyed as the shim keys them (an index as a number, a UUID without
    its GPU-/MIG- prefix, lower case), in the shim's order."""
    defaults = {"memory": 0, "compute": 100, "weight": 0}
    rules: dict[tuple[int, str], dict[str, int]] = {}
    for field in ShareRequest._fields:
        for scope, value in getattr(request or ShareRequest(), field):
            if not scope:
                defaults[field] = value
                continue
            key = (int(scope), "-") if scope.isdigit() else (-1, scope[4:].lower())  # the hook's: GPU-/MIG- UUIDs
            rules.setdefault(key, dict.fromkeys(defaults, 0))[field] = value
    return [" ".join(["default", *(f"{f}={v}" for f, v in defaults.items())]),
            *(" ".join([f"rule index={index} key={key}", *(f"{f}={v}" for f, v in rule.items())])
              for (index, key), rule in sorted(rules.items()))]


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


# ---------------------------------------------------------------- accounting

ANCHOR = 100 * MIB
# native/README.md's table of allocation entry points -> (program, its flags, operations allocating,
# bytes the shim must charge, operations freeing SLOT). Slots count successful allocations.
SLOT = "{slot}"
ENTRY_POINTS: dict[str, tuple[str, tuple[str, ...], list[object], int, list[object]]] = {
    "cuMemAlloc_v2": ("cuda_probe", (), ["alloc", 600 * MIB], 600 * MIB, ["free", SLOT]),
    "cuMemAllocManaged": ("cuda_probe", (), ["managed", 600 * MIB], 600 * MIB, ["free", SLOT]),
    "cuMemAllocPitch_v2": ("cuda_probe", (), ["pitch", 513, 512 * 1024, 4], 512 * MIB, ["free", SLOT]),  # pitch 1024
    "cuMemCreate": ("cuda_probe", (), ["vmm", 600 * MIB], 600 * MIB, ["vmmfree", SLOT]),
    "cuMemAllocAsync": ("cuda_probe", (), ["async", 600 * MIB], 600 * MIB,
                        ["freeasync", SLOT, "threshold", 0, "sync"]),
    "cuMemAllocAsync_ptsz": ("share_app", ("--ptds",), ["async", 600 * MIB], 600 * MIB,
                             ["freeasync", SLOT, "defaulttrim"]),
    "cuMemAllocFromPoolAsync": ("share_app", (), ["frompool", 600 * MIB], 600 * MIB, ["freeasync", SLOT, "trim", 0]),
    "cuMemAllocFromPoolAsync_ptsz": ("share_app", ("--ptds",), ["frompool", 600 * MIB], 600 * MIB,
                                     ["freeasync", SLOT, "trim", 0]),
    "cuArrayCreate_v2": ("cuda_probe", (), ["array", 8192, 8192, 0x20, 2], 8192 * 8192 * 8, ["arrayfree", SLOT]),
    "cuArray3DCreate_v2": ("cuda_probe", (), ["array3d", 1024, 1024, 100, 0x10, 4], 1024 * 1024 * 100 * 8,
                           ["arrayfree", SLOT]),
    "cuMipmappedArrayCreate": ("cuda_probe", (), ["mipmap", 8192, 8192, 0, 0x03, 1, 3],
                               4 * (8192**2 + 4096**2 + 2048**2), ["arrayfree", SLOT]),
    "cuGraphAddMemAllocNode": ("cuda_probe", (), ["gnode", "memalloc", 600 * MIB], 600 * MIB, ["gdestroy", SLOT]),
    "cuGraphAddNode": ("cuda_probe", (), ["gnode", "addnode", 600 * MIB], 600 * MIB, ["gdestroy", SLOT]),
    "cuGraphAddNode_v2": ("cuda_probe", (), ["gnode", "addnode2", 600 * MIB], 600 * MIB, ["gdestroy", SLOT]),
    "cuMemAllocAsync under stream capture": ("cuda_probe", (), ["gnode", "capture", 600 * MIB], 600 * MIB,
                                             ["gdestroy", SLOT]),
}


def readme_entry_points() -> list[str]:
    """The first column of native/README.md's allocation table: entry points, with their qualifier."""
    text = (REPO / "native" / "README.md").read_text()
    table = text.split("| Allocated by |", 1)[1].split("\n\n", 1)[0]
    names = []
    for row in table.splitlines()[2:]:
        for cell in row.split("|")[1].split(", "):
            match = re.fullmatch(r"`(\w+)`( under stream capture)?( \(.*\))?", cell.strip())
            assert match, cell
            names.append(match[1] + (match[2] or ""))
    return names


def test_every_listed_entry_point_is_tested():
    assert sorted(readme_entry_points()) == sorted(ENTRY_POINTS)


def codes(line: list[str]) -> list[str]:
    """A result line with share_app's numeric results named as cuda_probe names them."""
    names = {"0": "CUDA_SUCCESS", "2": "CUDA_ERROR_OUT_OF_MEMORY"}
    return [line[0], names.get(line[1], line[1]), *line[2:]]


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_entry_point_is_charged_before_granted_and_released_once(share, entry):
    """Refused when it does not fit (nothing granted), charged exactly its size when it does, refunded
    exactly once when released (a second release refunds nothing: the anchor's charge stays)."""
    program, flags, alloc, charged, release = ENTRY_POINTS[entry]
    release = [str(2) if op == SLOT else op for op in release]
    ops = ["alloc", GIB - charged + MIB, *alloc, "free", 0, "alloc", ANCHOR, *alloc, "meminfo",
           "alloc", GIB - ANCHOR - charged + MIB, *release, "meminfo", *release, "meminfo"]
    if program == "cuda_probe":
        out = [codes(line) for line in share.probe(*ops, limits={"NVC_SHARE_MEMORY_LIMIT": "1Gi"})]
    else:
        out = [codes(line) for line in share.run(program, *flags, "init", *ops,
                                                  limits={"NVC_SHARE_MEMORY_LIMIT": "1Gi"})[0][1:]]
        out = [["meminfo", "CUDA_SUCCESS", *line[2:]] if line[0] == "meminfo" else line for line in out]
    assert out[0][1] == "CUDA_SUCCESS"
    assert out[1][1] == "CUDA_ERROR_OUT_OF_MEMORY", out       # refused: it does not fit
    assert out[4][1] == "CUDA_SUCCESS", out
    assert meminfo(out[5]) == (GIB - ANCHOR - charged, GIB)
    assert out[6][1] == "CUDA_ERROR_OUT_OF_MEMORY"            # one MiB more than what is left
    rest = out[7:]
    first = next(i for i, line in enumerate(rest) if line[0] == "meminfo")
    assert all(line[1] == "CUDA_SUCCESS" for line in rest[:first]), rest
    assert meminfo(rest[first]) == (GIB - ANCHOR, GIB)       # refunded
    assert meminfo(rest[-1]) == (GIB - ANCHOR, GIB)          # and only once


def graph_run(share, *ops: object, limit: str = "1Gi") -> list[list[str]]:
    return share.probe(*ops, limits={"NVC_SHARE_MEMORY_LIMIT": limit})


@pytest.mark.parametrize("how", ["memalloc", "addnode", "addnode2", "capture"])
def test_graph_allocations_cannot_pass_the_limit(share, how):
    """The escape seen on the H100: graphs with one allocation node each, instantiated and launched, kept:
    8 x 512 MiB fit a 4 GiB budget, the ninth node is refused when it is created."""
    ops: list[object] = []
    for slot in range(8):
        ops += ["gnode", how, 512 * MIB, "ginst", slot, "flags", "glaunch", slot]
    out = graph_run(share, *ops, "gnode", how, 512 * MIB, "meminfo", limit="4Gi")
    assert [line[:2] for line in out[0:24]] == [["gnode", "CUDA_SUCCESS"], ["ginst", "CUDA_SUCCESS"],
                                                ["glaunch", "CUDA_SUCCESS"]] * 8
    assert out[24][:2] == ["gnode", "CUDA_ERROR_OUT_OF_MEMORY"]
    assert meminfo(out[-1])[0] == 0


def test_launched_graph_memory_stays_charged_until_freed(share):
    """A launched allocation outlives its graph and executable until it is freed; freed, it still
    holds its charge while its graph could launch it again. (gtrim: the driver's reserve of freed graph
    memory is charged until trimmed, test_graph_reserve_beyond_the_nodes_is_charged_until_trimmed.)"""
    out = graph_run(share, "gnode", "memalloc", 600 * MIB, "ginst", 0, "params", "glaunch", 0, "gexecdestroy", 0,
                    "gdestroy", 0, "meminfo", "gmemfree", 0, "gtrim", "meminfo",
                    "gnode", "addnode2", 300 * MIB, "ginst", 1, "flags", "glaunch", 1, "gfreeasync", 1, "gtrim",
                    "meminfo", "gexecdestroy", 1, "meminfo", "gdestroy", 1, "meminfo")
    assert all(line[1] == "CUDA_SUCCESS" for line in out), out
    assert meminfo(out[5])[0] == GIB - 600 * MIB          # graph and executable gone, memory live
    assert meminfo(out[8])[0] == GIB                      # cuMemFree
    assert meminfo(out[14])[0] == GIB - 300 * MIB         # freed, but its graph can launch it again
    assert meminfo(out[16])[0] == GIB - 300 * MIB
    assert meminfo(out[18])[0] == GIB


@pytest.mark.parametrize("how", ["memalloc", "addnode", "capture"])
def test_free_nodes_release_graph_memory(share, how):
    out = graph_run(share, "gnode", "memalloc", 600 * MIB, "ginst", 0, "autofree", "glaunch", 0, "glaunch", 0,
                    "gexecdestroy", 0, "gdestroy", 0, "meminfo", "gfreenode", 0, how, "gtrim", "meminfo",
                    "gmemfree", 0, "meminfo")
    assert [line[1] for line in out[:6]] == ["CUDA_SUCCESS"] * 6
    assert meminfo(out[6])[0] == GIB - 600 * MIB
    assert out[7] == ["gfreenode", "CUDA_SUCCESS"]
    assert meminfo(out[9])[0] == GIB                      # freed by the other graph's free node
    assert out[10][1] != "CUDA_SUCCESS"                   # already freed: the driver refuses
    assert meminfo(out[11])[0] == GIB                     # and nothing is refunded twice


def test_executable_keeps_graph_memory_after_its_graph(share):
    out = graph_run(share, "gnode", "memalloc", 600 * MIB, "ginst", 0, "flags", "gdestroy", 0, "meminfo",
                    "gexecdestroy", 0, "meminfo")
    assert meminfo(out[3])[0] == GIB - 600 * MIB
    assert meminfo(out[5])[0] == GIB


def test_memory_node_parameters_cannot_change(share):
    out = graph_run(share, "gnode", "memalloc", 100 * MIB, "ginst", 0, "flags", "gset", 0, 900 * MIB,
                    "gexecset", 0, 900 * MIB, "meminfo")
    assert out[2] == ["gset", "CUDA_ERROR_NOT_SUPPORTED"]
    assert out[3] == ["gexecset", "CUDA_ERROR_NOT_SUPPORTED"]
    assert meminfo(out[4])[0] == GIB - 100 * MIB


def test_exec_update_follows_the_new_graph(share):
    """After cuGraphExecUpdate the executable launches the other graph's allocation."""
    out = graph_run(share, "gnode", "memalloc", 100 * MIB, "ginst", 0, "flags", "gnode", "memalloc", 200 * MIB,
                    "gupdate", 0, 1, "gdestroy", 1, "meminfo", "glaunch", 0, "gexecdestroy", 0, "meminfo")
    assert all(line[1] == "CUDA_SUCCESS" for line in out), out
    assert meminfo(out[5])[0] == GIB - 300 * MIB          # graph 1 gone, but the executable runs it
    assert meminfo(out[8])[0] == GIB - 300 * MIB          # launched: live until freed; graph 0 still there


def test_graph_reserve_beyond_the_nodes_is_charged_until_trimmed(share):
    """Freed graph memory the driver keeps in its reserve counts until cuDeviceGraphMemTrim."""
    out = graph_run(share, "gnode", "memalloc", 600 * MIB, "ginst", 0, "flags", "glaunch", 0, "gexecdestroy", 0,
                    "gdestroy", 0, "gmemfree", 0, "greserve", "meminfo", "alloc", 600 * MIB, "gtrim", "meminfo",
                    "alloc", 600 * MIB)
    assert out[6] == ["greserve", "CUDA_SUCCESS", str(600 * MIB)]
    assert meminfo(out[7])[0] == GIB - 600 * MIB
    assert out[8][:2] == ["alloc", "CUDA_ERROR_OUT_OF_MEMORY"]
    assert meminfo(out[10])[0] == GIB
    assert out[11][:2] == ["alloc", "CUDA_SUCCESS"]


def test_pitch_is_refused_by_real_pitch_times_height(share):
    # width x height = 513 MiB fits a 600 MiB budget, pitch (1024) x height = 1 GiB does not.
    out = share.probe("pitch", 513, MIB, 4, "meminfo", limits={"NVC_SHARE_MEMORY_LIMIT": "600Mi"})
    assert out[0][:2] == ["pitch", "CUDA_ERROR_OUT_OF_MEMORY"]
    assert meminfo(out[1])[0] == 600 * MIB


def test_async_pool_reuse_and_trim(share):
    limits = {"NVC_SHARE_MEMORY_LIMIT": "1Gi"}
    out, _ = share.run("share_app", "init", "frompool", 512 * MIB, "freeasync", 0, "meminfo",
                       "frompool", 512 * MIB, "frompool", 600 * MIB, "freeasync", 1, "trim", 0, "meminfo",
                       limits=limits)
    assert out[1] == ["frompool", "0", "0"]
    assert out[3] == ["meminfo", "0", str(GIB - 512 * MIB), str(GIB)]    # the pool keeps its reserve
    assert out[4] == ["frompool", "0", "1"]                              # reused: no new charge
    assert out[5] == ["frompool", "2", "-1"]                             # CUDA_ERROR_OUT_OF_MEMORY
    assert out[8] == ["meminfo", "0", str(GIB), str(GIB)]                # trimmed: refunded


def test_context_overhead_is_charged_once_per_device(share):
    limits = {"NVC_SHARE_MEMORY_LIMIT": "1Gi", "NVC_SHARE_CONTEXT_OVERHEAD": "256Mi"}
    out = share.probe("meminfo", "alloc", 800 * MIB, "ctx", 0, "meminfo", limits=limits)
    assert meminfo(out[0])[0] == 768 * MIB
    assert out[1] == ["alloc", "CUDA_ERROR_OUT_OF_MEMORY", "-1"]
    assert meminfo(out[3])[0] == 768 * MIB


# ---------------------------------------------------------------- one budget per container

def test_two_processes_share_one_budget(share):
    limits = {"NVC_SHARE_MEMORY_LIMIT": "1Gi"}
    holder = share.holder("alloc", 600 * MIB, limits=limits)
    try:
        out = share.probe("meminfo", "alloc", 600 * MIB, "alloc", 400 * MIB, limits=limits)
        assert meminfo(out[0]) == (GIB - 600 * MIB, GIB)
        assert out[1] == ["alloc", "CUDA_ERROR_OUT_OF_MEMORY", "-1"]
        assert out[2] == ["alloc", "CUDA_SUCCESS", "0"]
    finally:
        holder.kill()
        holder.wait()


def test_a_forked_child_charges_its_own_allocations_only(share):
    """Across fork (the shim's fork handlers): the child holds none of its parent's allocations, so
    freeing one refunds nothing, and charges its own in a slot of its own, released when it exits;
    the parent's charge stays."""
    limits = {"NVC_SHARE_MEMORY_LIMIT": "1Gi"}
    out, _ = share.run("share_app", "init", "alloc", 600 * MIB, "fork", "free", 0, "meminfo", "alloc", 600 * MIB,
                       "alloc", 300 * MIB, "meminfo", "end", "meminfo", limits=limits)
    assert out[2:] == [["free", "0"], ["meminfo", "0", str(GIB - 600 * MIB), str(GIB)], ["alloc", "2", "-1"],
                       ["alloc", "0", "1"], ["meminfo", "0", str(GIB - 900 * MIB), str(GIB)], ["forked", "0"],
                       ["meminfo", "0", str(GIB - 600 * MIB), str(GIB)]]


def test_sigkilled_process_memory_is_reclaimed_within_a_second(share):
    limits = {"NVC_SHARE_MEMORY_LIMIT": "1Gi"}
    holder = share.holder("alloc", 600 * MIB, limits=limits)
    assert share.probe("alloc", 600 * MIB, limits=limits) == [["alloc", "CUDA_ERROR_OUT_OF_MEMORY", "-1"]]
    start = time.monotonic()
    holder.kill()                     # not waited for yet: a zombie must not keep its charge either
    while Path(f"/proc/{holder.pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
        time.sleep(0.001)             # SIGKILL is delivered asynchronously: probe once it is dead
    out = share.probe("alloc", 600 * MIB, limits=limits)
    elapsed = time.monotonic() - start
    holder.wait()
    assert out == [["alloc", "CUDA_SUCCESS", "0"]]
    assert elapsed < 1.0


def test_lock_holder_killed_does_not_wedge(share, programs):
    limits = {"NVC_SHARE_MEMORY_LIMIT": "1Gi"}
    share.probe("alloc", MIB, limits=limits)            # creates the region
    locker = subprocess.Popen([str(programs["hold_lock"]), str(share.dir / "region")], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert locker.stdout.readline().strip() == "locked"
        waiter = subprocess.Popen([str(programs["cuda_probe"]), "init", "ctx", "0", "alloc", str(MIB)],
                                  env=share.env(limits), stdout=subprocess.PIPE, text=True)
        with pytest.raises(subprocess.TimeoutExpired):
            waiter.wait(timeout=0.5)  # the allocation really waits for the region lock
        start = time.monotonic()
        locker.send_signal(signal.SIGKILL)
        waiter.wait(timeout=5)
        assert time.monotonic() - start < 5
        assert waiter.stdout.read().split("\n")[2] == "alloc CUDA_SUCCESS 0"
    finally:
        locker.kill()
        locker.wait()


def region_header(path: Path) -> tuple[bytes, int, int, int]:
    """(magic, version, config hash, memory default) from the documented layout."""
    data = path.read_bytes()[:48]
    magic, version, _size, config_hash = struct.unpack_from("<8sIIQ", data, 0)
    (memory_default,) = struct.unpack_from("<Q", data, 40)
    return magic, version, config_hash, memory_default


def test_stale_region_with_other_limits_is_reinitialised(share):
    big = {"NVC_SHARE_MEMORY_LIMIT": "8Gi"}
    holder = share.holder("alloc", 6 * GIB, limits=big)
    holder.kill()
    holder.wait()
    magic, version, old_hash, default = region_header(share.dir / "region")
    assert (magic, version, default) == (b"NVCSHRG\0", 1, 8 * GIB)
    out, err = share.run("cuda_probe", "init", "ctx", 0, "meminfo", "alloc", 900 * MIB, "alloc", 200 * MIB,
                         limits={"NVC_SHARE_MEMORY_LIMIT": "1Gi"})
    assert "re-initialising stale shared region" in err
    assert meminfo(out[2]) == (GIB, GIB)
    assert out[3] == ["alloc", "CUDA_SUCCESS", "0"]
    assert out[4] == ["alloc", "CUDA_ERROR_OUT_OF_MEMORY", "-1"]
    _, _, new_hash, default = region_header(share.dir / "region")
    assert new_hash != old_hash and default == GIB


def test_region_in_use_under_other_limits_keeps_ours(share):
    holder = share.holder("alloc", MIB, limits={"NVC_SHARE_MEMORY_LIMIT": "8Gi"})
    try:
        out, err = share.run("cuda_probe", "init", "ctx", 0, "alloc", 2 * GIB,
                             limits={"NVC_SHARE_MEMORY_LIMIT": "1Gi"})
        assert "in use under other limits" in err
        assert out[2] == ["alloc", "CUDA_ERROR_OUT_OF_MEMORY", "-1"]
    finally:
        holder.kill()
        holder.wait()


def in_hook_dir(shared: Path, argv: list[str]) -> list[str]:
    """``argv`` run with ``shared`` at /var/run/nvc-share, where the hook mounts a container's shared
    directory (the fixed path: its limits file is the authority), in a mount namespace of its own."""
    script = 'mount -t tmpfs -o size=1m tmpfs /run && mkdir /run/nvc-share && mount --bind "$0" /run/nvc-share ' \
             '&& exec "$@"'
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", script, str(shared), *argv]


@pytest.mark.parametrize("size", [0, REGION_SIZE - 8, REGION_SIZE, REGION_SIZE + 4096])
def test_hook_region_of_a_wrong_size_is_never_resized(share, programs, tmp_path, size):
    """nvc-py makes the hook's region at its final size in a tmpfs of fixed size. One the container
    truncated or grew is neither resized nor shared: the process enforces its own limits alone, and
    says so; one of the right size is used as is."""
    shared = tmp_path / "hook"
    shared.mkdir()
    (shared / "limits").write_text("version=1\nmemory_limit=1Gi\n")
    region = shared / "region"
    region.write_bytes(b"")
    os.truncate(region, size)
    argv = [str(programs["cuda_probe"]), "init", "ctx", "0", "meminfo", "alloc", str(GIB + MIB)]
    result = subprocess.run(in_hook_dir(shared, argv), env=share.env({"NVC_SHARE_MEMORY_LIMIT": "60G"}),
                            capture_output=True, text=True, timeout=20)
    assert result.returncode == 0, result.stderr
    out = [line.split() for line in result.stdout.splitlines()]
    assert meminfo(out[2])[1] == GIB
    assert out[3] == ["alloc", "CUDA_ERROR_OUT_OF_MEMORY", "-1"]
    assert region.stat().st_size == size
    alone = f"is {size} bytes, not {REGION_SIZE}: this process enforces its own limits alone"
    if size == REGION_SIZE:
        assert "alone" not in result.stderr and region_header(region)[0] == b"NVCSHRG\0"
    else:
        assert alone in result.stderr


# ---------------------------------------------------------------- interception

def test_cuGetProcAddress_hands_out_the_wrappers(share):
    out, _ = share.run("share_app", "which", "cuMemAlloc", "which", "cuCtxSetCurrent", "--ptds",
                       "which", "cuLaunchKernel", "which", "cuMemAllocAsync", "which", "cuGetProcAddress",
                       limits={"NVC_SHARE_MEMORY_LIMIT": "1Gi"})
    where = {(line[1], line[3]): Path(line[2]).name for line in out}
    assert where[("cuMemAlloc", "cuMemAlloc_v2")] == "libnvc-share.so"
    assert Path(out[1][2]).name.startswith("libcuda.so")                 # not wrapped: the real one
    assert where[("cuLaunchKernel", "cuLaunchKernel_ptsz")] == "libnvc-share.so"
    assert where[("cuMemAllocAsync", "cuMemAllocAsync_ptsz")] == "libnvc-share.so"
    assert where[("cuGetProcAddress", "cuGetProcAddress_v2")] == "libnvc-share.so"


def test_cuGetProcAddress_allocations_are_limited(share):
    out, _ = share.run("share_app", "init", "alloc", 700 * MIB, "alloc", 700 * MIB, "meminfo",
                       limits={"NVC_SHARE_MEMORY_LIMIT": "1Gi"})
    assert out[1] == ["alloc", "0", "0"]
    assert out[2] == ["alloc", "2", "-1"]           # exactly CUDA_ERROR_OUT_OF_MEMORY
    assert out[3] == ["meminfo", "0", str(GIB - 700 * MIB), str(GIB)]


def test_nvidia_smi_reports_the_limit_as_total(share):
    holder = share.holder("alloc", GIB, limits={"NVC_SHARE_MEMORY_LIMIT": "4Gi"})
    try:
        result = subprocess.run([str(share.root / "usr" / "bin" / "nvidia-smi"),
                                 "--query-gpu=memory.total,memory.used,memory.free", "--format=csv,noheader"],
                                env=share.env({"NVC_SHARE_MEMORY_LIMIT": "4Gi"}), capture_output=True, text=True,
                                timeout=20)
    finally:
        holder.kill()
        holder.wait()
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "4096 MiB, 1024 MiB, 3072 MiB"
    assert lines[1] == "4096 MiB, 0 MiB, 4096 MiB"


def test_nvidia_smi_keeps_working_with_a_broken_configuration(share):
    result = subprocess.run([str(share.root / "usr" / "bin" / "nvidia-smi"), "-L"],
                            env=share.env({"NVC_SHARE_MEMORY_LIMIT": "junk"}), capture_output=True, text=True,
                            timeout=20)
    assert result.returncode == 0 and "GPU 0" in result.stdout


# ---------------------------------------------------------------- compute share

def busy_fraction(share, percent: int, grid: int, launches: int = 60, kernel_us: int = 3000) -> float:
    out, _ = share.run("cuda_probe", "init", "ctx", 0, "launch", launches, grid, 128, "sync",
                       limits={"NVC_SHARE_COMPUTE": str(percent), "FAKE_CUDA_KERNEL_US": str(kernel_us)})
    wall_us = int(out[2][2]) + int(out[3][2])
    return launches * kernel_us / wall_us


def test_compute_share_throttles_full_grids(share):
    assert busy_fraction(share, 100, 264) > 0.9
    assert 0.4 <= busy_fraction(share, 50, 264) <= 0.6


def test_compute_share_holds_for_microsecond_kernels(share):
    """20 us kernels, thousands queued: each launch still settles in one event query (the harvest stops
    at the first kernel still running), so the share is the requested one, not the launch cost's."""
    # 0.4 s of GPU work: the 10 ms of credit a bucket may bank at the start moves it by ~1 point
    assert 0.47 <= busy_fraction(share, 50, 264, launches=20000, kernel_us=20) <= 0.53
    assert 0.72 <= busy_fraction(share, 75, 264, launches=20000, kernel_us=20) <= 0.78


def steps_per_second(share, percent: int, grid: int, host_us: int, kernel_us: int = 1000) -> float:
    """Rate of a loop of about 0.4 s uncapped: 8 of the cap's 50 ms periods, so the part slice at its
    end moves a ratio by about a point."""
    steps = 400_000 // (kernel_us + host_us)
    out, _ = share.run("cuda_probe", "init", "ctx", 0, "steps", steps, grid, 128, host_us,
                       limits={"NVC_SHARE_COMPUTE": str(percent), "FAKE_CUDA_KERNEL_US": str(kernel_us)})
    assert out[2][:2] == ["steps", "CUDA_SUCCESS"], out
    return steps / int(out[2][2]) * 1e6


@pytest.mark.parametrize(("grid", "host_us"), [(1, 0), (264, 1000), (1, 500)])
def test_a_cap_is_a_share_of_the_workloads_own_throughput(share, grid, host_us):
    """A cap is a share of wall time: a one-block grid, or a loop that waits for each kernel and then
    works on the host (a training step), runs at the cap's fraction of its own uncapped rate, not
    faster because its kernels keep the GPU busy for less than all of the time. (Launches are where
    the shim can hold a process: host work after a slice's last launch runs on, which adds up to one
    host segment per 50 ms period; here at most 1 ms, 2 points.)"""
    native = steps_per_second(share, 100, grid, host_us)
    assert 0.45 <= steps_per_second(share, 50, grid, host_us) / native <= 0.55
    assert 0.2 <= steps_per_second(share, 25, grid, host_us) / native <= 0.3


def test_a_capped_process_logs_where_its_launches_waited(share):
    """NVC_SHARE_LOG=2: at exit the shim says how long the process's launches waited for the cap's
    slice, for room in the queue and for other containers' shares, and how many slices it started;
    a loop of 1 ms kernels capped at 50 % for about 0.4 s waits for the slice about half of it."""
    start = time.monotonic()
    out, err = share.run("cuda_probe", "init", "ctx", 0, "steps", 200, 264, 128, 0,
                         limits={"NVC_SHARE_COMPUTE": "50", "FAKE_CUDA_KERNEL_US": "1000", "NVC_SHARE_LOG": "2"})
    wall_ms = (time.monotonic() - start) * 1000
    assert out[2][:2] == ["steps", "CUDA_SUCCESS"], out
    logged = re.search(r"compute: (\d+) throttled launches, (\d+) event pairs; waited ([\d.]+) ms for the slice, "
                       r"([\d.]+) ms for queue room, ([\d.]+) ms for other containers' shares; (\d+) slices started", err)
    assert logged, err
    launches, pairs, slice_ms, _, turn_ms, slices = (float(v) for v in logged.groups())
    assert launches == 200 and 1 <= pairs <= 200
    assert 0.3 * wall_ms <= slice_ms <= 0.7 * wall_ms, (slice_ms, wall_ms)
    assert turn_ms == 0 and slices >= 5
    # without a cap nothing is throttled, and nothing is logged
    _, err = share.run("cuda_probe", "init", "ctx", 0, "steps", 20, 264, 128, 0,
                       limits={"FAKE_CUDA_KERNEL_US": "1000", "NVC_SHARE_LOG": "2"})
    assert "throttled launches" not in err


# ---------------------------------------------------------------- weighted scheduler (fake clock)

class Simulated(NamedTuple):
    first: float                 # GPU share in percent, first half of the run
    second: float                # second half
    wait_ms: int                 # its longest wait


def simulate(programs, *tenants: str, ms: int = 2000) -> tuple[list[Simulated], float]:
    """Simulated tenants WEIGHT:CAP:KERNEL_US:BUSY_FROM_MS:BUSY_UNTIL_MS[:HOST_US|:LIE] under the shim's
    scheduler decision on a GPU that time-slices between them (tests/share_programs/sched_sim.c); also
    returns how busy the GPU was, in percent."""
    out = subprocess.run([str(programs["sched_sim"]), str(ms), *tenants], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    lines = [line.split() for line in out.splitlines()]
    return ([Simulated(int(f[2]) / 10, int(f[3]) / 10, int(f[4])) for f in lines if f[0] == "tenant"],
            next(int(f[1]) / 10 for f in lines if f[0] == "gpu"))


@pytest.mark.parametrize(("tenants", "want"), [
    (["1:100:1600:0:2000", "1:100:1600:0:2000"], [50, 50]),
    (["1:100:1600:0:2000", "3:100:1600:0:2000"], [25, 75]),
    (["1:100:1600:0:2000", "3:100:200:0:2000"], [25, 75]),               # short and long kernels
    (["1:100:1600:0:2000", "1:100:30000:0:2000", "2:100:200:0:2000"], [25, 25, 50]),
    (["1:100:1600:0:2000"], [100]),                                      # alone: the whole GPU
    (["1:75:1600:0:2000"], [75]),                                        # alone, capped
    (["1:25:1600:0:2000", "1:100:1600:0:2000"], [25, 75]),               # a capped one leaves the rest
    (["1:100:1000:0:2000", "3:100:1000:0:2000", "1:100:1000:0:2000", "5:100:1000:0:2000"], [10, 30, 10, 50]),
    (["10:100:1000:0:2000"] + ["1:100:1000:0:2000"] * 4, [71, 7, 7, 7, 7]),
    # a tenant publishing random values is read as idle: the others' ratios are unchanged
    (["1:100:1600:0:2000", "3:100:1600:0:2000", "1:100:0:0:2000:garbage"], [25, 75, 0]),
])
def test_scheduler_gives_each_busy_tenant_its_weight(programs, tenants, want):
    """Busy tenants get the GPU by weight, within 5 points once their shares have settled (the second
    half; 7 in the first, which holds the 200 ms the shares take to build up), and the GPU never idles
    while one of them has work: the lighter ones are held back only while a heavier one under its share
    has work on the GPU."""
    shares, gpu = simulate(programs, *tenants)
    for share, expected in zip(shares, want):
        assert abs(share.first - expected) <= 7 and abs(share.second - expected) <= 5, shares
    assert gpu >= sum(want) - 1, gpu


def test_scheduler_gives_an_idle_tenants_share_to_the_others(programs):
    (a, b), _ = simulate(programs, "1:100:1600:0:2000", "3:100:1600:0:1000")
    assert abs(a.first - 25) <= 5 and abs(b.first - 75) <= 5
    assert a.second >= 97 and b.second <= 1
    # and one coming back after idling gets its weight at once, not the time it idled
    (a, b), _ = simulate(programs, "1:100:1600:0:2000", "1:100:1600:1000:2000")
    assert a.first >= 97 and abs(a.second - 50) <= 5 and abs(b.second - 50) <= 5


def test_a_tenant_that_cannot_use_its_share_leaves_it_to_the_others(programs):
    """Work-conserving: the weight-3 tenant's host needs 1.5 ms before each 1 ms kernel, so it can keep
    the GPU busy only about two thirds of the time however much it is entitled to; the weight-1 tenant
    fills the rest instead of waiting, and the GPU stays busy. With the host gaps the other way round,
    the light tenant's own gaps cost nobody anything either."""
    (light, heavy), gpu = simulate(programs, "1:100:1600:0:2000", "3:100:1000:0:2000:1500")
    assert gpu >= 99 and heavy.second >= 60 and light.second >= 30, (light, heavy, gpu)
    (light, heavy), gpu = simulate(programs, "1:100:1000:0:2000:1500", "3:100:1600:0:2000")
    assert gpu >= 99 and abs(light.second - 25) <= 5 and abs(heavy.second - 75) <= 5, (light, heavy, gpu)


@pytest.mark.parametrize("claim", ["busy", "garbage"])
def test_a_lying_tenant_cannot_push_an_honest_one_below_its_weight(programs, claim):
    """A tenant (granted weight 3) that launches nothing and claims, every step, to have work queued
    for almost 10 s and no share at all, or publishes random values: an honest tenant (weight 1) is held
    back only while it is over its own entitlement (a quarter), so it gets at least that, and waits no
    longer than a few milliseconds at a time."""
    (honest, liar), _ = simulate(programs, "1:100:1600:0:2000", f"3:100:0:0:2000:{claim}")
    assert honest.wait_ms <= 20 and honest.first >= 25 - 3 and honest.second >= 25 - 3, honest
    assert liar.first == liar.second == 0


# (weight, cap or None, 1 ms kernels, host µs after each or None: back to back) per tenant -> (lowest,
# highest) wall time in seconds of each
TENANT_CASES = {
    "1:3, the 3 under its share": ([(1, None, 300, None), (3, None, 400, 1000)], [(0.45, 0.8), (0.75, 1.0)]),
    "1:3, the 3 done early": ([(1, None, 600, None), (3, None, 100, 1000)], [(0.6, 0.9), (0.18, 0.35)]),
    "1 capped at 25 % : 1": ([(1, 25, 250, None), (1, None, 750, None)], [(0.9, 1.25), (0.7, 1.25)]),
    "1:1": ([(1, None, 500, None), (1, None, 500, None)], [(0.45, 0.7), (0.45, 0.7)]),
}


@pytest.mark.parametrize("case", TENANT_CASES)
def test_a_tenant_over_its_share_is_held_while_the_others_run_free(share, programs, tmp_path, case):
    """Tenants (each its own share directory, one scheduler directory) busy with 1 ms kernels at once.
    Each process's fake GPU is its own, so nothing slows a tenant but the scheduler, and each is charged
    its kernels' work. 1:3 where the weight-3 tenant waits 1 ms on its host after each kernel (busy half
    the time, under its three quarters): the weight-1 tenant, over its quarter, is held while the other
    has work (300 kernels in ~0.6 s, not 0.3), the other runs free (400 in ~0.8 s); when the weight-3
    one is done early (~0.2 s) the other runs free from then on (600 kernels in ~0.7 s); one capped at
    25 % holds the other back at most during its own slices, 25 % of the time (250 kernels in ~1 s, the
    other's 750 in 0.75 to 1 s); 1:1, both within their half, run free."""
    tenants, want = TENANT_CASES[case]
    sched = tmp_path / "sched"
    sched.mkdir()
    procs = [tenant(share, programs, sched, f"t{i}", weight, launches, cap, host_us)
             for i, (weight, cap, launches, host_us) in enumerate(tenants)]
    walls = [wall_s(proc, timeout=30) for proc in procs]
    assert sorted(p.name for p in sched.iterdir()) == [f"t{i}" for i in range(len(tenants))]
    assert all(low <= wall <= high for wall, (low, high) in zip(walls, want)), walls


def tenant(share, programs, sched: Path, name: str, weight: int, launches: int,
           cap: int | None = None, host_us: int | None = None) -> subprocess.Popen:
    """A tenant's process with plain LD_PRELOAD use (its own share directory, its scheduler file
    ``name`` in ``sched``) launching 1 ms kernels on its own fake GPU 0 back to back, then synchronising;
    or with host_us, waiting for each and then spending host_us on its host (a training-like loop)."""
    limits = {"NVC_SHARE_WEIGHT": str(weight), "FAKE_CUDA_KERNEL_US": "1000", "NVC_SHARE_SCHED_DIR": str(sched),
              "NVC_SHARE_TENANT": name, **({"NVC_SHARE_COMPUTE": str(cap)} if cap else {})}
    env = dict(share.env(limits), NVC_SHARE_DIR=str(share.dir.parent / name))
    work = ["launch", str(launches), "264", "128", "sync"] if host_us is None else \
        ["steps", str(launches), "264", "128", str(host_us)]
    return subprocess.Popen([str(programs["cuda_probe"]), "init", "ctx", "0", *work],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wall_s(proc: subprocess.Popen, timeout: float) -> float:
    """Seconds a tenant took to launch its kernels and see them done; it must exit 0 in time."""
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, (proc.returncode, err)
    lines = [line.split() for line in out.splitlines()]
    return sum(int(line[2]) for line in lines[2:]) / 1e6


# ---------------------------------------------------------------- a hostile tenant's own scheduler file

ENTRY = struct.Struct("<40sQQQQQQIIIIIIqQ")      # native/sched.c struct nvc_sched_entry


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
    else:                             # garbage, written over it (never truncating it)
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
    from nvc.plan.share import limits_text

    sched = tmp_path / "sched"

    def grant(name: str, request) -> None:
        sharefiles._write_sched_file(str(sched), name, limits_text(request))

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
    started += [tenant(share, programs, sched, "t0", 1, 800), tenant(share, programs, sched, "t1", 3, 2400),
                tenant(share, programs, sched, "hostile", 1000, 1_000_000)]
    time.sleep(0.3)
    attack(how, sched / "hostile")
    stop = threading.Event()

    def rewrite() -> None:            # the garbage again, fresh, every 2 ms while the honest ones run
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


@pytest.mark.parametrize(("granted", "low", "high"), [
    ((("", 1),), 0.35, 0.7),                                  # granted 1 for every device
    ((("", 1000), (GPU0, 1)), 0.35, 0.7),                     # 1 for this GPU, by UUID
    ((("0", 1), ("1", 3)), 0.8, 1.5),                         # by NVML index, unknown here: at most 3
])
def test_a_peers_weight_is_the_one_the_hook_granted(share, programs, hook_sched, started, granted, low, high):
    """A peer claiming weight 1000 (its own env, its own file) runs a loop that keeps the GPU busy about
    62 % of the time (1 ms kernels, 0.6 ms of host work after each), and the honest tenant (weight 1,
    400 kernels of 1 ms back to back) is held while the peer has work only if the peer is under what
    the hook granted it, read with the limits grammar from the peer's granted limits for this GPU: with
    1 (for all devices, or by UUID over a default of 1000) half, which its 62 % is over, so the honest
    one runs free (0.4 s); where the peer's weights are by NVML index, which is the peer's own
    numbering, the largest of them (3: three quarters), under which it stays, so the honest one runs
    only in its gaps (about 1 s). Taken at its word (1000), the peer would hold it the same way."""
    from nvc.plan.request import ShareRequest

    sched, grant = hook_sched
    grant("honest", ShareRequest(weight=(("", 1),)))
    grant("peer", ShareRequest(weight=granted))
    started += [tenant(share, programs, sched, "honest", 1, 400),
                tenant(share, programs, sched, "peer", 1000, 1_000_000, host_us=600)]
    wall = wall_s(started[0], timeout=20)
    print(f"wall {wall}")
    assert low <= wall <= high, wall

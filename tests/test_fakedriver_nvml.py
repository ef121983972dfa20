"""The fake libnvidia-ml and nvidia-smi answer like the real ones, from the machine YAML.

Every probe runs in a child process (its own dlopen of libnvidia-ml.so.1, found through
LD_LIBRARY_PATH) while the fake's /dev nodes are shown at /dev by the ``active_*`` fixtures, so
visibility tests can delete nodes in the private /dev overlay without touching the host.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Runs in the child: pynvml for the normal calls, raw ctypes where pynvml would not reach the
# library (calls before init, short buffers, wrong struct versions).
PROBE = r"""
import ctypes, json, sys
import pynvml as n

def code(fn, *args):
    try:
        fn(*args)
        return 0
    except n.NVMLError as err:
        return err.value

def call(fn, *args):
    try:
        return fn(*args)
    except n.NVMLError as err:
        return {"error": err.value}

lib = ctypes.CDLL("libnvidia-ml.so.1")
count = ctypes.c_uint()
out = {"before_init": lib.nvmlDeviceGetCount_v2(ctypes.byref(count))}
out["init"] = code(n.nvmlInit)
if out["init"]:
    print(json.dumps(out)); sys.exit()
out.update(driver=n.nvmlSystemGetDriverVersion(), nvml=n.nvmlSystemGetNVMLVersion(),
           cuda=n.nvmlSystemGetCudaDriverVersion(), cuda_v2=n.nvmlSystemGetCudaDriverVersion_v2(),
           count=n.nvmlDeviceGetCount(), gpus=[])
for i in range(out["count"]):
    h = n.nvmlDeviceGetHandleByIndex(i)
    uuid = n.nvmlDeviceGetUUID(h)
    pci = n.nvmlDeviceGetPciInfo(h)
    gpu = dict(index=n.nvmlDeviceGetIndex(h), name=n.nvmlDeviceGetName(h), uuid=uuid, bus_id=pci.busId,
               bus_id_legacy=pci.busIdLegacy, pci_device_id=pci.pciDeviceId, minor=n.nvmlDeviceGetMinorNumber(h),
               brand=n.nvmlDeviceGetBrand(h), cc=list(n.nvmlDeviceGetCudaComputeCapability(h)),
               arch=n.nvmlDeviceGetArchitecture(h), memory=n.nvmlDeviceGetMemoryInfo(h).total,
               memory_v2=n.nvmlDeviceGetMemoryInfo(h, n.nvmlMemory_v2).total,
               free=n.nvmlDeviceGetMemoryInfo(h).free, used=n.nvmlDeviceGetMemoryInfo(h).used,
               by_uuid=n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByUUID(uuid)),
               by_bus_id=n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByPciBusId(pci.busId)),
               by_short_bus_id=n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByPciBusId(pci.busId[4:])),
               multi_gpu_board=n.nvmlDeviceGetMultiGpuBoard(h), is_mig=n.nvmlDeviceIsMigDeviceHandle(h).value,
               gi_on_gpu=code(n.nvmlDeviceGetGpuInstanceId, h), migs=[])
    # the unversioned export, nvml.h's first layout (52 bytes): what is past it must stay as it was
    v1 = ctypes.create_string_buffer(b"\xaa" * 68, 68)
    gpu["pci_v1"] = [lib.nvmlDeviceGetPciInfo(h, v1), v1.raw[:16].split(b"\0")[0].decode(),
                     list(memoryview(v1.raw[16:28]).cast("I")), v1.raw[52:] == b"\xaa" * 16]
    gpu["mig_mode"] = call(n.nvmlDeviceGetMigMode, h)
    gpu["max_migs"] = call(n.nvmlDeviceGetMaxMigDeviceCount, h)
    max_migs = gpu["max_migs"] if isinstance(gpu["max_migs"], int) else 0
    gpu["mig_past_max"] = code(n.nvmlDeviceGetMigDeviceHandleByIndex, h, max_migs)
    for m in range(max_migs):
        try:
            mh = n.nvmlDeviceGetMigDeviceHandleByIndex(h, m)
        except n.NVMLError as err:
            gpu["mig_end"] = [m, err.value]
            break
        attrs = n.nvmlDeviceGetAttributes(mh)
        gpu["migs"].append(dict(
            uuid=n.nvmlDeviceGetUUID(mh), name=n.nvmlDeviceGetName(mh), gi=n.nvmlDeviceGetGpuInstanceId(mh),
            ci=n.nvmlDeviceGetComputeInstanceId(mh), memory=n.nvmlDeviceGetMemoryInfo(mh).total,
            is_mig=n.nvmlDeviceIsMigDeviceHandle(mh).value, sm_count=attrs.multiprocessorCount,
            parent=n.nvmlDeviceGetUUID(n.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mh)),
            by_uuid=n.nvmlDeviceGetUUID(n.nvmlDeviceGetHandleByUUID(n.nvmlDeviceGetUUID(mh))),
            bus_id=n.nvmlDeviceGetPciInfo(mh).busId, minor=code(n.nvmlDeviceGetMinorNumber, mh),
            distinct=ctypes.cast(mh, ctypes.c_void_p).value != ctypes.cast(h, ctypes.c_void_p).value))
    out["gpus"].append(gpu)
if out["count"]:
    h0 = n.nvmlDeviceGetHandleByIndex(0)
    short = ctypes.create_string_buffer(8)
    wrong_version = n.c_nvmlMemory_v2_t(version=1)
    out["errors"] = dict(
        bad_index=code(n.nvmlDeviceGetHandleByIndex, out["count"]),
        unknown_uuid=code(n.nvmlDeviceGetHandleByUUID, "GPU-00000000-0000-0000-0000-000000000000"),
        unknown_bus_id=code(n.nvmlDeviceGetHandleByPciBusId, "00000000:FF:1F.0"),
        bad_bus_id=code(n.nvmlDeviceGetHandleByPciBusId, "not a bus id"),
        short_name=lib.nvmlDeviceGetName(h0, short, 8),
        short_driver=lib.nvmlSystemGetDriverVersion(short, 8),
        null_count=lib.nvmlDeviceGetCount_v2(None),
        bad_handle=lib.nvmlDeviceGetMinorNumber(ctypes.c_void_p(16), ctypes.byref(count)),
        memory_version=lib.nvmlDeviceGetMemoryInfo_v2(h0, ctypes.byref(wrong_version)),
        error_string=n.nvmlErrorString(n.NVML_ERROR_NOT_FOUND),
    )
n.nvmlShutdown()
out["after_shutdown"] = lib.nvmlDeviceGetCount_v2(ctypes.byref(count))
print(json.dumps(out))
"""

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_BRAND_NVIDIA = 14
NVML_DEVICE_ARCH_AMPERE = 7
NVML_DEVICE_ARCH_HOPPER = 9


def _env(fake) -> dict[str, str]:
    return dict(os.environ, LD_LIBRARY_PATH=str(fake.lib_dir))


def probe(fake) -> dict:
    """What a fresh process learns through pynvml from the fake NVML, with /dev as it is now."""
    result = subprocess.run([sys.executable, "-c", PROBE], env=_env(fake), capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def smi(fake, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(fake.bin_dir / "nvidia-smi"), *args], env=_env(fake), capture_output=True, text=True, timeout=30
    )


def expected_gpu(machine_gpu: dict, index: int) -> dict:
    """The probe's view of one YAML GPU when it is visible as NVML index ``index``."""
    domain, bus, device = machine_gpu["pci_bus_id"].replace(".", ":").split(":")[:3]
    return {
        "index": index,
        "name": machine_gpu["name"],
        "uuid": machine_gpu["uuid"],
        "bus_id": machine_gpu["pci_bus_id"],
        "bus_id_legacy": f"{domain[4:]}:{bus}:{device}.0",
        "pci_device_id": machine_gpu["pci_device_id"],
        "minor": machine_gpu["minor"],
        "brand": NVML_BRAND_NVIDIA,
        "cc": [int(x) for x in machine_gpu["compute_capability"].split(".")],
        "memory": machine_gpu["memory"],
        "memory_v2": machine_gpu["memory"],
        "free": machine_gpu["memory"],
        "used": 0,
        "by_uuid": index,
        "by_bus_id": index,
        "by_short_bus_id": index,
        "pci_v1": [0, f"{domain[4:]}:{bus}:{device}.0", [int(domain, 16), int(bus, 16), int(device, 16)], True],
        "multi_gpu_board": 0,
        "is_mig": 0,
        "gi_on_gpu": NVML_ERROR_NOT_SUPPORTED,
    }


def test_system_and_gpus_match_the_machine(active_2gpu):
    fake = active_2gpu
    out = probe(fake)
    assert out["before_init"] == NVML_ERROR_UNINITIALIZED
    assert out["init"] == 0
    assert out["driver"] == "580.95.05" == fake.driver_version
    assert out["nvml"] == "13.580.95.05"
    assert out["cuda"] == out["cuda_v2"] == 13000
    assert out["count"] == 2
    for index, machine_gpu in enumerate(fake.machine["gpus"]):
        got = out["gpus"][index]
        for key, value in expected_gpu(machine_gpu, index).items():
            assert got[key] == value, (index, key)
    assert [g["arch"] for g in out["gpus"]] == [NVML_DEVICE_ARCH_HOPPER, NVML_DEVICE_ARCH_AMPERE]
    assert out["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3" and out["gpus"][0]["memory"] == 80 << 30
    assert out["after_shutdown"] == NVML_ERROR_UNINITIALIZED


def test_mig_devices_match_the_machine(active_2gpu):
    out = probe(active_2gpu)
    h100, a100 = out["gpus"]
    assert h100["mig_mode"] == h100["max_migs"] == {"error": NVML_ERROR_NOT_SUPPORTED}
    assert h100["mig_past_max"] == NVML_ERROR_NOT_SUPPORTED
    assert a100["mig_mode"] == [1, 1]
    assert a100["max_migs"] == 7
    assert a100["mig_past_max"] == NVML_ERROR_INVALID_ARGUMENT
    assert a100["mig_end"] == [2, NVML_ERROR_NOT_FOUND]
    expected = active_2gpu.machine["gpus"][1]["mig"]["devices"]
    assert [(m["gi"], m["ci"], m["uuid"], m["memory"], m["sm_count"]) for m in a100["migs"]] == [
        (1, 0, expected[0]["uuid"], 10 << 30, 28),
        (2, 0, expected[1]["uuid"], 20 << 30, 42),
    ]
    assert [m["name"] for m in a100["migs"]] == [
        "NVIDIA A100-SXM4-40GB MIG 2g.10gb",
        "NVIDIA A100-SXM4-40GB MIG 3g.20gb",
    ]
    for mig in a100["migs"]:
        assert mig["uuid"].startswith("MIG-")
        assert mig["is_mig"] == 1 and mig["distinct"]
        assert mig["parent"] == a100["uuid"]
        assert mig["by_uuid"] == mig["uuid"]
        assert mig["bus_id"] == a100["bus_id"]
        assert mig["minor"] == NVML_ERROR_NOT_SUPPORTED


def test_error_codes(active_2gpu):
    errors = probe(active_2gpu)["errors"]
    assert errors == {
        "bad_index": NVML_ERROR_INVALID_ARGUMENT,
        "unknown_uuid": NVML_ERROR_NOT_FOUND,
        "unknown_bus_id": NVML_ERROR_NOT_FOUND,
        "bad_bus_id": NVML_ERROR_INVALID_ARGUMENT,
        "short_name": NVML_ERROR_INSUFFICIENT_SIZE,
        "short_driver": NVML_ERROR_INSUFFICIENT_SIZE,
        "null_count": NVML_ERROR_INVALID_ARGUMENT,
        "bad_handle": NVML_ERROR_INVALID_ARGUMENT,
        "memory_version": NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
        "error_string": "Not Found",
    }


@pytest.mark.parametrize(
    "removed, visible",
    [
        (["nvidia1"], [0]),
        (["nvidia0"], [1]),
        (["nvidia0", "nvidia1"], []),
    ],
)
def test_only_gpus_with_device_nodes_are_visible(active_2gpu, removed, visible):
    """A container given a subset of /dev/nvidia<N> sees only those GPUs, re-indexed from 0."""
    for name in removed:
        os.unlink(f"/dev/{name}")  # inside the private /dev overlay of the active fixture
    out = probe(active_2gpu)
    machine_gpus = active_2gpu.machine["gpus"]
    assert out["count"] == len(visible)
    assert [g["uuid"] for g in out["gpus"]] == [machine_gpus[i]["uuid"] for i in visible]
    assert [g["index"] for g in out["gpus"]] == list(range(len(visible)))
    if visible == [1]:
        assert len(out["gpus"][0]["migs"]) == 2


def test_only_mig_devices_with_capability_nodes_are_visible(active_2gpu):
    gi2 = 3 + 1 * 135 + 2 * 9  # GPU minor 1, GPU instance 2: the second MIG device's access node
    os.unlink(f"/dev/nvidia-caps/nvidia-cap{gi2}")
    a100 = probe(active_2gpu)["gpus"][1]
    assert [m["gi"] for m in a100["migs"]] == [1]
    assert a100["mig_end"] == [1, NVML_ERROR_NOT_FOUND]


def test_init_fails_without_nvidiactl(active_2gpu):
    os.unlink("/dev/nvidiactl")
    assert probe(active_2gpu)["init"] == NVML_ERROR_DRIVER_NOT_LOADED
    result = smi(active_2gpu, "-L")
    assert result.returncode == NVML_ERROR_DRIVER_NOT_LOADED
    assert "couldn't communicate with the NVIDIA driver" in result.stderr


def test_mig_capable_gpu_with_mig_disabled(active_local_nvidia):
    gpu = probe(active_local_nvidia)["gpus"][0]
    assert gpu["uuid"] == "GPU-956cc334-000a-fda6-20b6-917f691dc1de"
    assert gpu["bus_id"] == "00000000:00:06.0"
    assert gpu["mig_mode"] == [0, 0]
    assert gpu["max_migs"] == 0
    assert gpu["mig_past_max"] == NVML_ERROR_INVALID_ARGUMENT
    assert gpu["migs"] == []


def test_nvidia_smi_list(active_2gpu):
    result = smi(active_2gpu, "-L")
    assert result.returncode == 0, result.stderr
    gpus = active_2gpu.machine["gpus"]
    migs = gpus[1]["mig"]["devices"]
    assert result.stdout.splitlines() == [
        f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {gpus[0]['uuid']})",
        f"GPU 1: NVIDIA A100-SXM4-40GB (UUID: {gpus[1]['uuid']})",
        f"  MIG 2g.10gb     Device  0: (UUID: {migs[0]['uuid']})",
        f"  MIG 3g.20gb     Device  1: (UUID: {migs[1]['uuid']})",
    ]


def test_nvidia_smi_list_follows_visible_nodes(active_2gpu):
    os.unlink("/dev/nvidia0")
    lines = smi(active_2gpu, "-L").stdout.splitlines()
    assert lines[0] == f"GPU 0: NVIDIA A100-SXM4-40GB (UUID: {active_2gpu.machine['gpus'][1]['uuid']})"
    assert len(lines) == 3


def test_nvidia_smi_query_csv(active_2gpu):
    fields = "index,name,uuid,memory.total,memory.used,memory.free"
    result = smi(active_2gpu, f"--query-gpu={fields}", "--format=csv,noheader,nounits")
    assert result.returncode == 0, result.stderr
    gpus = active_2gpu.machine["gpus"]
    assert result.stdout.splitlines() == [
        f"{i}, {g['name']}, {g['uuid']}, {g['memory'] >> 20}, 0, {g['memory'] >> 20}" for i, g in enumerate(gpus)
    ]
    with_header = smi(active_2gpu, "--query-gpu=index,memory.total", "--format=csv").stdout.splitlines()
    assert with_header == ["index, memory.total [MiB]", "0, 81920 MiB", "1, 40960 MiB"]
    bad = smi(active_2gpu, "--query-gpu=index,bogus", "--format=csv")
    assert bad.returncode == 2 and 'Field "bogus" is not a valid field to query.' in bad.stderr


def test_nvidia_smi_table(active_2gpu):
    result = smi(active_2gpu)
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "Driver Version: 580.95.05" in text and "CUDA Version: 13.0" in text
    assert "00000000:3B:00.0" in text and "00000000:86:00.0" in text
    assert "0MiB /  81920MiB" in text and "0MiB /  40960MiB" in text
    assert "MIG devices:" in text and "2g.10gb" in text and "3g.20gb" in text


def test_helper_binaries_run(fake_2gpu, tmp_path):
    for name in ("nvidia-debugdump", "nvidia-persistenced", "nv-fabricmanager", "nvidia-cuda-mps-server"):
        result = subprocess.run([str(fake_2gpu.bin_dir / name)], capture_output=True, text=True, timeout=10)
        assert result.stdout == f"{name} 580.95.05 (fake NVIDIA driver)\n"
    # the MPS control client (tests/fakedriver/src/mps_control.c), with no daemon on its pipe directory
    result = subprocess.run(
        [str(fake_2gpu.bin_dir / "nvidia-cuda-mps-control")],
        input="get_server_list\n",
        capture_output=True,
        text=True,
        timeout=10,
        env={**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)},
    )
    assert (result.returncode, result.stderr) == (1, "Cannot find MPS control daemon process\n")


def test_nvml_without_active_driver_reports_driver_not_loaded(fake_2gpu):
    if Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has a real /dev/nvidiactl")
    assert probe(fake_2gpu)["init"] == NVML_ERROR_DRIVER_NOT_LOADED

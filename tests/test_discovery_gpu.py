"""``nvc-py info`` and ``nvc-py list`` against a real NVIDIA driver (``make test-gpu``).

Every expectation comes from a second, independent source: NVML queried in this test
process through pynvml (not through nvc-py's helper), /proc/driver/nvidia, the device
nodes' st_rdev and the driver's library directory as the file system shows it. Nothing
here runs on the fake driver.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

# Where the GPU machine's driver lives (found through /etc/ld.so.conf.d, see h100-measurements.md).
DRIVER_LIB_DIR = Path(os.environ.get("NVC_GPU_DRIVER_LIBDIR", "/usr/local/nvidia/lib64"))
NVIDIA_MAJOR = 195


def nvc(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "nvc", *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == "", (args, done.returncode, done.stderr)
    return done.stdout


@pytest.fixture(scope="module")
def nvml() -> Iterator:
    """pynvml, initialised in this process: the reference every answer of nvc-py is held to."""
    pynvml = pytest.importorskip("pynvml")
    if not Path("/proc/driver/nvidia/version").exists():
        pytest.fail("no NVIDIA driver on this machine: GPU tests need one")
    pynvml.nvmlInit()
    yield pynvml
    pynvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def nvml_gpus(pynvml) -> list[dict]:
    gpus = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        pci = pynvml.nvmlDeviceGetPciInfo(h)
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
        gpus.append(
            {
                "index": i,
                "minor": pynvml.nvmlDeviceGetMinorNumber(h),
                "model": _text(pynvml.nvmlDeviceGetName(h)),
                "uuid": _text(pynvml.nvmlDeviceGetUUID(h)),
                "bus_id": f"{pci.domain:08x}:{pci.bus:02x}:{pci.device:02x}.0",
                "architecture": f"{major}.{minor}",
                "memory_total": pynvml.nvmlDeviceGetMemoryInfo(h).total,
            }
        )
    return gpus


def test_info_reports_what_nvml_reports(nvml) -> None:
    doc = json.loads(nvc("info", "--json"))
    driver = _text(nvml.nvmlSystemGetDriverVersion())
    cuda = nvml.nvmlSystemGetCudaDriverVersion()
    assert driver.startswith("580."), driver
    assert doc["nvrm_version"] == driver
    assert doc["cuda_version"] == f"{cuda // 1000}.{cuda % 100 // 10}"
    got = [
        {k: d[k] for k in ("index", "minor", "model", "uuid", "bus_id", "architecture", "memory_total")}
        for d in doc["devices"]
    ]
    assert got == nvml_gpus(nvml)
    assert got, "NVML sees no GPU"


def test_info_text_layout(nvml) -> None:
    """The plain output carries the same facts in the reference's 15-column layout."""
    out = nvc("info")
    driver = _text(nvml.nvmlSystemGetDriverVersion())
    assert out.startswith(f"NVRM version:   {driver}\nCUDA version:   ")
    for gpu in nvml_gpus(nvml):
        assert f"\nModel:          {gpu['model']}\n" in out
        assert f"\nGPU UUID:       {gpu['uuid']}\n" in out
        assert f"\nBus Location:   {gpu['bus_id']}\n" in out


def test_driver_version_matches_proc(nvml) -> None:
    """NVML's driver version is the kernel module's (no library/module mismatch hidden)."""
    version = Path("/proc/driver/nvidia/version").read_text()
    assert re.search(rf"\s{re.escape(_text(nvml.nvmlSystemGetDriverVersion()))}\s", version)


def test_list_devices_are_the_gpus_nodes(nvml) -> None:
    listed = json.loads(nvc("list", "--json"))["devices"]
    assert "/dev/nvidiactl" in listed
    for gpu in nvml_gpus(nvml):
        assert f"/dev/nvidia{gpu['minor']}" in listed
    for path in listed:
        st = os.stat(path)
        assert stat.S_ISCHR(st.st_mode), path
    gpu_nodes = [p for p in listed if re.fullmatch(r"/dev/nvidia\d+", p)]
    assert sorted(os.major(os.stat(p).st_rdev) for p in gpu_nodes) == [NVIDIA_MAJOR] * len(nvml_gpus(nvml))
    assert len(gpu_nodes) == len(nvml_gpus(nvml))


def test_list_libraries_are_the_driver_directory(nvml) -> None:
    """Exactly the driver's version-suffixed libraries of its library directory that nvc-py knows by name
    (on the H100 every one passes the ELF checks, libnvidia-tls's ABI note included)."""
    from nvc.model import capabilities

    version = _text(nvml.nvmlSystemGetDriverVersion())
    listed = json.loads(nvc("list", "--json"))["libraries"]
    on_disk = sorted(
        str(p)
        for p in DRIVER_LIB_DIR.iterdir()
        if p.name.endswith(f".so.{version}")
        and not p.is_symlink()
        and p.is_file()
        and p.name.startswith(capabilities.all_library_prefixes())
    )
    from_dir = sorted(p for p in listed if os.path.dirname(p) == str(DRIVER_LIB_DIR))
    assert from_dir == on_disk
    assert all(os.path.realpath(p) == p for p in listed), "listed paths are resolved files"


def test_list_has_the_library_nvml_loads(nvml) -> None:
    """The libnvidia-ml that NVML itself runs from (this process's maps) is the one listed."""
    maps = Path("/proc/self/maps").read_text()
    loaded = {os.path.realpath(line.split()[-1]) for line in maps.splitlines() if "libnvidia-ml.so" in line}
    assert len(loaded) == 1, loaded
    assert loaded <= set(json.loads(nvc("list", "--json"))["libraries"])


def test_list_binaries_include_nvidia_smi(nvml) -> None:
    binaries = json.loads(nvc("list", "--json"))["binaries"]
    assert any(os.path.basename(b) == "nvidia-smi" for b in binaries)
    for b in binaries:
        assert os.access(b, os.X_OK) and Path(b).is_file(), b


def test_fast_path_and_nvml_agree() -> None:
    assert nvc("list") == nvc("list", "--nvml")
    assert nvc("list", "--json") == nvc("list", "--json", "--nvml")


def test_installed_nvc_py_through_the_server_answers_as_the_python_program(tmp_path: Path) -> None:
    """``nvc-py`` as installed (the native front) hands ``info`` and ``list`` to a running server, whose
    worker had NVML loaded and the GPU attached ahead of the call: the answers are the Python
    program's own. The debug log's pid shows the call ran in a worker."""
    import sysconfig

    from harness.hookserver import hook_server

    scripts = Path(sysconfig.get_path("scripts"))
    sock, log = tmp_path / "hook.sock", tmp_path / "debug.log"
    callers, answers = set(), {}
    with hook_server(scripts / "nvc-py-hook", sock):
        for args in (("info",), ("info", "--json"), ("list",)):
            proc = subprocess.Popen(
                [str(scripts / "nvc-py"), "--debug", str(log), *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env={**os.environ, "NVC_PY_HOOK_SOCKET": str(sock)},
            )
            out, err = proc.communicate(timeout=60)
            assert (proc.returncode, err) == (0, ""), args
            callers.add(proc.pid)
            answers[args] = out
    for args, out in answers.items():
        assert out == nvc(*args), args
    workers = {int(line.split()[2]) for line in log.read_text().splitlines() if line[:1] in "DI"}
    assert workers and not workers & callers
    for args in (("info",), ("list",)):
        print(f"--- nvc-py {' '.join(args)}, handed to the server by the installed nvc-py:\n{answers[args]}")

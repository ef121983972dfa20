"""The services' helpers, as real processes: the NVML driver helper (its values, its confinement, on the
fake two-GPU MIG machine) and the prestarted driver and container helpers the hook server keeps.

Hardening is read back from /proc while the helper serves, not assumed from the code.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import prctl
import pytest

from harness.helperroot import jail  # noqa: F401  (fixture)
from harness.processes import children as _children
from harness.processes import status as _status
from nvc import errors
from nvc.model.devices import DriverSnapshot
from nvc.rpc.driver_service import bus_id, open_driver
from nvc.rpc.driver_wire import brand_name, overflow_ids, snapshot_from_wire
from nvc.system.confinement import CONTAINER_HELPER

# ---- driver helper ------------------------------------------------------------------------


def test_brand_names_follow_nvml_values() -> None:
    import pynvml

    assert brand_name(pynvml.NVML_BRAND_NVIDIA) == "Nvidia"
    assert brand_name(pynvml.NVML_BRAND_UNKNOWN) == "Unknown"
    assert brand_name(pynvml.NVML_BRAND_TESLA) == "Tesla"
    assert brand_name(pynvml.NVML_BRAND_GRID) == "GRID"
    assert brand_name(pynvml.NVML_BRAND_NVIDIA_CLOUD_GAMING) == "CloudGaming"
    assert brand_name(pynvml.NVML_BRAND_TITAN_RTX) == "TitanRTX"
    assert brand_name(pynvml.NVML_BRAND_NVIDIA_NPU) == brand_name(-1) == "Unknown"


def test_pynvml_imports_without_what_ctypes_util_imports() -> None:
    """The helper's pynvml comes without subprocess, shutil and tempfile; pynvml's find_library
    still works, and a later import of ctypes.util gets the real module."""
    code = (
        "import sys; from nvc.rpc.driver_service import import_pynvml; nvml = import_pynvml()\n"
        "assert import_pynvml() is nvml and nvml.nvmlInit and nvml.NVML_BRAND_TESLA == 2\n"
        "print(sorted({'ctypes.util', 'subprocess', 'shutil', 'tempfile'} & set(sys.modules)))\n"
        "print(nvml.find_library('c'))\n"
        "import ctypes.util; print(ctypes.util.__file__ is not None, ctypes.util.find_library is not nvml.find_library)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    unwanted, library, real = done.stdout.splitlines()
    assert unwanted == "[]"
    assert library.startswith("libc.so")
    assert real == "True True"


def test_the_driver_helpers_modules_import_without_typing() -> None:
    """What ``info``'s driver helper imports before it starts NVML (its machinery, the confinement, pynvml)
    leaves typing out: its import came before NVML's start (docs/performance.md)."""
    code = (
        "import sys; import nvc.rpc.helper, nvc.rpc.protocol, nvc.rpc.pool\n"
        "from nvc.rpc import driver_service; driver_service._warm()\n"
        "print('typing' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout == "False\n"


def test_bus_id_is_normalised() -> None:
    assert bus_id(0, 0x3B, 0) == "00000000:3B:00.0"
    assert bus_id(0x10000, 0xA, 0x1F) == "00010000:0A:1F.0"


def test_snapshot_from_wire_builds_records() -> None:
    gpu = {
        "index": 0, "minor": 3, "model": "M", "brand": 2, "uuid": "GPU-1", "bus_id": "00000000:01:00.0",
        "architecture": "8.0", "memory_total": 5, "mig_enabled": True,
        "mig_devices": [{"index": 0, "gpu_instance_id": 1, "compute_instance_id": 0, "uuid": "MIG-1",
                         "memory_total": 2}],
    }  # fmt: skip
    snap = snapshot_from_wire({"driver_version": "1.2", "cuda_version": 12040, "gpus": [gpu]})
    assert isinstance(snap, DriverSnapshot) and snap.cuda_version == 12040
    (only,) = snap.gpus
    assert only.minor == 3 and only.brand == "Tesla"
    assert only.mig_devices[0].uuid == "MIG-1" and only.mig_devices[0].gi_caps_path is None


def test_overflow_ids_are_the_kernel_values() -> None:
    assert overflow_ids() == (
        int(Path("/proc/sys/kernel/overflowuid").read_text()),
        int(Path("/proc/sys/kernel/overflowgid").read_text()),
    )


def test_root_without_nvml_is_an_initialization_error(jail: Path) -> None:
    before = _children()
    with pytest.raises(errors.InitializationError) as caught:
        with open_driver(root=str(jail)):
            pass
    assert str(caught.value).startswith("initialization error: load library failed: libnvidia-ml.so.1: ")
    assert "cannot open shared object file" in str(caught.value)
    assert _children() == before


def test_snapshot_of_the_two_gpu_mig_machine(active_2gpu) -> None:
    root = str(active_2gpu.root)
    with open_driver(root=root) as driver:
        status = _status(driver.pid)
        assert status["CapEff"] == status["CapPrm"] == status["CapBnd"] == "0000000000000000"
        assert status["NoNewPrivs"] == "1"
        assert status["Uid"].split() == [str(overflow_ids()[0])] * 4
        assert Path(f"/proc/{driver.pid}/comm").read_text() == "nvc:[driver]\n"
        assert os.readlink(f"/proc/{driver.pid}/root") == os.path.realpath(root)
        snap = driver.snapshot()
        pid = driver.pid
    assert not Path(f"/proc/{pid}").exists()

    machine = active_2gpu.machine
    assert snap.driver_version == machine["driver_version"] == "580.95.05"
    assert snap.cuda_version == 13000
    assert [g.index for g in snap.gpus] == [0, 1]
    for gpu, described in zip(snap.gpus, machine["gpus"], strict=True):
        assert (gpu.minor, gpu.model, gpu.uuid, gpu.bus_id, gpu.architecture) == (
            described["minor"],
            described["name"],
            described["uuid"],
            described["pci_bus_id"],
            described["compute_capability"],
        )
        assert gpu.brand == "Nvidia"
    h100, a100 = snap.gpus
    assert h100.memory_total == 80 << 30 and not h100.mig_enabled and h100.mig_devices == ()
    assert a100.mig_enabled and a100.memory_total == 40 << 30
    assert [(m.index, m.gpu_instance_id, m.compute_instance_id, m.memory_total) for m in a100.mig_devices] == [
        (0, 1, 0, 10 << 30),
        (1, 2, 0, 20 << 30),
    ]
    assert [m.uuid for m in a100.mig_devices] == [d["uuid"] for d in machine["gpus"][1]["mig"]["devices"]]


def test_a_prestarted_helper_is_taken_for_the_same_options_only(active_2gpu) -> None:
    """The hook server's idle workers start NVML ahead (driver_service.prestart); a call asking for
    the same root and user takes that helper, any other gets a new one and the first is closed."""
    from nvc.rpc import driver_service

    root = str(active_2gpu.root)
    driver_service.prestart(root=root)
    ahead = driver_service._ahead.kept.pid
    with open_driver(root=root) as driver:
        assert driver.pid == ahead and len(driver.snapshot().gpus) == 2
    assert not Path(f"/proc/{ahead}").exists()
    driver_service.prestart(root=root, user=(12345, 12345))
    other = driver_service._ahead.kept.pid
    with open_driver(root=root) as driver:
        assert driver.pid != other and len(driver.snapshot().gpus) == 2
        assert not Path(f"/proc/{other}").exists()  # closed and reaped


_SNAPSHOT_OF_ROOT = """
import json, sys
from nvc import errors
from nvc.rpc import driver_service
try:
    with driver_service.open_driver(root=sys.argv[1], user=(0, 0)) as driver:  # the owner of pytest's dirs
        print(json.dumps([[g.uuid, len(g.mig_devices)] for g in driver.snapshot().gpus]))
except errors.NvcError as err:
    print(f"{type(err).__name__}: {err}")
print("pynvml" in sys.modules)
"""


def test_the_driver_helper_for_the_hosts_root_starts_nvml_while_pynvml_imports(active_2gpu) -> None:
    """For the driver root / (pynvml's files stay in reach in a chroot to /) the helper confines itself
    first, then starts NVML in a thread while pynvml imports: its snapshot is the one the other order
    gives for the fake's own root, and without any NVML its error is that order's too. The fake NVML is
    found at / through LD_LIBRARY_PATH, which the loader reads when a process starts: a child of its own."""

    def snapshot(root: str, library_path: str | None) -> list[str]:
        env = {key: value for key, value in os.environ.items() if key != "LD_LIBRARY_PATH"}
        env.update({"LD_LIBRARY_PATH": library_path} if library_path else {})
        code = [sys.executable, "-c", _SNAPSHOT_OF_ROOT, root]
        return subprocess.run(code, env=env, capture_output=True, text=True, timeout=60, check=True).stdout.splitlines()

    root = str(active_2gpu.root)
    through_root = snapshot(root, None)
    assert through_root[0].startswith("[[") and through_root[1] == "False", through_root
    assert snapshot("/", str(active_2gpu.lib_dir)) == through_root
    missing = snapshot("/", None)
    assert missing[0].startswith(
        "InitializationError: initialization error: load library failed: libnvidia-ml.so.1: "
    ), missing


def _chrooted_to(pid: int, root: str, timeout: float = 5.0) -> bool:
    """Whether process ``pid`` shows ``root`` as its root within ``timeout`` (a helper confines itself
    at set-up)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.readlink(f"/proc/{pid}/root") == root:
            return True
        time.sleep(0.01)
    return False


def test_the_cli_starts_nvml_ahead_for_the_configurations_options_where_none_are_given(
    active_2gpu, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``nvc-py info`` forks its driver helper before it parses (driver_service.prefork): with no
    global option before the command, the helper sets up (confined in the configuration's root) at
    once; with one, or with a configuration it cannot use, it only imports until the call sends the
    options. The call takes it either way."""
    from nvc.rpc import driver_service

    root = str(active_2gpu.root)
    config = tmp_path / "config.yaml"
    monkeypatch.setenv("NVC_PY_CONFIG", str(config))
    config.write_text(f"root: {root}\n")
    driver_service.prefork(["info", "--json"])
    ahead = driver_service._ahead.kept.pid
    assert _chrooted_to(ahead, root), "the helper was not started for the configuration's root"
    with open_driver(root=root) as driver:
        assert driver.pid == ahead and len(driver.snapshot().gpus) == 2

    for argv, text in ((["--root", root, "info"], f"root: {root}\n"), (["info"], "root: relative/path\n")):
        config.write_text(text)
        driver_service.prefork(argv)
        ahead = driver_service._ahead.kept.pid
        assert not _chrooted_to(ahead, root, timeout=0.3), argv
        with open_driver(root=root) as driver:
            assert driver.pid == ahead and len(driver.snapshot().gpus) == 2
        assert not Path(f"/proc/{ahead}").exists()


def test_a_prestarted_container_helper_is_confined_before_any_call_and_taken_once() -> None:
    """The hook server's idle workers fork the container helper ahead (container_service.prestart):
    before any call it holds only the mount capabilities, none effective, with NO_NEW_PRIVS; the
    next open_container takes it (no fork on the call's path), the one after forks its own."""
    from nvc.rpc import container_service

    container_service.prestart()
    ahead = container_service._ahead.kept.pid
    bounding = sum(1 << getattr(prctl, f"CAP_{name.upper()}") for name in CONTAINER_HELPER.permitted)
    deadline = time.monotonic() + 5
    while _status(ahead)["NoNewPrivs"] != "1":
        assert time.monotonic() < deadline, "the prestarted helper never confined itself"
        time.sleep(0.01)
    status = _status(ahead)
    assert status["Name"] == "nvc:[container]"
    assert int(status["CapBnd"], 16) == bounding and int(status["CapPrm"], 16) == bounding
    assert int(status["CapEff"], 16) == 0 and int(status["CapInh"], 16) == 0
    with container_service.open_container() as taken:
        assert taken.helper.pid == ahead
        with container_service.open_container() as another:
            assert another.helper.pid != ahead
    assert not Path(f"/proc/{ahead}").exists()  # shut down and reaped

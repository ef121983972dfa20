"""The fake driver's machine YAML validation, device nodes and /proc stand-in."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import yaml
from fakedriver.machine import MACHINES_DIR, MachineError, load_machine


def write_machine(tmp_path: Path, edit) -> Path:
    """two-gpu-mig.yaml with ``edit`` applied to its parsed dict, written to tmp_path."""
    data = yaml.safe_load((MACHINES_DIR / "two-gpu-mig.yaml").read_text())
    edit(data)
    path = tmp_path / "edited.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_sizes_and_bus_ids_are_normalised(tmp_path):
    def edit(data):
        data["gpus"][0]["memory"] = 1 << 30
        data["gpus"][0]["pci_bus_id"] = "0:3b:00.0"

    gpu = load_machine(write_machine(tmp_path, edit))["gpus"][0]
    assert gpu["memory"] == 1 << 30
    assert gpu["pci_bus_id"] == "00000000:3B:00.0"
    assert load_machine(MACHINES_DIR / "two-gpu-mig.yaml")["gpus"][1]["mig"]["devices"][1]["memory"] == 20 << 30


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d.pop("driver_version"), "top level: missing key(s) driver_version"),
        (lambda d: d.update(layout="rpm"), "layout: expected one of distro, debian, nvidia, got 'rpm'"),
        (lambda d: d.update(colour="green"), "top level: unknown key(s) colour"),
        (lambda d: d["gpus"][0].update(memory="80GB"), "gpus[0].memory: expected a positive size"),
        (lambda d: d["gpus"][0].update(brand="Radeon"), "gpus[0].brand: expected one of"),
        (lambda d: d["gpus"][0].update(uuid="GPU-1234"), "gpus[0].uuid: 'GPU-1234' does not match"),
        (lambda d: d["gpus"][1].update(minor=0), "gpus: two GPUs with the same minor"),
        (
            lambda d: d["gpus"][1]["mig"]["devices"][0].update(profile="2g.20gb"),
            "gpus[1].mig.devices[0].profile: 20gb does not match memory",
        ),
        (
            lambda d: d["gpus"][1]["mig"]["devices"][1].update(gpu_instance_id=1),
            "gpus[1].mig.devices: two MIG devices with the same GPU and compute instance ids",
        ),
        (lambda d: d["gpus"][1]["mig"].update(enabled=False), "gpus[1].mig.devices: MIG devices listed while MIG"),
        (
            lambda d: d["gpus"][1]["mig"]["devices"][1].update(uuid=d["gpus"][1]["mig"]["devices"][0]["uuid"]),
            "gpus: a UUID is used twice",
        ),
    ],
)
def test_invalid_machines_are_rejected_with_the_key(tmp_path, edit, message):
    with pytest.raises(MachineError) as err:
        load_machine(write_machine(tmp_path, edit))
    assert str(err.value).startswith(f"edited.yaml: {message}")


def node(path: Path) -> tuple[int, int, int]:
    st = path.lstat()
    assert stat.S_ISCHR(st.st_mode), path
    return os.major(st.st_rdev), os.minor(st.st_rdev), stat.S_IMODE(st.st_mode)


def test_device_nodes(fake_2gpu):
    dev = fake_2gpu.root / "dev"
    assert node(dev / "nvidiactl") == (195, 255, 0o666)
    assert node(dev / "nvidia-modeset") == (195, 254, 0o666)
    assert node(dev / "nvidia0")[:2] == (195, 0) and node(dev / "nvidia1")[:2] == (195, 1)
    assert node(dev / "nvidia-uvm")[:2] == (238, 0) and node(dev / "nvidia-uvm-tools")[:2] == (238, 1)
    assert node(dev / "nvidia-caps/nvidia-cap1") == (241, 1, 0o400)
    assert node(dev / "nvidia-caps/nvidia-cap2") == (241, 2, 0o444)
    # GPU minor 1: gi1 access 3+135+9, ci0 one above; gi2 access 3+135+18, ci0 one above.
    assert sorted(p.name for p in (dev / "nvidia-caps").iterdir()) == sorted(
        f"nvidia-cap{m}" for m in (1, 2, 147, 148, 156, 157)
    )
    assert node(dev / "nvidia-caps/nvidia-cap157") == (241, 157, 0o444)
    assert [node(dev / f"nvidia-caps-imex-channels/channel{n}")[:2] for n in (0, 1)] == [(242, 0), (242, 1)]
    assert not (dev / "nvidia-caps-imex-channels/channel2").exists()


def test_proc_driver_files(fake_2gpu):
    nvidia = fake_2gpu.proc / "driver/nvidia"
    version = (nvidia / "version").read_text().splitlines()
    assert version[0].startswith("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build")
    assert version[1].startswith("GCC version:")
    params = (nvidia / "params").read_text().splitlines()
    assert {"ModifyDeviceFiles: 1", "DeviceFileUID: 0", "DeviceFileGID: 0", "DeviceFileMode: 438"} <= set(params)
    assert sorted(p.name for p in (nvidia / "gpus").iterdir()) == ["0000:3b:00.0", "0000:86:00.0"]
    info = (nvidia / "gpus/0000:86:00.0/information").read_text()
    assert "Model: \t\t NVIDIA A100-SXM4-40GB\n" in info
    assert "GPU UUID: \t GPU-0d1e2f3a-4b5c-6d7e-8f90-a1b2c3d4e5f6\n" in info
    assert "Bus Location: \t 0000:86:00.0\n" in info and "Device Minor: \t 1\n" in info
    assert info.endswith("GPU Excluded:\t No\n")


def test_proc_mig_capabilities(fake_2gpu):
    caps = fake_2gpu.proc / "driver/nvidia/capabilities"
    assert (caps / "mig/config").read_text().startswith("DeviceFileMinor: 1\nDeviceFileMode: 256\n")
    assert (caps / "mig/monitor").read_text().startswith("DeviceFileMinor: 2\nDeviceFileMode: 292\n")
    assert sorted(str(p.relative_to(caps)) for p in caps.rglob("access")) == [
        "gpu1/mig/gi1/access",
        "gpu1/mig/gi1/ci0/access",
        "gpu1/mig/gi2/access",
        "gpu1/mig/gi2/ci0/access",
    ]
    assert (caps / "gpu1/mig/gi2/ci0/access").read_text().startswith("DeviceFileMinor: 157\nDeviceFileMode: 292\n")
    minors = (fake_2gpu.proc / "driver/nvidia-caps/mig-minors").read_text().splitlines()
    assert minors[:4] == ["config 1", "monitor 2", "gpu0/gi0/access 3", "gpu0/gi0/ci0/access 4"]
    assert "gpu1/gi2/ci0/access 157" in minors and "gpu1/gi14/ci7/access 272" in minors
    assert len(minors) == 2 + 32 * 15 * 9 == 4322  # full size, as a real driver writes it


def test_proc_devices_has_the_nvidia_majors(fake_2gpu):
    text = (fake_2gpu.proc / "devices").read_text()
    char, block = text.split("\n\n", 1)
    assert char.startswith("Character devices:\n") and block.startswith("Block devices:")
    lines = char.splitlines()[1:]
    for line in ("195 nvidia", "195 nvidiactl", "238 nvidia-uvm", "241 nvidia-caps", "242 nvidia-caps-imex-channels"):
        assert line in lines
    assert [int(line.split()[0]) for line in lines] == sorted(int(line.split()[0]) for line in lines)
    assert "  1 mem" in lines  # the host's own entries are kept

"""Build a fake NVIDIA driver from a machine description, for tests on machines without a GPU.

``build()`` reads a machine YAML (``machine``), compiles it into a fake libnvidia-ml and libcuda, lays
out every other library of NVIDIA's capability lists as a stub with its real SONAME, the binaries and
an ld.so.cache made by the real ``ldconfig`` (``libraries``), then the firmware, device nodes and a
separate ``proc`` tree shaped like ``/proc/driver/nvidia`` (``driverfiles``). Test double only.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .driverfiles import make_devices, make_files, make_loader_files, make_proc, make_sys
from .libraries import build_libraries, install_binaries, link_libraries, make_ldcache
from .machine import LAYOUTS, Layout, load_machine, machine_header


@dataclass(frozen=True)
class FakeDriver:
    """A built fake driver: ``root`` is the driver root, ``proc`` stands in for /proc, ``sys`` for
    /sys/bus/pci/devices."""

    root: Path
    proc: Path
    sys: Path
    machine: dict[str, Any]
    driver_version: str

    @property
    def layout(self) -> Layout:
        return LAYOUTS[self.machine["layout"]]

    @property
    def lib_dir(self) -> Path:
        return self.root / self.layout.lib

    @property
    def lib32_dir(self) -> Path:
        return self.root / self.layout.lib32

    @property
    def bin_dir(self) -> Path:
        return self.root / self.layout.bin


def build(machine_yaml: Path, out: Path) -> FakeDriver:
    """Build the fake driver described by ``machine_yaml`` into ``out`` (root/, proc/, and scratch).

    Needs root (mknod) and gcc with -m32 support. A previous build in ``out`` is replaced.
    """
    machine = load_machine(machine_yaml)
    layout = LAYOUTS[machine["layout"]]
    out = out.resolve()
    root, proc, gen, obj, sys = out / "root", out / "proc", out / "gen", out / "obj", out / "sys"
    for path in (root, proc, gen, obj, sys):
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
    (gen / "fake_machine.h").write_text(machine_header(machine, machine_yaml.name))
    version = machine["driver_version"]
    build_libraries(machine, gen, obj, {64: root / layout.lib, 32: root / layout.lib32}, layout)
    link_libraries(root, layout, version, machine["strays"])
    install_binaries(root / layout.bin, obj, version, machine["strays"])
    make_ldcache(root, layout)
    make_files(root, version)
    make_loader_files(root, version, layout.packaged)
    make_devices(machine, root / "dev")
    make_proc(machine, proc)
    make_sys(machine, sys / "devices")
    return FakeDriver(root=root, proc=proc, sys=sys / "devices", machine=machine, driver_version=version)

"""The fake driver's libraries are what container tools expect from a real installation.

Checked with the real ``ldconfig`` (its cache listing) and pyelftools (SONAME, ELF class, notes,
DT_NEEDED): every library of every capability list, 64-bit and 32-bit, in both layouts.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile
from fakedriver.libraries import LIBRARY_GROUPS, VDPAU, file_name

CACHE_LINE = re.compile(r"\s+(\S+) \(([^)]*)\) => (\S+)")
ARCH_TAGS = {64: "libc6,x86-64", 32: "libc6"}


@pytest.fixture(params=["fake_2gpu", "fake_local_nvidia"])
def fake(request):
    return request.getfixturevalue(request.param)


def cache_entries(root: Path) -> set[tuple[str, str, str]]:
    """(key, tags, path) of every entry ldconfig lists from root/etc/ld.so.cache."""
    listing = subprocess.run(
        ["ldconfig", "-p", "-C", str(root / "etc/ld.so.cache")], capture_output=True, text=True, check=True
    ).stdout
    return {m.groups() for m in map(CACHE_LINE.match, listing.splitlines()[1:]) if m}


def expected_sonames(fake) -> dict[str, str]:
    """Library name -> SONAME, from the build's own table; libvdpau_nvidia is in no cache where it is
    in vdpau/ (the installers), in the cache where it is beside the others (a self-contained tree)."""
    return {
        name: f"{name}.{suffix}" if suffix else f"{name}.{fake.driver_version}"
        for group in LIBRARY_GROUPS.values()
        for name, suffix in group.items()
        if name != VDPAU or not fake.layout.vdpau_apart
    }


def resolve_in_root(root: Path, path: str) -> Path:
    """Follow a cache path's symlinks the way a tool confined to ``root`` would."""
    current = root / path.lstrip("/")
    for _ in range(8):
        if not current.is_symlink():
            return current
        target = os.readlink(current)
        current = root / target.lstrip("/") if target.startswith("/") else current.parent / target
    raise AssertionError(f"symlink loop at {path}")


def elf_facts(path: Path) -> tuple[int, str | None, list[str], list[tuple]]:
    """ELF class, SONAME, DT_NEEDED list and GNU ABI notes of a shared object."""
    with path.open("rb") as f:
        elf = ELFFile(f)
        soname, needed = None, []
        for section in elf.iter_sections():
            if isinstance(section, DynamicSection):
                for tag in section.iter_tags():
                    if tag.entry.d_tag == "DT_SONAME":
                        soname = tag.soname
                    elif tag.entry.d_tag == "DT_NEEDED":
                        needed.append(tag.needed)
        notes = [
            (
                n["n_name"],
                n["n_desc"]["abi_os"],
                n["n_desc"]["abi_major"],
                n["n_desc"]["abi_minor"],
                n["n_desc"]["abi_tiny"],
            )
            for segment in elf.iter_segments()
            if segment.header.p_type == "PT_NOTE"
            for n in segment.iter_notes()
            if n["n_type"] == "NT_GNU_ABI_TAG"
        ]
        return elf.elfclass, soname, needed, notes


def test_cache_lists_nvml_and_cuda_for_both_architectures(fake):
    entries = cache_entries(fake.root)
    for bits, libdir in ((64, fake.layout.lib), (32, fake.layout.lib32)):
        for soname in ("libnvidia-ml.so.1", "libcuda.so.1"):
            assert (soname, ARCH_TAGS[bits], f"/{libdir}/{soname}") in entries


def test_cache_lists_every_library_for_both_architectures(fake):
    entries = cache_entries(fake.root)
    sonames = expected_sonames(fake)
    for bits, libdir in ((64, fake.layout.lib), (32, fake.layout.lib32)):
        for soname in sonames.values():
            assert (soname, ARCH_TAGS[bits], f"/{libdir}/{soname}") in entries
    assert len(entries) == 2 * len(sonames)


def test_cache_entries_resolve_to_versioned_files_with_that_soname(fake):
    sonames = expected_sonames(fake)
    by_soname = {soname: name for name, soname in sonames.items()}
    for key, tags, path in cache_entries(fake.root):
        target = resolve_in_root(fake.root, path)
        assert target.name == file_name(by_soname[key], fake.driver_version)
        elfclass, soname, needed, _ = elf_facts(target)
        assert soname == key
        assert elfclass == (64 if tags == ARCH_TAGS[64] else 32)
        assert "libc.so.6" in needed


def test_vdpau_is_under_vdpau_outside_the_cache(fake):
    """libvdpau loads its driver from <libdir>/vdpau/, which no ld.so.conf lists (both installers); a
    self-contained tree (/usr/local/nvidia/lib64, as on the H100 machine) keeps it beside the others."""
    apart = fake.layout.vdpau_apart
    vdpau = fake.lib_dir / ("vdpau" if apart else "") / f"{VDPAU}.1"
    assert os.readlink(vdpau) == f"{VDPAU}.{fake.driver_version}"
    assert elf_facts(vdpau)[1] == f"{VDPAU}.1"
    assert bool([e for e in cache_entries(fake.root) if e[0].startswith(VDPAU)]) == (not apart)


def test_tls_carries_the_gnu_abi_note(fake):
    for libdir in (fake.lib_dir, fake.lib32_dir):
        notes = elf_facts(libdir / f"libnvidia-tls.so.{fake.driver_version}")[3]
        assert notes == [("GNU", "ELF_NOTE_OS_LINUX", 2, 3, 99)]
        assert elf_facts(libdir / f"libnvidia-glsi.so.{fake.driver_version}")[3] == []


@pytest.mark.parametrize("name", sorted(LIBRARY_GROUPS["graphics_compat"]))
def test_compat_gl_libraries_need_glcore(fake_2gpu, name):
    for libdir in (fake_2gpu.lib_dir, fake_2gpu.lib32_dir):
        needed = elf_facts(libdir / f"{name}.{fake_2gpu.driver_version}")[2]
        assert f"libnvidia-glcore.so.{fake_2gpu.driver_version}" in needed
    assert not any(
        n.startswith("libnvidia-glcore")
        for n in elf_facts(fake_2gpu.lib_dir / f"libGLX_nvidia.so.{fake_2gpu.driver_version}")[2]
    )


def test_local_nvidia_libraries_are_reached_only_through_conf_d(fake_local_nvidia, tmp_path):
    """Without etc/ld.so.conf.d/nvidia.conf, ldconfig does not find any /usr/local/nvidia library."""
    root = fake_local_nvidia.root
    assert (root / "etc/ld.so.conf.d/nvidia.conf").read_text().split() == [
        "/usr/local/nvidia/lib64",
        "/usr/local/nvidia/lib",
    ]
    assert (root / "etc/ld.so.conf").read_text() == "include /etc/ld.so.conf.d/*.conf\n"
    copy = tmp_path / "root"
    shutil.copytree(root / "usr", copy / "usr", symlinks=True)
    (copy / "etc/ld.so.conf.d").mkdir(parents=True)
    shutil.copy(root / "etc/ld.so.conf", copy / "etc/ld.so.conf")
    subprocess.run(["ldconfig", "-r", str(copy)], check=True, capture_output=True)
    assert cache_entries(copy) == set()
    assert len(cache_entries(root)) > 0


def test_distro_layout_puts_binaries_and_libraries_in_multiarch_dirs(fake_2gpu):
    root = fake_2gpu.root
    assert fake_2gpu.lib_dir == root / "usr/lib/x86_64-linux-gnu"
    assert fake_2gpu.lib32_dir == root / "usr/lib/i386-linux-gnu"
    assert (root / "usr/bin/nvidia-smi").is_file()
    assert (root / "usr/lib/x86_64-linux-gnu/libcuda.so.1").resolve().name == "libcuda.so.580.95.05"
    assert sorted(p.name for p in (root / "lib/firmware/nvidia/580.95.05").iterdir()) == [
        "gsp_ga10x.bin",
        "gsp_tu10x.bin",
    ]

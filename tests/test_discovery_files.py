"""Driver file discovery: root-confined resolution, library selection rules (on libraries compiled
once per module), binaries, firmware, IPC."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from nvc.apply import hostnodes
from nvc.discover import driver, ldcache, rootpath
from nvc.errors import DetectionError

VERSION = "999.12.34"
X86_64, I386 = 0x0303, 0x0003


# --- rootpath ---------------------------------------------------------------------------------


def test_resolve_stays_inside_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "usr/lib").mkdir(parents=True)
    (root / "usr/lib/real.so").write_text("x")
    (root / "lib").symlink_to("/usr/lib")  # absolute: re-rooted
    (root / "usr/lib/up.so").symlink_to("../../../../../usr/lib/real.so")  # '..' stops at the root
    (root / "usr/lib/host").symlink_to("/etc/passwd")  # exists on the host, not in the root
    (root / "loop").symlink_to("loop")
    r = str(root)
    assert rootpath.resolve(r, "/lib/real.so") == "/usr/lib/real.so"
    assert rootpath.resolve(r, "lib/./real.so") == "/usr/lib/real.so"
    assert rootpath.resolve(r, "/usr/lib/up.so") == "/usr/lib/real.so"
    assert rootpath.resolve(r, "/usr/lib/host") is None
    assert rootpath.resolve(r, "/usr/lib/real.so/x") is None
    assert rootpath.resolve("/", "/etc/../etc/passwd") == "/etc/passwd"
    with pytest.raises(DetectionError, match="Too many levels of symbolic links"):
        rootpath.resolve(r, "/loop")


def test_makedirs_never_leaves_root(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "dev").symlink_to(outside)  # host-absolute target: inside the root it means <root>/<outside>
    with pytest.raises(FileExistsError):  # dangling inside the root: refused, not followed to the host
        hostnodes.makedirs(str(root), "/dev/nvidia-caps")
    (root / str(outside).lstrip("/")).mkdir(parents=True)
    assert hostnodes.makedirs(str(root), "/dev/nvidia-caps") == f"{outside}/nvidia-caps"
    assert (root / str(outside).lstrip("/") / "nvidia-caps").is_dir()
    assert list(outside.iterdir()) == []


# --- library selection on compiled libraries ------------------------------------------------

ABI_NOTE = """
.section .note.ABI-tag,"a",@note
.p2align 2
.long 4, 16, 1
.asciz "GNU"
.long 0, {0}, {1}, {2}
"""


def _cc(
    out: Path, soname: str, *, m32: bool = False, abi: tuple[int, int, int] | None = None, needs: Path | None = None
) -> None:
    work = out.parent / ".src"  # ldconfig does not descend into subdirectories
    work.mkdir(exist_ok=True)
    src = work / (out.name + ".c")
    src.write_text("int nvc_test_symbol(void) { return 1; }\n")
    cmd = ["gcc", "-shared", "-fPIC", "-nostdlib", f"-Wl,-soname,{soname}", "-o", str(out), str(src)]
    if m32:
        cmd.insert(1, "-m32")
    if abi:
        asm = work / (out.name + ".s")
        asm.write_text(ABI_NOTE.format(*abi))
        cmd.append(str(asm))
    if needs:
        cmd += ["-Wl,--no-as-needed", f"-L{needs.parent}", f"-l:{needs.name}"]
    subprocess.run(cmd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def libroot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A driver root with one library per selection rule, some passing, some not."""
    root = tmp_path_factory.mktemp("libroot")
    lib, lib32, other = root / "usr/lib/x86_64-linux-gnu", root / "usr/lib/i386-linux-gnu", root / "opt/b"
    for d in (lib, lib32, other):
        d.mkdir(parents=True)
    _cc(lib / f"libnvidia-ml.so.{VERSION}", "libnvidia-ml.so.1")
    (lib / "libnvidia-ml.so.1").symlink_to(f"libnvidia-ml.so.{VERSION}")
    _cc(lib32 / f"libnvidia-ml.so.{VERSION}", "libnvidia-ml.so.1", m32=True)
    _cc(lib / "libcuda.so.998.0.0", "libcuda.so.1")  # another driver version
    _cc(lib / f"libnvidia-cfg.so.{VERSION}", "libnvidia-cfg.so.1")
    _cc(other / f"libnvidia-cfg.so.{VERSION}", "libnvidia-cfg.so.1")
    _cc(lib / f"libnvidia-tls.so.{VERSION}", f"libnvidia-tls.so.{VERSION}", abi=(2, 3, 99))
    _cc(other / f"libnvidia-tls.so.{VERSION}", f"libnvidia-tls.so.{VERSION}", abi=(2, 2, 5))
    _cc(lib / f"libnvidia-glcore.so.{VERSION}", f"libnvidia-glcore.so.{VERSION}")
    _cc(lib / f"libGL.so.{VERSION}", "libGL.so.1", needs=lib / f"libnvidia-glcore.so.{VERSION}")
    _cc(lib / f"libEGL.so.{VERSION}", "libEGL.so.1")  # no DT_NEEDED on the GL core: not the driver's
    # A 32-bit file where the cache claims a 64-bit library.
    _cc(lib / f"libnvidia-encode.so.{VERSION}", "libnvidia-encode.so.1", m32=True)
    # A link leaving the root: its target exists on the host only.
    (lib / "libnvidia-ngx.so.1").symlink_to(f"/../../..{lib}/libnvidia-ngx.so.{VERSION}")
    (root / "usr/bin").mkdir()
    return root


def _entries(libroot: Path) -> tuple[ldcache.CacheEntry, ...]:
    d, d32 = "/usr/lib/x86_64-linux-gnu", "/usr/lib/i386-linux-gnu"
    rows = [
        ("libnvidia-ml.so.1", f"{d}/libnvidia-ml.so.1", X86_64),
        ("libnvidia-ml.so.1", f"{d32}/libnvidia-ml.so.{VERSION}", I386),
        ("libcuda.so.1", f"{d}/libcuda.so.998.0.0", X86_64),
        ("libnvidia-cfg.so.1", f"{d}/libnvidia-cfg.so.{VERSION}", X86_64),
        ("libnvidia-cfg.so", f"/opt/b/libnvidia-cfg.so.{VERSION}", X86_64),  # later: replaces the first
        ("libnvidia-tls.so", f"{d}/libnvidia-tls.so.{VERSION}", X86_64),
        ("libnvidia-tls.so", f"/opt/b/libnvidia-tls.so.{VERSION}", X86_64),  # later but wrong ABI note
        ("libnvidia-glcore.so", f"{d}/libnvidia-glcore.so.{VERSION}", X86_64),
        ("libGL.so.1", f"{d}/libGL.so.{VERSION}", X86_64),
        ("libEGL.so.1", f"{d}/libEGL.so.{VERSION}", X86_64),
        ("libnvidia-encode.so.1", f"{d}/libnvidia-encode.so.{VERSION}", X86_64),
        ("libnvidia-ngx.so.1", f"{d}/libnvidia-ngx.so.1", X86_64),
        ("libnvidia-ml.so", f"{d}/libnvidia-ml.so.{VERSION}", X86_64),  # same file again: listed once
    ]
    return tuple(ldcache.CacheEntry(k, v, f) for k, v, f in rows)


def test_library_selection_rules(libroot: Path) -> None:
    entries = _entries(libroot)
    d = "/usr/lib/x86_64-linux-gnu"
    libs = driver.select_libraries(str(libroot), ldcache.select(entries, "x86_64"), "x86_64", VERSION)
    assert libs == (
        f"{d}/libnvidia-ml.so.{VERSION}",
        f"/opt/b/libnvidia-cfg.so.{VERSION}",
        f"{d}/libnvidia-glcore.so.{VERSION}",
        f"{d}/libnvidia-tls.so.{VERSION}",
        f"{d}/libGL.so.{VERSION}",
    )
    libs32 = driver.select_libraries(str(libroot), ldcache.select(entries, "i386"), "i386", VERSION)
    assert libs32 == (f"/usr/lib/i386-linux-gnu/libnvidia-ml.so.{VERSION}",)


def test_discover_with_real_ldconfig_cache(libroot: Path, tmp_path: Path) -> None:
    """The whole discovery on a cache made by ldconfig itself, from a root that is not '/'."""
    root = tmp_path / "root"
    subprocess.run(["cp", "-a", str(libroot), str(root)], check=True)
    (root / "etc").mkdir()
    (root / "etc/ld.so.conf").write_text("/usr/lib/x86_64-linux-gnu\n/usr/lib/i386-linux-gnu\n")
    subprocess.run(["ldconfig", "-r", str(root)], check=True)
    files = driver.discover(
        str(root), VERSION, machine="x86_64", kernel_release="6.1.0", firmware_class_path="", mps_pipe_dir="/none"
    )
    assert f"{root}/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{VERSION}" in files.libraries
    # ldconfig registers the 32-bit file in the 64-bit directory as i386: that is where it belongs.
    assert files.libraries32 == (
        f"{root}/usr/lib/i386-linux-gnu/libnvidia-ml.so.{VERSION}",
        f"{root}/usr/lib/x86_64-linux-gnu/libnvidia-encode.so.{VERSION}",
    )
    assert all(p.startswith(f"{root}/") for p in files.libraries)
    with pytest.raises(DetectionError, match=f"{root}/nowhere: No such file"):
        driver.discover(str(root), VERSION, ldcache_path="/nowhere")


def test_elf_of_garbage(tmp_path: Path, libroot: Path) -> None:
    from nvc.discover import elf

    (tmp_path / "bad").write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 20)
    (tmp_path / "text").write_text("hello")
    for name in ("bad", "text", "missing"):
        assert elf.read_links(str(tmp_path / name)) is None
        assert not elf.matches(str(tmp_path / name), "x86_64")
    lib = libroot / f"usr/lib/i386-linux-gnu/libnvidia-ml.so.{VERSION}"
    assert elf.identity(str(lib)) == (32, elf.EM_386) and elf.matches(str(lib), "i386")


def test_elf_links_are_parsed_once_per_file_identity(
    tmp_path: Path, libroot: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A warm process (the hook server's workers) reads a library's links once; a file replaced or
    rewritten is read again."""
    from nvc.discover import elf

    parsed: list[str] = []
    parse = elf._parse_links
    monkeypatch.setattr(elf, "_parse_links", lambda path, stream: parsed.append(path) or parse(path, stream))
    monkeypatch.setattr(elf, "LINKS_CACHE", str(tmp_path / "run" / "elf-links.json"))
    current, older = (
        root / f"libnvidia-tls.so.{VERSION}" for root in (libroot / "usr/lib/x86_64-linux-gnu", libroot / "opt/b")
    )
    lib = tmp_path / "libnvidia-tls.so"
    shutil.copy(current, lib)
    for _ in range(3):
        assert elf.read_links(str(lib)) == elf.Links((), (2, 3, 99))
    assert parsed == [str(lib)]
    shutil.copy(older, tmp_path / "new")
    os.replace(tmp_path / "new", lib)  # an upgrade's rename: another inode
    assert elf.read_links(str(lib)) == elf.Links((), (2, 2, 5))
    lib.write_bytes(current.read_bytes())  # rewritten in place, the same inode
    os.utime(lib, ns=(1, 1))
    assert elf.read_links(str(lib)) == elf.Links((), (2, 3, 99))
    assert len(parsed) == 3


def test_elf_links_outlive_the_process_that_parsed_them(tmp_path: Path, libroot: Path) -> None:
    """A start with no server to ask (a fresh process) finds the links an earlier process parsed in root's
    own cache file, and imports no pyelftools; an entry of another shape is parsed again, and so is a
    library rewritten since (another identity)."""
    cache, lib = tmp_path / "run" / "elf-links.json", tmp_path / "libnvidia-tls.so"
    shutil.copy(libroot / f"usr/lib/x86_64-linux-gnu/libnvidia-tls.so.{VERSION}", lib)
    fresh = (
        "import sys; from nvc.discover import elf; elf.LINKS_CACHE = sys.argv[1]; "
        "print(elf.read_links(sys.argv[2]), 'elftools' in sys.modules)"
    )

    def fresh_process() -> str:
        done = subprocess.run([sys.executable, "-c", fresh, str(cache), str(lib)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    parsed, cached = "Links(needed=(), abi_tag=(2, 3, 99)) True", "Links(needed=(), abi_tag=(2, 3, 99)) False"
    assert fresh_process() == parsed
    assert oct(cache.stat().st_mode & 0o777) == "0o600"
    assert fresh_process() == cached
    entry = json.loads(cache.read_text())
    for shape in ([[*entry[0][:6], [2, 3, "99"]]], [[*entry[0][:5], "libc.so.6", None]], {"x": 1}, [entry[0][:6]]):
        cache.write_text(json.dumps(shape))
        assert fresh_process() == parsed, shape
    assert fresh_process() == cached
    os.utime(lib, ns=(1, 1))
    assert fresh_process() == parsed


# --- binaries, firmware, IPC -----------------------------------------------------------------


# The start of a 64-bit little-endian x86-64 ELF header: what discovery reads of a binary.
ELF_HEAD = b"\x7fELF\x02\x01\x01" + bytes(9) + b"\x02\x00\x3e\x00" + bytes(44)


def _exe(path: Path, mode: int = 0o755, content: bytes = ELF_HEAD + VERSION.encode()) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    path.chmod(mode)


def test_binaries_fixed_path_then_library_siblings(tmp_path: Path) -> None:
    _exe(tmp_path / "usr/local/nvidia/bin/nvidia-smi")
    _exe(tmp_path / "usr/local/nvidia/bin/nvidia-debugdump")
    _exe(tmp_path / "usr/bin/nvidia-debugdump")  # the fixed PATH comes first
    _exe(tmp_path / "usr/bin/nvidia-persistenced", 0o644)  # not executable
    _exe(tmp_path / "usr/local/nvidia/bin/nvidia-persistenced")
    os.symlink("/usr/local/nvidia/bin/nvidia-smi", tmp_path / "usr/bin/nv-fabricmanager")  # resolved in root
    # A host wrapper script that execs the real binary by path would fail alone in a container.
    _exe(tmp_path / "usr/bin/nvidia-smi", content=b'#!/bin/sh\nexec /usr/local/nvidia/bin/nvidia-smi "$@"\n')
    _exe(tmp_path / "usr/sbin/nv-fabricmanager", content=ELF_HEAD + b"470.256.02")  # another driver's: passed over
    # No driver version in it at all (the H100's nvidia-cuda-mps-server, nvidia-debugdump): kept
    _exe(tmp_path / "usr/bin/nvidia-cuda-mps-server", content=ELF_HEAD + b"CUDA 13.0 build 1.2.3")
    dirs = driver.binary_dirs(("/usr/local/nvidia/lib64", "/usr/local/nvidia/lib64"))
    assert dirs == (*driver.BINARY_PATH, "/usr/local/nvidia/bin")
    assert driver.find_binaries(str(tmp_path), dirs, VERSION) == (
        "/usr/local/nvidia/bin/nvidia-smi",
        "/usr/bin/nvidia-debugdump",
        "/usr/local/nvidia/bin/nvidia-persistenced",
        "/usr/bin/nvidia-cuda-mps-server",
    )


def test_firmware_search_order(tmp_path: Path) -> None:
    def fw(d: str, name: str) -> None:
        p = tmp_path / d.lstrip("/") / f"nvidia/{VERSION}/{name}"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(d)

    fw("/lib/firmware", "gsp_ga10x.bin")
    fw("/lib/firmware", "gsp_tu10x.bin")
    fw("/lib/firmware", "other.bin")
    fw("/lib/firmware/updates/6.1.0", "gsp_tu10x.bin")
    fw("/srv/fw", "gsp_ga10x.bin")
    dirs = driver.firmware_dirs("6.1.0", "/srv/fw")
    assert dirs[0] == "/srv/fw" and dirs[-1] == "/lib/firmware"
    assert driver.find_firmwares(str(tmp_path), VERSION, dirs) == (
        f"/srv/fw/nvidia/{VERSION}/gsp_ga10x.bin",
        f"/lib/firmware/updates/6.1.0/nvidia/{VERSION}/gsp_tu10x.bin",
    )
    assert driver.firmware_dirs("6.1.0", "")[0] == "/lib/firmware/updates/6.1.0"


def test_ipc_sockets_and_mps_dir(libroot: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "root"
    subprocess.run(["cp", "-a", str(libroot), str(root)], check=True)
    (root / "etc").mkdir()
    (root / "etc/ld.so.conf").write_text("/usr/lib/x86_64-linux-gnu\n")
    subprocess.run(["ldconfig", "-r", str(root)], check=True)
    (root / "run/nvidia-persistenced").mkdir(parents=True)
    (root / "var").mkdir()
    (root / "var/run").symlink_to("/run")
    (root / "run/nvidia-fabricmanager").mkdir()
    (root / "run/nvidia-fabricmanager/socket").write_text("not a socket")
    (root / "mps").mkdir()
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(root / "run/nvidia-persistenced/socket"))
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", "/mps")
    try:
        files = driver.discover(str(root), VERSION, machine="x86_64", kernel_release="6.1.0", firmware_class_path="")
    finally:
        sock.close()
    assert files.persistenced_socket == f"{root}/run/nvidia-persistenced/socket"
    assert files.fabricmanager_socket is None
    assert files.mps_pipe_dir == f"{root}/mps"

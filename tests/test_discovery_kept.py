"""Driver files kept between calls (nvc.discover.keptfiles): used again only while every path they
were found from answers an lstat as it did, found anew after any change on one, never kept where
the paths changed just before or where discovery warned."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from nvc.discover import driver, keptfiles
from nvc.model import capabilities

SETTLE_S = 0.05  # the tests' settle time: each test waits it out once before discovering


@pytest.fixture
def root(fake_2gpu, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of a fake driver's root (a test double) of its own, discovery keeping its results in
    a directory of the test's, and the copy's paths settled."""
    copy = tmp_path / "root"
    subprocess.run(["cp", "-a", str(fake_2gpu.root), str(copy)], check=True)
    monkeypatch.setattr(keptfiles, "DIRECTORY", str(tmp_path / "kept"))
    monkeypatch.setattr(keptfiles, "SETTLE_NS", int(SETTLE_S * 1e9))
    time.sleep(2 * SETTLE_S)
    return copy


def _discover(root: Path, version: str, mps_pipe_dir: str = "/mps") -> driver.DriverFiles:
    return driver.discover(
        str(root), version, machine="x86_64", kernel_release="6.1.0", firmware_class_path="", mps_pipe_dir=mps_pipe_dir
    )


def _finds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the discoveries made anew (not taken from a kept result)."""
    found: list[int] = []
    find = driver._find
    monkeypatch.setattr(driver, "_find", lambda *args: found.append(1) or find(*args))
    return found


def test_a_kept_result_is_used_while_its_lookups_answer_the_same(
    root: Path, fake_2gpu, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = _finds(monkeypatch)
    first = _discover(root, fake_2gpu.driver_version)
    assert first.libraries and first.binaries and first.firmwares
    kept = list(Path(keptfiles.DIRECTORY).iterdir())
    assert len(kept) == 1 and oct(kept[0].stat().st_mode & 0o777) == "0o600"
    for _ in range(3):
        assert _discover(root, fake_2gpu.driver_version) == first
    assert len(found) == 1
    # A directory's own times change with any entry made in it; a name no lookup asked for changes nothing.
    (root / "usr/lib/x86_64-linux-gnu/unrelated.txt").write_text("x")
    (root / "usr/bin/README").write_text("x")
    assert _discover(root, fake_2gpu.driver_version) == first
    assert len(found) == 1
    # Other inputs are other keys: the version, the capabilities' libraries.
    caps = frozenset({"compute"})
    restricted = driver.discover(
        str(root),
        fake_2gpu.driver_version,
        machine="x86_64",
        kernel_release="6.1.0",
        firmware_class_path="",
        mps_pipe_dir="/mps",
        prefixes=capabilities.library_prefixes(caps),
        loaders=capabilities.loader_files(caps),
    )
    assert restricted != first and len(found) == 2


def _rewrite_library(root: Path) -> None:
    lib = next((root / "usr/lib/x86_64-linux-gnu").glob("libcuda.so.*.*"))
    data = lib.read_bytes()
    lib.write_bytes(data[:4] + b"\x01" + data[5:])  # in place, one byte: now a 32-bit file, same inode and size
    os.utime(lib, ns=(lib.stat().st_atime_ns, lib.stat().st_mtime_ns - 10**9))  # its mtime put back too


def _relink_library(root: Path) -> None:
    lib = root / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
    lib.unlink()
    lib.symlink_to("/nowhere/libnvidia-ml.so.1")


def _new_binary(root: Path) -> None:
    (root / "usr/sbin").mkdir(exist_ok=True)
    shutil.copy(next(root.glob("usr/bin/nvidia-smi")), root / "usr/sbin/nvidia-smi")


def _new_firmware(root: Path) -> None:
    (next(root.glob("lib/firmware/nvidia/*")) / "gsp_gh100.bin").write_bytes(b"fw")


def _persistenced_starts(root: Path) -> None:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(root / "var/run/nvidia-persistenced/socket"))


def _new_ld_cache(root: Path) -> None:
    cache = root / "etc/ld.so.cache"
    shutil.copy(cache, root / "etc/new")
    os.replace(root / "etc/new", cache)  # as ldconfig writes it: another inode


def _mount_over_libraries(root: Path) -> None:
    (root / "usr/lib/x86_64-linux-gnu").rename(root / "usr/lib/moved")
    (root / "usr/lib/x86_64-linux-gnu").mkdir()


@pytest.mark.parametrize(
    ("change", "same"),
    [
        (_rewrite_library, False),
        (_relink_library, False),
        (_new_binary, False),
        (_new_firmware, False),
        (_persistenced_starts, False),
        (_new_ld_cache, True),  # the same cache, written anew: found again, the same files
        (_mount_over_libraries, False),
    ],
)
def test_any_change_on_a_path_looked_up_finds_the_files_again(
    root: Path, fake_2gpu, monkeypatch: pytest.MonkeyPatch, change: Callable[[Path], None], same: bool
) -> None:
    found = _finds(monkeypatch)
    before = _discover(root, fake_2gpu.driver_version)
    change(root)
    after = _discover(root, fake_2gpu.driver_version)
    assert len(found) == 2
    monkeypatch.setattr(keptfiles, "DIRECTORY", str(Path(keptfiles.DIRECTORY).parent / "none"))
    assert after == _discover(root, fake_2gpu.driver_version)
    assert (after == before) == same


def test_paths_changed_just_before_are_not_kept(root: Path, fake_2gpu, monkeypatch: pytest.MonkeyPatch) -> None:
    """A change within a clock tick of the lookups may not show in their times: such a result is
    found again at the next call, until its paths have settled."""
    found = _finds(monkeypatch)
    (root / "usr/bin/nvidia-smi").touch()
    _discover(root, fake_2gpu.driver_version)
    assert not Path(keptfiles.DIRECTORY).exists()
    time.sleep(2 * SETTLE_S)
    _discover(root, fake_2gpu.driver_version)
    _discover(root, fake_2gpu.driver_version)
    assert len(found) == 2


def test_a_discovery_that_warned_is_not_kept(
    root: Path, fake_2gpu, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Each call says what it left out."""
    (root / "usr/local/bin").mkdir(parents=True, exist_ok=True)
    other = root / "usr/local/bin/nvidia-smi"
    other.write_bytes(
        (root / "usr/bin/nvidia-smi").read_bytes().replace(fake_2gpu.driver_version.encode(), b"470.256.02")
    )
    other.chmod(0o755)
    time.sleep(2 * SETTLE_S)
    for _ in range(2):
        caplog.clear()
        _discover(root, fake_2gpu.driver_version)
        assert f"left out {other}: of driver 470.256.02" in caplog.text
    assert not Path(keptfiles.DIRECTORY).exists()


@pytest.mark.parametrize(
    "spoil",
    [
        lambda doc: {**doc, "lookups": [[path, [0], listed] for path, _, listed in doc["lookups"]]},
        lambda doc: {**doc, "lookups": [entry[:2] for entry in doc["lookups"]]},
        lambda doc: {**doc, "key": [*doc["key"][:-1], []]},
        lambda doc: {**doc, "value": [*doc["value"][:-1], [["a", "b", "c"]]]},
        lambda doc: {**doc, "value": doc["value"][:-1]},
        lambda doc: [doc],
    ],
)
def test_a_kept_file_of_another_shape_is_found_again(
    root: Path, fake_2gpu, monkeypatch: pytest.MonkeyPatch, spoil: Callable[[dict], object]
) -> None:
    found = _finds(monkeypatch)
    first = _discover(root, fake_2gpu.driver_version)
    (kept,) = Path(keptfiles.DIRECTORY).iterdir()
    kept.write_text(json.dumps(spoil(json.loads(kept.read_text()))))
    assert _discover(root, fake_2gpu.driver_version) == first
    assert len(found) == 2


def test_only_roots_own_kept_file_is_believed(root: Path, fake_2gpu, monkeypatch: pytest.MonkeyPatch) -> None:
    found = _finds(monkeypatch)
    first = _discover(root, fake_2gpu.driver_version)
    (kept,) = Path(keptfiles.DIRECTORY).iterdir()
    doc = json.loads(kept.read_text())
    doc["value"][1] = ["/planted/libcuda.so.1"]
    kept.write_text(json.dumps(doc))
    kept.chmod(0o644)  # readable by others: not what nvc-py writes
    assert _discover(root, fake_2gpu.driver_version) == first
    assert len(found) == 2


def test_each_thread_records_its_own_lookups(tmp_path: Path) -> None:
    """A daemon's threads may discover at once (the device plugin's and the DRA driver's calls): each
    recording holds its own thread's lookups, all of them, and nothing of the other's."""
    import threading

    from nvc.discover import rootpath

    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    both = threading.Barrier(2)
    seen: dict[str, set[str]] = {}

    def discover(name: str) -> None:
        with rootpath.recording() as lookups:
            both.wait()
            rootpath.resolve(str(tmp_path), f"/{name}/missing")
            both.wait()
        seen[name] = set(lookups.seen)

    threads = [threading.Thread(target=discover, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == {name: {f"{tmp_path}/{name}", f"{tmp_path}/{name}/missing"} for name in ("a", "b")}
    assert not rootpath._recording


def test_past_the_most_kept_the_oldest_written_results_go(
    root: Path, fake_2gpu, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each request's inputs keep a file (here the MPS pipe directory differs); past MAX_KEPT of them the
    oldest written is removed as the next is stored, and a request whose result went is found again."""
    monkeypatch.setattr(keptfiles, "MAX_KEPT", 2)
    found = _finds(monkeypatch)
    files = {}
    for name in ("a", "b", "c"):
        before = set(Path(keptfiles.DIRECTORY).glob("*.json")) if Path(keptfiles.DIRECTORY).exists() else set()
        _discover(root, fake_2gpu.driver_version, f"/mps-{name}")
        (files[name],) = set(Path(keptfiles.DIRECTORY).glob("*.json")) - before
        time.sleep(0.01)  # distinct mtimes
    assert sorted(Path(keptfiles.DIRECTORY).iterdir()) == sorted([files["b"], files["c"]])
    _discover(root, fake_2gpu.driver_version, "/mps-c")
    assert len(found) == 3  # the newest is used again
    _discover(root, fake_2gpu.driver_version, "/mps-a")
    assert len(found) == 4 and sorted(Path(keptfiles.DIRECTORY).iterdir()) == sorted([files["c"], files["a"]])

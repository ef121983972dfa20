"""Host sources cloned ahead of the call (nvc.apply.cloneahead): taken only for the very file the
call opens and checks, and by the applier's prepare. Real detached mounts (open_tree), as root."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvc.apply import cloneahead, fdmount
from nvc.apply.applier import Applier
from nvc.plan.mountplan import RO
from nvc.plan.operations import Bind, Plan


@pytest.fixture(autouse=True)
def _nothing_kept() -> Iterator[None]:
    yield
    for tree, _, _ in cloneahead._kept.values():
        os.close(tree)
    cloneahead._kept.clear()


def _bind(source: Path) -> Bind:
    return Bind(str(source), f"/usr/lib/{source.name}", int(RO))


def _opened(path: Path) -> int:
    return fdmount.open_source(str(path))


def test_a_clone_kept_is_taken_for_the_same_file_only(tmp_path: Path) -> None:
    """The file opened by the call is the one cloned: its clone is taken. Replaced since (a driver
    upgrade renames new files into place): the clone of the old one is dropped, nothing taken."""
    source = tmp_path / "libx.so.1"
    source.write_bytes(b"old")
    cloneahead.clone([_bind(source)], lambda: False)
    fd = _opened(source)
    try:
        tree = cloneahead.take(_bind(source), fd)
        assert tree is not None and os.fstat(tree).st_ino == source.stat().st_ino
        os.close(tree)
    finally:
        os.close(fd)
    cloneahead.clone([_bind(source)], lambda: False)
    (tmp_path / "new").write_bytes(b"new")
    os.rename(tmp_path / "new", source)
    fd = _opened(source)
    try:
        assert cloneahead.take(_bind(source), fd) is None
    finally:
        os.close(fd)
    assert not cloneahead._kept


def test_a_clone_is_taken_only_by_a_mount_with_its_flags(tmp_path: Path) -> None:
    """The flags are set at the clone: a mount that asks for others gets a clone of its own."""
    source = tmp_path / "libx.so.1"
    source.write_bytes(b"")
    cloneahead.clone([_bind(source)], lambda: False)
    fd = _opened(source)
    try:
        assert cloneahead.take(Bind(str(source), "/usr/lib/libx.so.1", 0), fd) is None
    finally:
        os.close(fd)
    assert len(cloneahead._kept) == 1  # still there for a mount that asks for its flags


def test_a_directory_is_not_cloned_ahead(tmp_path: Path) -> None:
    """A directory's clone takes the mounts below it as they are then: its mount clones it itself."""
    source = tmp_path / "firmware"
    source.mkdir()
    directory = Bind(str(source), "/lib/firmware/nvidia", int(RO), kind="dir")
    cloneahead.clone([directory], lambda: False)
    assert not cloneahead._kept
    fd = fdmount.open_source(str(source), directory=True)
    try:
        assert cloneahead.take(directory, fd) is None
    finally:
        os.close(fd)


def test_cloning_stops_once_the_call_comes(tmp_path: Path) -> None:
    sources = [tmp_path / f"lib{n}.so.1" for n in range(4)]
    for source in sources:
        source.write_bytes(b"")
    looks = iter([False, True])
    cloneahead.clone([_bind(s) for s in sources], lambda: next(looks))
    assert [key[0] for key in cloneahead._kept] == [str(sources[0])]


def test_the_applier_takes_the_clones_kept(tmp_path: Path) -> None:
    """A container helper started ahead cloned the sources; its call's prepare takes those clones
    (the very descriptors) and clones only what was not kept. Standalone (a plain root), in a forked
    child: prepare leaves its process without effective capabilities, as a helper."""
    rootfs = tmp_path / "rootfs"
    (rootfs / "usr" / "lib").mkdir(parents=True)
    sources = [tmp_path / name for name in ("liba.so.1", "libb.so.1")]
    for source in sources:
        source.write_bytes(b"")
    cloneahead.clone([_bind(sources[0])], lambda: False)
    kept = next(iter(cloneahead._kept.values()))[0]
    applier = Applier(Plan(str(rootfs), None, (0, 0), tuple(_bind(s) for s in sources), ldconfig=None))
    child = os.fork()
    if child == 0:
        try:
            applier.prepare(None)
            took = applier.trees[0] == kept and applier.trees[1] != kept and not cloneahead._kept
            os._exit(0 if took else 1)
        finally:
            os._exit(2)
    assert os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 0

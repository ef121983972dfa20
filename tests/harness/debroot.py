"""Minimal Debian roots made by debootstrap, for the tests that install nvc-py as a user does
(test_debootstrap.py: ``make deps build`` from a clone; test_deb.py: the Debian package).

A root is made from the network (deb.debian.org) once per suite and package list and cached as a
tarball in the suite's cache directory (hostcheck.CACHE_DIR: not /tmp, and ``make clean`` removes
it), so that later runs on the same machine skip debootstrap; each test unpacks it into its own
temporary directory. A root a test installed packages into, slowly, is cached as a directory for a
week, and each test gets an overlay over it (prepared_root). Both say on the terminal what they do and
how long it took (harness.progress).
Commands run chrooted in it inside a private mount namespace (/proc, /dev and /sys bound in, and
whatever the test binds), optionally a pid namespace of their own, which vanish with them.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shlex
import shutil
import stat
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from hostcheck import CACHE_DIR

from .progress import phase, say

REPO = Path(__file__).resolve().parent.parent.parent
CACHE = Path(CACHE_DIR)
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
PREPARED_DAYS = 7  # a root with packages installed is made again after a week (prepared_root)
CHROOT_ENV = (
    "env",
    "-i",
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME=/root",
    "LANG=C.UTF-8",
    "DEBIAN_FRONTEND=noninteractive",
)


def run(argv: Sequence[str], timeout: int) -> subprocess.CompletedProcess[str]:
    """``argv``'s result; a failure is an assertion with its output's tail."""
    result = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, (
        f"{list(argv)[:3]} failed ({result.returncode}):\n{result.stdout[-6000:]}\n{result.stderr[-4000:]}"
    )
    return result


def tarball(include: str, suite: str = SUITE) -> Path:
    """The cached bare root of ``suite`` with the packages ``include`` (debootstrap's --include)."""
    return CACHE / f"debootstrap-{suite}-minbase-{hashlib.sha256(include.encode()).hexdigest()[:12]}.tar"


def base_root(root: Path, include: str, suite: str = SUITE, mirror: str = MIRROR) -> bool:
    """A bare root at ``root``, from the cached tarball (True) or made by debootstrap (False)."""
    root.mkdir()
    cached = tarball(include, suite)
    if cached.is_file():
        with phase(f"a minimal Debian root ({suite}: {include}) from the suite's cache"):
            run(["tar", "-xpf", str(cached), "--numeric-owner", "-C", str(root)], 300)
        return True
    debootstrap = shutil.which("debootstrap") or "/usr/sbin/debootstrap"
    with phase(f"debootstrap: a minimal Debian root ({suite}: {include}) from {mirror}, cached for later runs"):
        run([debootstrap, "--variant=minbase", f"--include={include}", suite, str(root), mirror], 900)
        _store(root, cached)
    return False


@contextmanager
def prepared_root(
    where: Path, include: str, what: str, inputs: str, prepare: Callable[[Path], None], skip: Sequence[str] = ()
) -> Iterator[tuple[Path, bool]]:
    """The bare root of ``include`` after ``prepare`` (a test's slow first step, the packages it installs:
    ``what``), kept in the suite's cache while ``inputs`` (what decides its result: package lists,
    scripts) are the same, for PREPARED_DAYS (the packages stay within a week of the archive's); made
    there where it is not, without ``skip`` (paths relative to it), in place of the root of older inputs.
    Yields ``where``/root, an overlay over it (what the test changes goes to ``where``/upper and leaves
    the cached root as it was, unmounted at the end), and whether the cache had it."""
    name = f"prepared-{SUITE}-{hashlib.sha256(f'{include} {what}'.encode()).hexdigest()[:12]}"
    cached = CACHE / f"{name}-{hashlib.sha256(inputs.encode()).hexdigest()[:12]}"
    hit = cached.is_dir() and time.time() - cached.stat().st_mtime < PREPARED_DAYS * 86400
    if hit:
        say(f"  a Debian root ({SUITE}: {include}) with {what}: the suite's cache, under an overlay")
    else:
        for older in CACHE.glob(f"{name}-*"):
            shutil.rmtree(older)
        partial = CACHE / f".{cached.name}.{os.getpid()}"
        CACHE.mkdir(parents=True, exist_ok=True)
        try:
            base_root(partial, include)
            prepare(partial)
            for path in skip:
                shutil.rmtree(partial / path)
            os.rename(partial, cached)
            os.utime(cached)  # its age: from now
        finally:
            if partial.exists():
                shutil.rmtree(partial)
    root, upper, work = where / "root", where / "upper", where / "work"
    for directory in (root, upper, work):
        directory.mkdir(parents=True)
    run(
        ["mount", "-t", "overlay", "overlay", "-o", f"lowerdir={cached},upperdir={upper},workdir={work}", str(root)], 60
    )
    try:
        yield root, hit
    finally:
        run(["umount", "--lazy", str(root)], 60)  # also where the test failed with a process left in it


def _store(root: Path, cached: Path) -> None:
    """``root`` as the tarball ``cached`` (written aside and renamed: a run stopped midway leaves none)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    partial = cached.with_name(f".{cached.name}.{os.getpid()}")
    try:
        run(["tar", "-cf", str(partial), "--numeric-owner", "-C", str(root), "."], 300)
        os.replace(partial, cached)
    finally:
        partial.unlink(missing_ok=True)


def copy_tree(dest: Path) -> None:
    """The working tree as git sees it (tracked and untracked files, not ignored build outputs), as
    ``make deb`` copies it (tools/debpkg.py)."""
    spec = importlib.util.spec_from_file_location("debpkg", REPO / "tools" / "debpkg.py")
    debpkg = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(debpkg)  # type: ignore[union-attr]
    debpkg.copy_tree(REPO, dest)


def chroot(
    root: Path, script: str, timeout: int, binds: Sequence[tuple[Path, str]] = (), own_pids: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run ``script`` (sh) chrooted in ``root`` with a clean environment; ``binds``: (host path,
    path in the root) bound after /proc, /dev and /sys; ``own_pids``: in a pid namespace of its own,
    whose /proc shows its processes alone (and whose processes all end with the script)."""
    mounts = [
        f"mount --bind {root} {root}",  # a chroot whose / is a mount point, as unshare in it wants
        f"mount -t proc proc {root}/proc",
        f"mount --rbind /dev {root}/dev",
        f"mount --rbind /sys {root}/sys",
        *(f"mount --bind {shlex.quote(str(host))} {shlex.quote(str(root) + inside)}" for host, inside in binds),
    ]
    shell = " && ".join(mounts) + f' && exec {" ".join(CHROOT_ENV)} chroot {root} /bin/sh -c "$0"'
    unshare = ["unshare", "--mount", "--propagation", "private", *(["--pid", "--fork"] if own_pids else [])]
    return run([*unshare, "sh", "-c", shell, script], timeout)


def tree(root: Path, skip: Sequence[str] = ()) -> dict[str, tuple[object, ...]]:
    """Every entry under ``root`` but those of ``skip`` (paths relative to it) and what is below them:
    type, mode and owner, and a file's digest or a link's target."""
    entries: dict[str, tuple[object, ...]] = {}
    for top, dirs, names in os.walk(root):
        rel_top = os.path.relpath(top, root)
        dirs[:] = [d for d in dirs if os.path.normpath(os.path.join(rel_top, d)) not in skip]
        for name in dirs + names:
            rel = os.path.normpath(os.path.join(rel_top, name))
            if rel in skip:
                continue
            st = os.lstat(os.path.join(top, name))
            what: object = None
            if stat.S_ISREG(st.st_mode):
                what = hashlib.sha256(Path(top, name).read_bytes()).hexdigest()
            elif stat.S_ISLNK(st.st_mode):
                what = os.readlink(os.path.join(top, name))
            entries[rel] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, what)
    return entries


def differences(before: dict[str, tuple[object, ...]], after: dict[str, tuple[object, ...]]) -> list[str]:
    """The paths :func:`tree` found different, made or removed between ``before`` and ``after``."""
    return sorted(path for path in before.keys() | after.keys() if before.get(path) != after.get(path))

"""The suite leaves the host as it found it: what it watches, and how it tells.

The session runs in a mount namespace of its own with an empty tmpfs on each of :data:`PRIVATE_DIRS`
(runtimes and the hook write there at fixed paths: the config cache, sharing directories,
containerd's shim sockets, runc's state, dockerd's plugin directory, podman's blob-info cache), and
a directory of its own on /var/log (:func:`PrivateRun.bind_log`: the hooks' log at its default
place), so nothing written there reaches the host's. A directory that was missing is created for
the mount and removed at the end. At the end the mounts are detached, so the host's own directories
show again, and compared with what was there at the start, together with:

- the directories ``nvc-py setup`` and ``cdi generate`` write to on a host (:data:`SETUP_DIRS`:
  tests name their own) and those the device plugin and the engines would (:data:`ENGINE_DIRS`);
- :data:`WATCHED_FILES`, whose size and time must not change;
- the entries of the shared directories :data:`SHARED` (/tmp and /var/tmp: only names as nvc-py, its
  tests and the tools they run name theirs, since on a shared machine others write there meanwhile;
  /var/cache: every name), the suite's own :data:`CACHE_DIR` and :data:`WORK_DIR` aside: the first
  is kept between runs, the second is pytest's base temporary directory, removed after a passing run
  and by the next run after a failing one, both by ``make clean``;
- the processes the session started (:func:`own_processes`): none may still run.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from fakedriver.activate import MNT_DETACH, bind, enter_private_tmpfs, umount

PRIVATE_RUN_DIRS = ("/run/nvc-py", "/run/containerd", "/run/runc", "/run/docker")
# containers/image (podman import) keeps its blob-info cache here for root whatever store it is given.
PRIVATE_CACHE_DIRS = ("/var/lib/containers/cache",)
PRIVATE_DIRS = PRIVATE_RUN_DIRS + PRIVATE_CACHE_DIRS
# Where `nvc-py setup`, `cdi generate` and the configuration live on a host: tests write their own
# (--hooks-dir, --unit-dir, --drop-in, $NVC_PY_CONFIG...), never these; compared, not mounted over.
SETUP_DIRS = (
    "/etc/nvc-py",
    "/usr/share/containers/oci/hooks.d",
    "/etc/containers/oci/hooks.d",
    "/etc/crio",
    "/etc/containerd",
    "/etc/docker",
    "/var/lib/docker",
    "/etc/cdi",
    "/var/run/cdi",
)
# Where the device plugin (the kubelet's device plugin directory) and podman (its default store) write on a host.
ENGINE_DIRS = ("/var/lib/kubelet", "/var/lib/containers")
HOOK_LOG = "/var/log/nvc-py.log"  # the configuration's default log.file
WATCHED_FILES = (HOOK_LOG, "/var/lib/containers/cache/blob-info-cache-v1.boltdb")
CACHE_DIR = "/var/cache/nvc-py-test"  # Makefile's TEST_DIRS
WORK_DIR = "/var/tmp/nvc-py-test"
K8S_CACHE_DIR = "/var/cache/nvc-py-k8s"  # the test cluster's programs (Makefile's K8S_CLUSTER_CACHE), built before
OWN = (os.path.basename(CACHE_DIR), os.path.basename(WORK_DIR), os.path.basename(K8S_CACHE_DIR))
DEPTH = 4  # levels under each watched directory compared: enough for /run/nvc-py/share/<id>/shared
# nvc-py's and its tests' own (nvc-*, the MPS pipe directory), tempfile's default, pytest's, and
# the container tools' and lintian's.
TMP_PREFIXES = (
    "nvc",
    "nvidia",
    "tmp",
    "pytest-",
    "podman",
    "containers",
    "containerd",
    "runc",
    "crun",
    "libpod",
    "storage-run",
    "buildah",
    "ctr",
    "docker",
    "mldbm-",  # lintian's database files
)
SHARED = {"/tmp": TMP_PREFIXES, "/var/tmp": TMP_PREFIXES, "/var/cache": ("",)}
PYTEST_DIRS = "pytest-of-"  # pytest's default base directories in /tmp: their runs' directories are watched too
EXIT_WAIT = 5.0  # seconds for the session's last processes to end (podman's cleanup after `run --rm`)


def entries(path: str, depth: int) -> frozenset[str] | None:
    """Every entry under ``path`` down to ``depth`` levels, as relative paths (None: no ``path``).
    A symlink is an entry, never followed."""
    if not os.path.isdir(path):
        return None
    found: set[str] = set()
    stack = [("", depth)]
    while stack:
        relative, left = stack.pop()
        try:
            names = os.listdir(os.path.join(path, relative) if relative else path)
        except OSError:
            continue
        for name in names:
            child = os.path.join(relative, name) if relative else name
            found.add(child)
            full = os.path.join(path, child)
            if left > 1 and os.path.isdir(full) and not os.path.islink(full):
                stack.append((child, left - 1))
    return frozenset(found)


def _shared_entries(path: str, prefixes: tuple[str, ...]) -> frozenset[str]:
    """The entries of shared directory ``path`` that could be the suite's (not its own two)."""
    found = {name for name in entries(path, 1) or () if name.startswith(prefixes) and name not in OWN}
    for name in [n for n in found if n.startswith(PYTEST_DIRS)]:
        found |= {os.path.join(name, run) for run in entries(os.path.join(path, name), 1) or ()}
    return frozenset(found)


def _file_state(path: str) -> tuple[int, int] | None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return st.st_size, st.st_mtime_ns


@dataclass
class HostState:
    """What the watched places held; :func:`changes` compares two of them."""

    dirs: dict[str, frozenset[str] | None] = field(default_factory=dict)
    shared: dict[str, frozenset[str]] = field(default_factory=dict)
    files: dict[str, tuple[int, int] | None] = field(default_factory=dict)


def snapshot(
    dirs: tuple[str, ...] = PRIVATE_DIRS + SETUP_DIRS + ENGINE_DIRS,
    shared: dict[str, tuple[str, ...]] | None = None,
    files: tuple[str, ...] = WATCHED_FILES,
) -> HostState:
    return HostState(
        {path: entries(path, DEPTH) for path in dirs},
        {path: _shared_entries(path, prefixes) for path, prefixes in (SHARED if shared is None else shared).items()},
        {path: _file_state(path) for path in files},
    )


def changes(before: HostState, after: HostState) -> list[str]:
    """One line per difference: an entry that appeared or vanished, a directory made or removed, a
    watched file written to."""
    lines = []
    for path, was in before.dirs.items():
        now = after.dirs.get(path)
        if (was is None) != (now is None):
            lines.append(f"{path}: {'created' if was is None else 'removed'}")
            continue
        lines += [f"{path}/{name}: left behind" for name in sorted((now or frozenset()) - (was or frozenset()))]
        lines += [f"{path}/{name}: removed" for name in sorted((was or frozenset()) - (now or frozenset()))]
    for path, was in before.shared.items():
        lines += [f"{path}/{name}: left behind" for name in sorted(after.shared.get(path, frozenset()) - was)]
    for path, was in before.files.items():
        now = after.files.get(path)
        if was != now:
            lines.append(f"{path}: {'created' if was is None else 'removed' if now is None else 'written to'}")
    return lines


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(1 << 20)
    except OSError:
        return b""


def own_processes(marker: str, proc: str = "/proc") -> dict[int, str]:
    """The processes this session started that still run (pid -> command line), this process and its
    ancestors aside: those whose command line or environment names ``marker`` (the session's base
    temporary directory: every configuration, driver root, rootfs and private store a test makes is
    in it, and every program a test runs is given one of them), and what runs below them. A process of
    another program on the machine (another nvc-py's hook server and its helpers, a device plugin, a
    second test suite) names none of them, and is not this session's to judge."""
    parents: dict[int, int] = {}
    for name in os.listdir(proc):
        if name.isdigit():
            fields = _read(f"{proc}/{name}/stat").rsplit(b")", 1)[-1].split()
            if len(fields) > 1 and fields[0] != b"Z":  # a zombie is gone but for its parent's wait
                parents[int(name)] = int(fields[1])
    mine, pid = set(), os.getpid()
    while pid > 1:  # this process and its ancestors (make, the shell that ran pytest)
        mine.add(pid)
        pid = parents.get(pid, 0)
    key = os.fsencode(marker)
    found = {
        pid
        for pid in parents
        if pid not in mine and (key in _read(f"{proc}/{pid}/cmdline") or key in _read(f"{proc}/{pid}/environ"))
    }
    while grown := {pid for pid, parent in parents.items() if parent in found and pid not in found | mine}:
        found |= grown
    return {
        pid: _read(f"{proc}/{pid}/cmdline").replace(b"\0", b" ").decode(errors="replace").strip()
        for pid in sorted(found)
    }


def left_running(marker: str, wait: float = EXIT_WAIT) -> list[str]:
    """One line per process of the session (:func:`own_processes`) still running after ``wait`` seconds."""
    deadline = time.monotonic() + wait
    while (running := own_processes(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [f"process {pid} ({command[:200]}): left running" for pid, command in running.items()]


class PrivateRun:
    """The session's tmpfs mounts over :data:`PRIVATE_DIRS` (and its log directory on /var/log), and
    their removal at the end."""

    def __init__(self, paths: tuple[str, ...] = PRIVATE_DIRS) -> None:
        self.paths = list(paths)
        self.created = {path: _top_missing(path) for path in paths}
        enter_private_tmpfs(*paths)

    def bind_log(self, directory: str) -> None:
        """``directory`` shown on /var/log in the session's namespace: the hooks' log at its default
        place (``log.file``), and anything else a program of the suite logs there, lands in it."""
        bind(directory, os.path.dirname(HOOK_LOG), readonly=False)
        self.paths.append(os.path.dirname(HOOK_LOG))

    def leave(self) -> None:
        """Detach the mounts (the host's directories show again); remove the directories made for them."""
        for path in self.paths:
            umount(path, MNT_DETACH)
        for path, top in self.created.items():
            while top is not None:
                try:
                    os.rmdir(path)
                except OSError:
                    break  # not empty: something wrote there past the mount, which changes() reports
                if path == top:
                    break
                path = os.path.dirname(path)


def _top_missing(path: str) -> str | None:
    """The highest of ``path`` and its ancestors that is missing (what a mount there creates), or None."""
    top = None
    while not os.path.isdir(path):
        top, path = path, os.path.dirname(path)
    return top

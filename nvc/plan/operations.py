"""What a mount plan is made of: its operations, the :class:`Plan` that orders them, and the two
forms a plan takes, the lines ``configure --dry-run`` prints and the JSON-able form the container
helper receives.

The rules that decide which operations a container gets are :mod:`nvc.plan.mountplan`'s; the
applier (:mod:`nvc.apply.applier`) carries them out. Paths named ``target`` are paths inside the
container; ``source`` paths are host paths (or, for ``in_rootfs`` sources, paths inside the
container's rootfs). The wire form is each record's fields under its type's name, so it lives with
the types: a new operation has its wire form with no second table to keep in step.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from nvc.discover.nodes import NodeSpec
from nvc.plan.devfilter import DeviceRule
from nvc.plan.mps import MpsClient
from nvc.plan.share import BOUNDS_FILE, GRANTED_DIR, ShareFiles
from nvc.records import NamedTuple
from nvc.system.syscalls import MountAttr

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class Bind(NamedTuple):
    """Bind ``source`` onto ``target`` with per-mount flags ``attrs``; the target is created if missing.

    ``kind``: file, dir or device (a character device whose st_rdev must be ``rdev``).
    ``in_rootfs``: the source is a path inside the container's rootfs (CUDA compat libraries
    in mount mode), resolved there like every container path.
    """

    source: str
    target: str
    attrs: int
    kind: str = "file"
    what: str = "library"
    rdev: int | None = None
    in_rootfs: bool = False

    def text(self) -> str:
        flags = ",".join(str(f.name).lower() for f in MountAttr if f & self.attrs) or "rw"
        if self.rdev is not None:
            flags = f"c {os.major(self.rdev)}:{os.minor(self.rdev)}, {flags}"
        where = " (in rootfs)" if self.in_rootfs else ""
        return f"bind    {self.what:<9} {self.source}{where} -> {self.target} [{flags}]"


def _line(verb: str, target: str, detail: str = "", what: str = "proc") -> str:
    """An operation on one container path as ``--dry-run`` prints it."""
    return f"{verb:<7} {what:<9} {target}{detail}"


class Tmpfs(NamedTuple):
    """A fresh tmpfs on ``target`` (an existing directory on procfs), filled by the operations after it."""

    target: str

    def text(self) -> str:
        return _line("tmpfs", self.target)


class MakeDir(NamedTuple):
    """A directory inside a tmpfs of the plan."""

    target: str

    def text(self) -> str:
        return _line("mkdir", self.target)


class WriteFile(NamedTuple):
    """A read-only file with ``content`` inside a tmpfs of the plan."""

    target: str
    content: str = ""
    mode: int = 0o444

    def text(self) -> str:
        return _written(self.target, self.content)


def _written(target: str, content: str, what: str = "proc") -> str:
    """A file written with ``content``, as ``--dry-run`` prints it: its size and first line."""
    first = content.splitlines()[0] if content else ""
    return _line("write", target, f" ({len(content.encode())} bytes: {first[:40]!r}…)", what)


class Seal(NamedTuple):
    """Make the tmpfs on ``target`` read-only (nosuid, nodev, noexec) once it is filled."""

    target: str

    def text(self) -> str:
        return _line("seal", self.target, " [rdonly,nosuid,nodev,noexec]")


class Symlink(NamedTuple):
    """Symlink ``target`` -> ``link_to``, made only where nothing exists at ``target``."""

    target: str
    link_to: str = ""

    def text(self) -> str:
        return _line("symlink", self.target, f" -> {self.link_to}", what="library")


def _share_lines(share: ShareFiles) -> list[str]:
    """What ``--dry-run`` prints of GPU sharing's host files."""
    where = f"{share.state_dir.rstrip('/')}/{share.container_id}"
    lines = [
        _line("mkdir", where, what="host"),
        _line("write", f"{where}/owner", " (the container's bundle and process)", what="host"),
        _line("tmpfs", f"{where}/shared", " (limits, region)", what="host"),
        _written(f"{where}/shared/limits", share.limits, "host"),
        _written(f"{where}/ld.so.preload", share.preload, "host"),
        *(
            [_line("write", f"{where}/{BOUNDS_FILE}", " (the pod's grant: share set stays within)", what="host")]
            if share.bounds
            else []
        ),
    ]
    if share.scheduled:
        sched = share.sched_dir.rstrip("/")
        lines += [
            _line("write", f"{sched}/{GRANTED_DIR}/{share.container_id}", " (its granted compute limits)", what="host"),
            _line("write", f"{sched}/{share.container_id}", " (scheduler file)", what="host"),
        ]
    return lines


Operation = Bind | Tmpfs | MakeDir | WriteFile | Seal | Symlink
_OPS: dict[str, type] = {cls.__name__.lower(): cls for cls in (Bind, Tmpfs, MakeDir, WriteFile, Seal, Symlink)}


class Plan(NamedTuple):
    """Everything ``configure`` does to one container, in order."""

    rootfs: str  # as given (absolute path; with pid, in the container's mount namespace)
    pid: int | None
    owner: tuple[int, int]  # uid, gid created files get and ldconfig runs as
    operations: tuple[Operation, ...]
    cgroup_rules: tuple[DeviceRule, ...] = ()
    ldconfig: str | None = None  # None: no ldconfig run (no library mounted)
    ldconfig_dirs: tuple[str, ...] = ()
    # --load-kmods: driver nodes the loaded modules provide but the driver root lacks, made on the
    # host (under host_root) before anything in the container
    host_nodes: tuple[NodeSpec, ...] = ()
    host_root: str = "/"
    share: ShareFiles | None = None  # GPU sharing's host files, made next (removed if a later step fails)
    mps: MpsClient | None = None  # its device's MPS daemon, started before the sharing files (nvc.plan.mps)
    # How many leading operations make what ldconfig reads: it starts once they are done, beside the
    # rest (nvc.plan.mountplan orders them so); None: all of them
    before_ldconfig: int | None = None

    def ldconfig_start(self) -> int:
        """How many operations are done before ldconfig starts: ``before_ldconfig`` where ldconfig runs,
        all of them otherwise; the applier runs the rest beside it."""
        if self.ldconfig is None or self.before_ldconfig is None:
            return len(self.operations)
        return self.before_ldconfig

    def text(self) -> str:
        """The human-readable rendering ``configure --dry-run`` prints."""
        pid = "standalone" if self.pid is None else f"pid {self.pid}"
        root = self.host_root.rstrip("/")
        lines = [f"mknod   host      {root}{n.path} c {n.major}:{n.minor} mode {n.mode:o}" for n in self.host_nodes]
        if self.mps is not None:
            lines.append(
                _line(
                    "mps",
                    self.mps.directory,
                    f" (nvidia-cuda-mps-control -d for {self.mps.device} unless running; "
                    f"client uid {self.mps.uid}, limits added to its limits file)",
                    what="host",
                )
            )
        lines += _share_lines(self.share) if self.share is not None else []
        lines.append(f"rootfs  {self.rootfs} ({pid}, owner {self.owner[0]}:{self.owner[1]})")
        lines += [op.text() for op in self.operations]
        lines += [f"cgroup  allow     {rule}" for rule in self.cgroup_rules]
        if self.ldconfig is not None:
            lines.append(f"ldconfig {self.ldconfig} {' '.join(self.ldconfig_dirs)}")
        return "".join(f"{line}\n" for line in lines)

    def to_wire(self) -> dict[str, Any]:
        """A JSON-able form for the trip to the applier helper."""
        return {
            "rootfs": self.rootfs,
            "pid": self.pid,
            "owner": list(self.owner),
            "operations": [{"op": type(op).__name__.lower(), **op._asdict()} for op in self.operations],
            "cgroup_rules": [r._asdict() for r in self.cgroup_rules],
            "ldconfig": self.ldconfig,
            "ldconfig_dirs": list(self.ldconfig_dirs),
            "host_nodes": [list(n) for n in self.host_nodes],
            "host_root": self.host_root,
            "share": None if self.share is None else self.share._asdict(),
            "mps": None if self.mps is None else self.mps._asdict(),
            "before_ldconfig": self.before_ldconfig,
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Plan:
        ops = []
        for raw in data["operations"]:
            fields = dict(raw)
            ops.append(_OPS[fields.pop("op")](**fields))
        return cls(
            rootfs=data["rootfs"],
            pid=data["pid"],
            owner=(data["owner"][0], data["owner"][1]),
            operations=tuple(ops),
            cgroup_rules=tuple(DeviceRule(**r) for r in data["cgroup_rules"]),
            ldconfig=data["ldconfig"],
            ldconfig_dirs=tuple(data["ldconfig_dirs"]),
            host_nodes=tuple(NodeSpec(*n) for n in data["host_nodes"]),
            host_root=data["host_root"],
            share=None if data["share"] is None else ShareFiles(**data["share"]),
            mps=None if data.get("mps") is None else MpsClient(**data["mps"]),
            before_ldconfig=data.get("before_ldconfig"),
        )

"""`nvc-py share status`: per container on this host, its sharing limits, the memory each of its
processes holds, and its compute share and throttling, read from the per-container directories the
hook prepared (:mod:`nvc.apply.sharefiles`) and the regions the shim keeps there (:mod:`nvc.share.region`).

A container's shared directory is its own to write, so everything read there is the container's
word: root reads nothing there without checking it first (no symlink followed, no FIFO or device
opened, the region read only at its exact size) and reports what it found instead; every string
from there is escaped when shown (no forged lines, no terminal escapes). The processes listed are
the ones the container reports, with the memory it reports for them: a host pid is shown only for
a reported process found in the container's own pid namespace (recorded by the hook at prestart:
:mod:`nvc.apply.shareowner`), never for one the container claims elsewhere.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Iterator, Sequence

from nvc.apply import shareowner
from nvc.apply.mps import DeviceState
from nvc.errors import one_line
from nvc.plan import mps, share
from nvc.records import NamedTuple
from nvc.share.region import SIZE, Region, RegionFormatError, parse_region
from nvc.share.sched import IDLE_NS, SchedDevice, SchedFormatError, parse_sched
from nvc.share.sched import SIZE as SCHED_SIZE
from nvc.system import untrusted

DEFAULT_BACKEND = "timeslice"  # the shim's own time slicing, where the limits name no other backend


class Process(NamedTuple):
    pid: int  # inside the container, as the container reports it
    host_pid: int | None  # None: no such process in the container's pid namespace (gone, or a false claim)
    used: dict[str, int]  # device key -> bytes, as the container reports them


class Device(NamedTuple):
    key: str
    memory_limit: int  # bytes, 0 = unlimited
    memory_used: int  # the container's total over its processes
    compute_percent: int
    sm_count: int
    busy_s: float  # GPU time of throttled launches (SM-weighted)
    throttled_s: float  # time launches waited for their share
    launches: int
    weight: int | None = None  # None: not weighted
    share_percent: float | None = None  # measured share of the GPU while busy; None: idle or unknown
    latency_class: str | None = None  # the limits' priority for it; None: none given
    backend: str = DEFAULT_BACKEND  # the sharing backend the limits name for it
    duty_percent: int | None = None  # a weight's duty cycle beside a steady heavier container; None: none now
    backlog_percent: float | None = None  # its looks at its backlog that found its work queued; None: idle
    steady_percent: float | None = None  # those whose previous look's work had not run yet; None: idle


class ContainerShare(NamedTuple):
    id: str
    directory: str
    limits: dict[str, str]  # the limits file's key=value entries, as the hook wrote them
    region: str  # "ok", or why it cannot be read (e.g. no CUDA process yet)
    devices: tuple[Device, ...] = ()
    processes: tuple[Process, ...] = ()


def _limits(text: str) -> dict[str, str]:
    entries = (line.strip().split("=", 1) for line in text.splitlines())
    return {e[0]: e[1] for e in entries if len(e) == 2 and not e[0].startswith("#") and e[0] != "version"}


def _host_pids(proc: str = "/proc") -> dict[tuple[int, int, int], int]:
    """(pid namespace inode, pid in that namespace, start time) -> host pid, for every process."""
    found: dict[tuple[int, int, int], int] = {}
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            ino = os.stat(f"{proc}/{name}/ns/pid").st_ino
            with open(f"{proc}/{name}/status") as f:
                nspid = next(line.split()[-1] for line in f if line.startswith("NSpid:"))
            with open(f"{proc}/{name}/stat") as f:
                start = int(f.read().rsplit(")", 1)[1].split()[19])
        except (OSError, StopIteration, ValueError, IndexError):
            continue  # gone meanwhile, or a kernel without NSpid
        found[(ino, int(nspid), start)] = int(name)
    return found


class _Refused(Exception):
    """A file in a container's directory is not what the hook put there (the message says what)."""


def _read(dir_fd: int, name: str, label: str, *, max_size: int, size: int | None = None) -> bytes:
    """A root-owned regular file of the container's tmpfs, checked before it is opened for reading:
    the container may have put a symlink, FIFO, device node or huge file in its place."""
    try:
        path_fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as err:
        raise _Refused(f"{label}: {err.strerror}") from None
    try:
        return untrusted.read_checked(path_fd, max_size=max_size, size=size, owner=0)
    except untrusted.UnexpectedFile as err:
        raise _Refused(f"{label} {err}") from None
    finally:
        os.close(path_fd)


def _open_dir(dir_fd: int, name: str, label: str) -> int:
    try:
        return os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as err:
        raise _Refused(f"{label}: {err.strerror} (a directory expected, symlinks not followed)") from None


def _sched(sched_dir: str, cid: str) -> dict[str, SchedDevice]:
    """The container's scheduler entries by device key; none when it has no (readable) file."""
    try:
        dir_fd = os.open(sched_dir, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return {}
    try:
        data = _read(dir_fd, cid, f"{sched_dir}/{cid}", max_size=SCHED_SIZE, size=SCHED_SIZE)
        return {d.key: d for d in parse_sched(data)}
    except (_Refused, SchedFormatError):
        return {}
    finally:
        os.close(dir_fd)


def _per_device(limits: dict[str, str], name: str, key: str) -> str | None:
    """The value the limits give ``name`` on device ``key`` (a UUID key): its GPU-/MIG- UUID's, else
    the default (no scope); None where neither is given."""
    by_uuid = {
        entry[len(name) + 5 :].lower(): value
        for entry, value in limits.items()
        if entry.startswith((f"{name}.GPU-", f"{name}.MIG-"))
    }
    return by_uuid.get(key.lower()) or limits.get(name)


def _mps_client(limits: dict[str, str]) -> bool:
    """Whether the container is shared through MPS: the hook wrote MPS's client variables into its
    limits file (nvc.plan.mps: ``mps.NAME=VALUE``)."""
    return any(entry.startswith("mps.") for entry in limits)


def _mps_class(limits: dict[str, str]) -> str | None:
    """The latency class an MPS client's priority variable stands for (None: none given)."""
    priority = limits.get(f"mps.{mps.CLIENT_PRIORITY}")
    return next((name for name, value in mps.PRIORITY_OF_CLASS.items() if str(value) == priority), None)


def _weight(limits: dict[str, str], key: str) -> int | None:
    """The weight the limits give device ``key``."""
    return untrusted.decimal(_per_device(limits, "compute_weight", key) or "", 4)


def container_share(
    state_fd: int, cid: str, directory: str, host_pids: dict[tuple[int, int, int], int], sched_dir: str = ""
) -> ContainerShare:
    """The status of one per-container directory (``cid`` in the state directory open on ``state_fd``)."""
    limits: dict[str, str] = {}
    try:
        dir_fd = _open_dir(state_fd, cid, directory)
        try:
            record = shareowner.read(dir_fd)
            shared_fd = _open_dir(dir_fd, "shared", f"{directory}/shared")
        finally:
            os.close(dir_fd)
        try:
            limits = _limits(
                _read(shared_fd, "limits", f"{directory}/shared/limits", max_size=share.LIMITS_MAX).decode(
                    "utf-8", "replace"
                )
            )
            data = _read(shared_fd, "region", f"{directory}/shared/region", max_size=SIZE, size=SIZE)
        finally:
            os.close(shared_fd)
    except _Refused as err:
        return ContainerShare(cid, directory, limits, f"unreadable: {err}")
    try:
        region: Region = parse_region(data)
    except RegionFormatError as err:
        return ContainerShare(cid, directory, limits, f"not initialised: {err}")
    pidns = record.pidns if record else None
    processes = tuple(
        Process(
            s.pid,
            host_pids.get((s.pidns_ino, s.pid, s.start_time)) if s.pidns_ino == pidns else None,
            {d.key: used for d, used in zip(region.devices, s.used, strict=True) if used},
        )
        for s in region.slots
    )
    sched = _sched(sched_dir, cid) if sched_dir else {}
    now = time.monotonic_ns()

    def busy_entry(key: str) -> SchedDevice | None:
        entry = sched.get(key)
        return entry if entry and now - entry.seen_ns < IDLE_NS else None

    def share_of(key: str) -> float | None:
        entry = busy_entry(key)
        return entry.share_permille / 10 if entry else None

    def duty_of(key: str) -> int | None:
        entry = busy_entry(key)
        return entry.duty_percent if entry and entry.duty_percent else None

    def looks_of(key: str) -> tuple[float | None, float | None]:
        entry = busy_entry(key)
        return (entry.backlog_permille / 10, entry.steady_permille / 10) if entry else (None, None)

    devices = tuple(
        Device(
            d.key,
            d.memory_limit,
            sum(s.used[i] for s in region.slots),
            d.compute,
            d.sm_count,
            d.busy_ns / 1e9,
            d.throttled_ns / 1e9,
            d.launches,
            _weight(limits, d.key),
            share_of(d.key),
            _per_device(limits, "priority", d.key) or _mps_class(limits),
            _per_device(limits, "backend", d.key) or ("mps" if _mps_client(limits) else DEFAULT_BACKEND),
            duty_of(d.key),
            *looks_of(d.key),
        )
        for i, d in enumerate(region.devices)
    )
    return ContainerShare(cid, directory, limits, "ok", devices, processes)


def _is_dir(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False  # gone meanwhile


def status(state_dir: str = share.STATE_DIR, sched_dir: str | None = None) -> list[ContainerShare]:
    """Every container with a sharing directory under state_dir, by id. Only directories are
    considered, and nothing there is followed (see _read)."""
    try:
        state_fd = os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return []
    try:
        names = sorted(n for n in os.listdir(state_fd) if _is_dir(state_fd, n))
        host_pids = _host_pids() if names else {}
        sched_dir = sched_dir or share.sched_dir_for(state_dir)
        return [container_share(state_fd, n, os.path.join(state_dir, n), host_pids, sched_dir) for n in names]
    finally:
        os.close(state_fd)


_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
_LIMIT_NAMES = {"memory_limit": "memory", "compute_percent": "compute cap", "compute_weight": "weight"}


def size_text(n: int) -> str:
    """Bytes in the largest binary unit that leaves at least 1: ``4 GiB``, ``1.5 GiB``, ``600 MiB``."""
    unit = 0
    while unit + 1 < len(_UNITS) and n >= 1 << (10 * (unit + 1)):
        unit += 1
    value = n / (1 << (10 * unit))
    return f"{value:.0f} {_UNITS[unit]}" if value == int(value) or unit == 0 else f"{value:.1f} {_UNITS[unit]}"


def limit_text(key: str, value: str) -> str:
    """One entry of a limits file as a person reads it (``memory 4 GiB on GPU 1``); anything the hook
    does not write (the container cannot change the file, but an older or newer hook may have) as it is."""
    name, _, scope = key.partition(".")
    number = untrusted.decimal(value)
    if name not in _LIMIT_NAMES or number is None:
        return one_line(f"{key}={value}", 200)
    shown = {"memory_limit": size_text(number), "compute_percent": f"{number} %"}.get(name, str(number))
    index = scope.isascii() and scope.isdigit()
    where = "" if not scope else f" on GPU {scope}" if index else f" on {one_line(scope, 64)}"
    return f"{_LIMIT_NAMES[name]} {shown}{where}"


def _memory_text(used: int, limit: int) -> str:
    if limit == 0:
        return f"memory {size_text(used)} used (no limit)"
    return f"memory {size_text(used)} used of {size_text(limit)} ({100 * used / limit:.0f} %)"


def text(containers: list[ContainerShare], daemons: Sequence[DeviceState] = ()) -> str:
    """The human form: sizes in binary units, shares in percent, times in seconds (``--json`` keeps
    bytes, and the file's keys and values as they are); then each MPS daemon nvc-py runs."""
    found = "".join(f"{line}\n" for c in containers for line in _lines(c)) if containers else ""
    found = found or "no container shares a GPU on this host\n"
    return found + "".join(f"{_daemon_line(d)}\n" for d in daemons)


def _daemon_line(d: DeviceState) -> str:
    state = f"running (pid {d.pid})" if d.pid else "not running (the next container of the GPU starts it again)"
    clients = ", ".join(f"{one_line(c.container_id)} (uid {c.uid})" for c in d.clients) or "none"
    return f"MPS daemon of {one_line(d.device, 64)}: {state}; containers: {clients}"


def _lines(c: ContainerShare) -> Iterator[str]:
    """The text form; every string read from the container's files goes through ``one_line``."""
    yield f"container {one_line(c.id)}"
    yield "  limits: " + (", ".join(limit_text(k, v) for k, v in c.limits.items()) or "none")
    if c.region.startswith("not initialised: "):
        yield f"  usage: none recorded yet ({one_line(c.region.removeprefix('not initialised: '))})"
    elif c.region != "ok":
        yield f"  region: {one_line(c.region)}"
    for d in c.devices:
        cap = f"compute cap {d.compute_percent} %" if 0 < d.compute_percent < 100 else "no compute cap"
        weight = f", weight {d.weight}" if d.weight else ""
        measured = (
            f", measured share {d.share_percent:.1f} %" if d.share_percent is not None else ", idle" if d.weight else ""
        )
        if d.weight and d.backlog_percent is not None:
            measured += f", work queued at {d.backlog_percent:.0f} % of its looks (steady {d.steady_percent:.0f} %)"
        if d.duty_percent:
            measured += f", in a duty cycle of {d.duty_percent} % beside a steadily busy heavier container"
        yield (
            f"  {one_line(d.key, 64)}: {_memory_text(d.memory_used, d.memory_limit)}; {cap}{weight}{measured}, "
            f"busy {d.busy_s:.1f} s, throttled {d.throttled_s:.1f} s over {d.launches} launches"
        )
    for p in c.processes:
        host = f"host pid {p.host_pid}" if p.host_pid else "not running in the container's pid namespace"
        used = ", ".join(f"{one_line(k, 64)} {size_text(v)}" for k, v in p.used.items()) or "no device memory"
        yield f"  pid {p.pid} as the container reports it ({host}): {used}"


def _plain(value: object) -> object:
    """Records as JSON objects, all the way down (a named tuple would print as an array)."""
    if isinstance(value, tuple) and hasattr(value, "_asdict"):
        return {key: _plain(item) for key, item in value._asdict().items()}
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    return value


def as_json(containers: list[ContainerShare], daemons: Sequence[DeviceState] = ()) -> str:
    doc = {"containers": [_plain(c) for c in containers], "mps": [_plain(d) for d in daemons]}
    return json.dumps(doc, indent=2) + "\n"

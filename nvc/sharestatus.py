"""`nvc-py share status`: per container on this host, its sharing limits, the memory each of its
processes holds, and its compute share and throttling, read from the per-container directories the
hook prepared (nvc/share.py) and the regions the shim keeps there (nvc/shareregion.py).

Processes are listed with their pid inside the container and, where it can be found, on the host
(matched by pid namespace inode and NSpid); a registered process that no longer runs is shown as
gone: the shim reclaims its memory at the next out-of-memory decision.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass

from nvc import share
from nvc.shareregion import Region, RegionFormatError, parse_region


@dataclass(frozen=True)
class Process:
    pid: int                      # inside the container
    host_pid: int | None          # None: not running any more (or not visible from here)
    used: dict[str, int]          # device key -> bytes


@dataclass(frozen=True)
class Device:
    key: str
    memory_limit: int             # bytes, 0 = unlimited
    memory_used: int              # the container's total over its processes
    compute_percent: int
    sm_count: int
    busy_s: float                 # GPU time of throttled launches (SM-weighted)
    throttled_s: float            # time launches waited for their share
    launches: int


@dataclass(frozen=True)
class ContainerShare:
    id: str
    directory: str
    limits: dict[str, str]        # the limits file's key=value entries, as the hook wrote them
    region: str                   # "ok", or why it cannot be read (e.g. no CUDA process yet)
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
            continue                  # gone meanwhile, or a kernel without NSpid
        found[(ino, int(nspid), start)] = int(name)
    return found


def container_share(directory: str, host_pids: dict[tuple[int, int, int], int]) -> ContainerShare:
    """The status of one per-container directory."""
    shared = os.path.join(directory, "shared")
    cid = os.path.basename(directory)
    try:
        with open(os.path.join(shared, "limits")) as f:
            limits = _limits(f.read())
        with open(os.path.join(shared, "region"), "rb") as f:
            region: Region = parse_region(f.read())
    except OSError as err:
        return ContainerShare(cid, directory, {}, f"unreadable: {err.strerror}")
    except RegionFormatError as err:
        return ContainerShare(cid, directory, limits, f"not initialised: {err}")
    processes = tuple(
        Process(s.pid, host_pids.get((s.pidns_ino, s.pid, s.start_time)),
                {d.key: used for d, used in zip(region.devices, s.used) if used})
        for s in region.slots)
    devices = tuple(
        Device(d.key, d.memory_limit, sum(s.used[i] for s in region.slots), d.compute, d.sm_count,
               d.busy_ns / 1e9, d.throttled_ns / 1e9, d.launches)
        for i, d in enumerate(region.devices))
    return ContainerShare(cid, directory, limits, "ok", devices, processes)


def status(state_dir: str = share.STATE_DIR) -> list[ContainerShare]:
    """Every container with a sharing directory under state_dir, by id."""
    try:
        names = sorted(n for n in os.listdir(state_dir) if os.path.isdir(os.path.join(state_dir, n)))
    except FileNotFoundError:
        return []
    host_pids = _host_pids() if names else {}
    return [container_share(os.path.join(state_dir, n), host_pids) for n in names]


def _size(n: int) -> str:
    return "unlimited" if n == 0 else f"{n / (1 << 20):.0f} MiB"


def text(containers: list[ContainerShare]) -> str:
    if not containers:
        return "no container shares a GPU on this host\n"
    return "".join(f"{line}\n" for c in containers for line in _lines(c))


def _lines(c: ContainerShare) -> Iterator[str]:
    yield f"container {c.id}"
    yield "  limits: " + (" ".join(f"{k}={v}" for k, v in c.limits.items()) or "-")
    if c.region != "ok":
        yield f"  region: {c.region}"
    for d in c.devices:
        yield (f"  {d.key}: memory {_size(d.memory_used) if d.memory_used else '0 MiB'} used of "
               f"{_size(d.memory_limit)}; compute {d.compute_percent}%, busy {d.busy_s:.1f} s, "
               f"throttled {d.throttled_s:.1f} s over {d.launches} launches")
    for p in c.processes:
        host = f"host pid {p.host_pid}" if p.host_pid else "gone"
        used = ", ".join(f"{k} {_size(v)}" for k, v in p.used.items()) or "no device memory"
        yield f"  pid {p.pid} ({host}): {used}"


def as_json(containers: list[ContainerShare]) -> str:
    return json.dumps({"containers": [asdict(c) for c in containers]}, indent=2) + "\n"

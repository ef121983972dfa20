"""What the device plugin tells the exporter (``nvc-py exporter``): each resource's healthy and
unhealthy device count, as the kubelet is told them, and which process says so.

A small root-owned JSON file, written anew (a rename, so a reader never sees half of it) at every
change the plugin announces to the kubelet, removed when the plugin stops. A plugin killed without
stopping leaves it behind, so the reader believes it only while the process it names runs: the same
pid and start time, as seen in the /proc both mount (the plugin's pid is read from /proc/self, which
names it in that /proc's pid namespace, so a plugin in a pod and an exporter in another container
of that pod agree on it). Imports nothing of gRPC: the exporter reads it.
"""

from __future__ import annotations

import json
import os

from nvc.records import NamedTuple

FILE = "/run/nvc-py/device-plugin.json"
MAX_RESOURCES = 64  # what a reader takes: the plugin has one per MIG profile, a handful
_MAX = 64 * 1024


class ResourceHealth(NamedTuple):
    name: str
    healthy: int
    unhealthy: int


class Published(NamedTuple):
    pid: int  # in the pid namespace of the /proc mounted where the plugin runs
    start_time: int  # /proc/PID/stat field 22
    resources: tuple[ResourceHealth, ...]


def this_process(resources: tuple[ResourceHealth, ...]) -> Published | None:
    """The record for this process (None where /proc does not show it)."""
    from nvc.apply.container import start_time

    try:
        pid = int(os.readlink("/proc/self"))
    except (OSError, ValueError):
        return None
    started = start_time(pid)
    return None if started is None else Published(pid, started, resources)


def encode(published: Published) -> bytes:
    return (
        json.dumps(
            {
                "pid": published.pid,
                "start_time": published.start_time,
                "resources": [r._asdict() for r in published.resources],
            }
        ).encode()
        + b"\n"
    )


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def decode(data: bytes) -> Published | None:
    """The record in ``data``; None when it is not one."""
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    if (
        not isinstance(doc, dict)
        or _count(doc.get("pid")) is None
        or _count(doc.get("start_time")) is None
        or not isinstance(doc.get("resources"), list)
    ):
        return None
    found = []
    for entry in doc["resources"][:MAX_RESOURCES]:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            return None
        healthy, unhealthy = _count(entry.get("healthy")), _count(entry.get("unhealthy"))
        if healthy is None or unhealthy is None:
            return None
        found.append(ResourceHealth(entry["name"], healthy, unhealthy))
    return Published(doc["pid"], doc["start_time"], tuple(found))


def write(path: str, published: Published) -> None:
    """Replace ``path`` with ``published`` (OSError to the caller: the plugin logs it and goes on)."""
    directory, name = os.path.split(path)
    os.makedirs(directory or ".", 0o755, exist_ok=True)
    temporary = os.path.join(directory, f".{name}.{os.getpid()}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, encode(published))
    finally:
        os.close(fd)
    os.replace(temporary, path)


def remove(path: str, published: Published) -> None:
    """Remove ``path`` if it still is this process's record (a newer plugin may have replaced it)."""
    if read(path, alive_only=False) == published:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def read(path: str, alive_only: bool = True) -> Published | None:
    """The record at ``path``: only root's own regular file, read bounded; None when there is none,
    it is not one, or (``alive_only``) the process it names no longer runs."""
    from nvc.apply.container import start_time
    from nvc.system import untrusted

    try:
        path_fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        published = decode(untrusted.read_checked(path_fd, max_size=_MAX, owner=0))
    except (OSError, untrusted.UnexpectedFile):
        return None
    finally:
        os.close(path_fd)
    if published is None or (alive_only and start_time(published.pid) != published.start_time):
        return None
    return published

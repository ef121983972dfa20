"""The driver's files as an earlier call found them, kept under /run/nvc-py while nothing they were
found from has changed.

Discovery walks the driver root path by path (hundreds of lookups, ELF headers, the binaries'
version strings) and every start repeats it: a served call, and a process that no server answers
alike. What it finds depends only on what those lookups saw (:func:`nvc.discover.rootpath.recording`),
on the inputs in the key (driver version, architecture, kernel release, firmware path, the
capabilities asked for) and on nvc-py's own code. So a result is kept with the lookups it made
(each path's type, device, inode, size, mtime and ctime; or its absence) and used again only
while a fresh lstat of every one of them gives the same answer. A change anywhere on a path (a
link replaced, a library rewritten in place, a directory gaining a file, a mount over it) changes
the ctime or the identity of a path looked up, so the next call finds the files again.

Timestamps are taken at a clock tick, not to the nanosecond, so a change made within a tick of the
lookup could leave the times it saw unchanged: a result whose paths changed less than
:data:`SETTLE_NS` before it was found is not kept (git's racy index, the same rule). A result that
warned (a file left out) is not kept either, so every call still says so. Files are
:mod:`nvc.system.runcache`'s: root's own, one per key, written atomically; at most :data:`MAX_KEPT`,
the oldest written going first (a driver upgrade or a capability set no longer asked for leaves
its results behind until a reboot otherwise).
"""

from __future__ import annotations

import json
import os
import zlib

from nvc.discover import rootpath
from nvc.records import NamedTuple
from nvc.system import runcache

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

DIRECTORY = "/run/nvc-py/driver-files"
MAX_FILE = 512 * 1024  # bytes of one kept result
SETTLE_NS = 2_000_000_000  # a result whose lookups changed this recently is not kept
MAX_KEPT = 64  # results kept: a host asks for a few (a root, a driver version, a set of capabilities each)
FORMAT = 1


_HERE = os.path.dirname(os.path.abspath(__file__))
# The code a result comes from: a changed nvc-py finds anew.
CODE = tuple(
    os.path.join(_HERE, name)
    for name in ("driver.py", "rootpath.py", "elf.py", "ldcache.py", "keptfiles.py", "../model/capabilities.py")
)


def _code_identity() -> list[int]:
    identity = []
    for path in CODE:
        st = os.stat(path)
        identity += [st.st_ino, st.st_mtime_ns, st.st_size]
    return identity


class Slot(NamedTuple):
    """Where one request's result is kept: its whole key (with the format and nvc-py's code, as read
    back from JSON: tuples are lists) and its file, named by the key's checksum (the file holds the
    whole key, compared on reading)."""

    key: list[Any]
    path: str

    def load(self) -> Any | None:
        """The value kept (JSON data), or None: nothing kept, or a path it was found from has changed
        since."""
        raw = runcache.load(self.path, MAX_FILE)
        if raw is None:
            return None
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError):
            return None
        if not isinstance(doc, dict) or doc.get("key") != self.key or not isinstance(doc.get("lookups"), list):
            return None
        for entry in doc["lookups"]:
            if not isinstance(entry, list) or len(entry) != 3 or not isinstance(entry[0], str):
                return None
            if rootpath.lookup(entry[0], entry[2] is True) != entry[1]:
                return None
        return doc.get("value")

    def store(self, value: Any, lookups: rootpath.Lookups, started_ns: int) -> None:
        """Keep ``value`` with the ``lookups`` it was found from (best effort), unless one of them
        changed within :data:`SETTLE_NS` before ``started_ns`` or the discovery warned; then drop the
        oldest written past :data:`MAX_KEPT`."""
        if lookups.warned:
            return
        settled = started_ns - SETTLE_NS
        for signature in lookups.seen.values():
            if signature is not None and len(signature) > 3 and max(signature[4], signature[5]) >= settled:
                return
        seen = [[name, signature, name in lookups.listed] for name, signature in lookups.seen.items()]
        runcache.store(self.path, json.dumps({"key": self.key, "lookups": seen, "value": value}).encode())
        _evict()


def slot(key: list[Any]) -> Slot:
    """The slot of a request's inputs ``key`` (JSON data)."""
    text = json.dumps([FORMAT, _code_identity(), key])
    return Slot(json.loads(text), f"{DIRECTORY}/{zlib.crc32(text.encode()):08x}.json")


def _evict() -> None:
    """Remove the oldest written of the kept results past :data:`MAX_KEPT` (best effort: another
    process may remove or write one meanwhile)."""
    try:
        with os.scandir(DIRECTORY) as entries:
            kept = [
                (entry.stat(follow_symlinks=False).st_mtime_ns, entry.name)
                for entry in entries
                if entry.name.endswith(".json")  # not another process's file still being written
            ]
    except OSError:
        return
    for _, name in sorted(kept)[: max(0, len(kept) - MAX_KEPT)]:
        try:
            os.unlink(os.path.join(DIRECTORY, name))
        except OSError:
            pass

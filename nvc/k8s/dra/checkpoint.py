"""The driver's memory of prepared claims, across its restarts: a small JSON file in its plugin directory.

The kubelet calls NodePrepareResources again for a claim it already prepared (after its own restart, or
ours) and NodeUnprepareResources for one prepared by an earlier run of the driver: the first answers what
was prepared, the second finds the claim's CDI spec to remove. The file is written anew (a rename after
an fsync) before an answer is given, so what the kubelet was told is on disk.
"""

from __future__ import annotations

import json
import os

from nvc.errors import InputError
from nvc.k8s.dra.claims import ClaimRef, Prepared

FILE = "checkpoint.json"
VERSION = 1
_MAX = 16 << 20


# claim UID -> (the claim, its CDI spec's path, what NodePrepareResources answered)
Claims = dict[str, tuple[ClaimRef, str, tuple[Prepared, ...]]]


def encode(claims: Claims) -> bytes:
    doc = {
        "version": VERSION,
        "claims": {
            uid: {"namespace": ref.namespace, "name": ref.name, "spec": spec, "devices": [p._asdict() for p in devices]}
            for uid, (ref, spec, devices) in sorted(claims.items())
        },
    }
    return json.dumps(doc, indent=1).encode() + b"\n"


def decode(data: bytes, path: str) -> Claims:
    """The claims in ``data``; an error naming ``path`` when it is not a checkpoint of this version."""
    try:
        doc = json.loads(data)
        if doc.get("version") != VERSION:
            raise ValueError(f"version {doc.get('version')!r}, not {VERSION}")
        out = {}
        for uid, entry in doc["claims"].items():
            devices = tuple(
                Prepared(tuple(d["requests"]), d["pool"], d["device"], tuple(d["cdi_ids"])) for d in entry["devices"]
            )
            out[uid] = (ClaimRef(entry["namespace"], uid, entry["name"]), str(entry["spec"]), devices)
        return out
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise InputError(
            f"{path}: not a checkpoint of nvc-py's DRA driver ({err}): move it away to start "
            "afresh (claims prepared by then are not unprepared)"
        ) from None


def load(path: str) -> Claims:
    """The checkpoint at ``path`` (nothing when there is none)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return {}
    except OSError as err:
        raise InputError(f"{path}: cannot read the checkpoint: {err.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        return decode(f.read(_MAX), path)


def save(path: str, claims: Claims) -> None:
    write_atomically(path, encode(claims), 0o600)


def write_atomically(path: str, data: bytes, mode: int) -> None:
    """Replace ``path`` with ``data``: a file beside it, synced, renamed over it."""
    directory, name = os.path.split(path)
    temporary = os.path.join(directory, f".{name}.{os.getpid()}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)


def remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass

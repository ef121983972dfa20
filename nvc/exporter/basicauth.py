"""HTTP basic authentication against the web configuration's bcrypt hashes.

bcrypt is slow on purpose (a cost of 10: about 70 ms), too slow to pay at every scrape, so a
verified name and password are remembered, as the exporter-toolkit does: by an HMAC under a key of
this process's own, so what is kept reveals no password and a lookup's time tells nothing about
one. An unknown name costs a bcrypt check all the same (against a configured user's hash), so the
time of an answer does not tell which names exist.
"""

from __future__ import annotations

import binascii
import hashlib
import hmac
import os
import threading
from collections.abc import Mapping

MAX_REMEMBERED = 64  # verified credentials kept; all are forgotten when more arrive
MAX_HEADER = 1024  # characters of an Authorization header worth decoding


class BasicAuth:
    def __init__(self, users: Mapping[str, bytes]) -> None:
        if not users:
            raise ValueError("no users")
        self.users = dict(users)
        self.decoy = next(iter(self.users.values()))
        self.key = os.urandom(32)
        self.verified: set[bytes] = set()
        self.lock = threading.Lock()

    def allows(self, header: str | None) -> bool:
        """Whether an ``Authorization`` header names a user with the right password."""
        credentials = _credentials(header)
        if credentials is None:
            return False
        name, password = credentials
        hashed = self.users.get(name)
        digest = hmac.new(self.key, b"\0".join((name.encode(), password, hashed or b"")), hashlib.sha256).digest()
        with self.lock:
            if digest in self.verified:
                return True
        import bcrypt

        try:
            ok = bcrypt.checkpw(password, hashed or self.decoy) and hashed is not None
        except ValueError:  # a password over bcrypt's 72 bytes
            ok = False
        if ok:
            with self.lock:
                if len(self.verified) >= MAX_REMEMBERED:
                    self.verified.clear()
                self.verified.add(digest)
        return ok


def _credentials(header: str | None) -> tuple[str, bytes] | None:
    """(name, password) from ``Basic base64(name:password)``; None for anything else."""
    if header is None or len(header) > MAX_HEADER:
        return None
    scheme, _, encoded = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = binascii.a2b_base64(encoded.strip().encode("ascii"), strict_mode=True)
        name, colon, password = decoded.partition(b":")
        return (name.decode(), password) if colon else None
    except (binascii.Error, UnicodeError):
        return None

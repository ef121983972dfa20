"""Global options (given before the command), importable without click.

The OCI hook calls :func:`nvc.configure.configure` in-process with these, and must not pay
for the CLI's imports at every container start.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GlobalOptions:
    """Options given before the command."""

    root: str  # driver root, absolute
    ldcache: str  # ld cache path inside the root
    user: tuple[int, int]  # uid, gid the driver helper runs as
    load_kmods: bool

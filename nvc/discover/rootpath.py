"""Resolve paths inside a driver root as if it were ``/``.

The driver root may be a directory of somebody else's filesystem (a driver container,
``/run/nvidia/driver``). Its symlinks are interpreted relative to that root: absolute
targets are re-rooted and ``..`` stops at the root, so a lookup can never leave it,
whatever the links say. Resolution is manual (no ``realpath``) for exactly that reason.

This module names files (discovery reports paths and opens them to read ELF headers).
Creating or mounting files in an untrusted container rootfs, where check/use races
matter, goes through the fd-based :mod:`nvc.apply.rootfs` instead.
"""

from __future__ import annotations

import errno
import os
import stat

from nvc.errors import DetectionError

MAX_SYMLINKS = 40  # the kernel's limit (ELOOP)


def host_path(root: str, inner: str) -> str:
    """The host path of ``inner``, an absolute path inside ``root``."""
    if root == "/":
        return inner
    return root.rstrip("/") + inner


def resolve(root: str, path: str) -> str | None:
    """Canonical absolute path inside ``root`` that ``path`` leads to, or None if a component is missing.

    ``path`` is read as a path inside the root (absolute or relative to its top). Every
    component, the last one included, has its symlinks followed within the root.
    """
    pending = [c for c in path.split("/") if c not in ("", ".")]
    pending.reverse()  # a stack: the next component is at the end
    done: list[str] = []
    links = 0
    while pending:
        name = pending.pop()
        if name == "..":
            if done:
                done.pop()
            continue
        inner = "/" + "/".join(done + [name])
        try:
            st = os.lstat(host_path(root, inner))
        except FileNotFoundError:
            return None
        except NotADirectoryError:
            return None
        except OSError as err:
            raise DetectionError(f"{host_path(root, inner)}: {err.strerror}") from None
        if not stat.S_ISLNK(st.st_mode):
            done.append(name)
            continue
        links += 1
        if links > MAX_SYMLINKS:
            raise DetectionError(f"{host_path(root, path)}: {os.strerror(errno.ELOOP)}")
        target = os.readlink(host_path(root, inner))
        if target.startswith("/"):
            done = []
        pending.extend(reversed([c for c in target.split("/") if c not in ("", ".")]))
    return "/" + "/".join(done)

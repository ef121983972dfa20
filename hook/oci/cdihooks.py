"""The ``createContainer`` hooks of nvc-py's CDI spec: what CDI's mounts and nodes cannot do.

``create-symlinks --link TARGET::LINK`` makes the links applications expect
(``libcuda.so -> libcuda.so.1``); ``update-ldcache --folder DIR`` adds the mounted driver
libraries to the container's ld cache. Both run in the container's mount namespace before
pivot_root (runc and crun run createContainer hooks there), take the rootfs from the
bundle's spec, and work only through :mod:`nvc.apply.rootfs` (links, resolved in the root) and
the sandboxed ldconfig of :mod:`nvc.apply.ldconfig` (never the image's binaries).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from nvc.errors import ContainerError, InputError, LdcacheError


def _options(args: Sequence[str], name: str) -> list[str]:
    """Values of the repeated ``--name VALUE`` options; anything else is an error."""
    values = []
    it = iter(args)
    for word in it:
        value = next(it, None)
        if word != f"--{name}" or value is None:
            raise InputError(f"expected --{name} VALUE ..., got {word!r}")
        values.append(value)
    return values


def _rootfs(stdin: bytes) -> str:
    from nvc.hook.oci import spec

    state = spec.parse_state(stdin)
    return spec.container(state.bundle, spec.load_config(state.bundle)).rootfs


def _owner() -> tuple[int, int]:
    """The container's uid and gid, which files nvc-py creates get: this hook's own. A createContainer
    hook runs in the container's namespaces as its init (runc and crun run it from there), so in a
    user namespace it is the container's root there (rootless podman: the user). Not the state's pid:
    runc gives init's pid in the container's pid namespace (1), which this /proc, the host's before
    the pivot, does not name (its pid 1, the host's init, is nobody in a user namespace)."""
    return os.getuid(), os.getgid()


def create_symlinks(args: Sequence[str], stdin: bytes) -> None:
    from nvc.apply import rootfs as inroot

    links = []
    for pair in _options(args, "link"):
        target, sep, link = pair.partition("::")
        if not sep or not target or not os.path.isabs(link):
            raise InputError(f"--link {pair!r}: expected TARGET::/ABSOLUTE/LINK")
        links.append((target, link))
    root = _rootfs(stdin)
    owner = _owner()
    try:  # a rootfs that is a symlink is refused, as configure refuses it
        root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        raise ContainerError(f"open failed: {root}: {err.strerror}") from None
    try:
        for target, link in links:
            try:
                inroot.symlink_in_root(root_fd, link, target, owner)
            except FileExistsError:
                continue  # the image has its own file there: never replaced
            except OSError as err:
                raise ContainerError(f"{link}: cannot create link: {err.strerror}") from None
    finally:
        os.close(root_fd)


def update_ldcache(args: Sequence[str], stdin: bytes, ldconfig: str) -> None:
    from nvc.apply.ldconfig import run_ldconfig

    folders = _options(args, "folder")
    if not all(os.path.isabs(f) for f in folders):
        raise InputError("--folder: expected absolute paths inside the container")
    if not run_ldconfig(ldconfig, _rootfs(stdin), folders, owner=_owner()):
        raise LdcacheError(f"{ldconfig}: no ldconfig to run")

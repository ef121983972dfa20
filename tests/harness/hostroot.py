"""A throwaway copy of this host's root: an overlay of / whose upper layer is a tmpfs of a private
mount namespace, made that namespace's root (pivot_root, not chroot: a program that enters a
namespace of one of its processes, as the hook's sandboxes do, finds the same root there), with
/proc (a pid namespace of its own), /dev and /sys, and fresh tmpfs on /tmp, /run/nvc-py,
/run/containerd and /run/docker (no host hook server, containerd or dockerd answers there).
Everything installed or removed in it (a Debian package through dpkg, this tree's make targets, a
dockerd's and podman's stores) vanishes with the script: the host's /usr/lib/nvc-py, dpkg database
and engines' files stay as found (tests/test_deb.py's walks of the package, which need the host's
own tools: make, gcc, podman, dockerd).
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Sequence
from pathlib import Path

from .debroot import CHROOT_ENV

# Inside the namespace: the overlay at $1's merged/, the kernel's file systems and the private tmpfs
# in it; the binds, then the pivot into it. $0 is the script, $1 a directory of the host for the layers.
MOUNTS = """set -e
mount -t tmpfs -o mode=0700 tmpfs "$1"
mkdir "$1/upper" "$1/work" "$1/merged"
mount -t overlay overlay -o "lowerdir=/,upperdir=$1/upper,workdir=$1/work" "$1/merged"
root="$1/merged"
mount --rbind /dev "$root/dev"
mount --rbind /sys "$root/sys"
mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
for dir in nvc-py containerd docker; do
	mkdir -p "$root/run/$dir" && mount -t tmpfs -o mode=0755 tmpfs "$root/run/$dir"
done
"""


def run(
    script: str, layers: Path, timeout: int, binds: Sequence[tuple[Path, str]] = ()
) -> subprocess.CompletedProcess[str]:
    """``script`` (sh, ``set -eu`` is the caller's) run in a throwaway copy of the host's root as its
    root, ``layers`` an empty directory of the host for its tmpfs; ``binds``: (host path, path in the
    root) bound read-write. Stdout and stderr together in ``stdout``; the caller judges the return code."""
    bound = "".join(
        f'mkdir -p "$root"{shlex.quote(inside)} && mount --bind {shlex.quote(str(host))} "$root"{shlex.quote(inside)}\n'
        for host, inside in binds
    )
    pivot = (
        'cd "$root" && mkdir .host && pivot_root . .host && cd / && mount -t proc proc /proc && '
        "umount -l /.host && rmdir /.host\n"
    )
    shell = f'{MOUNTS}{bound}{pivot}exec {" ".join(CHROOT_ENV)} /bin/sh -c "$0" 2>&1\n'
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "--pid", "--fork", "sh", "-c", shell, script, str(layers)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )

"""Which of the files ``nvc-py setup`` would write the Debian package installed: dpkg's list of the
package's files (``/var/lib/dpkg/info/nvc-py.list``; none on a source install, ``make install``).

A file the package installed is dpkg's: ``dpkg --verify`` reports it changed or missing, an upgrade
replaces it, a removal removes it. So setup neither rewrites nor removes one (its hooks.d files in
/usr/share/containers/oci/hooks.d), and never shadows one by a copy elsewhere (its units in
/lib/systemd/system: a copy in /etc/systemd/system would hide the next version's changes).
"""

from __future__ import annotations

import os

from nvc.errors import InputError

PACKAGE = "nvc-py"
DPKG_LIST = f"/var/lib/dpkg/info/{PACKAGE}.list"
_MAX_LIST = 64 << 20  # bytes of dpkg's list read (the bundled environment's files: a few MiB)


def files(list_path: str = DPKG_LIST) -> frozenset[str]:
    """The paths dpkg lists as the package's; none where it is not installed (or its list cannot be read)."""
    from nvc.system.untrusted import read_file

    try:
        data, _ = read_file(list_path, _MAX_LIST)
    except (OSError, InputError):
        return frozenset()
    return frozenset(os.path.normpath(line) for line in data.decode(errors="replace").splitlines() if line)


def owns(path: str, listed: frozenset[str]) -> bool:
    """Whether ``path`` is one of ``listed`` (:func:`files`), also through a link in either path
    (/lib is /usr/lib on a merged-/usr system, while dpkg lists the path the package ships)."""
    path = os.path.normpath(path)
    if path in listed:
        return True
    real = os.path.realpath(path)
    name = os.path.basename(path)
    return any(os.path.realpath(entry) == real for entry in listed if os.path.basename(entry) == name)


def unit_dir(unit: str, listed: frozenset[str]) -> str | None:
    """The directory of the package's systemd unit ``unit`` (/lib/systemd/system), None where the
    package does not install it (a source install)."""
    for entry in listed:
        if (
            os.path.basename(entry) == unit
            and os.path.basename(os.path.dirname(entry)) == "system"
            and os.path.isfile(entry)
        ):
            return os.path.dirname(entry)
    return None

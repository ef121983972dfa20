"""Where podman and CRI-O read OCI hooks (and podman CDI specs): their ``hooks_dir`` (``cdi_spec_dirs``)
through the whole configuration chain.

A hook written where the engine does not look is silently never run: the container starts without
its GPUs and nobody is told. So ``nvc-py setup podman|crio`` (and ``doctor``) resolve the directories
the engine will read, as the engine does:

- podman (containers.conf(5), containers-config(5)): ``[engine] hooks_dir`` from
  /usr/share/containers/containers.conf, its ``containers.conf.d`` and ``containers.rootful.conf.d``
  drop-ins, /etc/containers/containers.conf and its drop-ins (``*.conf``, by name), each later file
  replacing the list; ``$CONTAINERS_CONF`` replaces the whole chain, ``$CONTAINERS_CONF_OVERRIDE``
  comes last. Default ``/usr/share/containers/oci/hooks.d``.
- CRI-O (crio.conf(5)): ``[crio.runtime] hooks_dir`` from /etc/crio/crio.conf, then
  /etc/crio/crio.conf.d/*.conf by name. Same default.

Hook directories are ordered by increasing preference (oci-hooks(5): a file in a later directory
masks one of the same name in an earlier), so nvc-py's files go to the last one. Reading only:
every file as :mod:`nvc.hook.setup.engineconf` reads one (a symbolic link, a FIFO, a device, an oversize
file refused), and one that is not valid TOML is an error naming it (the engine would refuse it too).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping, Sequence
from typing import Any

from nvc.errors import InputError
from nvc.hook.setup import engineconf
from nvc.records import NamedTuple

DEFAULT_HOOKS_DIR = "/usr/share/containers/oci/hooks.d"
LEGACY_HOOKS_DIR = "/etc/containers/oci/hooks.d"  # where nvc-py wrote before it resolved the chain
SYSTEMD_CGROUPS = "systemd"  # the cgroup manager podman and CRI-O default to where systemd runs
CDI_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")  # the CDI specification's and the engines' default


class Engine(NamedTuple):
    """One engine's configuration chain: main files, each followed by its drop-in directories."""

    name: str
    chain: tuple[tuple[str, tuple[str, ...]], ...]  # (main file, its drop-in directories)
    table: tuple[str, ...]  # where hooks_dir sits
    env: str = ""  # the variable naming a file that replaces the chain ("" = none)
    override_env: str = ""  # the variable naming a file read after the chain


PODMAN = Engine(
    "podman",
    (
        (
            "/usr/share/containers/containers.conf",
            ("/usr/share/containers/containers.conf.d", "/usr/share/containers/containers.rootful.conf.d"),
        ),
        (
            "/etc/containers/containers.conf",
            ("/etc/containers/containers.conf.d", "/etc/containers/containers.rootful.conf.d"),
        ),
    ),
    ("engine",),
    "CONTAINERS_CONF",
    "CONTAINERS_CONF_OVERRIDE",
)
CRIO = Engine("CRI-O", (("/etc/crio/crio.conf", ("/etc/crio/crio.conf.d",)),), ("crio", "runtime"))


class Resolved(NamedTuple):
    """The directories an engine reads hooks from, and the file that set them ("" = the default)."""

    dirs: tuple[str, ...]
    source: str

    @property
    def target(self) -> str:
        """Where a hook of ours goes: the most preferred directory, which no other file masks."""
        return self.dirs[-1]


def config_files(engine: Engine, env: Mapping[str, str], root: str = "/") -> list[str]:
    """The engine's configuration files that exist, in the order it reads them (paths under ``root``)."""

    def under(path: str) -> str:
        return os.path.join(root, path.lstrip("/"))

    replacing = env.get(engine.env) if engine.env else None
    if replacing:
        files = [replacing]
    else:
        files = []
        for main, drop_ins in engine.chain:
            if os.path.lexists(under(main)):  # whatever is there: engineconf.read says what is wrong with it
                files.append(under(main))
            for directory in drop_ins:
                try:
                    names = sorted(n for n in os.listdir(under(directory)) if n.endswith(".conf"))
                except OSError:
                    continue
                files += [os.path.join(under(directory), n) for n in names]
    override = env.get(engine.override_env) if engine.override_env else None
    return files + ([override] if override else [])


def _parse(path: str) -> Mapping[str, Any]:
    doc = engineconf.toml(path, engineconf.replace_link)
    if doc is None:
        raise InputError(f"{path}: cannot read: {os.strerror(errno.ENOENT)}")
    return doc.unwrap()


def _value(doc: Mapping[str, Any], table: Sequence[str], key: str) -> Any:
    """``key`` of ``table`` in one parsed file (None where it sets none)."""
    for name in table:
        doc = doc.get(name, {})
        if not isinstance(doc, Mapping):
            return None
    return doc.get(key)


def dirs_in(doc: Mapping[str, Any], table: Sequence[str], key: str, path: str) -> tuple[str, ...] | None:
    """The directory list ``key`` of one parsed file (None where it sets none); a value that is no
    list of absolute paths is an error naming the file."""
    value = _value(doc, table, key)
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    where = f"{path}: {'.'.join(table)}.{key}"
    if not isinstance(value, list) or not all(isinstance(d, str) and os.path.isabs(d) for d in value):
        raise InputError(f"{where}: expected a list of absolute directories")
    for directory in value:
        engineconf.check_path(directory, where)
    return tuple(os.path.normpath(d) for d in value)


def setting(
    engine: Engine, key: str, default: tuple[str, ...], env: Mapping[str, str] | None = None, root: str = "/"
) -> Resolved:
    """The directory list ``key`` as ``engine`` reads it on this host: the last file of its chain
    that sets it decides (an empty list there means the default, as in the engines)."""
    env = os.environ if env is None else env
    found = Resolved(default, "")
    for path in config_files(engine, env, root):
        dirs = dirs_in(_parse(path), engine.table, key, path)
        if dirs is not None:
            found = Resolved(dirs or default, path)
    return found


def resolve(engine: Engine, env: Mapping[str, str] | None = None, root: str = "/") -> Resolved:
    """The hooks directories ``engine`` reads on this host."""
    return setting(engine, "hooks_dir", (DEFAULT_HOOKS_DIR,), env, root)


def cgroup_manager(engine: Engine, env: Mapping[str, str] | None = None, root: str = "/") -> str:
    """Who manages ``engine``'s containers' cgroups, ``systemd`` (both engines' default where systemd
    runs) or ``cgroupfs``: the last file of its chain that sets ``cgroup_manager`` decides."""
    env = os.environ if env is None else env
    found = SYSTEMD_CGROUPS
    for path in config_files(engine, env, root):
        value = _value(_parse(path), engine.table, "cgroup_manager")
        if isinstance(value, str) and value:
            found = value
    return found


def cdi_dirs(env: Mapping[str, str] | None = None, root: str = "/") -> tuple[str, ...]:
    """Where podman reads CDI specs (containers.conf's ``engine.cdi_spec_dirs``)."""
    return setting(PODMAN, "cdi_spec_dirs", CDI_SPEC_DIRS, env, root).dirs


def described(engine: Engine, resolved: Resolved) -> str:
    """Where ``engine`` reads hooks, for a user: the directories and what set them."""
    where = f"{resolved.source}'s hooks_dir" if resolved.source else "its default"
    return f"{engine.name} reads hooks from {', '.join(resolved.dirs)} ({where})"


def spec_files(dirs: Sequence[str]) -> list[str]:
    """The CDI spec files (``*.yaml``, ``*.yml``, ``*.json``) in ``dirs``, by name; a missing
    directory has none, one that cannot be listed is an error naming it."""
    found = []
    for directory in dirs:
        try:
            names = sorted(os.listdir(directory))
        except FileNotFoundError:
            continue
        except OSError as err:
            raise InputError(f"{directory}: cannot list: {err.strerror}") from None
        found += [os.path.join(directory, n) for n in names if n.endswith((".yaml", ".yml", ".json"))]
    return found

"""OCI bundles (config.json, runtime spec 1.0.2) for driving runc directly.

The config mirrors what `runc spec` and the container engines generate (same
mounts, masked paths, device-cgroup default deny plus the standard allow
list, Docker's default capabilities), so what nvc sees in a hook is what it
would see under a real engine.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

OCI_VERSION = "1.0.2"
DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CAPABILITIES = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
]
MOUNTS: list[dict[str, Any]] = [
    {"destination": "/proc", "type": "proc", "source": "proc"},
    {
        "destination": "/dev",
        "type": "tmpfs",
        "source": "tmpfs",
        "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
    },
    {
        "destination": "/dev/pts",
        "type": "devpts",
        "source": "devpts",
        "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"],
    },
    {
        "destination": "/dev/shm",
        "type": "tmpfs",
        "source": "shm",
        "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
    },
    {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]},
    {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
    {
        "destination": "/sys/fs/cgroup",
        "type": "cgroup",
        "source": "cgroup",
        "options": ["nosuid", "noexec", "nodev", "relatime", "ro"],
    },
]


def _allow(kind: str, access: str, major: int | None = None, minor: int | None = None) -> dict[str, Any]:
    """A device-cgroup allow rule; a missing major/minor means "any"."""
    rule: dict[str, Any] = {"allow": True, "type": kind, "access": access}
    if major is not None:
        rule["major"] = major
    if minor is not None:
        rule["minor"] = minor
    return rule


# Device cgroup: deny everything, then the list containerd/Docker allow by default
# (mknod of any node; null, zero, full, random, urandom, tty, console, ptmx, the pts).
DEFAULT_DEVICE_RULES: list[dict[str, Any]] = [
    {"allow": False, "access": "rwm"},
    _allow("c", "m"),
    _allow("b", "m"),
    *(
        _allow("c", "rwm", major, minor)
        for major, minor in ((1, 3), (1, 5), (1, 7), (1, 8), (1, 9), (5, 0), (5, 1), (5, 2), (136, None))
    ),
]
MASKED_PATHS = [
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/sys/firmware",
    "/proc/scsi",
]
READONLY_PATHS = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]


def _host_bind(mount: Mapping[str, Any]) -> dict[str, Any]:
    """``mount``, but /proc and /sys as binds of this process's (see make_bundle's ``host_proc_sys``)."""
    if mount["destination"] not in ("/proc", "/sys"):
        return dict(mount)
    options = ["rbind", "nosuid", "noexec", "nodev"] + (["ro"] if mount["destination"] == "/sys" else [])
    return {"destination": mount["destination"], "type": "bind", "source": mount["destination"], "options": options}


def _root_path(bundle: Path, rootfs: Path) -> str:
    """Relative like `runc spec` when the rootfs sits in the bundle, else absolute."""
    rootfs = Path(rootfs).absolute()
    return str(rootfs.relative_to(bundle)) if rootfs.parent == bundle else str(rootfs)


def make_config(
    bundle: Path,
    rootfs: Path,
    args: Sequence[str],
    env: Mapping[str, str] | None = None,
    hooks: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    devices: Sequence[Mapping[str, Any]] | None = None,
    readonly: bool = False,
    cgroups_path: str | None = None,
    network_ns: bool = True,
    id_map: tuple[int, int] | None = None,
    host_proc_sys: bool = False,
) -> dict[str, Any]:
    """The config.json document; see make_bundle."""
    namespaces = [{"type": t} for t in ("pid", "ipc", "uts", "mount")]
    if network_ns:
        namespaces.append({"type": "network"})
    if id_map is not None:
        namespaces.append({"type": "user"})
    device_rules = [dict(rule) for rule in DEFAULT_DEVICE_RULES]
    for dev in devices or ():
        device_rules.append(_allow(dev["type"], "rwm", dev["major"], dev["minor"]))
    linux: dict[str, Any] = {
        "namespaces": namespaces,
        "resources": {"devices": device_rules},
        "devices": [dict(dev) for dev in devices or ()],
        "maskedPaths": list(MASKED_PATHS),
        "readonlyPaths": list(READONLY_PATHS),
    }
    if cgroups_path is not None:
        linux["cgroupsPath"] = cgroups_path
    if id_map is not None:
        mapping = [{"containerID": 0, "hostID": id_map[0], "size": id_map[1]}]
        linux["uidMappings"], linux["gidMappings"] = mapping, [dict(m) for m in mapping]
    config: dict[str, Any] = {
        "ociVersion": OCI_VERSION,
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": list(args),
            "env": [DEFAULT_PATH, *(f"{k}={v}" for k, v in (env or {}).items())],
            "cwd": "/",
            "capabilities": {k: list(CAPABILITIES) for k in ("bounding", "effective", "permitted")},
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
            "noNewPrivileges": True,
        },
        "root": {"path": _root_path(Path(bundle).absolute(), rootfs), "readonly": readonly},
        "hostname": "nvc-test",
        "mounts": [
            _host_bind(m) if host_proc_sys else dict(m)
            for m in MOUNTS
            if not host_proc_sys or m["destination"] != "/sys/fs/cgroup"
        ],
        "linux": linux,
    }
    if hooks:
        config["hooks"] = {stage: [dict(h) for h in entries] for stage, entries in hooks.items()}
    return config


def make_bundle(
    dir: Path,
    rootfs: Path,
    args: Sequence[str],
    env: Mapping[str, str] | None = None,
    hooks: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    devices: Sequence[Mapping[str, Any]] | None = None,
    readonly: bool = False,
    cgroups_path: str | None = None,
    network_ns: bool = True,
    id_map: tuple[int, int] | None = None,
    host_proc_sys: bool = False,
) -> Path:
    """Write `dir`/config.json and return the bundle dir.

    `env` is added after PATH; `hooks` maps OCI stages ("prestart",
    "createRuntime", …) to hook dicts ({"path", "args", "env", "timeout"});
    `devices` are linux.devices entries (path, type, major, minor, …), each
    also allowed rwm in the device cgroup. `id_map` (host id, size): a user
    namespace whose uids and gids 0.. are those host ids. `host_proc_sys`:
    /proc and /sys are binds of this process's, and no /sys/fs/cgroup: the
    fake driver's mounts over /proc make a fresh proc or sysfs one the kernel
    refuses to a user namespace (it would reveal what they cover).
    """
    bundle = Path(dir).absolute()
    bundle.mkdir(parents=True, exist_ok=True)
    config = make_config(
        bundle, rootfs, args, env, hooks, devices, readonly, cgroups_path, network_ns, id_map, host_proc_sys
    )
    (bundle / "config.json").write_text(json.dumps(config, indent=2))
    return bundle


def reachable_from_userns(path: Path) -> None:
    """Let a container's root in a user namespace (an unmapped host uid) reach ``path`` through
    pytest's 0700 directories: the runtime's init opens the rootfs from inside that namespace."""
    for parent in (Path(path), *Path(path).parents):
        if parent in (Path("/tmp"), Path("/var/tmp"), Path("/")):
            break
        parent.chmod(parent.stat().st_mode | 0o111)

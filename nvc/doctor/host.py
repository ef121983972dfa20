"""Doctor's checks of the host itself: the configuration file, the driver, NVML, device nodes, the
cgroup version and the ldconfig the hook runs."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from typing import TYPE_CHECKING

from nvc.doctor import Check, fail, ok, skip
from nvc.errors import TRY_WITHOUT_GPU, NvcError

if TYPE_CHECKING:
    from nvc.config import Config
    from nvc.model.devices import Gpu

CGROUP2_MAGIC = 0x63677270


def configuration(path: str | None) -> tuple[Check, Config]:
    """The configuration file the hook reads, and the configuration (defaults where it is invalid,
    so the other checks still run)."""
    from nvc import config

    where = path or config.config_path()
    try:
        loaded = config.load(path, must_exist=path is not None)
    except NvcError as err:
        return fail(
            "configuration", str(err), f"correct {where} (`nvc-py config show --file {where}` checks it)"
        ), config.defaults()
    if not os.path.exists(where):
        return ok("configuration", f"defaults ({where} does not exist)"), loaded
    return ok("configuration", f"{where} is valid"), loaded


def driver() -> tuple[Check, str | None]:
    """The kernel driver's version from /proc (None where it is not loaded)."""
    from nvc.discover import procfs

    try:
        version = procfs.read_version()
    except NvcError as err:
        return fail(
            "driver",
            str(err).partition(": ")[2] or str(err),
            f"install or load the NVIDIA driver (modprobe nvidia); {TRY_WITHOUT_GPU}",
        ), None
    return ok("driver", f"NVIDIA kernel driver {version} loaded"), version


def nvml(conf: Config) -> tuple[Check, Sequence[Gpu]]:
    """NVML answering through the driver helper, in the configured driver root."""
    from nvc.config.options import parse_user
    from nvc.rpc import driver_service

    try:
        inventory = driver_service.inventory(conf.root, parse_user(conf.user))
    except NvcError as err:
        return fail(
            "NVML",
            str(err),
            f"check the driver root ({conf.root}) holds libnvidia-ml.so.1 of the loaded "
            "driver (`nvc-py list --libraries`)",
        ), ()
    gpus = inventory.gpus
    names = ", ".join(f"{g.index}: {g.model}" for g in gpus) or "no GPU"
    return ok("NVML", f"driver {inventory.driver_version}, {len(gpus)} GPU(s) ({names})"), gpus


def device_nodes(root: str, gpus: Sequence[Gpu]) -> Check:
    """The control nodes and each GPU's node, as character devices under the driver root's /dev."""
    wanted = ["dev/nvidiactl", "dev/nvidia-uvm", *(f"dev/nvidia{g.minor}" for g in gpus)]
    missing = []
    for name in wanted:
        try:
            if not stat.S_ISCHR(os.stat(os.path.join(root, name)).st_mode):
                missing.append(f"/{name} (not a character device)")
        except OSError:
            missing.append(f"/{name}")
    if missing:
        return fail(
            "device nodes",
            f"missing: {', '.join(missing)}",
            "`nvc-py --load-kmods info` creates them (or set load-kmods: true in the configuration)",
        )
    return ok("device nodes", f"{len(wanted)} present ({', '.join('/' + n for n in wanted)})")


def is_cgroup2(path: str = "/sys/fs/cgroup") -> bool:
    """Whether ``path`` is the cgroup v2 hierarchy (a host on v2 alone); OSError where it cannot be read."""
    return _fs_type(path) == CGROUP2_MAGIC


def cgroup_version(path: str = "/sys/fs/cgroup") -> Check:
    """Which device cgroup the hook programs: v2's eBPF filter, or v1's devices.allow."""
    try:
        v2 = is_cgroup2(path)
    except OSError as err:
        return fail("cgroups", f"{path}: {err.strerror}", "mount the cgroup filesystem (or set no-cgroups: true)")
    if v2:
        return ok("cgroups", "v2 (device access through an eBPF filter per container)")
    if os.path.isdir(os.path.join(path, "devices")):
        return ok("cgroups", "v1 (device access through devices.allow)")
    return skip("cgroups", f"no devices controller under {path}: device access is left to the runtime")


def _fs_type(path: str) -> int:
    from nvc.system.syscalls import fs_type

    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        return fs_type(fd, path)
    finally:
        os.close(fd)


def ldconfig(conf: Config) -> Check:
    """The ldconfig the hook runs for the container's ld cache: a host binary (``@PATH``; a shell
    wrapper, Ubuntu's, stands for its ``.real``) or, where allowed, the image's own."""
    value = conf.ldconfig
    if not value.startswith("@"):
        return ok("ldconfig", f"{value} inside each image (allow-ldconfig-from-container)")
    path = value[1:]
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as err:
        return fail("ldconfig", f"{path}: {err.strerror}", "install libc-bin, or set ldconfig: in the configuration")
    if head == b"\x7fELF":
        return ok("ldconfig", f"{path} (ELF)")
    if os.path.isfile(path + ".real"):
        return ok("ldconfig", f"{path} is a script: the hook runs {path}.real")
    return fail(
        "ldconfig",
        f"{path} is neither an ELF program nor a wrapper of one (no {path}.real)",
        "set ldconfig: @/sbin/ldconfig.real (or the host's ELF ldconfig) in the configuration",
    )

"""The host's configuration file, ``/etc/nvc-py/config.yaml`` (``$NVC_PY_CONFIG`` overrides the path).

The hook runs at every container start with no command line of its own, so everything an
administrator would pass as flags lives here. The file is validated strictly: an unknown
key or a bad value is an error naming the file, the key and the reason, because a typo
silently ignored in a security setting (``accept-volume-mounts``, ``ldconfig``) is worse
than a container that does not start. A missing file means all defaults.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping

from nvc.config.yamlfile import MAX_SIZE, yaml_document
from nvc.errors import SHOWN_LIMIT, InputError, one_line
from nvc.model.capabilities import CAPABILITIES
from nvc.records import NamedTuple
from nvc.system.untrusted import decimal, read_file

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    Check = Callable[[Any], Any]  # a validator of one setting

DEFAULT_PATH = "/etc/nvc-py/config.yaml"
ENV_VAR = "NVC_PY_CONFIG"
LOG_LEVELS = ("debug", "info", "warning", "error")
CUDA_COMPAT_MODES = ("disabled", "mount", "ldconfig")
DEFAULT_RUNTIMES = ("runc", "crun")


def default_ldconfig(root: str = "/") -> str:
    """The host ldconfig: ``ldconfig.real`` where the distribution wraps ldconfig in a script (Ubuntu)."""
    real = os.path.join(root, "sbin/ldconfig.real")
    return "@/sbin/ldconfig.real" if os.path.isfile(real) else "@/sbin/ldconfig"


class Sharing(NamedTuple):
    """Defaults of GPU sharing (the shim, see nvc/share.py) for containers that do not set their own."""

    enabled: bool = False  # inject the sharing shim into GPU containers
    device_memory_limit: str | None = None  # CUDA_DEVICE_MEMORY_LIMIT grammar, e.g. "8g"
    device_sm_limit: int | None = None  # percent, 1..100
    # each GPU's sharing backend: (GPU, backend) pairs, GPU "all", a UUID or an NVML index (nvc.plan.mps)
    backend: tuple[tuple[str, str], ...] = (("all", "timeslice"),)


# The XIDs NVIDIA's device plugin also leaves out: errors of one application (its own illegal
# access, a page fault, a killed channel), not of the GPU. Any other critical XID marks it unhealthy.
APPLICATION_XIDS = (13, 31, 43, 45, 68, 109)
DEVICE_LIST_STRATEGIES = ("envvar", "volume-mounts")
SHARE_COMPUTE = ("proportional", "none")
# nvc.containerenv.sharing.BACKENDS (a layer above this one; tests/test_mps_config.py checks they agree)
SHARE_BACKENDS = ("timeslice", "mps")


class K8s(NamedTuple):
    """The Kubernetes device plugin (``nvc-py k8s device-plugin``, nvc/k8s/); docs/kubernetes.md."""

    device_plugin_dir: str = "/var/lib/kubelet/device-plugins"  # the kubelet's kubelet.sock is here
    gpu_resource: str = "nvidia.com/gpu"  # whole GPUs (not shared, MIG disabled)
    mig_resource_prefix: str = "nvidia.com/mig-"  # + the MIG profile: nvidia.com/mig-2g.10gb
    share_resource: str = "nvc-py.io/gpu-share"  # units of share_slice bytes of one shared GPU
    share_gpus: tuple[str, ...] = ()  # GPUs (UUIDs or NVML indices, or "all") offered as shares only
    share_slice: str = "1Gi"  # the memory of one share unit
    share_compute: str = "proportional"  # compute cap: the unit's fraction of the GPU's memory, or none
    share_weight: bool = True  # a scheduling weight of one per unit
    share_backend: str = "timeslice"  # mps: the shares' GPUs shared through CUDA MPS (NVC_SHARE_BACKEND_<UUID>)
    device_list_strategy: str = "envvar"  # how Allocate names the devices to the hook
    cdi_devices: bool = False  # also answer CDI device names (nvidia.com/gpu=<UUID>)
    ignored_xids: tuple[int, ...] = APPLICATION_XIDS  # critical XIDs that leave a device healthy
    xid_recovery: int = (
        300  # seconds without a new XID after which a device that NVML still finds is healthy again; 0: never
    )
    nvml_retry: int = 30  # seconds between tries while NVML cannot be loaded or fails


class Config(NamedTuple):
    """The effective configuration: the file's values over these defaults."""

    root: str = "/"
    ldcache: str = "/etc/ld.so.cache"
    ldconfig: str = "@/sbin/ldconfig"  # the loader puts ldconfig.real where the host has one: defaults()
    allow_ldconfig_from_container: bool = False
    load_kmods: bool = True
    no_cgroups: bool = False
    user: str | None = None  # "UID[:GID]" of the driver helper; None: the kernel's overflow ids
    log_file: str | None = "/var/log/nvc-py.log"
    log_level: str = "info"
    accept_envvar_when_unprivileged: bool = True
    accept_volume_mounts: bool = False
    disable_require: bool = False
    supported_capabilities: tuple[str, ...] = CAPABILITIES
    cuda_compat_mode: str = "ldconfig"
    runtimes: tuple[str, ...] = DEFAULT_RUNTIMES
    sharing: Sharing = Sharing()
    k8s: K8s = K8s()
    path: str | None = None  # the file it came from, None for defaults

    def as_dict(self) -> dict[str, Any]:
        """The file's form (dashed keys), as ``config show`` prints it."""
        sharing = {**self.sharing._asdict(), "backend": _backend_form(self.sharing.backend)}
        return _to_file({**self._asdict(), "sharing": sharing, "k8s": self.k8s._asdict()})


def _backend_form(backend: tuple[tuple[str, str], ...]) -> str | dict[str, str]:
    """``sharing.backend`` as the file writes it: one backend for all GPUs, or a mapping."""
    if len(backend) == 1 and backend[0][0] == "all":
        return backend[0][1]
    return dict(backend)


def _to_file(values: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        if key == "path":
            continue
        if key == "log_file":
            out.setdefault("log", {})["file"] = value
        elif key == "log_level":
            out.setdefault("log", {})["level"] = value
        elif isinstance(value, dict) and key != "backend":  # backend's keys are GPUs
            out[key.replace("_", "-")] = _to_file(value)
        else:
            out[key.replace("_", "-")] = list(value) if isinstance(value, tuple) else value
    return out


# --- validation ---------------------------------------------------------------------------------


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("expected true or false")
    return value


def _abs_path(value: Any) -> str:
    if not isinstance(value, str) or not os.path.isabs(value):
        raise ValueError("expected an absolute path")
    return os.path.normpath(value)


def _opt_abs_path(value: Any) -> str | None:
    return None if value is None else _abs_path(value)


def _choice(*choices: str) -> Check:
    def check(value: Any) -> str:
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return value

    return check


def _ldconfig(value: Any) -> str:
    if not isinstance(value, str) or not os.path.isabs(value.removeprefix("@")):
        raise ValueError("expected @HOSTPATH (a host ldconfig) or an absolute path inside the image")
    return value


def _user(value: Any) -> str | None:
    if value is None:
        return None
    text = str(value)
    uid, sep, gid = text.partition(":")
    if decimal(uid, 10) is None or (sep and decimal(gid, 10) is None):
        raise ValueError("expected UID or UID:GID")
    return text


def _capabilities(value: Any) -> tuple[str, ...]:
    names = value.split(",") if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError("expected a list of capability names")
    names = [n.strip() for n in names if n.strip()]
    if names == ["all"]:
        return CAPABILITIES
    unknown = sorted(set(names) - set(CAPABILITIES))
    if unknown:
        raise ValueError(f"unknown capability {unknown[0]!r} (known: {', '.join(CAPABILITIES)})")
    return tuple(c for c in CAPABILITIES if c in names)


def _runtimes(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(n, str) and n for n in value):
        raise ValueError("expected a non-empty list of runtime names or absolute paths")
    return tuple(value)


def _memory_limit(value: Any) -> str | None:
    if value is None:
        return None
    text = str(value).strip()
    number = text[:-1] if text[-1:].lower() in ("k", "m", "g") else text
    if decimal(number) is None:
        raise ValueError("expected a byte count with an optional k, m or g suffix")
    return text


_GPU = r"all|[0-9]{1,3}|(?:GPU|MIG)-[0-9A-Fa-f-]{1,36}"  # nvc.containerenv.sharing.SCOPE's devices


def _backend(value: Any) -> tuple[tuple[str, str], ...]:
    """One backend for every GPU, or a mapping of GPUs (``all``, a UUID, an NVML index) to backends."""
    if isinstance(value, str):
        value = {"all": value}
    if not isinstance(value, dict) or not value:
        raise ValueError(f"expected one of {', '.join(SHARE_BACKENDS)}, or a mapping of GPUs to them")
    found = {"all": "timeslice"}
    for gpu, backend in value.items():
        if isinstance(gpu, bool) or not isinstance(gpu, (str, int)) or not re.fullmatch(_GPU, str(gpu)):
            raise ValueError(f"{one_line(repr(gpu), SHOWN_LIMIT)}: not a GPU (all, a GPU- or MIG- UUID, an index)")
        if backend not in SHARE_BACKENDS:
            raise ValueError(f"{gpu}: expected one of {', '.join(SHARE_BACKENDS)}")
        found[str(int(gpu)) if isinstance(gpu, int) or str(gpu).isdigit() else str(gpu)] = backend
    return tuple(sorted(found.items(), key=lambda item: item[0] != "all"))


def _percent(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100:
        raise ValueError("expected an integer percent from 1 to 100")
    return value


_RESOURCE = r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"


def _resource(value: Any) -> str:
    """An extended resource name as the kubelet accepts it: ``domain/name``."""
    if not isinstance(value, str) or not re.fullmatch(_RESOURCE, value) or len(value) > 253:
        raise ValueError("expected an extended resource name, DOMAIN/NAME (e.g. nvidia.com/gpu)")
    return value


def _resource_prefix(value: Any) -> str:
    if not isinstance(value, str) or not re.fullmatch(_RESOURCE, value + "x"):
        raise ValueError("expected the start of an extended resource name, DOMAIN/PREFIX (e.g. nvidia.com/mig-)")
    return value


def _gpu_list(value: Any) -> tuple[str, ...]:
    names = value.split(",") if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(n, (str, int)) and not isinstance(n, bool) for n in names):
        raise ValueError("expected a list of GPU UUIDs or indices, or all")
    return tuple(str(n).strip() for n in names if str(n).strip())


def _slice(value: Any) -> str:
    """Its grammar is the sharing variables' (nvc.containerenv.sharing.parse_size, a layer above this one):
    the plugin checks it as it starts."""
    if isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value).strip():
        raise ValueError("expected a size: bytes with an optional K, M, G, T, Ki, Mi, Gi or Ti")
    return str(value).strip()


def _xids(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in value):
        raise ValueError("expected a list of XID numbers")
    return tuple(sorted(set(value)))


def _seconds(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError("expected a whole number of seconds (0 or more)")
    return value


def _positive_seconds(value: Any) -> int:
    if _seconds(value) == 0:
        raise ValueError("expected a whole number of seconds (1 or more)")
    return value


_K8S: dict[str, tuple[str, Check]] = {
    "device-plugin-dir": ("device_plugin_dir", _abs_path),
    "gpu-resource": ("gpu_resource", _resource),
    "mig-resource-prefix": ("mig_resource_prefix", _resource_prefix),
    "share-resource": ("share_resource", _resource),
    "share-gpus": ("share_gpus", _gpu_list),
    "share-slice": ("share_slice", _slice),
    "share-compute": ("share_compute", _choice(*SHARE_COMPUTE)),
    "share-weight": ("share_weight", _bool),
    "share-backend": ("share_backend", _choice(*SHARE_BACKENDS)),
    "device-list-strategy": ("device_list_strategy", _choice(*DEVICE_LIST_STRATEGIES)),
    "cdi-devices": ("cdi_devices", _bool),
    "ignored-xids": ("ignored_xids", _xids),
    "xid-recovery": ("xid_recovery", _seconds),
    "nvml-retry": ("nvml_retry", _positive_seconds),
}
_SHARING: dict[str, tuple[str, Check]] = {
    "enabled": ("enabled", _bool),
    "device-memory-limit": ("device_memory_limit", _memory_limit),
    "device-sm-limit": ("device_sm_limit", _percent),
    "backend": ("backend", _backend),
}
_LOG: dict[str, tuple[str, Check]] = {
    "file": ("log_file", _opt_abs_path),
    "level": ("log_level", _choice(*LOG_LEVELS)),
}
_TOP: dict[str, tuple[str, Check]] = {
    "root": ("root", _abs_path),
    "ldcache": ("ldcache", _abs_path),
    "ldconfig": ("ldconfig", _ldconfig),
    "allow-ldconfig-from-container": ("allow_ldconfig_from_container", _bool),
    "load-kmods": ("load_kmods", _bool),
    "no-cgroups": ("no_cgroups", _bool),
    "user": ("user", _user),
    "accept-envvar-when-unprivileged": ("accept_envvar_when_unprivileged", _bool),
    "accept-volume-mounts": ("accept_volume_mounts", _bool),
    "disable-require": ("disable_require", _bool),
    "supported-capabilities": ("supported_capabilities", _capabilities),
    "cuda-compat-mode": ("cuda_compat_mode", _choice(*CUDA_COMPAT_MODES)),
    "runtimes": ("runtimes", _runtimes),
}


def _section(
    path: str, prefix: str, data: Any, keys: Mapping[str, tuple[str, Check]], sections: tuple[str, ...] = ()
) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise InputError(f"{path}: {prefix or 'top level'}: expected a mapping")
    values: dict[str, Any] = {}
    for key, raw in data.items():
        name = f"{prefix}{key}"
        if key not in keys:
            raise InputError(f"{path}: {name}: unknown key (known: {', '.join((*keys, *sections))})")
        attr, check = keys[key]
        try:
            values[attr] = check(raw)
        except ValueError as err:
            raise InputError(f"{path}: {name}: {err} (got {one_line(repr(raw), SHOWN_LIMIT)})") from None
    return values


def parse(text: str, path: str) -> Config:
    """The configuration in ``text`` (YAML), ``path`` naming it in errors."""
    data = yaml_document(text, path)
    data = {} if data is None else data
    log: Any = {}
    sharing: Any = {}
    k8s: Any = {}
    if isinstance(data, dict):
        data = dict(data)
        log = data.pop("log", None) or {}
        sharing = data.pop("sharing", None) or {}
        k8s = data.pop("k8s", None) or {}
    values = _section(path, "", data, _TOP, ("log", "sharing", "k8s"))
    values.update(_section(path, "log.", log, _LOG))
    values["sharing"] = Sharing(**_section(path, "sharing.", sharing, _SHARING))
    values["k8s"] = K8s(**_section(path, "k8s.", k8s, _K8S))
    if "ldconfig" not in values:
        values["ldconfig"] = default_ldconfig(values.get("root", "/"))
    config = Config(**values, path=path)
    if not config.ldconfig.startswith("@") and not config.allow_ldconfig_from_container:
        raise InputError(
            f"{path}: ldconfig: {config.ldconfig} is a path in the container image, refused "
            "(an image binary must not run for the hook; set allow-ldconfig-from-container: true "
            "to accept it, or use @HOSTPATH)"
        )
    return config


def defaults() -> Config:
    """The configuration without a file: the class's defaults, with this host's ldconfig."""
    return Config(ldconfig=default_ldconfig())


def config_path(env: Mapping[str, str] | None = None) -> str:
    """The file to read: ``$NVC_PY_CONFIG`` if set, else the default path."""
    return (os.environ if env is None else env).get(ENV_VAR) or DEFAULT_PATH


def load(path: str | None = None, must_exist: bool = False) -> Config:
    """The effective configuration from ``path`` (default: :func:`config_path`); no file means
    defaults, unless ``must_exist`` (a file the user named: a typo must not pass as defaults)."""
    path = path or config_path()
    try:
        raw, _ = read_file(path, MAX_SIZE)
    except FileNotFoundError:
        if must_exist:
            raise InputError(f"{path}: no such configuration file") from None
        return defaults()
    except OSError as err:
        raise InputError(f"{path}: cannot read configuration: {err.strerror}") from None
    except InputError as err:
        raise InputError(
            f"{err.args[0]} (a configuration file must be a regular file of at most {MAX_SIZE} bytes)"
        ) from None
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text") from None
    return parse(text, path)


def show(config: Config) -> str:
    """YAML text of the effective configuration, with a comment naming where it came from."""
    import yaml

    origin = config.path or "built-in defaults (no configuration file)"
    body = yaml.safe_dump(config.as_dict(), sort_keys=False, default_flow_style=False)
    return f"# effective nvc-py configuration from {origin}\n{body}"

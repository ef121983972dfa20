"""Register nvc-py with the container engines: podman's hooks.d and containerd's config.

Generated files name the installed console scripts and the hook client by absolute path (a
pyenv shim or a PATH lookup would depend on the environment the engine gives its hooks) and
give every hook an explicit environment: a fixed PATH and, where one was chosen, the configuration
file. Nothing from the container's own environment may reach a hook (CVE-2025-23266).
"""

from __future__ import annotations

import json
import os
import sysconfig
from collections.abc import Mapping
from typing import Any

from nvc.errors import InputError

HOOK_SCRIPT = "nvc-py-hook"
RUNTIME_SCRIPT = "nvc-py-runtime"
HOOK_CLIENT = "/usr/lib/nvc-py/nvc-py-hook-client"  # native/hook_client.c, installed by make install
SYSTEMD_UNIT_DIR = "/etc/systemd/system"
SERVER_UNIT = "nvc-py-hook.service"
FIXED_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PODMAN_HOOKS_DIR = "/etc/containers/oci/hooks.d"
PODMAN_HOOK_FILES = {"prestart": "oci-nvc-py-hook.json", "poststop": "oci-nvc-py-poststop.json"}
CONTAINERD_CONFIG = "/etc/containerd/config.toml"
CONTAINERD_DROP_IN = "/etc/containerd/conf.d/99-nvc-py.toml"
CRI_PLUGIN_NAME = "io.containerd.grpc.v1.cri"


def script_path(name: str) -> str:
    """Absolute path of one of nvc-py's console scripts, as installed next to this interpreter."""
    return os.path.join(sysconfig.get_path("scripts"), name)


def hook_env(config_path: str | None) -> list[str]:
    """The whole environment a hook gets: fixed PATH, and the configuration file when not the default."""
    return [FIXED_PATH] + ([f"NVC_PY_CONFIG={config_path}"] if config_path else [])


def oci_hook(stage: str, config_path: str | None = None) -> dict[str, Any]:
    """The OCI hook entry that runs ``nvc-py-hook STAGE`` (prestart configures; poststop drops
    the GPU-sharing directory of a container that had one).

    Through nvc-py-hook-client where ``make install`` put it: it hands the call to a running
    ``nvc-py-hook serve`` (no interpreter start on the container's start), and runs
    nvc-py-hook itself when no server answers, so the entry is right with or without one.
    """
    script = script_path(HOOK_SCRIPT)
    if os.access(HOOK_CLIENT, os.X_OK):
        return {"path": HOOK_CLIENT, "args": [os.path.basename(HOOK_CLIENT), script, stage],
                "env": hook_env(config_path)}
    return {"path": script, "args": [HOOK_SCRIPT, stage], "env": hook_env(config_path)}


def podman_hook(stage: str, config_path: str | None = None) -> dict[str, Any]:
    """The hooks.d document (schema 1.0.0) of one stage (a hooks.d file has one argv for all its stages).

    hooks.d can match annotations, commands and bind mounts but not environment variables,
    and most GPU requests are ``-e NVIDIA_VISIBLE_DEVICES=…``: so the hook is attached to
    every container and itself returns at once for those that ask for no GPU (about 20 ms
    after the interpreter's start; see bench/hook_load).
    """
    return {"version": "1.0.0", "hook": oci_hook(stage, config_path), "when": {"always": True}, "stages": [stage]}


def write_atomic(path: str, text: str, mode: int = 0o644) -> None:
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fchmod(f.fileno(), mode)
        os.fsync(f.fileno())
    os.replace(tmp, path)


def install_podman(hooks_dir: str = PODMAN_HOOKS_DIR, config_path: str | None = None) -> list[str]:
    """Write the hooks.d files (prestart and poststop); returns their paths."""
    paths = []
    for stage, name in PODMAN_HOOK_FILES.items():
        paths.append(os.path.join(hooks_dir, name))
        write_atomic(paths[-1], json.dumps(podman_hook(stage, config_path), indent=2) + "\n")
    return paths


def server_unit(config_path: str | None = None) -> str:
    """A systemd unit running ``nvc-py-hook serve`` in the host's namespaces.

    KillMode=process: a stop or restart ends the server and its idle spare worker (which dies
    with it), never a worker in the middle of a container's start. RestartPreventExitStatus=2:
    a refusal to start (a socket directory others control, see nvc.hook.server) is no failure a
    restart mends; the clients run the hook themselves meanwhile.
    """
    env = "".join(f"Environment={entry}\n" for entry in hook_env(config_path))
    return ("[Unit]\n"
            "Description=nvc-py hook server: runs nvc-py-hook calls in pre-started workers\n"
            "Documentation=man:nvc-py-hook(1)\n\n"
            "[Service]\n"
            f"ExecStart={script_path(HOOK_SCRIPT)} serve\n"
            f"{env}"
            "KillMode=process\n"
            "Restart=always\n"
            "RestartPreventExitStatus=2\n\n"
            "[Install]\n"
            "WantedBy=multi-user.target\n")


def install_server(unit_dir: str = SYSTEMD_UNIT_DIR, config_path: str | None = None) -> str:
    """Write the server's systemd unit; returns its path."""
    path = os.path.join(unit_dir, SERVER_UNIT)
    write_atomic(path, server_unit(config_path))
    return path


def _read_toml(path: str) -> Any:
    import tomlkit

    try:
        with open(path, encoding="utf-8") as f:
            return tomlkit.parse(f.read())
    except FileNotFoundError:
        return tomlkit.document()
    except OSError as err:
        raise InputError(f"{path}: cannot read: {err.strerror}") from None
    except tomlkit.exceptions.TOMLKitError as err:
        raise InputError(f"{path}: not valid TOML ({err})") from None


def _table(parent: Any, dotted: list[str]) -> Any:
    """The nested table at ``dotted`` under ``parent``, created (as real tables) where missing."""
    import tomlkit

    for key in dotted:
        if key not in parent:
            parent[key] = tomlkit.table()
        parent = parent[key]
        if not isinstance(parent, Mapping):
            raise InputError(f"containerd config: {key} is not a table")
    return parent


def _version(doc: Any, path: str) -> None:
    """containerd reads a file without ``version`` as version 1, an absent or empty one as defaults."""
    version = doc.get("version", 2 if not doc else 1)
    if version != 2:
        raise InputError(f"{path}: containerd config version {version}: only version 2 "
                         "(containerd 1.6/1.7) is supported")


def containerd_drop_in(main: Any, runtime_name: str, set_default: bool) -> Any:
    """The drop-in document registering runtime ``runtime_name`` (runc v2 shim, ``BinaryName``).

    containerd 1.6 merges imported files key by key at the top of ``plugins`` and replaces
    whole plugin tables: a drop-in holding only our runtime would wipe the user's CRI
    settings. So the drop-in carries the main file's CRI table with the runtime added.
    """
    import tomlkit

    drop_in = tomlkit.document()
    drop_in["version"] = 2
    existing = main.get("plugins", {}).get(CRI_PLUGIN_NAME)
    cri = existing.unwrap() if existing is not None else {}
    drop_in["plugins"] = {CRI_PLUGIN_NAME: cri}
    runtimes = _table(drop_in, ["plugins", CRI_PLUGIN_NAME, "containerd", "runtimes"])
    runtime = _table(runtimes, [runtime_name])
    runtime["runtime_type"] = "io.containerd.runc.v2"
    _table(runtime, ["options"])["BinaryName"] = script_path(RUNTIME_SCRIPT)
    if set_default:
        _table(drop_in, ["plugins", CRI_PLUGIN_NAME, "containerd"])["default_runtime_name"] = runtime_name
    return drop_in


def install_containerd(config: str = CONTAINERD_CONFIG, drop_in: str = CONTAINERD_DROP_IN,
                       runtime_name: str = "nvc-py", set_default: bool = False,
                       dry_run: bool = False) -> dict[str, str]:
    """Write the drop-in and add it to ``imports`` of ``config`` (every other setting kept, comments too).

    Returns the new text of each file by path; ``dry_run`` writes nothing.
    """
    import tomlkit

    main = _read_toml(config)
    _version(main, config)
    texts = {drop_in: tomlkit.dumps(containerd_drop_in(main, runtime_name, set_default))}
    imports = main.get("imports")
    if imports is None:
        main["version"] = 2
        main["imports"] = [drop_in]
    elif drop_in not in imports:
        imports.append(drop_in)
    texts[config] = tomlkit.dumps(main)
    if not dry_run:
        for path, text in texts.items():
            write_atomic(path, text)
    return texts

"""Register nvc-py with the container engines (podman's hooks.d, containerd's config) and set up
its hook server (systemd socket activation where systemd runs).

Generated files name the installed programs by absolute path (a pyenv shim or a PATH lookup would
depend on the environment the engine gives its hooks): those ``make install`` put in
/usr/lib/nvc-py (the native fronts, which start the isolated interpreters), which a later ``pip
install`` leaves alone. Every hook gets an explicit environment:
a fixed PATH and, where one was chosen, the configuration file. Nothing from the container's own
environment may reach a hook (CVE-2025-23266).
"""

from __future__ import annotations

import json
import os
import subprocess
import sysconfig
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from nvc.errors import InputError, NvcError
from nvc.hook.setup import engineconf, packaged
from nvc.hook.setup.files import holds, remove_files, remove_files_and_dirs, write_files
from nvc.system.programs import LIBDIR, RUNTIME_SCRIPT, SOCKET_ENV, hook_env, installed_program, oci_hook

if TYPE_CHECKING:
    from nvc.hook.setup.hooksdirs import Engine

SERVER_PROGRAM = "nvc-py-hook-python"  # the Python nvc-py-hook, in LIBDIR: what serves
SYSTEMD_UNIT_DIR = "/etc/systemd/system"
SYSTEMD_RUNNING = "/run/systemd/system"  # exists where systemd is PID 1 (sd_booted)
SERVER_UNIT = "nvc-py-hook.service"
SOCKET_UNIT = "nvc-py-hook.socket"
WATCHDOG_SEC = 10  # the server's unit: seconds without a keep-alive before systemd replaces it
NO_SERVER_FILE = "no-server"  # beside the configuration file: no server started on demand (client/server_start.c)
PODMAN_HOOK_FILES = {"prestart": "oci-nvc-py-hook.json", "poststop": "oci-nvc-py-poststop.json"}
CONTAINERD_CONFIG = "/etc/containerd/config.toml"
CONTAINERD_DROP_IN = "/etc/containerd/conf.d/99-nvc-py.toml"
CRI_PLUGIN_NAME = "io.containerd.grpc.v1.cri"


def script_path(name: str) -> str:
    """Absolute path of one of nvc-py's console scripts, as installed next to this interpreter."""
    return os.path.join(sysconfig.get_path("scripts"), name)


def podman_hook(stage: str, config_path: str | None = None) -> dict[str, Any]:
    """The hooks.d document (schema 1.0.0) of one stage (a hooks.d file has one argv for all its stages).

    hooks.d can match annotations, commands and bind mounts but not environment variables,
    and most GPU requests are ``-e NVIDIA_VISIBLE_DEVICES=…``: so the hook is attached to
    every container and itself returns at once for those that ask for no GPU (bench/hook_load.py
    measures what that costs).
    """
    return {"version": "1.0.0", "hook": oci_hook(stage, config_path), "when": {"always": True}, "stages": [stage]}


def hook_files(target: str, config_path: str | None = None) -> dict[str, str]:
    """The hooks.d files (path in ``target``: text), as setup and the Debian package install them."""
    return {
        os.path.join(target, name): json.dumps(podman_hook(stage, config_path), indent=2) + "\n"
        for stage, name in PODMAN_HOOK_FILES.items()
    }


def install_hooks(
    engine: Engine, hooks_dir: str | None = None, config_path: str | None = None, env: Mapping[str, str] | None = None
) -> tuple[list[str], list[str]]:
    """Write the hooks.d files (prestart and poststop) where ``engine`` reads them (nvc.hook.setup.hooksdirs),
    or in ``hooks_dir``; our files left in the directory earlier versions wrote to are removed
    when the engine does not read it. The package's own files there (nvc.hook.setup.packaged) are
    kept as they are, and a change to one (``config_path``) refused. Returns (what was done,
    warnings), a line each."""
    from nvc.hook.setup import hooksdirs

    resolved = hooksdirs.resolve(engine, env)
    target = hooks_dir or resolved.target
    texts = hook_files(target, config_path)
    listed = packaged.files()
    theirs = [path for path in texts if packaged.owns(path, listed)]
    for path in theirs:
        if not os.path.lexists(path):
            raise InputError(
                f"{path}: the {packaged.PACKAGE} package's file is missing: "
                f"apt install --reinstall {packaged.PACKAGE} puts it back"
            )
        if not holds(path, texts[path]):
            raise InputError(
                f"{path}: the {packaged.PACKAGE} package's file, which setup would change: list a "
                f"directory of your own after {target} in {engine.name}'s hooks_dir and give it as "
                "--hooks-dir"
            )
    write_files({path: text for path, text in texts.items() if path not in theirs})
    done = [f"kept {path} (the {packaged.PACKAGE} package's)" if path in theirs else f"wrote {path}" for path in texts]
    legacy = os.path.normpath(hooksdirs.LEGACY_HOOKS_DIR)
    if legacy not in resolved.dirs and os.path.normpath(target) != legacy:
        done += [f"{line} (moved to {target})" if line.endswith(".json") else line for line in _remove_ours([legacy])]
    warnings = (
        []
        if os.path.normpath(target) in resolved.dirs
        else [f"{hooksdirs.described(engine, resolved)}: it will not read {target}"]
    )
    if reload_drops_hook_rules(engine, env):
        warnings.append(RELOAD_WARNING.format(engine=engine.name))
    return done, warnings


# Where systemd is PID 1 and manages an engine's containers' cgroups, a reload (or a set-property on
# a container's scope) rewrites their device rules from the scope's DeviceAllow= list, which the
# rules the hook adds at prestart are not on (tests/test_systemd_reload.py; docs/engines.md).
RELOAD_WARNING = (
    "{engine}'s containers get their GPUs through the hook while systemd manages their cgroups: "
    "`systemctl daemon-reload` takes the GPUs away from running containers; where that matters, "
    'use CDI (nvc-py cdi generate; docs/engines.md, "systemd reloads")'
)


def reload_drops_hook_rules(
    engine: Engine, env: Mapping[str, str] | None = None, running: str = SYSTEMD_RUNNING
) -> bool:
    """Whether systemd runs and manages ``engine``'s containers' cgroups (a configuration file it
    cannot read: the engine's own check says so, nothing here)."""
    from nvc.hook.setup import hooksdirs

    if not os.path.isdir(running):
        return False
    try:
        return hooksdirs.cgroup_manager(engine, env) == hooksdirs.SYSTEMD_CGROUPS
    except NvcError:
        return False


def remove_hooks(
    engine: Engine, hooks_dir: str | None = None, env: Mapping[str, str] | None = None, keep: tuple[str, ...] = ()
) -> list[str]:
    """Remove the hooks.d files :func:`install_hooks` writes: from ``hooks_dir``, every directory the
    engine reads and the one earlier versions wrote to, except those in ``keep`` (a package's own
    directory, whose files its package manager removes) and the files the package installed (named
    in one line: its removal removes them), and the directories left empty
    (:func:`remove_files_and_dirs`). Returns what was done, a line each."""
    from nvc.hook.setup import hooksdirs

    dirs = [*([hooks_dir] if hooks_dir else []), *hooksdirs.resolve(engine, env).dirs, hooksdirs.LEGACY_HOOKS_DIR]
    kept = {os.path.normpath(d) for d in keep}
    return _remove_ours([d for d in dict.fromkeys(os.path.normpath(d) for d in dirs) if d not in kept])


def _remove_ours(dirs: list[str]) -> list[str]:
    """Our hooks.d files in ``dirs`` removed, and the directories they leave empty; the package's
    own (nvc.hook.setup.packaged) left to it, in one line."""
    listed = packaged.files()
    paths = [os.path.join(d, name) for d in dirs for name in PODMAN_HOOK_FILES.values()]
    theirs = [path for path in paths if os.path.lexists(path) and packaged.owns(path, listed)]
    done = remove_files_and_dirs([path for path in paths if path not in theirs])
    if theirs:
        done.append(
            f"kept {', '.join(theirs)}: the {packaged.PACKAGE} package's (apt remove {packaged.PACKAGE} removes them)"
        )
    return done


def server_unit(config_path: str | None = None) -> str:
    """The systemd service running ``nvc-py-hook serve`` in the host's namespaces, started by its
    socket unit on the first connection.

    KillMode=mixed: a stop or restart sends SIGTERM to the server alone, which kills its idle spares
    and waits for its busy workers to finish their calls (never a worker in the middle of a
    container's start: nvc.hook.server.loop's STOP_WAIT, below the stop timeout) and exits once no
    process of its own is left; what would still be there after it exited (none: the journal's
    "left-over process" lines of KillMode=process) systemd kills. RestartPreventExitStatus=2:
    a refusal to start (a socket directory others control, see nvc.hook.server) is no failure a
    restart mends; the clients run the hook themselves meanwhile. WatchdogSec=: a server whose
    accept loop stops sending keep-alives (wedged, stopped, or its workers taking no call:
    nvc.hook.server.watchdog) is killed and restarted; SIGKILL, since a stopped process would hold any
    other signal until continued. Meanwhile one call pays the clients' hand-over timeout and the
    others run the hook themselves (nvc.hook.server.wedge).
    """
    env = "".join(f"Environment={entry}\n" for entry in hook_env(config_path))
    program = os.path.join(LIBDIR, SERVER_PROGRAM)
    return (
        "[Unit]\n"
        "Description=nvc-py hook server: runs nvc-py-hook calls in pre-started workers\n"
        f"Requires={SOCKET_UNIT}\n"
        f"After={SOCKET_UNIT}\n\n"
        "[Service]\n"
        f"ExecStart={program} serve\n"
        f"{env}"
        "KillMode=mixed\n"
        f"WatchdogSec={WATCHDOG_SEC}\n"
        "WatchdogSignal=SIGKILL\n"
        "NotifyAccess=main\n"
        "Restart=on-failure\n"
        "RestartPreventExitStatus=2\n"
    )  # a refused socket directory: restarting cannot help


def socket_unit() -> str:
    """The socket unit: systemd binds the server's socket (root's alone) and starts the service on
    the first connection; calls that arrive while the server (re)starts wait in its queue."""
    from nvc.system.programs import DEFAULT_SOCKET

    return (
        "[Unit]\n"
        "Description=nvc-py hook server socket\n\n"
        "[Socket]\n"
        f"ListenSequentialPacket={DEFAULT_SOCKET}\n"
        "SocketMode=0600\n"
        "DirectoryMode=0700\n"
        "SocketUser=root\n"
        "SocketGroup=root\n\n"
        "[Install]\n"
        "WantedBy=sockets.target\n"
    )


def install_server(
    unit_dir: str | None = None, config_path: str | None = None, systemctl: str = "systemctl"
) -> list[str]:
    """Set up the hook server; returns what was done, a line each.

    Where systemd runs: the socket and service units in ``unit_dir`` (default: the system's), and
    where that is the system's, the socket enabled and started (and a running server restarted on
    them where they changed). Where it does not: a server that stays started now
    (:func:`start_server`), and units only where a ``unit_dir`` was asked for. On a packaged install
    the package's units serve: none written to the system's directory (:func:`_packaged_server`).
    """
    running = os.path.isdir(SYSTEMD_RUNNING)
    if unit_dir is None and not running:
        return ["systemd is not running: no units written", start_server()]
    unit_dir = unit_dir or SYSTEMD_UNIT_DIR
    theirs = packaged.unit_dir(SOCKET_UNIT, packaged.files())
    if theirs is not None and os.path.realpath(unit_dir) == os.path.realpath(SYSTEMD_UNIT_DIR):
        if not running:
            return [
                f"no units written: the {packaged.PACKAGE} package's in {theirs} serve where systemd runs",
                start_server(),
            ]
        return _packaged_server(theirs, systemctl)
    texts = {
        os.path.join(unit_dir, SOCKET_UNIT): socket_unit(),
        os.path.join(unit_dir, SERVER_UNIT): server_unit(config_path),
    }
    changed = {path: text for path, text in texts.items() if not holds(path, text)}
    write_files(changed)
    done = [f"wrote {path}" for path in changed]
    if not _systemd_manages(unit_dir):
        why = "systemd is not running" if not running else f"{unit_dir} is not {SYSTEMD_UNIT_DIR}"
        return [
            *done,
            f"not enabled ({why}): systemctl enable --now {SOCKET_UNIT}",
            *([] if running else [start_server()]),
        ]
    # try-restart: a server already running takes the changed units over (a server of older code
    # restarts itself at its next call); units as they were: the running server stays
    _systemctl(
        systemctl,
        *([["daemon-reload"]] if changed else []),
        ["enable", "--now", SOCKET_UNIT],
        *([["try-restart", SERVER_UNIT]] if changed else []),
    )
    return [*done, f"enabled and started {SOCKET_UNIT}"]


def start_server() -> str:
    """Where systemd does not run: a server that stays, started now by the installed front
    (``nvc-py-hook start-server``: detached, reparented to init, in PID 1's cgroups, without the idle
    exit of one a hook call starts), so that no start waits for a server's start-up, and none is
    started by, and adopted by, a runtime that waits for it (crun's ``run``). Returns what was done;
    where none could start, why, and that the hook calls start one on demand. It lives until the host
    restarts: then the first hook call starts one on demand (docs/hook-server.md). Its socket is the
    default, which the registered hooks use (setup itself runs with ``NVC_PY_HOOK_SOCKET=none``
    where the front ran it)."""
    front = installed_program("nvc-py-hook")
    env = {key: value for key, value in os.environ.items() if key != SOCKET_ENV}  # the registered hooks' socket
    try:
        done = subprocess.run(
            [front, "start-server"], stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env
        )
    except OSError as err:
        return f"no hook server started ({front}: {err.strerror}): the hook calls start one on demand"
    if done.returncode == 0:
        return done.stdout.strip().removeprefix("nvc-py-hook: ")
    why = done.stderr.strip().removeprefix("nvc-py-hook: ") or f"{front} start-server: exit status {done.returncode}"
    return f"{why}: the hook calls start one on demand"


def _packaged_server(units: str, systemctl: str) -> list[str]:
    """The package's units in ``units`` serve: copies an earlier setup wrote to /etc/systemd/system
    (which would shadow them) removed, the socket enabled and started; the server restarted only
    where its unit changed so."""
    done = remove_files([os.path.join(SYSTEMD_UNIT_DIR, name) for name in (SOCKET_UNIT, SERVER_UNIT)])
    _systemctl(
        systemctl,
        *([["daemon-reload"]] if done else []),
        ["enable", "--now", SOCKET_UNIT],
        *([["try-restart", SERVER_UNIT]] if done else []),
    )
    return [*done, f"enabled and started {SOCKET_UNIT} (the {packaged.PACKAGE} package's, in {units})"]


def _systemd_manages(unit_dir: str) -> bool:
    """Whether systemd runs and ``unit_dir`` is its system unit directory (what it loads units from)."""
    return os.path.isdir(SYSTEMD_RUNNING) and os.path.realpath(unit_dir) == os.path.realpath(SYSTEMD_UNIT_DIR)


def _systemctl(systemctl: str, *calls: list[str]) -> None:
    """Run ``systemctl`` once per argument list, in order; the first failure is one InputError."""
    for args in calls:
        try:
            subprocess.run([systemctl, *args], check=True, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        except (OSError, subprocess.CalledProcessError) as err:
            detail = err.stderr.strip() if isinstance(err, subprocess.CalledProcessError) else err.strerror
            raise InputError(f"{systemctl} {' '.join(args)}: failed ({detail})") from None


def remove_server(
    unit_dir: str = SYSTEMD_UNIT_DIR, config_path: str | None = None, systemctl: str = "systemctl"
) -> list[str]:
    """Undo :func:`install_server` and ``--no-server``: the units (:func:`remove_units`), and the
    no-server file beside the configuration file removed. The package's units (nvc.hook.setup.packaged)
    stay where they are, disabled and stopped (the package's upgrades start no disabled socket).
    Returns what was done, a line each."""
    done = remove_units(unit_dir, systemctl)
    theirs = packaged.unit_dir(SOCKET_UNIT, packaged.files())
    if theirs is not None and os.path.realpath(unit_dir) == os.path.realpath(SYSTEMD_UNIT_DIR):
        done.append(_disable_packaged(theirs, systemctl))
    changed = set_server_start(config_path, True)
    return done + ([changed] if changed else [])


def _disable_packaged(units: str, systemctl: str) -> str:
    """The package's socket and service disabled and stopped where systemd runs (else what to run)."""
    kept = f"the {packaged.PACKAGE} package's units stay in {units}"
    if not os.path.isdir(SYSTEMD_RUNNING):
        return f"{kept}: systemd is not running: systemctl disable {SOCKET_UNIT}"
    _systemctl(systemctl, ["disable", "--now", SOCKET_UNIT], ["stop", SERVER_UNIT])
    return (
        f"stopped and disabled {SOCKET_UNIT} and {SERVER_UNIT} ({kept}: systemctl enable --now {SOCKET_UNIT} "
        "serves again)"
    )


def remove_units(unit_dir: str = SYSTEMD_UNIT_DIR, systemctl: str = "systemctl") -> list[str]:
    """The units :func:`install_server` wrote in ``unit_dir``: stopped and disabled (where systemd
    manages ``unit_dir``) and removed. Returns what was done, a line each."""
    units = [os.path.join(unit_dir, name) for name in (SOCKET_UNIT, SERVER_UNIT)]
    managed = _systemd_manages(unit_dir) and any(os.path.lexists(path) for path in units)
    if managed:
        _systemctl(systemctl, ["disable", "--now", SOCKET_UNIT], ["stop", SERVER_UNIT])
    done = remove_files(units)
    if managed:
        _systemctl(systemctl, ["daemon-reload"])
        done.insert(0, f"stopped and disabled {SOCKET_UNIT} and {SERVER_UNIT}")
    return done


def set_server_start(config_path: str | None, enabled: bool) -> str | None:
    """Allow or forbid the on-demand start of a server (``setup ... --no-server``): the no-server
    file beside the configuration file the hooks read, which the native front checks before it
    starts one. Returns what changed, if anything."""
    from nvc import config as config_file

    path = os.path.join(os.path.dirname(config_path or config_file.DEFAULT_PATH), NO_SERVER_FILE)
    if not enabled:
        write_files({path: "# nvc-py setup --no-server: hook clients start no nvc-py-hook server\n"})
        return f"wrote {path}"
    removed = remove_files([path])
    return removed[0] if removed else None


def _read_toml(path: str) -> Any:
    """containerd's configuration at ``path`` (:func:`nvc.hook.setup.engineconf.toml`: a link, a file that
    is not a regular one or is too large, bad TOML refused); a missing file is an empty document."""
    import tomlkit

    doc = engineconf.toml(path, engineconf.config_option)
    return tomlkit.document() if doc is None else doc


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
        raise InputError(
            f"{path}: containerd config version {version}: only version 2 (containerd 1.6/1.7) is supported"
        )


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
    _table(runtime, ["options"])["BinaryName"] = installed_program(RUNTIME_SCRIPT)
    if set_default:
        _table(drop_in, ["plugins", CRI_PLUGIN_NAME, "containerd"])["default_runtime_name"] = runtime_name
    return drop_in


def install_containerd(
    config: str = CONTAINERD_CONFIG,
    drop_in: str = CONTAINERD_DROP_IN,
    runtime_name: str = "nvc-py",
    set_default: bool = False,
    dry_run: bool = False,
) -> dict[str, str]:
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
        write_files(texts, backup=(config,))
    return texts


def remove_containerd(config: str = CONTAINERD_CONFIG, drop_in: str = CONTAINERD_DROP_IN) -> list[str]:
    """Undo :func:`install_containerd`: ``drop_in`` out of ``config``'s imports (every other setting
    kept; the file removed where nothing else is left, as when install_containerd made it), then the
    drop-in removed, and the directories left empty (:func:`remove_files_and_dirs`). Returns what
    was done, a line each."""
    import tomlkit

    done = []
    main = engineconf.toml(config, engineconf.config_option)
    if main is not None:
        imports = main.get("imports")
        if imports is not None and drop_in in imports:
            imports.remove(drop_in)
            if not imports:
                del main["imports"]
            backup = config + engineconf.BACKUP_SUFFIX  # setup's: the file is restored, it goes too
            if main.unwrap() == {"version": 2}:  # what install_containerd made where there was no file
                return remove_files_and_dirs([config, backup, drop_in])
            write_files({config: tomlkit.dumps(main)}, backup=(config,))
            done.append(f"removed {drop_in} from the imports of {config}")
            done += remove_files([backup])
    return done + remove_files_and_dirs([drop_in])

"""Doctor's checks of the engines: is nvc-py registered where each installed engine reads it (resolved
as the engine resolves it), has the engine read it since (a daemon started before its configuration
changed has not), is the CDI spec today's, and does the hook server answer with the installed code."""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from nvc.doctor import FAIL, OK, Check, fail, ok, skip
from nvc.errors import InputError, NvcError
from nvc.hook.setup.docker import DAEMON_JSON, GPUS_HOOK
from nvc.hook.setup.hooksdirs import SYSTEMD_CGROUPS
from nvc.hook.setup.processes import Daemon, processes, running
from nvc.system.programs import is_ours

_MAX_CONFIG = 1 << 20
CONTAINERD_CONFIG = "/etc/containerd/config.toml"  # containerd's default --config
CLOCK_SLACK = 1.0  # seconds: a process's start time is known to the boot time's whole second


def _hook_file(path: str) -> str | None:
    """The program of a hooks.d file of ours (None where it is not one, or unreadable)."""
    from nvc.system.untrusted import read_file

    try:
        raw, _ = read_file(path, _MAX_CONFIG)
        program = json.loads(raw)["hook"]["path"]
    except (OSError, NvcError, ValueError, KeyError, TypeError):
        return None
    return program if isinstance(program, str) else None


def hooks_engine(name: str, binary: str, env: Mapping[str, str] | None = None) -> Check:
    """podman or CRI-O: nvc-py's prestart hook in a directory the engine reads."""
    from nvc.hook.setup import engines, hooksdirs

    engine = hooksdirs.CRIO if name == "CRI-O" else hooksdirs.PODMAN
    if shutil.which(binary) is None:
        return skip(name, f"not installed ({binary} not on PATH)")
    command = "crio" if name == "CRI-O" else "podman"
    try:
        resolved = hooksdirs.resolve(engine, env)
    except NvcError as err:
        return fail(name, str(err), f"fix that file: {name} would refuse it too")
    hook = engines.PODMAN_HOOK_FILES["prestart"]
    for directory in reversed(resolved.dirs):
        program = _hook_file(os.path.join(directory, hook))
        if program is None:
            continue
        if not os.access(program, os.X_OK):
            return fail(
                name,
                f"{directory}/{hook} runs {program}, which is missing",
                f"reinstall nvc-py, then `nvc-py setup {command}`",
            )
        return ok(name, f"hook {directory}/{hook} ({hooksdirs.described(engine, resolved)})")
    legacy = os.path.join(hooksdirs.LEGACY_HOOKS_DIR, hook)
    elsewhere = f"; {legacy} exists, but {name} does not read it" if os.path.exists(legacy) else ""
    return fail(
        name, f"no nvc-py hook where {hooksdirs.described(engine, resolved)}{elsewhere}", f"nvc-py setup {command}"
    )


def systemd_reload(
    registered: Sequence[tuple[Check, str]], env: Mapping[str, str] | None = None, dockerd: Daemon | None = None
) -> Check:
    """Whether the GPUs of containers started through the hook survive ``systemctl daemon-reload``:
    not where systemd runs and manages their engine's cgroups (``registered``: each hooks engine's
    check and its name, "podman" or "CRI-O"; ``docker run --gpus`` runs the hook too, under
    ``dockerd``'s cgroup driver; tests/test_systemd_reload.py)."""
    from nvc.hook.setup import engines, hooksdirs

    name = "daemon-reload"
    if not os.path.isdir(engines.SYSTEMD_RUNNING):
        return skip(name, "systemd is not PID 1: no reload rewrites a container's device rules")
    lost = [
        engine
        for check, engine in registered
        if check.status == OK
        and engines.reload_drops_hook_rules(hooksdirs.CRIO if engine == "CRI-O" else hooksdirs.PODMAN, env)
    ] + (["docker run --gpus"] if _docker_gpus_under_systemd(dockerd) else [])
    if lost:
        return fail(
            name,
            f"{' and '.join(lost)} start GPU containers through nvc-py's hook with systemd managing their "
            "cgroups: `systemctl daemon-reload` takes the GPUs of running containers away",
            "give them GPUs through CDI (nvc-py cdi generate --output /etc/cdi/nvidia.yaml; "
            "podman run --device nvidia.com/gpu=0 ...) or Docker's through `--runtime nvc-py` "
            '(docs/engines.md, "systemd reloads")',
        )
    return ok(name, "no engine starts GPU containers through the hook with systemd managing their cgroups")


def _started_after(daemon: Daemon | None, name: str, path: str) -> Check | None:
    """A failing check when ``daemon`` started before ``path`` last changed (it runs with the
    configuration it read at its start); None where that holds or it does not run."""
    if daemon is None or not os.path.exists(path):
        return None
    changed = os.stat(path).st_mtime
    if daemon.started < changed - CLOCK_SLACK:
        return fail(
            name,
            f"{name} (pid {daemon.pid}) started {_when(daemon.started)}, before {path} changed "
            f"({_when(changed)}): it has not read nvc-py's registration",
            f"restart it (systemctl restart {name})",
        )
    return None


def docker() -> tuple[list[Check], Daemon | None]:
    """dockerd, as the running one reads it (its --config-file, its PATH): the nvc-py runtime in
    daemon.json (``--runtime nvc-py``), the ``--gpus`` hook program, and dockerd started since
    daemon.json changed. Also the daemon found, for ``--run``."""
    from nvc.hook.setup import docker as registration

    if shutil.which("dockerd") is None:
        return [skip("docker", "not installed (dockerd not on PATH)")], None
    daemons = running("dockerd")
    daemon = daemons[0] if daemons else None
    config_path = _docker_config_path(daemon)
    try:
        doc = _docker_config(config_path)
    except NvcError as err:
        return [fail("docker", str(err), f"correct {config_path}: dockerd would refuse it too")], daemon
    ours = sorted(
        name
        for name, entry in doc.get(registration.RUNTIMES, {}).items()
        if isinstance(entry.get("path"), str) and is_ours(entry["path"])
    )
    found = [
        ok("docker", f"runtime {ours[0]} in {config_path} (docker run --runtime {ours[0]} ...)")
        if ours
        else fail("docker", f"{config_path} registers no nvc-py runtime", "nvc-py setup docker")
    ]
    program = _gpus_program(daemon)
    if program is None:
        found.append(
            fail("docker --gpus", f"no {GPUS_HOOK} on dockerd's PATH: `docker run --gpus` fails", "nvc-py setup docker")
        )
    else:
        whose = "nvc-py's hook" if is_ours(program) else "not nvc-py's (NVIDIA's toolkit?): --gpus runs it"
        found.append(ok("docker --gpus", f"{program} is {whose}"))
    if daemon is None:  # nothing fails for a dockerd that does not run: what to do, for one started later
        found = [
            skip(c.name, f"{c.detail} ({c.fix}, for a dockerd started later)") if c.status == FAIL else c for c in found
        ]
        found.append(skip("dockerd", "not running"))
    stale = _started_after(daemon, "dockerd", config_path)
    return found + ([stale] if stale else []), daemon


def _docker_config_path(daemon: Daemon | None) -> str:
    """The daemon.json the running dockerd reads (its --config-file), else the default."""
    return (daemon.flag("--config-file") if daemon else None) or DAEMON_JSON


def _docker_config(path: str) -> Mapping[str, Any]:
    """daemon.json as dockerd reads it ({} where there is none); one that it would refuse is an error."""
    from nvc.hook.setup import docker as registration

    text, _ = registration.read_config(path)
    return registration.parse(text, path) if text is not None else {}


def _gpus_program(daemon: Daemon | None) -> str | None:
    """The program ``docker run --gpus`` runs: the hook's name on dockerd's PATH."""
    path = daemon.path if daemon else None
    return shutil.which(GPUS_HOOK, path=path or "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")


def docker_cgroup_driver(doc: Mapping[str, Any], exec_opt: str | None, cgroup2: bool) -> str:
    """dockerd's cgroup driver: the last ``native.cgroupdriver`` of daemon.json's ``exec-opts`` and
    its ``--exec-opt``, else its default (systemd on cgroup v2, since 20.10; cgroupfs on v1)."""
    given = doc.get("exec-opts")
    opts = [o for o in given if isinstance(o, str)] if isinstance(given, list) else []
    driver = SYSTEMD_CGROUPS if cgroup2 else "cgroupfs"
    for opt in [*opts, *([exec_opt] if exec_opt else [])]:
        key, _, value = opt.partition("=")
        if key.strip() == "native.cgroupdriver":
            driver = value.strip()
    return driver


def _docker_gpus_under_systemd(daemon: Daemon | None) -> bool:
    """Whether ``docker run --gpus`` runs nvc-py's hook in containers whose cgroups systemd manages."""
    from nvc.doctor.host import is_cgroup2

    program = _gpus_program(daemon)
    if program is None or not is_ours(program):
        return False
    try:
        doc = _docker_config(_docker_config_path(daemon))
        cgroup2 = is_cgroup2()
    except (NvcError, OSError):
        return False  # the docker and cgroups lines say so
    exec_opt = daemon.flag("--exec-opt") if daemon else None
    return docker_cgroup_driver(doc, exec_opt, cgroup2) == SYSTEMD_CGROUPS


def containerd(config_path: str = CONTAINERD_CONFIG) -> list[Check]:
    """containerd: a drop-in of the main file's ``imports`` registering nvc-py-runtime, and
    containerd started since the main file changed. The containerd inspected is one of its own (its
    --config, else ``config_path``); dockerd's own containerd (its child, with a configuration
    dockerd writes) never reads that file, so where only it runs a missing registration is no failure."""
    if shutil.which("containerd") is None:
        return [skip("containerd", "not installed (containerd not on PATH)")]
    daemons = running("containerd")
    dockerds = {d.pid for d in running("dockerd")}
    own = [d for d in daemons if d.parent not in dockerds]
    if own:
        config_path = own[0].flag("--config") or own[0].flag("-c") or config_path
    try:
        main = _toml(config_path) if os.path.exists(config_path) else {}
        runtimes = []
        for drop_in in main.get("imports", []) if isinstance(main.get("imports"), list) else []:
            if isinstance(drop_in, str) and os.path.isfile(drop_in):
                runtimes += _runtimes_of(_toml(drop_in))
        runtimes += _runtimes_of(main)
    except NvcError as err:
        return [fail("containerd", str(err), "correct that file: containerd would refuse it too")]
    if not runtimes and not own:
        theirs = [
            f"pid {d.pid} is dockerd's own, reading {d.flag('--config') or 'its defaults'}"
            for d in daemons
            if d.parent in dockerds
        ]
        return [
            skip(
                "containerd",
                f"no containerd of its own runs{' (' + '; '.join(theirs) + ')' if theirs else ''}; "
                f"{config_path} registers no nvc-py runtime (nvc-py setup containerd, for one "
                f"started later)",
            )
        ]
    if not runtimes:
        return [
            fail(
                "containerd",
                f"containerd (pid {own[0].pid}) reads {config_path}: no runtime of it or its "
                f"imports runs nvc-py-runtime",
                "nvc-py setup containerd, then restart containerd",
            )
        ]
    stale = _started_after(own[0] if own else None, "containerd", config_path)
    name, binary = runtimes[0]
    return [
        ok(
            "containerd",
            f"CRI runtime handler {name} (a RuntimeClass with handler: {name} for runtimeClassName; "
            f"ctr run --runc-binary {binary} …)",
        )
    ] + ([stale] if stale else [])


def _toml(path: str) -> Mapping[str, Any]:
    import tomlkit

    from nvc.system.untrusted import read_file

    raw, _ = read_file(path, _MAX_CONFIG)
    try:
        return tomlkit.parse(raw.decode("utf-8", "replace")).unwrap()
    except tomlkit.exceptions.TOMLKitError as err:
        raise InputError(f"{path}: not valid TOML ({err})") from None


def _runtimes_of(doc: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(CRI handler, its BinaryName) of each runtime of ``doc`` that runs nvc-py-runtime. The handler
    is no name ctr knows (``ctr run --runtime`` takes a shim's): ctr runs the binary itself."""
    from nvc.hook.setup.engines import CRI_PLUGIN_NAME

    cri = doc.get("plugins", {}).get(CRI_PLUGIN_NAME, {})
    runtimes = cri.get("containerd", {}).get("runtimes", {}) if isinstance(cri, dict) else {}
    return sorted(
        (name, entry["options"]["BinaryName"])
        for name, entry in runtimes.items()
        if isinstance(entry, dict)
        and isinstance(entry.get("options"), dict)
        and isinstance(entry["options"].get("BinaryName"), str)
        and is_ours(entry["options"]["BinaryName"])
    )


def cdi(fresh: Callable[[], Mapping[str, Any]], dirs: Sequence[str] | None = None) -> Check:
    """The CDI specs naming nvc-py's hook, where podman reads them (``dirs``: its cdi_spec_dirs by
    default): each lists today's devices (``fresh``: the spec ``cdi generate`` would write now)."""
    from nvc.cdi import specfiles
    from nvc.hook.setup import hooksdirs

    try:
        dirs = hooksdirs.cdi_dirs() if dirs is None else dirs
        paths = hooksdirs.spec_files(dirs)
    except NvcError as err:
        return fail("CDI", str(err), "fix that: podman would refuse it too")
    specs = specfiles.found(paths)
    if not specs:
        return skip(
            "CDI",
            f"no nvc-py CDI spec in {', '.join(dirs)} (podman --device nvidia.com/gpu=… needs "
            "`nvc-py cdi generate --output /etc/cdi/nvidia.yaml`)",
        )
    try:
        want = _devices(fresh())
    except NvcError as err:
        return fail("CDI", f"cannot tell whether {specs[0][0]} is current: {err}", "see the NVML check")
    stale = [path for path, doc in specs if _devices(doc) != want]
    if stale:
        return fail(
            "CDI",
            f"{', '.join(stale)} does not list today's devices ({', '.join(sorted(want)) or 'none'})",
            f"nvc-py cdi generate --output {stale[0]}",
        )
    return ok("CDI", f"{', '.join(p for p, _ in specs)} lists today's {len(want)} device names")


def _devices(doc: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """Device name -> its device node paths, for comparing two specs."""
    found = {}
    for device in doc.get("devices", []) if isinstance(doc.get("devices"), list) else []:
        if isinstance(device, dict) and isinstance(device.get("name"), str):
            edits = device.get("containerEdits") if isinstance(device.get("containerEdits"), dict) else {}
            nodes = edits.get("deviceNodes") if isinstance(edits.get("deviceNodes"), list) else []
            found[device["name"]] = tuple(sorted(str(n.get("path")) for n in nodes if isinstance(n, dict)))
    return found


# What the native front does where no server runs (native/client/server_start.c, hook/server/loop.py).
ON_DEMAND = (
    "a hook call as root in PID 1's namespaces starts one (it stops after 600 s without a call, "
    "0.5 s where a runtime adopted it); other calls run the hook themselves"
)


def server(config_path: str | None = None) -> Check:
    """The hook server: its socket answers, and the process serving runs the installed code; where none
    runs, what a hook call reading ``config_path`` does then (the no-server file beside it: no start)."""
    from nvc.hook.setup import engines
    from nvc.system.programs import DEFAULT_SOCKET, installed_program

    managed = os.path.isdir(engines.SYSTEMD_RUNNING)
    if not os.path.exists(DEFAULT_SOCKET):
        if managed:
            return fail(
                "hook server",
                f"no socket {DEFAULT_SOCKET}: the socket unit is not running",
                f"nvc-py setup server (or systemctl enable --now {engines.SOCKET_UNIT})",
            )
        no_server = os.path.join(os.path.dirname(config_path or _config_default()), engines.NO_SERVER_FILE)
        if os.path.exists(no_server):
            return skip(
                "hook server",
                f"not running; hook calls run the hook themselves and start none ({no_server}: setup's --no-server)",
            )
        return skip(
            "hook server",
            f"not running ({DEFAULT_SOCKET}); {ON_DEMAND}; nvc-py setup server (or {installed_program('nvc-py-hook')} "
            "start-server) starts one that stays",
        )
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    probe.settimeout(2)
    try:
        probe.connect(DEFAULT_SOCKET)
    except OSError as err:
        return fail(
            "hook server",
            f"{DEFAULT_SOCKET}: nobody answers ({err.strerror or err}): the server stopped",
            f"systemctl restart {engines.SOCKET_UNIT}" if managed else f"remove {DEFAULT_SOCKET}: {ON_DEMAND}",
        )
    finally:
        probe.close()
    installed = _installed_at()
    servers = [d.started for d in _servers()]
    older = [t for t in servers if t < installed]
    if older:
        return fail(
            "hook server",
            f"the server started {_when(min(older))}, before nvc-py was installed "
            f"({_when(installed)}): it serves the old code",
            f"systemctl restart {engines.SERVER_UNIT}" if managed else f"kill it: {ON_DEMAND}",
        )
    return ok("hook server", f"{DEFAULT_SOCKET} answers" + (" (installed code)" if servers else ""))


def _config_default() -> str:
    """The configuration file the hooks read where none is given: $NVC_PY_CONFIG, else the default."""
    from nvc import config

    return os.environ.get("NVC_PY_CONFIG") or config.DEFAULT_PATH


def _installed_at() -> float:
    """When this nvc-py was installed: its package's newest file."""
    import nvc

    package = os.path.dirname(nvc.__file__)
    return max(os.stat(os.path.join(package, name)).st_mtime for name in os.listdir(package) if name.endswith(".py"))


def _servers() -> list[Daemon]:
    """The hook server's processes: an interpreter running nvc-py-hook's program with ``serve``."""
    return processes(
        lambda argv: "serve" in argv and any(os.path.basename(a).startswith("nvc-py-hook") for a in argv[:3])
    )


def _when(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))

"""A running dockerd told to read daemon.json again, where no systemd restarts it (``setup docker
--restart``, the package's removal): SIGHUP, on which dockerd (20.10) reloads its runtimes and
default-runtime, but only from a file that has a ``runtimes`` member: a removal that took the member
(or the file) away writes it for the reload with ``"runtimes": {}``, then puts back what the removal
left. Whether the runtime came or went is read from the daemon itself (``docker info``); dockerd
looks for the ``--gpus`` hook only as it starts, so where that link came or went a line says how to
start it again (its own command line)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

from nvc.hook.setup.docker import DAEMON_JSON, GPUS_HOOK, RESTART, RUNTIME_NAME, RUNTIMES, Plan
from nvc.hook.setup.engines import SYSTEMD_RUNNING
from nvc.hook.setup.files import remove_files_and_dirs, write_files

RELOAD_WAIT = 5.0  # seconds for a signalled dockerd to show the reloaded runtimes


def reload_running(plan: Plan, name: str) -> list[str]:
    """SIGHUP to the running dockerds that read ``plan.config`` (their --config-file, else the
    default), after :func:`apply` made ``plan``; a line each on what they serve now, with what to do
    where that is not the file's; a line where none runs."""
    from nvc.hook.setup.processes import docker_host, running

    config = os.path.realpath(plan.config)
    daemons = [d for d in running("dockerd") if os.path.realpath(d.flag("--config-file") or DAEMON_JSON) == config]
    if not daemons:
        return [f"no running dockerd reads {plan.config}: dockerd reads it as it starts"]
    wanted = plan.after is not None and name in json.loads(plan.after).get(RUNTIMES, {})
    interim = _interim(plan)
    if interim is not None:
        write_files({plan.config: interim}, plan.mode)
    lines = []
    try:
        for daemon in daemons:
            again = f"stop it (kill {daemon.pid}) and start it again as before: {' '.join(daemon.argv)}"
            try:
                os.kill(daemon.pid, signal.SIGHUP)
            except OSError as err:
                lines.append(f"dockerd (pid {daemon.pid}): not signalled ({err.strerror}): {again}")
                continue
            lists = _wait_for(docker_host(daemon), name, wanted)
            state = f"{'serves' if wanted else 'dropped'} runtime {name}"
            if lists is None:
                lines.append(
                    f"dockerd (pid {daemon.pid}) told to reload {plan.config} (SIGHUP): it {state} once "
                    f"it did (no docker client here to ask)"
                )
            elif lists == wanted:
                lines.append(f"dockerd (pid {daemon.pid}) reloaded {plan.config} (SIGHUP): it {state}")
            else:
                lines.append(
                    f"dockerd (pid {daemon.pid}) did not reload {plan.config} (SIGHUP; its log says why): {again}"
                )
            if plan.link.after is not None and plan.link.after != plan.link.before:
                lines.append(
                    f"dockerd (pid {daemon.pid}) looks for {GPUS_HOOK} only as it starts: for `docker "
                    f"run --gpus`, {again}"
                )
            elif plan.link.after is None and plan.link.before is not None:
                lines.append(
                    f"dockerd (pid {daemon.pid}) found {GPUS_HOOK} as it started: `docker run --gpus` "
                    f"fails until it starts again; {again}"
                )
    finally:
        if interim is not None:
            if plan.after is None:
                remove_files_and_dirs([plan.config])
            else:
                write_files({plan.config: plan.after}, plan.mode)
    return lines


def _interim(plan: Plan) -> str | None:
    """What daemon.json holds while dockerd reloads it: None where that is ``plan.after`` as it is
    (it has a runtimes member, or nvc-py's runtime was never in the file), else the file with
    ``"runtimes": {}``, for dockerd to drop the runtimes it has."""
    before = json.loads(plan.before) if plan.before is not None else {}
    after = json.loads(plan.after) if plan.after is not None else {}
    if RUNTIMES in after or not before.get(RUNTIMES):
        return None
    return json.dumps({**after, RUNTIMES: {}}, indent=2) + "\n"


def _wait_for(host: str | None, name: str, wanted: bool) -> bool | None:
    """Whether dockerd (at ``host``) lists runtime ``name``, once it does as ``wanted`` or
    :data:`RELOAD_WAIT` passed; None where no docker client can ask it."""
    deadline = time.monotonic() + RELOAD_WAIT
    while True:
        try:
            done = subprocess.run(
                ["docker", *(["-H", host] if host else []), "info", "--format", "{{json .Runtimes}}"],
                capture_output=True,
                text=True,
                timeout=RELOAD_WAIT,
                stdin=subprocess.DEVNULL,
            )
            lists = name in json.loads(done.stdout or "{}") if done.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired, ValueError):
            return None
        if lists is None or lists == wanted or time.monotonic() > deadline:
            return lists
        time.sleep(0.1)


def restart(plan: Plan, systemctl: str, name: str = RUNTIME_NAME) -> list[str]:
    """``--restart``: dockerd restarted through systemd where systemd runs; elsewhere each running
    dockerd that reads ``plan``'s daemon.json reloads it (reload_running)."""
    if os.path.isdir(SYSTEMD_RUNNING):
        from nvc.hook.setup.engines import _systemctl

        _systemctl(systemctl, RESTART)
        return [f"restarted docker ({systemctl} {' '.join(RESTART)})"]
    return reload_running(plan, name)

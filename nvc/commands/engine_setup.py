"""``nvc-py setup``: register nvc-py with a container engine (podman, CRI-O, containerd, Docker)
and install its hook server's units; ``--remove`` undoes each.

Registered by :mod:`nvc.commands.cli`. The commands write host files through
:mod:`nvc.hook.setup.engines` and :mod:`nvc.hook.setup.docker`, imported when a command runs, so ``nvc-py``'s
start-up imports nothing of them.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import click

from nvc.errors import InputError, one_line

if TYPE_CHECKING:
    from collections.abc import Callable


def hook_config_file(path: str | None) -> str | None:
    """A ``--config`` that hooks will read: absolute (they run from another working directory) and
    a valid configuration file now (else every container start would fail on it)."""
    if path is None:
        return None
    if not os.path.isabs(path):
        raise InputError(f"{path}: --config must be an absolute path (the hooks read it from elsewhere)")
    from nvc import config

    config.load(path, must_exist=True)
    return os.path.normpath(path)


@click.group()
def setup() -> None:
    """Register nvc-py with a container engine."""


def _server_options(command: Callable[..., None]) -> Callable[..., None]:
    """The options every setup command shares for the hook server."""
    for option in reversed(
        (
            click.option(
                "--no-server",
                is_flag=True,
                help="No hook server: no systemd units, and no server started on demand by the hooks.",
            ),
            click.option(
                "--unit-dir",
                default=None,
                metavar="PATH",
                help="Write the systemd units here (default: /etc/systemd/system where systemd runs).",
            ),
            click.option("--systemctl", default="systemctl", hidden=True, help="The systemctl to run."),
        )
    ):
        command = option(command)
    return command


def _setup_server(no_server: bool, unit_dir: str | None, config_path: str | None, systemctl: str) -> None:
    """Served by default: socket-activated units where systemd runs, else the hooks' on-demand start
    (docs/hook-server.md); ``--no-server``: neither."""
    from nvc.hook.setup import engines

    lines = [] if no_server else engines.install_server(unit_dir, config_path, systemctl)
    changed = engines.set_server_start(config_path, not no_server)
    for line in (*lines, *([changed] if changed else [])):
        click.echo(line)


_REMOVE = click.option("--remove", is_flag=True, help="Remove what this command installs instead.")


def _echo_lines(lines: list[str]) -> None:
    """What a setup command did, a line each."""
    for line in lines:
        click.echo(line)


def _stop_mps_daemons() -> None:
    """``--remove``: the MPS daemons nvc-py started and no running container uses stopped, their
    directories removed (nvc.apply.mps); those of running containers named."""
    from nvc.apply import mps

    done, left = mps.stop_idle()
    _echo_lines(done + left)


_HOOKS_DIR = click.option(
    "--hooks-dir",
    default=None,
    metavar="PATH",
    help="Write the hooks.d files here instead of where the engine reads them (its hooks_dir, "
    "resolved through its configuration files; a warning says when it will not read PATH).",
)


def _hooks_command(engine_name: str, short: str, summary: str) -> None:
    """``setup podman`` and ``setup crio``: the hooks.d files where the engine reads them (its
    hooks_dir through its configuration files, nvc.hook.setup.hooksdirs), and the hook server."""

    @setup.command(
        engine_name,
        short_help=short,
        help=f"{summary}, and the hook server (--remove: the hooks.d files only; "
        "`setup server --remove` removes the server).",
    )
    @_HOOKS_DIR
    @click.option(
        "--config",
        "config_path",
        metavar="PATH",
        default=None,
        help="Configuration file the hook reads (absolute; default: /etc/nvc-py/config.yaml).",
    )
    @_server_options
    @_REMOVE
    def command(
        hooks_dir: str | None,
        config_path: str | None,
        no_server: bool,
        unit_dir: str | None,
        systemctl: str,
        remove: bool,
    ) -> None:
        from nvc.hook.setup import engines, hooksdirs

        engine = hooksdirs.CRIO if engine_name == "crio" else hooksdirs.PODMAN
        if remove:
            _echo_lines(engines.remove_hooks(engine, hooks_dir))
            _stop_mps_daemons()
            return
        config_path = hook_config_file(config_path)
        done, warnings = engines.install_hooks(engine, hooks_dir, config_path)
        _echo_lines(done)
        _setup_server(no_server, unit_dir, config_path, systemctl)
        for line in warnings:  # once all is done: a failure is its one line alone
            click.echo(f"warning: {one_line(line)}", err=True)


_hooks_command(
    "podman",
    "Hooks where podman reads them, and the hook server.",
    "Install the hooks.d files that run nvc-py-hook at prestart and poststop where podman "
    "reads them (containers.conf's engine.hooks_dir; default /usr/share/containers/oci/hooks.d)",
)
_hooks_command(
    "crio",
    "Hooks where CRI-O reads them, and the hook server.",
    "Install the hooks.d files that run nvc-py-hook at prestart and poststop where CRI-O reads "
    "them (crio.conf's crio.runtime.hooks_dir, drop-ins in /etc/crio/crio.conf.d; default "
    "/usr/share/containers/oci/hooks.d)",
)


def _stop_started_server() -> None:
    """Where systemd does not run, the server of the registered hooks' socket (the default: setup's,
    or one a hook call started) stopped: none is left serving the removed setup."""
    from nvc.hook.setup import engines, maintainer
    from nvc.system.programs import DEFAULT_SOCKET

    if os.path.isdir(engines.SYSTEMD_RUNNING):
        return
    done, failed = maintainer.stop_servers(DEFAULT_SOCKET)
    _echo_lines(done)
    if failed:
        raise InputError("; ".join(failed))


@setup.command("server", short_help="The hook server's systemd socket and service units.")
@click.option(
    "--unit-dir", metavar="PATH", default="/etc/systemd/system", show_default=True, help="systemd unit directory."
)
@click.option(
    "--config",
    "config_path",
    metavar="PATH",
    default=None,
    help="Configuration file the hook reads (absolute; default: /etc/nvc-py/config.yaml).",
)
@click.option("--systemctl", default="systemctl", hidden=True, help="The systemctl to run.")
@_REMOVE
def setup_server(unit_dir: str, config_path: str | None, systemctl: str, remove: bool) -> None:
    """Install the systemd socket and service units of `nvc-py-hook serve` (enabled where systemd runs;
    elsewhere a server that stays is started now; --remove: stopped, disabled and removed, with the
    no-server file beside the configuration)."""
    from nvc.hook.setup import engines

    if remove:
        _echo_lines(engines.remove_server(unit_dir, config_path, systemctl))
        _stop_started_server()
        _stop_mps_daemons()
        return
    _setup_server(False, unit_dir, hook_config_file(config_path), systemctl)


@setup.command("containerd", short_help="Runtime nvc-py for containerd, and the hook server.")
@click.option(
    "--config",
    "config_path",
    metavar="PATH",
    default="/etc/containerd/config.toml",
    show_default=True,
    help="containerd's main configuration (version 2); only its imports list is changed.",
)
@click.option(
    "--drop-in",
    metavar="PATH",
    default="/etc/containerd/conf.d/99-nvc-py.toml",
    show_default=True,
    help="The drop-in file registering the runtime.",
)
@click.option("--runtime-name", metavar="NAME", default="nvc-py", show_default=True, help="Name of the CRI runtime.")
@click.option("--set-as-default", is_flag=True, help="Make it the CRI plugin's default runtime.")
@click.option("--dry-run", is_flag=True, help="Print the files instead of writing them.")
@_server_options
@_REMOVE
def setup_containerd(
    config_path: str,
    drop_in: str,
    runtime_name: str,
    set_as_default: bool,
    dry_run: bool,
    no_server: bool,
    unit_dir: str | None,
    systemctl: str,
    remove: bool,
) -> None:
    """Register nvc-py-runtime as a containerd runtime (runc v2 shim with BinaryName), and the hook server
    (--remove: the drop-in and its imports entry; `setup server --remove` removes the server)."""
    from nvc.hook.setup import engines

    if remove:
        _echo_lines(engines.remove_containerd(config_path, drop_in))
        _stop_mps_daemons()
        return
    texts = engines.install_containerd(config_path, drop_in, runtime_name, set_as_default, dry_run)
    for path, text in texts.items():
        click.echo(f"# {path}\n{text}" if dry_run else f"wrote {path}")
    if not dry_run:  # the runtime's hooks read the default configuration file (or $NVC_PY_CONFIG)
        _setup_server(no_server, unit_dir, os.environ.get("NVC_PY_CONFIG") or None, systemctl)


@setup.command("docker", short_help="Docker's runtime nvc-py and --gpus hook, and the hook server.")
@click.option(
    "--config",
    "config_path",
    metavar="PATH",
    default="/etc/docker/daemon.json",
    show_default=True,
    help="dockerd's daemon.json; only the runtime (and default-runtime) keys are changed.",
)
@click.option(
    "--runtime-name",
    metavar="NAME",
    default="nvc-py",
    show_default=True,
    help="Name of the runtime (docker run --runtime).",
)
@click.option("--set-as-default", is_flag=True, help="Make it dockerd's default-runtime.")
@click.option(
    "--gpus-hook/--no-gpus-hook",
    default=None,
    help="Link nvidia-container-runtime-hook, what docker run --gpus runs, to nvc-py-hook "
    "(--no-gpus-hook: remove nvc-py's link).  [default: where no such file is, or it is nvc-py's]",
)
@click.option(
    "--gpus-hook-dir",
    default="/usr/bin",
    show_default=True,
    metavar="PATH",
    help="Where that link goes (a directory on dockerd's PATH).",
)
@click.option(
    "--restart",
    "restart_docker",
    is_flag=True,
    help="Restart dockerd afterwards (systemctl restart docker where systemd runs; elsewhere a running "
    "dockerd reloads daemon.json's runtimes: SIGHUP).",
)
@click.option("--dry-run", is_flag=True, help="Print the changes instead of making them.")
@_server_options
@_REMOVE
def setup_docker(
    config_path: str,
    runtime_name: str,
    set_as_default: bool,
    gpus_hook: bool | None,
    gpus_hook_dir: str,
    restart_docker: bool,
    dry_run: bool,
    no_server: bool,
    unit_dir: str | None,
    systemctl: str,
    remove: bool,
) -> None:
    """Register nvc-py-runtime as Docker runtime `nvc-py` in daemon.json, link nvidia-container-runtime-hook
    (what `docker run --gpus` runs) to nvc-py-hook, and the hook server as `setup podman` (--remove: the
    runtime and the link where they are nvc-py's; daemon.json as it was). dockerd reads both when it starts.

    \b
    Then:  docker run --gpus all IMAGE nvidia-smi -L          (also --gpus 2, --gpus '"device=0,1"')
           docker run --runtime nvc-py -e NVIDIA_VISIBLE_DEVICES=0 IMAGE nvidia-smi -L
    CDI names (docker run --device nvidia.com/gpu=0, from `nvc-py cdi generate`) need Docker 25 or
    later; Debian 12's docker.io is 20.10.
    """
    from nvc.hook.setup import docker, dockerd

    plan = (
        docker.plan_remove(config_path, runtime_name, gpus_hook_dir)
        if remove
        else docker.plan_install(config_path, runtime_name, set_as_default, gpus_hook, gpus_hook_dir)
    )
    if dry_run:
        _echo_lines(docker.preview(plan))
        return
    _echo_lines(docker.apply(plan))
    if remove:
        _stop_mps_daemons()
    else:  # the runtime's and --gpus's hooks read the default configuration file (or $NVC_PY_CONFIG)
        _setup_server(no_server, unit_dir, os.environ.get("NVC_PY_CONFIG") or None, systemctl)
    _echo_lines(dockerd.restart(plan, systemctl, runtime_name) if restart_docker else docker.restart_lines(plan))

"""The ``nvc-py`` command line.

The CLI parses and plans; privileged work happens in forked helpers (``nvc.rpc``).
Every :class:`~nvc.errors.NvcError` becomes one line on stderr and its stable exit code.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import click

from nvc import __version__
from nvc.commands import queries
from nvc.commands.lazygroup import LazyGroup
from nvc.config.options import GlobalOptions, resolve_options
from nvc.containerenv import MIG_FILE_VALUES
from nvc.errors import InputError, NvcError

if TYPE_CHECKING:
    from collections.abc import Callable

# Global options that take a separate value, and the one whose value is optional
# (getopt's ``--user[=UID[:GID]]``: a value only when attached with '=').
_GLOBAL_VALUE_OPTIONS = ("-r", "--root", "-l", "--ldcache", "-d", "--debug")
_OPTIONAL_VALUE_OPTIONS = ("-u", "--user")


def _optional_user_value(argv: list[str]) -> list[str]:
    """Rewrite a bare global ``-u``/``--user`` to ``--user=`` so the next word stays the command."""
    out = list(argv)
    i = 0
    while i < len(out) and out[i].startswith("-"):
        if out[i] in _OPTIONAL_VALUE_OPTIONS:
            out[i] = "--user="
        elif out[i] in _GLOBAL_VALUE_OPTIONS:
            i += 1
        i += 1
    return out


@click.group(
    cls=LazyGroup,
    lazy={  # their own modules, imported when named (nvc.commands.lazygroup)
        "doctor": "nvc.doctor.command:doctor",
        "exporter": "nvc.exporter.command:exporter",
        "k8s": "nvc.k8s.command:k8s",
        "setup": "nvc.commands.engine_setup:setup",
        "share": "nvc.commands.sharecli:share",
    },
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(__version__, "-V", "--version", prog_name="nvc-py", message="%(prog)s %(version)s")
@click.option(
    "-r",
    "--root",
    metavar="PATH",
    default=None,
    help="Driver root: where driver files and nodes are.  [default: the configuration's root, /]",
)
@click.option(
    "-l",
    "--ldcache",
    metavar="PATH",
    default=None,
    help="ld cache, inside the root.  [default: the configuration's ldcache, /etc/ld.so.cache]",
)
@click.option(
    "-u",
    "--user",
    metavar="[=UID[:GID]]",
    default=None,
    help="Identity of the driver helper.  [default: the configuration's user]",
)
@click.option("-d", "--debug", metavar="PATH", default=None, help="Append a debug log to PATH.")
@click.option("-k", "--load-kmods", is_flag=True, help="Create missing driver device nodes under <root>/dev.")
@click.pass_context
def cli(
    ctx: click.Context, root: str | None, ldcache: str | None, user: str | None, debug: str | None, load_kmods: bool
) -> None:
    """Make NVIDIA GPUs appear inside containers."""
    if debug is not None:
        from nvc import debuglog

        debuglog.enable(debug)
    ctx.obj = _Given(root, ldcache, user, load_kmods)


class _Given:
    """The global options as given; the driver commands resolve them (:func:`_pass_options`), so the
    configuration file is read only by commands that use it, after their own ``--help``."""

    def __init__(self, root: str | None, ldcache: str | None, user: str | None, load_kmods: bool) -> None:
        self.root, self.ldcache, self.user, self.load_kmods = root, ldcache, user, load_kmods

    def resolve(self) -> GlobalOptions:
        """The options, the configuration's standing in for those not given (:func:`resolve_options`)."""
        return resolve_options(self.root, self.ldcache, self.user, self.load_kmods)


def _pass_options(command: Callable[..., None]) -> Callable[..., None]:
    """Pass the resolved global options as the command's first argument, after ``--load-kmods``
    made the missing nodes (``configure`` plans that instead: :func:`_pass_planned_options`)."""

    def load_now(opts: GlobalOptions) -> None:
        if opts.load_kmods:
            queries.load_nodes(opts.root)

    return _with_options(command, load_now)


def _pass_planned_options(command: Callable[..., None]) -> Callable[..., None]:
    """As :func:`_pass_options` for a command whose plan makes the nodes (``--dry-run`` shows them)."""
    return _with_options(command, lambda opts: None)


def _with_options(command: Callable[..., None], before: Callable[[GlobalOptions], None]) -> Callable[..., None]:
    import functools

    @functools.wraps(command)
    def with_options(*args: object, **kwargs: object) -> None:
        opts = click.get_current_context().find_object(_Given).resolve()
        with queries.driver_required():
            before(opts)
            command(opts, *args, **kwargs)

    return with_options


@cli.command(short_help="Print the driver version and every GPU and MIG device.")
@click.option("--csv", "fmt", flag_value="csv", help="Comma-separated output.")
@click.option("--json", "fmt", flag_value="json", help="JSON output.")
@_pass_options
def info(opts: GlobalOptions, fmt: str | None) -> None:
    """Print the driver version and every GPU and MIG device (queries NVML)."""
    click.echo(queries.info_text(opts, fmt), nl=False)


@cli.command("list", short_help="Print the host files a container would get.")
@click.option("-d", "--device", "devices", multiple=True, metavar="ID", help="GPUs/MIG devices to list (§ --device).")
@click.option("-l", "--libraries", is_flag=True, help="List driver libraries.")
@click.option("-b", "--binaries", is_flag=True, help="List driver binaries.")
@click.option("-i", "--ipcs", is_flag=True, help="List IPC sockets and the MPS pipe directory.")
@click.option("-f", "--firmwares", is_flag=True, help="List GSP firmware files.")
@click.option("--compat32", is_flag=True, help="Also list 32-bit libraries (with -l).")
@click.option("--mig-config", type=click.Choice(MIG_FILE_VALUES), help="List MIG configuration capability files.")
@click.option("--mig-monitor", type=click.Choice(MIG_FILE_VALUES), help="List MIG monitoring capability files.")
@click.option("--imex-channel", "imex", multiple=True, metavar="N[,N…]", help="List IMEX channel nodes.")
@click.option("--no-persistenced", is_flag=True, help="Leave out the persistenced socket.")
@click.option("--no-fabricmanager", is_flag=True, help="Leave out the fabric manager socket.")
@click.option("--no-gsp-firmware", is_flag=True, help="Leave out GSP firmware.")
@click.option("--json", "as_json", is_flag=True, help="JSON output, one list per section.")
@click.option(
    "--nvml",
    "force_nvml",
    is_flag=True,
    help="Ask NVML even where /proc suffices (both sources must agree; bench/discovery.py times both).",
)
@_pass_options
def list_(
    opts: GlobalOptions,
    devices: tuple[str, ...],
    libraries: bool,
    binaries: bool,
    ipcs: bool,
    firmwares: bool,
    compat32: bool,
    mig_config: str | None,
    mig_monitor: str | None,
    imex: tuple[str, ...],
    no_persistenced: bool,
    no_fabricmanager: bool,
    no_gsp_firmware: bool,
    as_json: bool,
    force_nvml: bool,
) -> None:
    """Print the host paths a container would get (with no selection flags: -d all --compat32 -l -b -i -f)."""
    request, devices = queries.list_request(
        devices,
        libraries,
        binaries,
        ipcs,
        firmwares,
        compat32,
        mig_config,
        mig_monitor,
        imex,
        no_persistenced,
        no_fabricmanager,
        no_gsp_firmware,
    )
    result = queries.run_list(opts, request, devices, use_nvml=True if force_nvml else None)
    click.echo(result.json() if as_json else result.text(), nl=False)


@cli.command(short_help="Make GPUs usable in a container (the hook's work, by hand).")
@click.option(
    "-p", "--pid", type=int, metavar="PID", default=None, help="Container process (supervised mode; else standalone)."
)
@click.option(
    "-d", "--device", "devices", multiple=True, metavar="ID", help="GPUs/MIG devices (all, none, 0,1, UUIDs…)."
)
@click.option("-r", "--require", "requirements", multiple=True, metavar="EXPR", help="Requirement, e.g. cuda>=12.0.")
@click.option(
    "-l",
    "--ldconfig",
    metavar="[@]PATH",
    default="@/sbin/ldconfig",
    show_default=True,
    help="ldconfig to run: @HOSTPATH (host binary, from a memfd copy) or a path in the container.",
)
@click.option("-c", "--compute", is_flag=True, help="Compute (CUDA, OpenCL) libraries and binaries.")
@click.option("-u", "--utility", is_flag=True, help="NVML and nvidia-smi.")
@click.option("-v", "--video", is_flag=True, help="Video codec libraries (with the compute ones).")
@click.option("-g", "--graphics", is_flag=True, help="OpenGL/Vulkan libraries.")
@click.option("-D", "--display", is_flag=True, help="Graphics libraries and the modeset node.")
@click.option("-n", "--ngx", is_flag=True, help="NGX library.")
@click.option("--compat32", is_flag=True, help="32-bit libraries of the chosen capabilities.")
@click.option("--no-cgroups", is_flag=True, help="Leave the device cgroup alone.")
@click.option("--no-devbind", is_flag=True, help="Do not bind-mount device nodes.")
@click.option("--mig-config", type=click.Choice(MIG_FILE_VALUES), default=None, help="MIG configuration capability.")
@click.option("--mig-monitor", type=click.Choice(MIG_FILE_VALUES), default=None, help="MIG monitoring capability.")
@click.option("--imex-channel", "imex", multiple=True, metavar="N[,N…]", help="IMEX channel nodes.")
@click.option(
    "--cuda-compat-mode",
    type=click.Choice(["disabled", "mount", "ldconfig"]),
    default="ldconfig",
    show_default=True,
    help="CUDA forward-compat libraries of the image.",
)
@click.option("--dry-run", is_flag=True, help="Print the plan; change nothing.")
@click.argument("rootfs")
@_pass_planned_options
def configure(
    opts: GlobalOptions,
    pid: int | None,
    devices: tuple[str, ...],
    requirements: tuple[str, ...],
    ldconfig: str,
    compute: bool,
    utility: bool,
    video: bool,
    graphics: bool,
    display: bool,
    ngx: bool,
    compat32: bool,
    no_cgroups: bool,
    no_devbind: bool,
    mig_config: str | None,
    mig_monitor: str | None,
    imex: tuple[str, ...],
    cuda_compat_mode: str,
    dry_run: bool,
    rootfs: str,
) -> None:
    """Make the selected GPUs usable in the container whose rootfs is ROOTFS (absolute, not /)."""
    from nvc.pipeline.configure import configure as run
    from nvc.plan.request import from_flags

    flags = {
        "compute": compute,
        "utility": utility,
        "video": video,
        "graphics": graphics,
        "display": display,
        "ngx": ngx,
        "compat32": compat32,
    }
    request = from_flags(
        rootfs=rootfs,
        pid=pid,
        devices=devices,
        capabilities=(name for name, on in flags.items() if on),
        requirements=requirements,
        ldconfig=ldconfig,
        no_cgroups=no_cgroups,
        no_devbind=no_devbind,
        mig_config=mig_config,
        mig_monitor=mig_monitor,
        imex_channels=imex,
        cuda_compat_mode=cuda_compat_mode,
    )
    plan = run(opts, request, dry_run=dry_run)
    if dry_run:
        click.echo(plan.text(), nl=False)


@cli.command(
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
    short_help="The OCI hook, as nvc-py-hook: prestart, poststart, poststop.",
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def hook(args: tuple[str, ...]) -> None:
    """The OCI hook (same as nvc-py-hook): prestart|poststart|poststop, OCI state on stdin."""
    from nvc.hook.oci import prestart

    click.get_current_context().exit(prestart.main(list(args)))  # its status, once main's stdout is flushed


@cli.group("config", short_help="Show the effective configuration file.")
def config_group() -> None:
    """The configuration file (/etc/nvc-py/config.yaml, or $NVC_PY_CONFIG)."""


@config_group.command("show")
@click.option("--file", "path", metavar="PATH", default=None, help="Read PATH instead of the default file.")
def config_show(path: str | None) -> None:
    """Print the effective configuration, defaults included."""
    from nvc import config

    click.echo(config.show(config.load(path, must_exist=path is not None)), nl=False)


@cli.group()
def cdi() -> None:
    """Container Device Interface specs."""


@cdi.command("generate")
@click.option("--output", metavar="PATH", default=None, help="Write the spec to PATH (default: stdout).")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["yaml", "json"]),
    default=None,
    help="Output format (default: from the --output suffix, else yaml).",
)
@click.option(
    "--device-name-strategy",
    "strategy",
    type=click.Choice(["index", "uuid"]),
    default="index",
    show_default=True,
    help="Name devices 0, 1, 1:0 or by their UUIDs.",
)
@click.option(
    "--config",
    "config_path",
    metavar="PATH",
    default=None,
    help="Configuration file the spec's hooks read (default: /etc/nvc-py/config.yaml).",
)
@_pass_options
def cdi_generate(
    opts: GlobalOptions, output: str | None, fmt: str | None, strategy: str, config_path: str | None
) -> None:
    """Generate the nvidia.com/gpu CDI spec of this host's GPUs."""
    from nvc import cdi as cdi_spec
    from nvc.commands import engine_setup
    from nvc.hook.setup import files as setupfiles
    from nvc.system import programs

    if fmt is None:
        fmt = "json" if output is not None and output.endswith(".json") else "yaml"
    config_path = engine_setup.hook_config_file(config_path)
    spec = cdi_spec.generate(
        opts.root,
        opts.ldcache,
        opts.user,
        strategy,
        programs.installed_program(programs.HOOK_SCRIPT),
        programs.hook_env(config_path),
    )
    text = cdi_spec.render(spec, fmt)
    _char_links([spec])
    if output is None:
        click.echo(text, nl=False)
        return
    setupfiles.write_files({output: text})
    click.echo(f"wrote {output}")


@cdi.command("refresh", short_help="Regenerate nvc-py's CDI specs for today's driver (after an upgrade).")
@click.option(
    "--spec-dir",
    "spec_dirs",
    metavar="PATH",
    multiple=True,
    help="A directory of CDI specs (repeatable; default: where podman reads them, /etc/cdi and /var/run/cdi).",
)
@_pass_options
def cdi_refresh(opts: GlobalOptions, spec_dirs: tuple[str, ...]) -> None:
    """Regenerate the CDI specs nvc-py wrote (after a driver upgrade: they name its files), each as it
    was generated (device names, hook configuration, format); a spec that is today's is left as it is."""
    from nvc import cdi as cdi_spec
    from nvc.cdi import specfiles
    from nvc.hook.setup import files as setupfiles
    from nvc.hook.setup import hooksdirs
    from nvc.system import programs

    dirs = spec_dirs or hooksdirs.cdi_dirs()
    specs = specfiles.found(hooksdirs.spec_files(dirs))
    if not specs:
        click.echo(f"no nvc-py CDI spec in {', '.join(dirs)}")
        return

    def generate(strategy: str, hook_env: list[str]) -> dict:
        hook = programs.installed_program(programs.HOOK_SCRIPT)
        return cdi_spec.generate(opts.root, opts.ldcache, opts.user, strategy, hook, hook_env)

    done = specfiles.refresh(specs, generate)
    setupfiles.write_files(done.changed)
    for path in sorted([*done.changed, *done.unchanged]):
        click.echo(f"refreshed {path}" if path in done.changed else f"{path}: today's already")
    _char_links([specfiles.read(path) for path in sorted([*done.changed, *done.unchanged])])


def _char_links(specs: list[Any]) -> None:
    """The /dev/char links of the specs' nodes, without which an engine's runc does not tell systemd
    of them and a daemon-reload takes the GPUs away (:func:`nvc.cdi.devnodes.char_links`); made at
    each refresh too, as /dev is new at each boot (the package's timer refreshes at boot)."""
    from nvc.cdi import devnodes

    for problem in devnodes.char_links([n for doc in specs if isinstance(doc, dict) for n in devnodes.spec_nodes(doc)]):
        click.echo(f"warning: {problem}: GPU access of CDI containers lost on systemctl daemon-reload", err=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point (the console script's and a hook server worker's): the CLI with its streams guarded
    (:mod:`nvc.system.stdio`: a closed or full stdout is one line and OutputError's status)."""
    from nvc.system import stdio

    return stdio.guarded("nvc-py", lambda: _run(sys.argv[1:] if argv is None else argv))


def _run(argv: list[str]) -> int:
    """Run the CLI; nvc-py's errors and click's usage errors become one line and an exit code."""
    try:  # ctx.exit(N) (``hook``, doctor's 1 when a check failed) is returned, not raised
        code = cli.main(args=_optional_user_value(argv), prog_name="nvc-py", standalone_mode=False)
    except NvcError as err:
        click.echo(f"nvc-py: {err}", err=True)
        return err.exit_code
    except click.ClickException as err:  # usage: one line too, naming where to read more
        ctx = getattr(err, "ctx", None)
        hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        usage = InputError(err.format_message().rstrip(".") + hint)
        click.echo(f"nvc-py: {usage}", err=True)
        return usage.exit_code
    except click.exceptions.Abort:
        click.echo("nvc-py: aborted", err=True)
        return 1
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())

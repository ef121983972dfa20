"""`nvc-py share`: GPU sharing's commands (`status`, `top`, `set`), registered on the command line by
:mod:`nvc.commands.cli`; what they show and do is :mod:`nvc.commands.sharestatus`, :mod:`nvc.commands.sharetop`
and :mod:`nvc.commands.shareset`."""

from __future__ import annotations

import sys

import click


@click.group(short_help="GPU sharing: each container's limits and usage.")
def share() -> None:
    """GPU sharing (memory budget and compute share per container, enforced by libnvc-share)."""


_state_dir = click.option(
    "--state-dir",
    default="/run/nvc-py/share",
    show_default=True,
    metavar="PATH",
    help="Where the hook keeps the per-container sharing directories.",
)


@share.command("status", short_help="Per container: limits, memory, compute share and throttling.")
@click.option("--json", "as_json", is_flag=True, help="JSON output.")
@_state_dir
def share_status(as_json: bool, state_dir: str) -> None:
    """Per container: limits, memory used per process, compute share and throttling."""
    from nvc.apply import mps
    from nvc.commands import sharestatus
    from nvc.system.untrusted import directory_or_missing

    directory_or_missing(state_dir)  # missing: no container shares a GPU
    containers, daemons = sharestatus.status(state_dir), mps.status()
    click.echo(sharestatus.as_json(containers, daemons) if as_json else sharestatus.text(containers, daemons), nl=False)


@share.command("top", short_help="Every shared GPU live: memory, compute, latency class, backend, throttling.")
@click.option("--once", is_flag=True, help="Print one frame as plain text (for scripts) and exit.")
@click.option(
    "--interval",
    default=2.0,
    show_default=True,
    type=click.FloatRange(0.1, 3600),
    metavar="SECONDS",
    help="Seconds between refreshes; with --once, the time compute is measured over.",
)
@_state_dir
def share_top(once: bool, interval: float, state_dir: str) -> None:
    """Per shared GPU and container: memory used and its limit, compute used over the last interval
    against its cap or weight, latency class, backend and throttled time, refreshed in place (q quits)."""
    from nvc.commands import sharestatus, sharetop
    from nvc.system.untrusted import directory_or_missing

    directory_or_missing(state_dir)  # missing: no container shares a GPU

    def read() -> list[sharestatus.ContainerShare]:
        return sharestatus.status(state_dir)

    if once or not sys.stdout.isatty():
        click.echo(sharetop.once(read, interval), nl=False)
    else:
        sharetop.live(read, interval)


@share.command("set", short_help="Change a running container's share, without restarting it.")
@click.argument("container")
@click.option(
    "--gpu",
    default="",
    metavar="UUID",
    help="The GPU (UUID, or index as the container numbers them); default: every GPU.",
)
@click.option("--memory", metavar="SIZE", help="Memory limit (bytes, or K/M/G/T with an optional i).")
@click.option("--compute", metavar="PERCENT", help="Compute cap, 1-100 (100: none).")
@click.option("--weight", metavar="N", help="Weight among the containers sharing the GPU, 1-1000.")
@click.option("--priority", metavar="CLASS", help="Latency class: latency-critical or batch.")
@_state_dir
def share_set(
    container: str,
    gpu: str,
    memory: str | None,
    compute: str | None,
    weight: str | None,
    priority: str | None,
    state_dir: str,
) -> None:
    """Change CONTAINER's GPU share while it runs: its processes take the new limits within a second.
    Lowering memory below what it holds refuses new allocations only; under MPS the compute share and
    latency class apply to processes started afterwards. Root only; a pod's container stays within its
    pod's grant."""
    from nvc.commands import shareset
    from nvc.containerenv import sharing
    from nvc.errors import InputError
    from nvc.plan.share import Change

    if gpu and not sharing.SCOPE.fullmatch(f"_{gpu}"):
        raise InputError(f"--gpu {gpu!r}: not a GPU or MIG UUID, nor an index")
    if memory is compute is weight is priority is None:
        raise InputError("share set: nothing to change (--memory, --compute, --weight or --priority)")
    wanted = Change(
        gpu=gpu,
        memory=None if memory is None else sharing.parse_size("--memory", memory),
        compute=None if compute is None else sharing.parse_percent("--compute", compute, False),
        weight=None if weight is None else sharing.parse_weight("--weight", weight),
        priority=None if priority is None else sharing.parse_choice("--priority", priority, sharing.PRIORITY_CLASSES),
    )
    for line in shareset.change(container, wanted, state_dir):
        click.echo(line)

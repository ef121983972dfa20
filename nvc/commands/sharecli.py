"""`nvc-py share`: GPU sharing's commands (`status`, `top`), registered on the command line by
:mod:`nvc.commands.cli`; what they show is :mod:`nvc.commands.sharestatus` and :mod:`nvc.commands.sharetop`."""

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

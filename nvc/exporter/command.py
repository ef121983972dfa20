"""The ``nvc-py exporter`` command (registered by nvc/commands/cli.py). Imports nothing heavy:
prometheus_client and the exporter's modules load when it runs, after its options are read."""

from __future__ import annotations

import click


@click.command("exporter", short_help="Serve Prometheus metrics of GPU sharing, the hook and the plugin.")
@click.option(
    "--listen",
    metavar="ADDR:PORT|unix:PATH",
    default="127.0.0.1:9402",
    show_default=True,
    help="Where Prometheus scrapes ([ADDR]:PORT for IPv6; unix:PATH for a socket of root and its group).",
)
@click.option(
    "--state-dir",
    metavar="PATH",
    default="/run/nvc-py/share",
    show_default=True,
    help="Where the hook keeps the per-container sharing directories.",
)
@click.option(
    "--hook-log", metavar="PATH", default=None, help="The hook's log [default: the configuration's log.file]."
)
@click.option(
    "--hook-socket",
    metavar="PATH",
    default=None,
    help="The hook server's socket [default: $NVC_PY_HOOK_SOCKET, else /run/nvc-py/hook.sock].",
)
@click.option(
    "--device-plugin-file",
    metavar="PATH",
    default=None,
    help="The device plugin's health file [default: /run/nvc-py/device-plugin.json].",
)
@click.option(
    "--nvml-interval",
    metavar="SECONDS",
    type=click.FloatRange(min=0),
    default=10.0,
    show_default=True,
    help="Least time between two reads of GPU memory from NVML (scrapes in between get the last one).",
)
@click.option("--no-nvml", is_flag=True, help="Do not read GPU memory (no NVML helper).")
@click.option(
    "--web-config-file",
    metavar="PATH",
    default=None,
    help="TLS and basic authentication, in the Prometheus exporter-toolkit's web configuration format.",
)
@click.pass_context
def exporter(
    ctx: click.Context,
    listen: str,
    state_dir: str,
    hook_log: str | None,
    hook_socket: str | None,
    device_plugin_file: str | None,
    nvml_interval: float,
    no_nvml: bool,
    web_config_file: str | None,
) -> None:
    """Serve Prometheus metrics until SIGTERM: GPU memory (NVML), every sharing container's limits,
    memory, compute share and throttling, the hook's starts by outcome and their durations (its log),
    the hook server and the device plugin (docs/metrics.md), over TLS and with basic authentication
    where --web-config-file asks for them. The global --root and --user choose the
    driver root and the NVML helper's identity, as for `info`."""
    import os

    from nvc import config
    from nvc.exporter import serve, webconfig
    from nvc.system.untrusted import directory_or_missing

    where = serve.parse_listen(listen)
    web = webconfig.load(web_config_file) if web_config_file else webconfig.WebConfig()
    tls = webconfig.tls_context(web.tls) if web.tls else None
    directory_or_missing(state_dir, "--state-dir")  # missing: no container shares a GPU yet
    given = ctx.find_root().obj  # the global options (nvc.commands.cli._Given)
    from nvc.exporter.collector import Collector, Sources
    from nvc.exporter.nvml import GpuMemoryCache
    from nvc.k8s import published
    from nvc.system.programs import DEFAULT_SOCKET, SOCKET_ENV

    sources = Sources(
        state_dir,
        hook_log or config.load().log_file,
        hook_socket or os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET,
        device_plugin_file or published.FILE,
    )
    gpus = None if no_nvml else GpuMemoryCache(given.resolve(), nvml_interval)
    collector = Collector(sources, gpus)
    try:
        collector.collect()  # the NVML helper forked now, before anything else runs; the log read from its start
        ctx.exit(serve.serve(where, collector, web, tls))
    finally:
        if gpus is not None:
            gpus.close()

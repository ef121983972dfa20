"""The ``nvc-py k8s`` command group (registered by nvc/commands/cli.py). Imports nothing heavy: the plugin's
modules, with grpcio and protobuf, load when ``device-plugin`` runs, after its options are read."""

from __future__ import annotations

import click

_LOG_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}


@click.group("k8s", short_help="Kubernetes: the kubelet device plugin.")
def k8s() -> None:
    """Kubernetes: the kubelet device plugin (docs/kubernetes.md)."""


@k8s.command("device-plugin", short_help="Run the kubelet device plugin until SIGTERM.")
@click.option("--config", "config_path", metavar="PATH", default=None,
              help="Configuration file whose k8s: section (and root, user) the plugin reads "
                   "[default: $NVC_PY_CONFIG, else /etc/nvc-py/config.yaml].")
@click.option("--device-plugin-dir", metavar="PATH", default=None,
              help="The kubelet's device plugin directory, where kubelet.sock is and the plugin's sockets go "
                   "[default: the configuration's k8s.device-plugin-dir, /var/lib/kubelet/device-plugins].")
@click.option("--health-file", metavar="PATH", default=None,
              help="Where each resource's healthy and unhealthy device count goes, for `nvc-py exporter` "
                   "[default: /run/nvc-py/device-plugin.json].")
@click.option("--log-level", type=click.Choice(tuple(_LOG_LEVELS)), default="info", show_default=True,
              help="Least severity of the lines logged to stderr.")
@click.pass_context
def device_plugin(ctx: click.Context, config_path: str | None, device_plugin_dir: str | None, health_file: str | None,
                  log_level: str) -> None:
    """Run the kubelet device plugin until SIGTERM: nvidia.com/gpu (whole GPUs by UUID),
    nvidia.com/mig-<profile> (MIG devices) and nvc-py.io/gpu-share (memory slices of the GPUs in
    k8s.share-gpus), with health from NVML's critical XIDs; re-registers when the kubelet restarts.
    The global --root and --user choose the driver root and the NVML helper's identity, as for `info`."""
    import logging
    import os
    import sys

    from nvc import config
    from nvc.errors import InputError
    from nvc.config.options import GlobalOptions, parse_user

    conf = config.load(config_path, must_exist=config_path is not None)
    given = ctx.find_root().obj  # the global options (nvc.commands.cli._Given)
    root = given.root if given.root is not None else conf.root
    if not os.path.isabs(root) or not os.path.isdir(root):
        raise InputError(f"{root}: invalid driver root (must be an absolute path to a directory)")
    user = parse_user(given.user if given.user is not None else conf.user)
    k8s_conf = conf.k8s
    from nvc.containerenv.sharing import parse_size

    parse_size("k8s.share-slice", k8s_conf.share_slice)  # a bad size stops it here, not at discovery
    if health_file is not None and not os.path.isabs(health_file):
        raise InputError(f"{health_file}: --health-file must be an absolute path")
    if device_plugin_dir is not None:
        if not os.path.isabs(device_plugin_dir):
            raise InputError(f"{device_plugin_dir}: --device-plugin-dir must be an absolute path")
        k8s_conf = k8s_conf._replace(device_plugin_dir=os.path.normpath(device_plugin_dir))
    from nvc.system.untrusted import directory_or_missing

    directory_or_missing(k8s_conf.device_plugin_dir, "the device plugin directory")
    if not os.path.exists(k8s_conf.device_plugin_dir):  # the kubelet's to make: no kubelet here, or another --root-dir
        raise InputError(f"{k8s_conf.device_plugin_dir}: no such directory: is a kubelet running on this host? (it "
                         "makes it; another kubelet --root-dir: --device-plugin-dir)")
    logging.basicConfig(stream=sys.stderr, level=_LOG_LEVELS[log_level],
                        format="%(asctime)s nvc-py k8s device-plugin: %(levelname)s: %(message)s")
    from nvc.k8s import daemon

    opts = GlobalOptions(os.path.normpath(root), given.ldcache or conf.ldcache, user, False)
    ctx.exit(daemon.run(opts, k8s_conf, health_file))

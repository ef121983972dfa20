"""The ``nvc-py k8s`` command group (registered by nvc/commands/cli.py). Imports nothing heavy: the plugin's
modules, with grpcio and protobuf, load when ``device-plugin`` or ``dra-driver`` runs, after its options are read."""

from __future__ import annotations

from typing import Any

import click

_LOG_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}
_log_level = click.option(
    "--log-level",
    type=click.Choice(tuple(_LOG_LEVELS)),
    default="info",
    show_default=True,
    help="Least severity of the lines logged to stderr.",
)


def _stops() -> list[int]:
    """SIGTERM and SIGINT noted from the daemon's first line on: the kubelet or a test may stop it
    while it still imports and discovers, and it then stops at once with status 0 instead of dying of
    the signal. Its loop ends once the list is not empty."""
    import signal

    stop: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda number, frame: stop.append(number))
    return stop


@click.group("k8s", short_help="Kubernetes: the kubelet device plugin and the DRA driver.")
def k8s() -> None:
    """Kubernetes: the kubelet device plugin and the DRA driver (docs/kubernetes.md)."""


@k8s.command("device-plugin", short_help="Run the kubelet device plugin until SIGTERM.")
@click.option(
    "--config",
    "config_path",
    metavar="PATH",
    default=None,
    help="Configuration file whose k8s: section (and root, user) the plugin reads "
    "[default: $NVC_PY_CONFIG, else /etc/nvc-py/config.yaml].",
)
@click.option(
    "--device-plugin-dir",
    metavar="PATH",
    default=None,
    help="The kubelet's device plugin directory, where kubelet.sock is and the plugin's sockets go "
    "[default: the configuration's k8s.device-plugin-dir, /var/lib/kubelet/device-plugins].",
)
@click.option(
    "--health-file",
    metavar="PATH",
    default=None,
    help="Where each resource's healthy and unhealthy device count goes, for `nvc-py exporter` "
    "[default: /run/nvc-py/device-plugin.json].",
)
@_log_level
@click.pass_context
def device_plugin(
    ctx: click.Context, config_path: str | None, device_plugin_dir: str | None, health_file: str | None, log_level: str
) -> None:
    """Run the kubelet device plugin until SIGTERM: nvidia.com/gpu (whole GPUs by UUID),
    nvidia.com/mig-<profile> (MIG devices) and nvc-py.io/gpu-share (memory slices of the GPUs in
    k8s.share-gpus), with health from NVML's critical XIDs; re-registers when the kubelet restarts.
    The global --root and --user choose the driver root and the NVML helper's identity, as for `info`."""
    stop = _stops()
    import os

    from nvc.errors import InputError

    conf, opts = _options(ctx, config_path)
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
        raise InputError(
            f"{k8s_conf.device_plugin_dir}: no such directory: is a kubelet running on this host? (it "
            "makes it; another kubelet --root-dir: --device-plugin-dir)"
        )
    _logging("device-plugin", log_level)
    from nvc.k8s import daemon

    ctx.exit(daemon.run(opts, k8s_conf, stop, health_file))


def _options(ctx: click.Context, config_path: str | None) -> tuple[Any, Any]:
    """The configuration file and the global options: the global --root and --user, else the file's."""
    import os

    from nvc import config
    from nvc.config.options import GlobalOptions, parse_user
    from nvc.errors import InputError

    conf = config.load(config_path, must_exist=config_path is not None)
    given = ctx.find_root().obj  # the global options (nvc.commands.cli._Given)
    root = given.root if given.root is not None else conf.root
    if not os.path.isabs(root) or not os.path.isdir(root):
        raise InputError(f"{root}: invalid driver root (must be an absolute path to a directory)")
    user = parse_user(given.user if given.user is not None else conf.user)
    return conf, GlobalOptions(os.path.normpath(root), given.ldcache or conf.ldcache, user, False)


def _utf8(text: str) -> bool:
    """Whether ``text`` came from valid UTF-8 (not bytes Python kept as surrogates)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _logging(name: str, level: str) -> None:
    import logging
    import sys

    logging.basicConfig(
        stream=sys.stderr, level=_LOG_LEVELS[level], format=f"%(asctime)s nvc-py k8s {name}: %(levelname)s: %(message)s"
    )


@k8s.command("dra-driver", short_help="Run the DRA driver (resource.k8s.io/v1) until SIGTERM.")
@click.option(
    "--config",
    "config_path",
    metavar="PATH",
    default=None,
    help="Configuration file (root, user, k8s.device-list-strategy) "
    "[default: $NVC_PY_CONFIG, else /etc/nvc-py/config.yaml].",
)
@click.option(
    "--driver-name",
    metavar="NAME",
    default="gpu.nvc-py.io",
    show_default=True,
    help="The DRA driver name: DeviceClasses select it, and the attributes' domain.",
)
@click.option(
    "--node-name",
    metavar="NAME",
    envvar="NODE_NAME",
    required=True,
    help="This node's name in the cluster (its ResourceSlices' pool) [env NODE_NAME].",
)
@click.option(
    "--kubeconfig",
    metavar="PATH",
    default=None,
    help="Kubeconfig to reach the API server with [default: the pod's service account].",
)
@click.option(
    "--service-account-dir",
    metavar="PATH",
    default="/var/run/secrets/kubernetes.io/serviceaccount",
    show_default=True,
    help="The pod's service account token and ca.crt, without --kubeconfig.",
)
@click.option(
    "--kubelet-dir",
    metavar="PATH",
    default="/var/lib/kubelet",
    show_default=True,
    help="The kubelet's --root-dir: plugins_registry/ and plugins/<driver>/ are in it.",
)
@click.option(
    "--cdi-dir",
    metavar="PATH",
    default="/var/run/cdi",
    show_default=True,
    help="Where each prepared claim's CDI spec goes (the container runtime's CDI spec directory).",
)
@click.option(
    "--resync",
    "resync_s",
    type=click.FloatRange(min=1),
    default=60,
    show_default=True,
    help="Seconds between checks that the API server still has this node's ResourceSlices.",
)
@_log_level
@click.pass_context
def dra_driver(
    ctx: click.Context,
    config_path: str | None,
    driver_name: str,
    node_name: str,
    kubeconfig: str | None,
    service_account_dir: str,
    kubelet_dir: str,
    cdi_dir: str,
    resync_s: float,
    log_level: str,
) -> None:
    """Run the DRA driver until SIGTERM: publishes this node's GPUs and MIG devices as ResourceSlices,
    registers with the kubelet and prepares each allocated ResourceClaim as a CDI spec of its own, with
    the sharing limits of the claim's opaque configuration (docs/kubernetes.md)."""
    stop = _stops()
    import os
    import re

    from nvc.errors import InputError
    from nvc.system.untrusted import directory_or_missing

    conf, opts = _options(ctx, config_path)
    label = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
    if not re.fullmatch(rf"{label}(\.{label})+", driver_name) or len(driver_name) > 63:
        raise InputError(f"--driver-name {driver_name!r}: not a DNS subdomain of at most 63 characters with a dot")
    if not re.fullmatch(rf"{label}(\.{label})*", node_name) or len(node_name) > 253:
        raise InputError(f"--node-name {node_name!r}: not a node name (a DNS subdomain of at most 253 characters)")
    for name, path in (("--kubelet-dir", kubelet_dir), ("--cdi-dir", cdi_dir)):
        if not os.path.isabs(path) or not path.isprintable() or not _utf8(path):
            raise InputError(f"{path!r}: {name} must be an absolute path of printable UTF-8")  # grpc's is UTF-8
        directory_or_missing(path, name)
    if not os.path.isdir(kubelet_dir):  # the kubelet makes it: no kubelet here, or another --root-dir
        raise InputError(
            f"{kubelet_dir}: no such directory: is a kubelet running on this host? (another --root-dir: --kubelet-dir)"
        )
    from nvc.k8s.dra import driver, kubeapi

    api = kubeapi.from_kubeconfig(kubeconfig) if kubeconfig is not None else kubeapi.in_cluster(service_account_dir)
    settings = driver.Settings(
        driver_name,
        node_name,
        os.path.normpath(kubelet_dir),
        os.path.normpath(cdi_dir),
        conf.k8s.device_list_strategy == "volume-mounts",
        resync_s,
        config_path,
    )
    _logging("dra-driver", log_level)
    ctx.exit(driver.Driver(opts, settings, api).run(stop))

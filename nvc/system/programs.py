"""nvc-py's installed programs (the native fronts make install and the package put in LIBDIR) and the
OCI hook entry an engine runs: its program, argv and whole environment. Registration
(:mod:`nvc.hook.setup`) writes it into the engines' files, the runtime wrapper adds it to a GPU
container's spec, the CDI specs (the CLI's, the DRA driver's) name it in their hooks."""

from __future__ import annotations

import os

HOOK_SCRIPT = "nvc-py-hook"
RUNTIME_SCRIPT = "nvc-py-runtime"
LIBDIR = "/usr/lib/nvc-py"  # as the Makefile's: make install's fronts and launchers
FIXED_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_SOCKET = "/run/nvc-py/hook.sock"  # where the hook server listens (the hook hands its calls there)
SOCKET_ENV = "NVC_PY_HOOK_SOCKET"  # the hook's variable naming another socket, or none


def installed_program(name: str) -> str:
    """``name`` as make install and the package put it in LIBDIR: the native front, which drops the
    caller's unsafe variables before the isolated interpreter starts (nvc.system.loaderenv). pip makes no
    console scripts of its own (they would run a root hook in a caller-steered interpreter), and
    would silently undo a front put in their place at every install."""
    return os.path.join(LIBDIR, name)


def is_ours(path: str) -> bool:
    """Whether ``path`` names one of nvc-py's programs (a hook or runtime entry pointing at it)."""
    real = os.path.realpath(path)
    return real.startswith(LIBDIR + "/") or os.path.basename(real) in (HOOK_SCRIPT, RUNTIME_SCRIPT)


def hook_env(config_path: str | None) -> list[str]:
    """The whole environment a hook gets: fixed PATH, and the configuration file when not the default."""
    return [FIXED_PATH] + ([f"NVC_PY_CONFIG={config_path}"] if config_path else [])


def oci_hook(stage: str, config_path: str | None = None) -> dict[str, str | list[str]]:
    """The OCI hook entry that runs ``nvc-py-hook STAGE`` (prestart configures; poststop drops
    the GPU-sharing directory of a container that had one).

    Where ``make install`` put it, nvc-py-hook is the native front: it hands the call to the hook
    server (no interpreter start on the container's start; where none runs it starts one, see
    native/client/server_start.c) and runs the Python hook itself when none answers, so the entry is
    right with or without a server.
    """
    return {"path": installed_program(HOOK_SCRIPT), "args": [HOOK_SCRIPT, stage], "env": hook_env(config_path)}

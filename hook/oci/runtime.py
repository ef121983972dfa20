"""``nvc-py-runtime``: an OCI runtime that is runc (or crun) plus nvc-py for GPU containers.

containerd (and anything else that only knows runtimes, not hooks) runs it in place of
runc. On ``create`` it reads the bundle's ``config.json``; when the spec asks for GPUs it
adds the ``nvc-py-hook`` prestart hook and, where the container may share a GPU, the
poststop one (which cleans up after GPU sharing) unless they are there, the device nodes and
their cgroup rules (and the nodes' /dev/char links, without which systemd drops the rules on a reload:
:func:`nvc.cdi.devnodes.char_links`), writes the spec back atomically, and then execs the
real runtime with the original arguments. Every other subcommand is passed straight through.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time

from nvc.errors import InputError, NvcError
from nvc.system.loaderenv import runtime_environment

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from nvc.config import Config
    from nvc.hook.oci.spec import Container

PROG = "nvc-py-runtime"
# runc/crun global options that take a value (as a separate word) before the subcommand.
_GLOBAL_VALUE_OPTIONS = {"--root", "--log", "--log-format", "--criu", "--rootless", "--cgroup-manager"}


def global_options(args: list[str]) -> tuple[dict[str, str], int]:
    """The runtime's global options (``--log PATH`` or ``--log=PATH``...) and the subcommand's index."""
    found: dict[str, str] = {}
    i = 0
    while i < len(args) and args[i].startswith("-"):
        name, sep, value = args[i].partition("=")
        if not sep and name in _GLOBAL_VALUE_OPTIONS and i + 1 < len(args):
            value = args[i + 1]
            i += 1
        found[name] = value
        i += 1
    return found, i


def find_create(args: list[str]) -> tuple[int, str] | None:
    """(index of ``create``, bundle dir) when ``args`` is a create command, else None."""
    _, i = global_options(args)
    if i >= len(args) or args[i] != "create":
        return None
    bundle = "."
    rest = args[i + 1 :]
    for j, word in enumerate(rest):
        if word in ("--bundle", "-b") and j + 1 < len(rest):
            bundle = rest[j + 1]
        elif word.startswith("--bundle="):
            bundle = word.split("=", 1)[1]
    return i, os.path.abspath(bundle)


def has_nvc_hook(spec: dict[str, Any], stage: str) -> bool:
    """Whether ``stage`` already runs nvc-py-hook (directly, through nvc-py-hook-client, or through a
    link to it under another name: ``docker run --gpus``'s nvidia-container-runtime-hook, see
    :mod:`nvc.hook.setup.docker`)."""
    hooks = (spec.get("hooks") or {}).get(stage) or []
    return any(
        os.path.basename(os.path.realpath(str(h.get("path", "")))) in ("nvc-py-hook", "nvc-py-hook-client")
        for h in hooks
    )


def shares(config: Config, ctr: Container) -> bool:
    """Whether the container may share its GPUs, so that its poststop hook has something to drop: limits
    that do not parse count (the prestart hook refuses them with its own line)."""
    from nvc.hook.oci.prestart import share_request

    try:
        return share_request(config, ctr) is not None
    except InputError:
        return True


def rewrite(spec: dict[str, Any], bundle: str, config: Config) -> bool:
    """Add the hook (and the poststop one where the container may share a GPU), device nodes and cgroup
    rules to ``spec`` if it asks for GPUs; True if changed."""
    from nvc.cdi import devnodes
    from nvc.hook.oci import spec as oci
    from nvc.hook.oci.prestart import global_options, policy
    from nvc.pipeline.configure import device_nodes
    from nvc.plan import fromenv
    from nvc.system.programs import oci_hook

    ctr = oci.container(bundle, spec)
    req = fromenv.gpu_request(ctr.env, list(ctr.mounts), ctr.privileged, policy(config))
    if req is None:
        return False
    changed = False
    for stage in ("prestart", "poststop") if shares(config, ctr) else ("prestart",):
        if not has_nvc_hook(spec, stage):
            spec.setdefault("hooks", {}).setdefault(stage, []).append(oci_hook(stage, config.path))
            changed = True
    found = devnodes.find_all(config.root, device_nodes(global_options(config), req))
    for problem in devnodes.char_links(found):
        print(f"{PROG}: warning: {problem}: access lost on systemctl daemon-reload", file=sys.stderr)
    return devnodes.add_to_spec(spec, config.root, found) or changed


def write_atomic(path: str, spec: dict[str, Any]) -> None:
    """Replace ``path`` with ``spec``: a reader sees the old file or the new one, never a torn one. No
    fsync: a bundle lives as long as its container, which a crash ends (the engine writes it anew)."""
    tmp = f"{path}.nvc-py.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(spec, f)
            f.flush()
            os.fchmod(f.fileno(), os.stat(path).st_mode & 0o7777)
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise


def real_runtime(config: Config) -> str:
    """The first of the configured runtimes found (names looked up in PATH), never this wrapper."""
    names = config.runtimes
    for name in names:
        path = name if os.path.isabs(name) else shutil.which(name)
        if path and os.access(path, os.X_OK) and os.path.basename(path) != PROG:
            return path
    raise InputError(f"no OCI runtime found (tried {', '.join(names)}; see 'runtimes' in the configuration)")


def report(args: list[str], message: str) -> None:
    """The error on stderr and, where the caller named one, in the runtime's log file.

    containerd's shim shows the last error of runc's ``--log`` file (JSON with
    ``--log-format json``), not the runtime's stderr: without this line the user would
    read "unable to retrieve OCI runtime error" instead of the reason.
    """
    print(message, file=sys.stderr)
    options, _ = global_options(args)
    path = options.get("--log")
    if not path:
        return
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if options.get("--log-format") == "json":
        line = json.dumps({"level": "error", "msg": message, "time": stamp})
    else:
        line = f"time={json.dumps(stamp)} level=error msg={json.dumps(message)}"
    from nvc.system.untrusted import open_append

    try:  # without blocking: a FIFO there without a reader is no log, not a wait
        fd = open_append(path, 0o644)
    except OSError:
        return  # stderr has it
    try:
        os.write(fd, (line + "\n").encode(errors="backslashreplace"))
    except OSError:
        pass  # stderr has it
    finally:
        os.close(fd)


# runc's and crun's own: nvc-py-runtime says what it is, then the runtime it execs answers too.
_ABOUT_OPTIONS = ("--help", "-h", "--version", "-v")


def about(config: Config, runtime: str | None) -> str:
    """What ``--help``/``--version`` print before the real runtime's own answer (a blank line between)."""
    from nvc import __version__

    execs = runtime or f"no runtime found (tried {', '.join(config.runtimes)})"
    return (
        f"{PROG} {__version__} (nvc-py): an OCI runtime that is runc or crun plus nvc-py's hooks for GPU\n"
        f"containers (on create it adds the nvc-py-hook prestart hook, and poststop where GPUs are shared,\n"
        f"the device nodes and their cgroup rules to a spec asking for GPUs); every command is then run by\n"
        f"{execs} (configuration: {config.path or 'built-in defaults'}, its 'runtimes' key).\n\n"
    )


def log_refusal(config: Config | None, args: list[str], err: NvcError, started: float) -> None:
    """The refusal's one JSON line in the hook's log, as every refused hook call has (README): the
    configuration's ``log.file``, the default one where the configuration itself was refused."""
    from nvc import config as config_file
    from nvc.hook.oci import log

    config = config or config_file.defaults()
    _, i = global_options(args)
    create = find_create(args)
    log.write(
        config.log_file,
        config.log_level,
        True,
        stage="runtime",
        command=args[i] if i < len(args) else None,
        container=args[-1] if create and len(args) > create[0] + 1 else None,
        bundle=create[1] if create else None,
        pid=os.getpid(),
        outcome="error",
        error=str(err),
        duration_ms=round((time.monotonic() - started) * 1000, 1),
    )


def prepare(args: list[str], config: Config) -> None:
    """On ``create``: the bundle's spec rewritten where it asks for GPUs (:func:`rewrite`)."""
    create = find_create(args)
    if create is not None:
        from nvc.hook.oci import spec as oci

        bundle = create[1]
        spec = oci.load_config(bundle)
        if rewrite(spec, bundle, config):
            write_atomic(os.path.join(bundle, "config.json"), spec)


def served_create(args: list[str]) -> int:
    """A create the front hands to a hook server's worker (native/client/runtime_front.c): the spec rewritten
    as :func:`main` rewrites it, the same lines and status where it cannot be; the front then executes the
    runtime the runtime cache names (the one :func:`main` would), in the caller's process."""
    started = time.monotonic()
    config = None
    try:
        from nvc import config as config_file

        config = config_file.load()
        prepare(args, config)
    except NvcError as err:
        report(args, f"{PROG}: {err}")
        log_refusal(config, args, err, started)
        return err.exit_code
    return 0


def main(argv: list[str] | None = None) -> int:
    """Rewrite the spec on create, then become the real runtime."""
    args = sys.argv[1:] if argv is None else argv
    started = time.monotonic()
    config = None
    try:
        from nvc import config as config_file

        config = config_file.load()
        if len(args) == 1 and args[0] in _ABOUT_OPTIONS:
            try:
                runtime = real_runtime(config)
            except InputError:
                runtime = None
            text = about(config, runtime)
            print(text, end="", flush=True)
            if runtime is None:
                return 0
        else:
            prepare(args, config)
            runtime = real_runtime(config)
            text = about(config, runtime)
        from nvc.hook.oci import runtimecache

        # the front passes calls through from now on, and answers --help/--version as this program did
        runtimecache.store(config_file.config_path(), runtime, text)
    except NvcError as err:
        report(args, f"{PROG}: {err}")
        log_refusal(config, args, err, started)
        return err.exit_code
    os.execve(runtime, [runtime, *args], runtime_environment())
    return 0  # not reached


def run() -> None:
    """Console script entry point.

    A hook or runtime may be handed a container's environment: restart without the loader
    variables before anything loads a shared library (this module's own imports load none).
    Its streams are guarded (:mod:`nvc.system.stdio`): a closed or full stdout is one line and a status.
    """
    from nvc.system.loaderenv import restart_without_unsafe_variables
    from nvc.system.stdio import guarded

    restart_without_unsafe_variables(stash=True)
    sys.exit(guarded(PROG, main))

"""The reference beside nvc-py in the benches: NVIDIA's ``nvidia-container-cli`` (libnvidia-container),
timed the way ../shared/reference/h100-measurements.md timed it, in the same run as nvc-py's rows.

Nothing here builds or ships it: ``--reference PATH`` names a copy the user has (an install, or a build of
their own). Where a ``lib`` directory sits beside the directory holding it (``.../bin/nvidia-container-cli``
and ``.../lib``), its runs get that directory first in LD_LIBRARY_PATH, and only its runs. Its ``info`` and
``list`` run on the test suite's fake driver too (bench/discovery.py); its ``configure`` needs the real one
(NEEDS_REAL).

As a prestart hook it runs in a bash wrapper that reads the container's pid and bundle from the OCI state
on stdin (the shape of the reference's published measurement: its CLI in a bash hook), with the flags
NVIDIA's hook passes for ``NVIDIA_VISIBLE_DEVICES=0``, ``compute,utility``: ``--load-kmods configure
--ldconfig=@LDCONFIG --no-cgroups --device=0 --compute --utility --pid=PID ROOTFS``. ``--no-cgroups`` as in
the reference's published figures: its row grants no device cgroup access, which nvc-py's rows do (their
``cgroup`` stage), so the reference's row does that much less work.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

LABEL = "reference (nvidia-container-cli)"
# Why its configure cannot run on the test suite's fake driver, whose /proc tree is mounted over the host's:
NEEDS_REAL = (
    "nvidia-container-cli configure reads the driver's /proc under its --root, and masks /proc/driver/nvidia in "
    "a container's own /proc"
)

# bash: the pid and the bundle out of the state without forking; the rootfs is the bundle's.
HOOK = """#!/bin/bash
read -r -d '' state
[[ $state =~ \\"pid\\":\\ *([0-9]+) ]] || exit 1
pid=${{BASH_REMATCH[1]}}
[[ $state =~ \\"bundle\\":\\ *\\"([^\\"]+)\\" ]] || exit 1
{env}exec {cli} --root {root} --load-kmods configure --ldconfig=@{ldconfig} --no-cgroups --device=0 \\
    --compute --utility --pid="$pid" "${{BASH_REMATCH[1]}}/rootfs"
"""


def library_dir(cli: Path) -> Path | None:
    """The ``lib`` directory beside the one holding ``cli``, if there is one."""
    lib = cli.resolve().parent.parent / "lib"
    return lib if lib.is_dir() else None


def environment(cli: Path) -> dict[str, str]:
    """The environment the reference's runs add to the caller's: its own libraries first."""
    lib = library_dir(cli)
    if lib is None:
        return {}
    inherited = os.environ.get("LD_LIBRARY_PATH", "")
    return {"LD_LIBRARY_PATH": f"{lib}:{inherited}" if inherited else str(lib)}


def ldconfig() -> str:
    """The host's ldconfig binary: Ubuntu's /sbin/ldconfig is a shell script around ldconfig.real, which
    the reference cannot run (the container's ld cache is left as it was)."""
    return "/sbin/ldconfig.real" if Path("/sbin/ldconfig.real").exists() else "/sbin/ldconfig"


def hook_script(cli: Path, root: str) -> str:
    """The prestart hook's bash wrapper around ``cli``, for driver root ``root``."""
    env = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in environment(cli).items())
    # absolute: a runtime runs the hook in the bundle's directory
    return HOOK.format(env=env, cli=shlex.quote(str(cli.resolve())), root=shlex.quote(root), ldconfig=ldconfig())


def write_hook(cli: Path, root: str, path: Path) -> dict:
    """Writes the wrapper to ``path``; the OCI hook entry that runs it."""
    path.write_text(hook_script(cli, root))
    path.chmod(0o755)
    return {
        "path": str(path),
        "args": [path.name],
        "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
    }


def ratio(value: float, reference: float | None) -> str:
    """``value`` as a multiple of the reference's, where the run has one."""
    return f"{value / reference:.2f}x" if reference else "-"

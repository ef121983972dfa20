"""``nvc-py configure`` as a runc prestart hook: the hook script, a probe of a device node run in the
container, a container started with such a hook, and the paths under a rootfs (what a configure
that was refused must leave as it was)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from .bundle import make_bundle

NVC = shutil.which("nvc-py") or "nvc-py"

# Reads the OCI state on stdin, then runs configure for the container's pid.
HOOK = """#!/bin/sh
pid=$(sed -n 's/.*"pid": *\\([0-9]*\\).*/\\1/p')
{prefix} {nvc} --root {root} configure --pid "$pid" {args} {rootfs} 2>>{log}
"""
# Probes a device node: "open" when the kernel let us open it (the fake node then says ENXIO), "denied" on EPERM.
PROBE = 'probe() { if (exec 3<"$1") 2>&1 | grep -q "not permitted"; then echo "$1 denied"; else echo "$1 open"; fi; }'


def hook(tmp_path: Path, fake, rootfs: Path, args: str, prefix: str = "") -> dict:
    """The OCI prestart hook entry running :data:`HOOK` for ``fake``'s driver root with ``args``."""
    script = tmp_path / "hook.sh"
    script.write_text(
        HOOK.format(prefix=prefix, nvc=NVC, root=fake.root, args=args, rootfs=rootfs, log=tmp_path / "hook.log")
    )
    script.chmod(0o755)
    return {"path": str(script), "args": ["hook.sh"], "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"]}


def run(runc, tmp_path: Path, rootfs: Path, hook: dict, script: str, **bundle_args) -> subprocess.CompletedProcess:
    bundle = make_bundle(tmp_path / "bundle", rootfs, ["sh", "-c", script], hooks={"prestart": [hook]}, **bundle_args)
    result = runc.create_start(bundle)
    log = tmp_path / "hook.log"
    assert result.returncode == 0, result.stderr + (log.read_text() if log.exists() else "")
    return result


def paths(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}

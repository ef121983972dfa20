"""What crun, podman's default runtime on Debian 12 (crun 1.8.1), shows of a GPU start the hook refuses:
only ``error executing hook PATH (exit code: N)``, the hook's own line (its stderr) dropped, unless the
container's annotation ``run.oci.hooks.stderr`` names a file for it (``/dev/stderr``: crun's own, which
the engine shows). docs/engines.md says so, and where the line always is (the hook's log).

crun 1.8 refuses this machine's cgroups (v1 and v2 mounted side by side): it runs here in a mount
namespace where /sys/fs/cgroup is the v2 hierarchy alone, managing no cgroup (the hook runs as under any
manager: the refusal comes before the container's process does).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from harness.bundle import make_bundle
from nvc.system.programs import oci_hook

REASON = "the NVIDIA kernel driver is not loaded"


def _crun(bundle: Path, state: Path) -> subprocess.CompletedProcess[str]:
    crun = shutil.which("crun")
    if crun is None:
        pytest.skip("crun is not installed")
    script = 'mount -t cgroup2 none /sys/fs/cgroup && exec "$@"'
    argv = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        script,
        "sh",
        crun,
        "--cgroup-manager=disabled",
        "--root",
        str(state),
        "run",
        "--bundle",
        str(bundle),
        "nvc-crun-refusal",
    ]
    try:  # stderr a pipe, as the engines give it (a file given as /dev/stderr would be truncated)
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    finally:
        subprocess.run([crun, "--root", str(state), "delete", "-f", "nvc-crun-refusal"], capture_output=True)


@pytest.mark.parametrize("annotation", [None, "/dev/stderr"], ids=["default", "hooks-stderr"])
def test_crun_shows_the_hooks_reason_only_where_the_annotation_names_a_file(
    debian_rootfs: Path, tmp_path: Path, annotation: str | None
) -> None:
    if Path("/proc/driver/nvidia").exists():
        pytest.skip("a real NVIDIA driver is loaded: the hook would not refuse")
    config = tmp_path / "config.yaml"
    config.write_text(f"log: {{file: {tmp_path / 'hook.log'}}}\n")
    hook = oci_hook("prestart", str(config))  # the entry setup registers, served by no server here
    hook["env"].append("NVC_PY_HOOK_SOCKET=none")
    bundle = make_bundle(
        tmp_path / "bundle", debian_rootfs, ["true"], env={"NVIDIA_VISIBLE_DEVICES": "all"}, hooks={"prestart": [hook]}
    )
    if annotation is not None:
        spec = json.loads((bundle / "config.json").read_text())
        spec["annotations"] = {"run.oci.hooks.stderr": annotation}
        (bundle / "config.json").write_text(json.dumps(spec))
    done = _crun(bundle, tmp_path / "state")
    assert done.returncode != 0
    assert f"error executing hook `{hook['path']}` (exit code: 3)" in done.stderr, done.stderr
    assert (REASON in done.stderr) == (annotation is not None), done.stderr
    logged = [json.loads(line) for line in (tmp_path / "hook.log").read_text().splitlines()]
    assert [(entry["outcome"], REASON in entry["error"]) for entry in logged] == [("error", True)], logged

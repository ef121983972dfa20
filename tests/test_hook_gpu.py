"""nvc-py-hook as the prestart hook of crun/runc containers on a real GPU (``make test-gpu``).

The expected GPU comes from NVML queried in this test process through pynvml, not from
nvc-py. The container output is printed (``pytest -rP`` shows it) so it can be quoted.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from contextlib import nullcontext
from pathlib import Path

import pytest

from harness.bundle import make_bundle, reachable_from_userns
from harness.gpufixtures import crun, gpu0_uuid, gpu_driver, hook_with_log, runtime  # noqa: F401  (fixtures)
from harness.hookserver import client_hook, hook_server
from harness.installed import SCRIPTS
from harness.runtime import Runc

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
import sharegpu  # noqa: E402

pytestmark = pytest.mark.gpu

SHOW = ["sh", "-c", "nvidia-smi -L 2>&1; ls /dev | grep '^nvidia[0-9]' || echo 'no GPU device nodes'"]


@pytest.mark.parametrize("served", [False, True], ids=["nvc-py-hook", "client+server"])
def test_prestart_hook_on_the_gpu(runtime: Runc, make_rootfs, gpu0_uuid: str, tmp_path: Path, served: bool) -> None:
    """nvc-py-hook as the hook, and nvc-py-hook-client handing the call to ``nvc-py-hook serve``."""
    config = tmp_path / "config.yaml"
    config.write_text(f"log: {{file: {tmp_path / 'hook.log'}}}\n")
    env = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", f"NVC_PY_CONFIG={config}"]
    sock = tmp_path / "run" / "hook.sock"
    hook = (
        client_hook(SCRIPTS / "nvc-py-hook", sock, env)
        if served
        else {"path": str(SCRIPTS / "nvc-py-hook"), "args": ["nvc-py-hook", "prestart"], "env": env}
    )
    with hook_server(SCRIPTS / "nvc-py-hook", sock) if served else nullcontext():
        _show_gpu0_and_unset(runtime, make_rootfs, gpu0_uuid, tmp_path, hook)
    if served:
        assert all(json.loads(line)["via"] == "server" for line in (tmp_path / "hook.log").read_text().splitlines())


def _show_gpu0_and_unset(runtime: Runc, make_rootfs, gpu0_uuid: str, tmp_path: Path, hook: dict) -> None:
    outputs = {}
    for name, env in (("gpu0", {"NVIDIA_VISIBLE_DEVICES": "0"}), ("unset", {})):
        bundle = make_bundle(
            tmp_path / name, make_rootfs(name=f"rootfs-{name}"), SHOW, env=env, hooks={"prestart": [hook]}
        )
        result = runtime.create_start(bundle)
        print(
            f"--- {Path(runtime.binary).name}, NVIDIA_VISIBLE_DEVICES={env.get('NVIDIA_VISIBLE_DEVICES', '(unset)')}:"
        )
        print(result.stdout + result.stderr)
        assert result.returncode == 0, result.stderr
        outputs[name] = result.stdout
    print((tmp_path / "hook.log").read_text())
    assert outputs["gpu0"].splitlines()[0].startswith("GPU 0: ") and f"(UUID: {gpu0_uuid})" in outputs["gpu0"]
    assert len([w for w in outputs["gpu0"].split() if w.startswith("nvidia") and w[6:].isdigit()]) == 1
    assert "nvidia-smi: not found" in outputs["unset"] and "no GPU device nodes" in outputs["unset"]


def test_doctor_on_the_gpu_host() -> None:
    """`nvc-py doctor` on the GPU machine: the driver, NVML, device nodes and the ldconfig the hook
    runs all hold (engines it lacks are checks that do not apply; printed for the closing note)."""
    import subprocess

    done = subprocess.run([str(SCRIPTS / "nvc-py"), "doctor"], capture_output=True, text=True, timeout=120)
    print(done.stdout + done.stderr)
    checks = json.loads(
        subprocess.run(
            [str(SCRIPTS / "nvc-py"), "doctor", "--json"], capture_output=True, text=True, timeout=120
        ).stdout
    )["checks"]
    status = {c["name"]: c["status"] for c in checks}
    assert [status[name] for name in ("configuration", "driver", "NVML", "device nodes", "cgroups", "ldconfig")] == [
        "ok"
    ] * 6, checks


def test_crun_runs_the_hook_from_where_podman_would_read_it(make_rootfs, gpu0_uuid: str, tmp_path: Path) -> None:
    """The GPU machine has no podman: `nvc-py setup podman` writes its hooks.d files where podman would
    read them (resolved through containers.conf's chain as podman resolves it), and crun runs that
    file's prestart entry as podman passes it on: the container sees GPU 0."""
    import subprocess

    from nvc.hook.setup import hooksdirs

    binary = shutil.which("crun")
    if binary is None:
        pytest.skip("crun is not installed")
    config = tmp_path / "config.yaml"
    config.write_text(f"log: {{file: {tmp_path / 'hook.log'}}}\n")
    setup = subprocess.run(
        [str(SCRIPTS / "nvc-py"), "setup", "podman", "--config", str(config), "--no-server"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    print(setup.stdout + setup.stderr)
    assert setup.returncode == 0, setup.stderr
    try:
        resolved = hooksdirs.resolve(hooksdirs.PODMAN)
        print(hooksdirs.described(hooksdirs.PODMAN, resolved))
        entry = json.loads((Path(resolved.target) / "oci-nvc-py-hook.json").read_text())
        assert entry["stages"] == ["prestart"] and entry["when"] == {"always": True}
        runtime = Runc(tmp_path / "state", binary)
        bundle = make_bundle(
            tmp_path / "gpu0",
            make_rootfs(name="rootfs-gpu0"),
            SHOW,
            env={"NVIDIA_VISIBLE_DEVICES": "0"},
            hooks={"prestart": [entry["hook"]]},
        )
        result = runtime.create_start(bundle)
        print(result.stdout + result.stderr)
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines()[0].startswith("GPU 0: ") and f"(UUID: {gpu0_uuid})" in result.stdout
    finally:
        subprocess.run([str(SCRIPTS / "nvc-py"), "setup", "podman", "--remove"], capture_output=True, timeout=60)


USERNS_HOST_ID, USERNS_SIZE = 100000, 65536  # uid and gid 0 inside are host 100000


@pytest.fixture(scope="module")
def share_program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/gpu/share_gpu.cu, built (static cudart): its ``compute`` runs CUDA kernels."""
    return sharegpu.build(tmp_path_factory.mktemp("share_gpu"))


def _userns_rootfs(make_rootfs, share_program: Path, name: str) -> Path:
    """The test image with the CUDA program, owned by the mapped range as podman's layers are."""
    rootfs = make_rootfs(name=name)
    shutil.copy2(share_program, rootfs / "usr/local/bin/share_gpu")
    subprocess.run(["chown", "-R", "-h", f"{USERNS_HOST_ID}:{USERNS_HOST_ID}", str(rootfs)], check=True)
    reachable_from_userns(rootfs)
    return rootfs


def test_crun_userns_container_runs_nvidia_smi_and_a_kernel(
    crun: Runc, make_rootfs, share_program: Path, gpu0_uuid: str, tmp_path: Path
) -> None:
    """crun with uid/gid maps 0 -> 100000 (65536) and its default /dev tmpfs: nvc-py-hook joins the
    container's user namespace for its steps inside; the container lists GPU 0, runs CUDA kernels,
    and the ld cache and /proc/driver/nvidia belong to its root (uid 0 inside)."""
    rootfs = _userns_rootfs(make_rootfs, share_program, "rootfs-userns")
    script = (
        "nvidia-smi -L 2>&1; ls /dev | grep '^nvidia[0-9]'; share_gpu compute 1 "
        f"{sharegpu.COMPUTE_ITERS}; stat -c 'owner %u:%g %n' /etc/ld.so.cache /proc/driver/nvidia; "
        "cat /proc/self/uid_map"
    )
    bundle = make_bundle(
        tmp_path / "bundle",
        rootfs,
        ["sh", "-c", script],
        env={"NVIDIA_VISIBLE_DEVICES": "0"},
        hooks=hook_with_log(tmp_path),
        id_map=(USERNS_HOST_ID, USERNS_SIZE),
    )
    result = crun.create_start(bundle, timeout=120)
    print(f"--- crun, uid/gid maps 0 -> {USERNS_HOST_ID} ({USERNS_SIZE}), NVIDIA_VISIBLE_DEVICES=0:")
    print(result.stdout + result.stderr)
    print((tmp_path / "hook.log").read_text())
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("GPU 0: ") and f"(UUID: {gpu0_uuid})" in lines[0]
    assert lines[1] == "nvidia0"
    compute = lines[2].split()
    assert compute[0] == "compute" and float(compute[1]) > 0 and compute[2] == "cudaSuccess", lines[2]
    assert lines[3:5] == ["owner 0:0 /etc/ld.so.cache", "owner 0:0 /proc/driver/nvidia"]
    assert lines[5].split() == ["0", str(USERNS_HOST_ID), str(USERNS_SIZE)]


def test_crun_userns_shared_container_keeps_its_memory_limit(
    crun: Runc, make_rootfs, share_program: Path, tmp_path: Path
) -> None:
    """The same container sharing the GPU (NVC_SHARE_MEMORY_LIMIT=4Gi): inside its user namespace the
    shim still sees 4 GiB and gets out of memory past it."""
    rootfs = _userns_rootfs(make_rootfs, share_program, "rootfs-userns-share")
    env = {"NVIDIA_VISIBLE_DEVICES": "0", "NVC_SHARE_MEMORY_LIMIT": "4Gi"}
    bundle = make_bundle(
        tmp_path / "bundle",
        rootfs,
        ["sh", "-c", "share_gpu meminfo fill 256"],
        env=env,
        hooks=hook_with_log(tmp_path),
        id_map=(USERNS_HOST_ID, USERNS_SIZE),
    )
    result = crun.create_start(bundle, timeout=120)
    print(f"--- crun, uid/gid maps 0 -> {USERNS_HOST_ID} ({USERNS_SIZE}), {env}:")
    print(result.stdout + result.stderr)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert int(lines[0].split()[2]) == 4 << 30  # meminfo total
    assert lines[1] == "fill 4096 cudaErrorMemoryAllocation"

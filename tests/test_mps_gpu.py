"""GPU sharing's MPS backend on a real GPU (H100, driver 580): PyTorch in runc containers started
through nvc-py-hook with NVC_SHARE_BACKEND=mps shares GPU 0 through the driver's own MPS control
daemon, which the hook starts (again, when a container finds it dead) and the last poststop stops;
containers of two users; two weighted containers' split. Run by `make test-gpu` on the GPU machine; deselected elsewhere.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.bundle import make_bundle
from harness.gpufixtures import gpu0_uuid, hook_with_log, torch_rootfs  # noqa: F401  (fixtures)
from harness.runtime import Runc
from nvc.apply import mps
from nvc.plan import mps as mpsplan

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
import sharegpu  # noqa: E402

pytestmark = pytest.mark.gpu
GIB = 1 << 30
PYTHON = "/opt/torch/.venv/bin/python3"
SERVER = "nvidia-cuda-mps-server"


class Torch:
    """runc containers of the GPU machine's PyTorch, configured by the installed hook (prestart and
    poststop) with NVC_SHARE_BACKEND=mps for GPU 0; each started in a thread of its own."""

    def __init__(self, torch_rootfs: Callable[[str], Path], tmp_path: Path) -> None:
        runc = shutil.which("runc")
        if runc is None:
            pytest.skip("runc is not installed")
        self.runc = Runc(tmp_path / "state", runc)
        self.make_rootfs, self.tmp = torch_rootfs, tmp_path
        self.hooks = hook_with_log(tmp_path)
        self.rootfs: dict[str, Path] = {}
        self.results: dict[str, subprocess.CompletedProcess[str]] = {}
        self.threads: dict[str, threading.Thread] = {}

    def bundle(self, name: str, script: str, env: dict[str, str], uid: int = 0) -> Path:
        """Made before any thread starts a container: the rootfs cache builds one image at a time."""
        full = {"NVIDIA_VISIBLE_DEVICES": "0", "NVC_SHARE_BACKEND": "mps", "HOME": "/tmp", **env}
        self.rootfs[name] = self.make_rootfs(f"rootfs-{name}")
        bundle = make_bundle(self.tmp / name, self.rootfs[name], ["sh", "-c", script], env=full, hooks=self.hooks)
        spec = json.loads((bundle / "config.json").read_text())
        spec["process"]["user"] = {"uid": uid, "gid": uid}
        (bundle / "config.json").write_text(json.dumps(spec))
        return bundle

    def start(self, name: str, bundle: Path) -> None:
        def run() -> None:
            self.results[name] = self.runc.create_start(bundle, container_id=f"nvc-mps-{name}", timeout=300)

        self.threads[name] = threading.Thread(target=run)
        self.threads[name].start()

    def running(self) -> bool:
        return any(thread.is_alive() for thread in self.threads.values())

    def finish(self, name: str) -> subprocess.CompletedProcess[str]:
        self.threads[name].join(timeout=300)
        assert not self.threads[name].is_alive(), name
        result = self.results[name]
        print(f"--- {name} (exit {result.returncode}):\n{result.stdout}{result.stderr}")
        return result

    def reached(self, name: str, marker: str) -> None:
        """Wait for the container's process to create ``marker`` (a path inside it, under /tmp)."""
        deadline = time.monotonic() + 240
        while not (self.rootfs[name] / marker.lstrip("/")).exists():
            assert time.monotonic() < deadline and self.threads[name].is_alive(), f"{name} never reached {marker}"
            time.sleep(0.1)


def _servers() -> dict[int, int]:
    """The MPS servers running on this machine: pid -> its real uid."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and Path(os.readlink(entry / "exe")).name.startswith(SERVER):
                uid_line = next(line for line in (entry / "status").read_text().splitlines() if line.startswith("Uid:"))
                found[int(entry.name)] = int(uid_line.split()[1])
        except (OSError, StopIteration):
            continue
    return found


def _until(condition: Callable[[], object], what: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"waited {seconds:g} s for {what}"
        time.sleep(0.05)


def _memory_checked(result: subprocess.CompletedProcess[str]) -> None:
    """torch_share.py's lines under a 4 GiB limit: the budget shown, 3 GiB fits, 2 more do not."""
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    assert lines["mem_get_info"].split()[1] == str(4 * GIB)
    assert (lines["alloc3"], lines["alloc2"]) == ("ok", "OutOfMemoryError")


def test_two_pytorch_containers_share_gpu0_through_nvc_pys_mps_daemon(torch_rootfs, gpu0_uuid, tmp_path):  # noqa: F811
    """Each container's processes get their MPS client variables (the cap, the pinned memory limit,
    the class's priority) and the shim's 4 GiB budget on top (3 GiB fits, 2 more do not); both run
    while one daemon serves GPU 0; after the last, no daemon and no directory is left."""
    ctrs = Torch(torch_rootfs, tmp_path)
    script = (
        f"{PYTHON} -c \"import os; print('env', sorted(k + '=' + v for k, v in os.environ.items() "
        f"if k.startswith('CUDA_MPS_')))\"; {PYTHON} /gpu/torch_share.py"
    )
    envs = {
        "fast": {"NVC_SHARE_MEMORY_LIMIT": "4Gi", "NVC_SHARE_PRIORITY": "latency-critical"},
        "batch": {"NVC_SHARE_MEMORY_LIMIT": "4Gi", "NVC_SHARE_COMPUTE": "30", "NVC_SHARE_PRIORITY": "batch"},
    }
    bundles = {name: ctrs.bundle(name, script, env) for name, env in envs.items()}
    for name, bundle in bundles.items():
        ctrs.start(name, bundle)
    seen: list[mps.DeviceState] = []
    while ctrs.running():
        seen.extend(mps.status())
        time.sleep(0.2)
    results = {name: ctrs.finish(name) for name in bundles}
    for result in results.values():
        _memory_checked(result)
    pinned = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=5120M"
    pipe = "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"
    assert results["fast"].stdout.splitlines()[0] == f"env {['CUDA_MPS_CLIENT_PRIORITY=0', pinned, pipe]}"
    assert results["batch"].stdout.splitlines()[0] == (
        f"env {['CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30', 'CUDA_MPS_CLIENT_PRIORITY=1', pinned, pipe]}"
    )
    running = [state for state in seen if state.pid]
    assert running and {state.device for state in running} == {gpu0_uuid}
    assert len({state.pid for state in running}) == 1  # one daemon served both
    assert mps.status() == [] and not (Path(mpsplan.MPS_DIR) / gpu0_uuid).exists() and _servers() == {}


@pytest.mark.parametrize("killed", ["control daemon", "control daemon and server"])
def test_a_pytorch_client_whose_mps_daemon_is_killed(torch_rootfs, gpu0_uuid, tmp_path, killed):  # noqa: F811
    """The daemon a running PyTorch client uses is killed: the control daemon alone, or with its
    server (what a stop of the cgroup it runs in does where no systemd runs). The client's next CUDA
    call fails, and every later one (it does not hang); the next container's hook finds the daemon
    dead, starts one again and is served; after the last container no daemon, server or directory
    is left."""
    ctrs = Torch(torch_rootfs, tmp_path)
    limit = {"NVC_SHARE_MEMORY_LIMIT": "4Gi"}
    client = ctrs.bundle("client", f"{PYTHON} /gpu/torch_survive.py 30 /tmp/ready", limit)
    later = ctrs.bundle("later", f"{PYTHON} /gpu/torch_share.py", limit)
    ctrs.start("client", client)
    ctrs.reached("client", "/tmp/ready")
    time.sleep(2)  # its loop running
    [before], servers = mps.status(), _servers()
    assert before.pid and servers, (before, servers)
    os.kill(before.pid, signal.SIGKILL)
    if killed.endswith("server"):
        for pid in servers:
            os.kill(pid, signal.SIGKILL)
    killed_at = time.time()
    _until(lambda: mps.status()[0].pid is None, "the daemon to be seen dead")
    ctrs.start("later", later)
    restarted: list[int] = []
    while ctrs.threads["later"].is_alive():
        restarted.extend(state.pid for state in mps.status() if state.pid)
        time.sleep(0.2)
    _memory_checked(ctrs.finish("later"))
    assert restarted and before.pid not in restarted
    client_said = ctrs.finish("client").stdout.splitlines()
    after = [line for line in client_said if line.split()[0] != "alive" or float(line.split()[1]) > killed_at]
    print(f"{killed} killed at {killed_at:.3f} (servers {sorted(servers)}); the client after it: {after}")
    assert any(line.startswith("alive") and float(line.split()[1]) < killed_at for line in client_said)
    # measured (H100, driver 580): either kill ends the client's server connection; the next CUDA call
    # fails 2-41 ms later, and so does a new one: its context is lost, the process must start again
    [error] = [line for line in after if line.startswith("error")]
    assert "MPS server and the MPS client failed" in error and float(error.split()[1]) > killed_at
    ending = [line for line in after if not line.startswith("alive")]  # a step may end as it is killed
    assert [line.split()[0] for line in ending] == ["error", "retry", "done"] and ending[1] != "retry ok"
    assert mps.status() == [] and not (Path(mpsplan.MPS_DIR) / gpu0_uuid).exists()
    assert _servers() == {}


def test_mps_serves_one_user_at_a_time(torch_rootfs, gpu0_uuid, tmp_path):  # noqa: F811
    """Beside a running root client a container of uid 1000 is refused in one line naming both
    uids; once the root container is gone, a uid 1000 container is served, by an MPS server running
    as uid 1000, within its memory limit; nothing is left after it."""
    ctrs = Torch(torch_rootfs, tmp_path)
    limit = {"NVC_SHARE_MEMORY_LIMIT": "4Gi"}
    root = ctrs.bundle("root", f"{PYTHON} /gpu/torch_survive.py 8 /tmp/ready", limit)
    refused = ctrs.bundle("refused", "true", limit, uid=1000)
    user = ctrs.bundle("user", f"{PYTHON} /gpu/torch_share.py", limit, uid=1000)
    ctrs.start("root", root)
    ctrs.reached("root", "/tmp/ready")
    root_servers = _servers()
    ctrs.start("refused", refused)
    said = ctrs.finish("refused")
    assert said.returncode != 0
    assert (
        f"nvc-py-hook: container error: {gpu0_uuid}: its MPS daemon serves uid 0 (containers nvc-mps-root), this "
        "container runs as uid 1000: MPS serves one user at a time" in said.stderr
    )
    assert ctrs.finish("root").returncode == 0
    assert mps.status() == []
    ctrs.start("user", user)
    uids: set[int] = set()
    while ctrs.running():
        uids.update(_servers().values())
        time.sleep(0.2)
    _memory_checked(ctrs.finish("user"))
    print(f"servers' uids: for the root container {sorted(set(root_servers.values()))}, for uid 1000 {sorted(uids)}")
    assert set(root_servers.values()) == {0} and uids == {1000}
    assert mps.status() == [] and not (Path(mpsplan.MPS_DIR) / gpu0_uuid).exists() and _servers() == {}


def test_weights_split_two_mps_containers_whichever_starts_first(torch_rootfs, gpu0_uuid, tmp_path):  # noqa: F811
    """Two PyTorch containers on nvc-py's MPS daemon run the transformer step from one moment on, weights 1
    and 3, the lighter one started first (alone, it has no duty cycle): once the heavier one comes, the
    lighter one's limits file gets the duty cycle of 1:3 and its processes put it in force, so the heavier
    one's part of their summed throughput is its weight's within 5 points. Prints the pair's sum, each as
    % of the step alone without MPS (issue 42's second goal asks 120 %: a figure of the workload, shown)."""
    alone = sharegpu.torch_result(sharegpu.torch_run("transformer", sharegpu.shim_env(None), 6))[0]
    ctrs = Torch(torch_rootfs, tmp_path)
    start_at = time.time() + 90  # both containers up, PyTorch imported and warmed up by then
    run = f"touch /tmp/up; {PYTHON} /gpu/torch_load.py transformer 6 {start_at}"
    # NVC_SHARE_LOG=2: each container's shim says at exit where its launches waited and what its looks at its
    # backlog found (finish prints it), for a run where the lighter one makes no step (docs/performance.md)
    bundles = {w: ctrs.bundle(f"w{w}", run, {"NVC_SHARE_WEIGHT": w, "NVC_SHARE_LOG": "2"}) for w in ("1", "3")}
    ctrs.start("w1", bundles["1"])
    ctrs.reached("w1", "/tmp/up")
    ctrs.start("w3", bundles["3"])
    rates = {}
    for weight in ("1", "3"):
        result = ctrs.finish(f"w{weight}")
        assert result.returncode == 0 and "late" not in result.stdout, result.stdout + result.stderr
        rates[weight] = 100 * sharegpu.torch_output_of(result.stdout)[0] / alone
    part = 100 * rates["3"] / (rates["1"] + rates["3"])
    print(
        f"MPS 1:3, the lighter first: {rates['1']:.1f} + {rates['3']:.1f} = {sum(rates.values()):.1f} % of one alone "
        f"({alone:.2f} it/s); the heavier's part {part:.1f} %"
    )
    assert abs(part - 75) <= 5
    assert mps.status() == [] and not (Path(mpsplan.MPS_DIR) / gpu0_uuid).exists()

"""The Kubernetes device plugin (``nvc-py k8s device-plugin``) against a kubelet stand-in, on the fake driver.

The stand-in (tests/harness/kubelet.py) speaks the kubelet's side of the v1beta1 gRPC API on a
temporary kubelet.sock; the plugin runs as the installed ``nvc-py`` in this test's private mount
namespace, where the fake driver (a test double: 2 GPUs, the A100 with 2 MIG devices) is shown at
the real /proc and /dev paths. XIDs are injected through the fake NVML's event file.
"""

from __future__ import annotations

import os
import pickle
import re
import shutil
import signal
import subprocess
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from harness.fakegpus import A100, H100, MIG_2G, MIG_3G, uuids as _uuids
from harness.installed import SCRIPTS

GIB = 1 << 30
GPUS3 = tuple(f"GPU-11111111-2222-4333-8444-5555555555{i:02d}" for i in range(3))  # machines/three-gpu.yaml
XID_FILE = "var/lib/fake-nvml/xid-events"  # in the driver root (tests/fakedriver/src/libnvidia-ml/events.c)


class PluginRun:
    """A running ``nvc-py k8s device-plugin`` and its log."""

    def __init__(self, config: Path, directory: Path, log: Path) -> None:
        self.log = log
        self.health_file = log.with_suffix(".health.json")  # not the host's /run/nvc-py/device-plugin.json
        env = {**os.environ, "NVC_PY_HOOK_SOCKET": "none"}
        with log.open("wb") as out:
            self.process = subprocess.Popen([str(SCRIPTS / "nvc-py"), "k8s", "device-plugin", "--config", str(config),
                                             "--device-plugin-dir", str(directory),
                                             "--health-file", str(self.health_file)], stdout=out,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)

    def text(self) -> str:
        return self.log.read_text()

    def wait_log(self, pattern: str, timeout: float = 20) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(pattern, self.text())
            if found:
                return found.group(0)
            assert self.process.poll() is None, f"the plugin exited ({self.process.returncode}):\n{self.text()}"
            time.sleep(0.05)
        raise AssertionError(f"no {pattern!r} in the plugin's log:\n{self.text()}")

    def stop(self) -> int:
        """SIGTERM once it logged its first line (its handler is set by then); its exit status."""
        if self.process.poll() is None:
            self.wait_log("device-plugin: ")
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise


def _config(tmp_path: Path, root: Path, k8s: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(f"root: {root}\nload-kmods: false\nlog: {{file: {tmp_path / 'hook.log'}}}\nk8s: {k8s}\n")
    return path


def in_child(body: Callable[..., Any], *args: Any) -> Any:
    """``body(*args)`` in a forked child, its result back (pickled), or the test failed with its traceback.

    gRPC's threads must never live in the pytest process: they outlive every test, and a process with
    threads cannot setns back out of a fake driver's namespace (tests/fakedriver/activate.py). So the
    stand-in, and every gRPC call, runs in a child; the plugin and containerd run from the parent.
    """
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            out = ("ok", body(*args))
        except BaseException:  # noqa: BLE001 - everything goes back to the parent
            out = ("error", traceback.format_exc())
        with os.fdopen(write, "wb") as f:
            pickle.dump(out, f)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    status, value = pickle.loads(data) if data else ("error", "the child died without an answer")
    if status != "ok":
        pytest.fail(f"in the kubelet stand-in's process:\n{value}", pytrace=False)
    return value


@contextmanager
def kubelet(directory: Path) -> Iterator[Any]:
    """The stand-in serving on ``directory`` (in a child of :func:`in_child` only)."""
    from harness.kubelet import Kubelet

    node = Kubelet(directory)
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    """A short device plugin directory (a socket's path has at most 107 bytes; pytest's are long)."""
    directory = Path(tempfile.mkdtemp(prefix="nvc-k8s-"))
    yield directory
    shutil.rmtree(directory)


@pytest.fixture
def run_plugin(plugin_dir: Path, tmp_path: Path) -> Iterator[Callable[..., PluginRun]]:
    runs: list[PluginRun] = []

    def start(root: Path, k8s: str = "{}") -> PluginRun:
        run = PluginRun(_config(tmp_path, root, k8s), plugin_dir, tmp_path / f"plugin{len(runs)}.log")
        runs.append(run)
        return run

    yield start
    for run in runs:
        assert run.stop() == 0, run.text()


def _whole_and_mig(directory: Path) -> None:
    with kubelet(directory) as node:
        gpu = node.plugin("nvidia.com/gpu")
        assert gpu.options.get_preferred_allocation_available and not gpu.options.pre_start_required
        assert gpu.devices() == {H100: "Healthy"}
        assert node.plugin("nvidia.com/mig-2g.10gb").devices() == {MIG_2G: "Healthy"}
        assert node.plugin("nvidia.com/mig-3g.20gb").devices() == {MIG_3G: "Healthy"}
        assert node.plugin("nvc-py.io/gpu-share").devices() == {}
        assert {r.version for r in node.registrations} == {"v1beta1"}
        assert {r.endpoint for r in node.registrations} == {
            "nvc-py-nvidia.com_gpu.sock", "nvc-py-nvidia.com_mig-2g.10gb.sock", "nvc-py-nvidia.com_mig-3g.20gb.sock",
            "nvc-py-nvc-py.io_gpu-share.sock"}
        (answer,) = gpu.allocate([H100])
        assert dict(answer.envs) == {"NVIDIA_VISIBLE_DEVICES": H100}
        assert [d.name for d in answer.cdi_devices] == [f"nvidia.com/gpu={H100}"]
        (mig,) = node.plugin("nvidia.com/mig-3g.20gb").allocate([MIG_3G])
        assert dict(mig.envs) == {"NVIDIA_VISIBLE_DEVICES": MIG_3G}
        with pytest.raises(Exception, match="unknown device ID 'GPU-nope'"):
            gpu.allocate(["GPU-nope"])


def test_whole_gpus_and_mig_devices(active_2gpu, plugin_dir: Path, run_plugin) -> None:
    """Registration, capacity and Allocate answers: the H100 as nvidia.com/gpu by UUID, each MIG profile of
    the A100 as a resource of its own (the MIG-enabled A100 is no whole GPU), no share units."""
    run = run_plugin(active_2gpu.root, "{cdi-devices: true}")
    in_child(_whole_and_mig, plugin_dir)
    run.wait_log(r"registered nvidia\.com/gpu \(1 devices\)")


# ---------------------------------------------------------------- shares, through containerd and nvc-py-runtime

def _shares(directory: Path) -> dict[str, str]:
    with kubelet(directory) as node:
        share = node.plugin("nvc-py.io/gpu-share")
        units = sorted(share.devices(), key=lambda unit: int(unit.rpartition("::")[2]))
        assert units == [f"{H100}::{k}" for k in range(10)]  # 80 GiB in 8 GiB slices
        assert node.plugin("nvidia.com/gpu").devices() == {}  # a shared GPU is not also a whole one
        assert share.preferred(units[::-1], 3, must=[units[4]]) [0] == units[4]
        first, second, third = share.allocate(units[:2], units[2:9], units[9:])
        limits = [int(answer.envs[f"NVC_SHARE_MEMORY_LIMIT_{H100}"]) for answer in (first, second, third)]
        assert limits == [16 * GIB, 56 * GIB, 8 * GIB] and sum(limits) == 80 * GIB  # never more than the GPU has
        assert [answer.envs[f"NVC_SHARE_COMPUTE_{H100}"] for answer in (first, second, third)] == ["20", "70", "10"]
        assert [answer.envs[f"NVC_SHARE_WEIGHT_{H100}"] for answer in (first, second, third)] == ["2", "7", "1"]
        with pytest.raises(Exception, match="unknown device ID"):
            share.allocate([H100])
        return dict(first.envs)


def _ctr_wrapper(tmp_path: Path, config: Path) -> Path:
    wrapper = tmp_path / "runtime.sh"  # containerd hands shims no environment of our choosing
    wrapper.write_text(f'#!/bin/sh\nNVC_PY_CONFIG={config} exec {SCRIPTS / "nvc-py-runtime"} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


SEE = ["sh", "-c", "nvidia-smi -L 2>&1; grep -h -e memory_limit -e compute_ /var/run/nvc-share/limits 2>/dev/null; "
       "nvidia-smi --query-gpu=memory.total --format=csv,noheader 2>/dev/null; "
       "ls /dev/nvidia-caps-imex-channels 2>/dev/null; true"]


def _in_containers(tmp_path: Path, rootfs_cache, *runs: tuple[str, dict[str, str], list]) -> list:
    """SEE's output in a real container (containerd, `ctr`, nvc-py-runtime with tmp_path's config) per
    (name, env, mounts as an Allocate answers them) of ``runs``."""
    from harness.containerd import Containerd

    wrapper = _ctr_wrapper(tmp_path, tmp_path / "config.yaml")
    daemon = Containerd(tmp_path / "containerd", rootfs_cache)
    try:
        image = daemon.image()
        results = []
        for name, env, mounts in runs:
            binds = [f"--mount=type=bind,src={host},dst={ctr},options=rbind:ro" for ctr, host, _ in mounts]
            result = daemon.run(image, name, SEE, env=env, extra_args=binds, runc_binary=str(wrapper))
            assert result.returncode == 0, result.stderr
            results.append(result.stdout)
        return results
    finally:
        daemon.stop()


def _answered(answer) -> list:
    """An Allocate answer's env and mounts, as plain values a forked child can return."""
    return [dict(answer.envs), [(m.container_path, m.host_path, m.read_only) for m in answer.mounts]]


def test_shares_accounting_and_a_container_with_the_allocated_share(active_2gpu, plugin_dir: Path, run_plugin,
                                                                     rootfs_cache, tmp_path: Path) -> None:
    """The H100 shared in 8 GiB units: the units of all containers add up to its memory; one container's
    Allocate env, given to a real container (containerd, `ctr`, nvc-py-runtime), shows it exactly that GPU,
    the memory budget (the fake nvidia-smi through the shim reports it), compute cap and weight."""
    run = run_plugin(active_2gpu.root, "{share-gpus: [0], share-slice: 8Gi}")
    envs = in_child(_shares, plugin_dir)
    assert envs == {"NVIDIA_VISIBLE_DEVICES": H100, f"NVC_SHARE_MEMORY_LIMIT_{H100}": str(16 * GIB),
                    f"NVC_SHARE_COMPUTE_{H100}": "20", f"NVC_SHARE_WEIGHT_{H100}": "2"}
    (seen,) = _in_containers(tmp_path, rootfs_cache, ("nvc-k8s-share", envs, []))
    assert _uuids(seen) == [H100]
    assert seen.splitlines()[1:] == [f"memory_limit.{H100}={16 * GIB}", f"compute_percent.{H100}=20",
                                     f"compute_weight.{H100}=2", "16384 MiB"]
    run.wait_log(rf"Allocate nvc-py\.io/gpu-share \[.*\]: NVC_SHARE_COMPUTE_{H100}=20")


def _share_mounts(directory: Path) -> list:
    with kubelet(directory) as node:
        share = node.plugin("nvc-py.io/gpu-share")
        (answer,) = share.allocate(sorted(share.devices(), key=lambda unit: int(unit.rpartition("::")[2]))[:2])
        return _answered(answer)


def test_a_pods_own_env_cannot_replace_its_share_limits(active_2gpu, plugin_dir: Path, run_plugin,
                                                        rootfs_cache, tmp_path: Path) -> None:
    """The kubelet puts a device plugin's env before the pod's own and the runtime keeps the last, so
    limits passed as env are the pod's to replace. With volume mounts the limits travel as /dev/null
    mounts the hook reads instead of the env: a pod setting NVC_SHARE_MEMORY_LIMIT=1Ti and a 100 %
    compute share for itself still gets its 16 GiB, 20 % and weight 2."""
    run_plugin(active_2gpu.root, "{share-gpus: [0], share-slice: 8Gi, device-list-strategy: volume-mounts}\n"
                                 "accept-volume-mounts: true\naccept-envvar-when-unprivileged: false")
    envs, mounts = in_child(_share_mounts, plugin_dir)
    assert envs == {"NVIDIA_VISIBLE_DEVICES": "void"}
    share_dir = "/var/run/nvidia-container-devices/share/"
    assert sorted(mounts) == [(f"/var/run/nvidia-container-devices/{H100}", "/dev/null", True),
                              (f"{share_dir}NVC_SHARE_COMPUTE_{H100}=20", "/dev/null", True),
                              (f"{share_dir}NVC_SHARE_MEMORY_LIMIT_{H100}={16 * GIB}", "/dev/null", True),
                              (f"{share_dir}NVC_SHARE_WEIGHT_{H100}=2", "/dev/null", True)]
    hostile = {**envs, "NVC_SHARE_MEMORY_LIMIT": "1Ti", f"NVC_SHARE_COMPUTE_{H100}": "100"}
    (seen,) = _in_containers(tmp_path, rootfs_cache, ("nvc-k8s-share-mounts", hostile, mounts))
    assert _uuids(seen) == [H100]
    assert seen.splitlines()[1:] == [f"memory_limit.{H100}={16 * GIB}", f"compute_percent.{H100}=20",
                                     f"compute_weight.{H100}=2", "16384 MiB"]


def _volume_mounts(directory: Path) -> list:
    with kubelet(directory) as node:
        (answer,) = node.plugin("nvidia.com/mig-3g.20gb").allocate([MIG_3G])
        return _answered(answer)


def test_volume_mounts_strategy_and_a_pod_asking_for_no_gpu(active_2gpu, plugin_dir: Path, run_plugin,
                                                             rootfs_cache, tmp_path: Path) -> None:
    """The void policy: with device-list-strategy volume-mounts the plugin answers /dev/null mounts and
    NVIDIA_VISIBLE_DEVICES=void; a hook that accepts volume mounts and ignores the variable in
    unprivileged containers gives the allocated MIG device, and nothing to a pod that asked for no GPU
    although its image says NVIDIA_VISIBLE_DEVICES=all."""
    run_plugin(active_2gpu.root, "{device-list-strategy: volume-mounts}\n"
                                 "accept-volume-mounts: true\naccept-envvar-when-unprivileged: false")
    envs, mounts = in_child(_volume_mounts, plugin_dir)
    assert envs == {"NVIDIA_VISIBLE_DEVICES": "void"}
    assert mounts == [(f"/var/run/nvidia-container-devices/{MIG_3G}", "/dev/null", True)]
    mig, none, legacy, imex = _in_containers(
        tmp_path, rootfs_cache, ("nvc-k8s-mig", envs, mounts), ("nvc-k8s-none", {"NVIDIA_VISIBLE_DEVICES": "all"}, []),
        ("nvc-k8s-legacy", {"CUDA_VERSION": "12.0"}, []),
        ("nvc-k8s-imex", {**envs, "NVIDIA_IMEX_CHANNELS": "0,1"}, mounts))
    assert _uuids(mig) == [A100, MIG_3G]
    assert "nvidia-smi: not found" in none, none
    # a legacy CUDA image's default of all GPUs, and IMEX channels a pod asks for itself, pass the same policy
    assert "nvidia-smi: not found" in legacy, legacy
    assert _uuids(imex) == [A100, MIG_3G] and "channel" not in imex, imex


def _whole_and_shares(directory: Path) -> list:
    with kubelet(directory) as node:
        (whole,) = node.plugin("nvidia.com/gpu").allocate([GPUS3[0]])
        (shares,) = node.plugin("nvc-py.io/gpu-share").allocate([f"{GPUS3[2]}::0", f"{GPUS3[1]}::0", f"{GPUS3[1]}::1"])
        return [_answered(whole), _answered(shares)]


def test_a_whole_gpu_beside_shares_of_two_others_in_one_container(active_3gpu, plugin_dir: Path, run_plugin,
                                                                   rootfs_cache, tmp_path: Path) -> None:
    """A pod asking for one whole GPU and shares of two others: each share's limit lands on its own GPU
    (keyed by UUID end to end: plugin, hook, limits file, shim), the whole GPU stays unlimited although
    the container numbers it first."""
    run_plugin(active_3gpu.root, "{share-gpus: [1, 2], share-slice: 8Gi, device-list-strategy: volume-mounts}\n"
                                 "accept-volume-mounts: true\naccept-envvar-when-unprivileged: false")
    (whole_envs, whole_mounts), (share_envs, share_mounts) = in_child(_whole_and_shares, plugin_dir)
    assert whole_envs == share_envs == {"NVIDIA_VISIBLE_DEVICES": "void"}
    (seen,) = _in_containers(tmp_path, rootfs_cache, ("nvc-k8s-mixed", whole_envs, [*whole_mounts, *share_mounts]))
    assert _uuids(seen) == list(GPUS3)
    gpu1, gpu2 = GPUS3[1:]
    assert seen.splitlines()[3:] == [f"memory_limit.{gpu1}={16 * GIB}", f"memory_limit.{gpu2}={8 * GIB}",
                                     f"compute_percent.{gpu1}=20", f"compute_percent.{gpu2}=10",
                                     f"compute_weight.{gpu1}=2", f"compute_weight.{gpu2}=1",
                                     "81920 MiB", "16384 MiB", "8192 MiB"]


# ---------------------------------------------------------------- kubelet restarts, health, no NVML

def _reregister(directory: Path) -> None:
    with kubelet(directory) as node:
        before = node.plugin("nvidia.com/gpu")
        assert before.devices() == {H100: "Healthy"}
        node.plugin("nvidia.com/mig-3g.20gb")  # the last one registered: the first registration is complete
        node.restart()  # a new kubelet.sock, the plugin's sockets removed
        after = node.plugin("nvidia.com/gpu", registrations=2)
        assert after is not before and after.devices() == {H100: "Healthy"}
        (answer,) = after.allocate([H100])
        assert dict(answer.envs) == {"NVIDIA_VISIBLE_DEVICES": H100}
        assert node.plugin("nvidia.com/mig-2g.10gb", registrations=2).devices() == {MIG_2G: "Healthy"}


def _dropped(directory: Path) -> None:
    with kubelet(directory) as node:
        first = node.plugin("nvidia.com/gpu")
        assert first.devices() == {H100: "Healthy"}
        first.close()  # the kubelet ends the stream, as it does when an older plugin's stream ends
        again = node.plugin("nvidia.com/gpu", registrations=2)
        assert again is not first and again.devices() == {H100: "Healthy"}


def test_registers_again_when_the_kubelet_drops_a_stream(active_2gpu, plugin_dir: Path, run_plugin) -> None:
    """An older instance of the plugin stopping (a restart that overlaps the new one) removes the new
    one's socket by its path and makes the kubelet drop its stream: seen on a real kubelet as a
    flap until the socket's absence was noticed. A stream the kubelet ends is reason enough to register."""
    run = run_plugin(active_2gpu.root)
    in_child(_dropped, plugin_dir)
    run.wait_log("kubelet restarted or our sockets removed: registering again")


def test_reregisters_when_the_kubelet_restarts(active_2gpu, plugin_dir: Path, run_plugin) -> None:
    run = run_plugin(active_2gpu.root)
    in_child(_reregister, plugin_dir)
    run.wait_log("kubelet restarted or our sockets removed: registering again")


def _health(directory: Path, xids: Path, log: Path) -> None:
    def wait_for(text: str) -> None:
        deadline = time.monotonic() + 20
        while text not in log.read_text():
            assert time.monotonic() < deadline, f"no {text!r} in the plugin's log:\n{log.read_text()}"
            time.sleep(0.05)

    def inject(uuid: str, xid: int) -> None:
        with xids.open("a") as f:
            f.write(f"{uuid} {xid}\n")

    with kubelet(directory) as node:
        gpu, mig_2g, mig_3g = (node.plugin(name) for name in ("nvidia.com/gpu", "nvidia.com/mig-2g.10gb",
                                                                "nvidia.com/mig-3g.20gb"))
        assert gpu.devices() == {H100: "Healthy"}
        wait_for(f"health: watching critical XIDs of {H100}, {A100}")
        inject(H100, 43)  # an application's own fault (k8s.ignored-xids): the GPU stays healthy
        wait_for(f"health: XID 43 on {H100} ignored")
        inject(H100, 79)
        assert gpu.devices(lambda d: d[H100] == "Unhealthy") == {H100: "Unhealthy"}
        inject(MIG_2G, 48)  # a MIG device's XID: that MIG device only
        assert mig_2g.devices(lambda d: d[MIG_2G] == "Unhealthy") == {MIG_2G: "Unhealthy"}
        assert mig_3g.devices() == {MIG_3G: "Healthy"}
        # xid-recovery (2 s) without another XID, and NVML still finds them: healthy again
        assert gpu.devices(lambda d: d[H100] == "Healthy") == {H100: "Healthy"}
        assert mig_2g.devices(lambda d: d[MIG_2G] == "Healthy") == {MIG_2G: "Healthy"}
        inject(A100, 94)  # a GPU-wide XID on the MIG-enabled A100: every MIG device on it
        assert mig_3g.devices(lambda d: d[MIG_3G] == "Unhealthy") == {MIG_3G: "Unhealthy"}
        assert mig_2g.devices(lambda d: d[MIG_2G] == "Unhealthy") == {MIG_2G: "Unhealthy"}


def test_health_follows_critical_xids(active_2gpu, plugin_dir: Path, run_plugin, tmp_path: Path) -> None:
    """XIDs injected through the fake NVML's events (nvmlEventSetWait_v2): unhealthy on a critical one,
    not on an ignored one, a MIG device alone on its own XID, healthy again after xid-recovery."""
    xids = active_2gpu.root / XID_FILE
    made = next(p for p in reversed(xids.parents) if not p.exists())  # the first directory made here
    xids.parent.mkdir(parents=True)
    xids.write_text("")
    xids.chmod(0o644)  # read by the driver helper, which runs as nobody
    try:
        run = run_plugin(active_2gpu.root, "{xid-recovery: 2}")
        in_child(_health, plugin_dir, xids, run.log)
    finally:
        shutil.rmtree(made)  # the fake driver is the session's: leave it as it was
    assert f"health: XID 79 on {H100}: unhealthy" in run.text()
    assert f"health: {H100} healthy again" in run.text()


def _no_devices(directory: Path) -> None:
    with kubelet(directory) as node:
        assert node.plugin("nvidia.com/gpu").devices() == {}
        assert node.plugin("nvc-py.io/gpu-share").devices() == {}


def test_no_nvml_is_one_line_and_no_crash(plugin_dir: Path, run_plugin, tmp_path: Path) -> None:
    """A driver root without libnvidia-ml: one log line, the plugin keeps running (trying again each
    nvml-retry), registered with no devices (the kubelet shows a capacity of 0)."""
    empty = tmp_path / "no-driver"
    empty.mkdir()
    run = run_plugin(empty, "{share-gpus: [0], nvml-retry: 1}")
    in_child(_no_devices, plugin_dir)
    time.sleep(3)  # three more tries
    assert run.process.poll() is None
    lines = [line for line in run.text().splitlines() if "NVML unavailable" in line]
    assert len(lines) == 1 and lines[0].endswith("libnvidia-ml.so.1: cannot open shared object file: No such file or "
                                                  "directory): advertising no devices; trying again every 1 s"), lines


def _published(run: PluginRun, want: dict[str, tuple[int, int]], timeout: float = 20) -> None:
    """Wait for the plugin's health file to say ``want`` (resource -> healthy, unhealthy), as the
    exporter reads it."""
    from nvc.k8s import published

    deadline = time.monotonic() + timeout
    while True:
        record = published.read(str(run.health_file))
        found = {r.name: (r.healthy, r.unhealthy) for r in record.resources} if record else None
        if found == want:
            return
        assert time.monotonic() < deadline and run.process.poll() is None, (found, run.text())
        time.sleep(0.05)


def test_the_health_file_follows_what_the_kubelet_is_told(active_2gpu, plugin_dir: Path, run_plugin) -> None:
    """The file `nvc-py exporter` reads: each resource's healthy and unhealthy count, every device unhealthy
    while NVML fails (its helper killed), healthy again once it answers; removed when the plugin stops."""
    run = run_plugin(active_2gpu.root, "{nvml-retry: 1}")
    healthy = {"nvidia.com/gpu": (1, 0), "nvidia.com/mig-2g.10gb": (1, 0), "nvidia.com/mig-3g.20gb": (1, 0),
               "nvc-py.io/gpu-share": (0, 0)}
    _published(run, healthy)
    os.kill(_driver_helper(run.process.pid), signal.SIGKILL)
    _published(run, {name: (0, h + u) for name, (h, u) in healthy.items()})
    _published(run, healthy)
    assert run.stop() == 0
    assert not run.health_file.exists()


def _driver_helper(plugin: int) -> int:
    """The plugin's NVML helper: its child named nvc:[driver]."""
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "comm").read_text().strip() == "nvc:[driver]" and \
                    int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == plugin:
                return int(entry.name)
        except OSError:
            continue
    raise AssertionError(f"no nvc:[driver] below {plugin}")


def _nvml_dies(directory: Path, plugin: int) -> None:
    with kubelet(directory) as node:
        gpu = node.plugin("nvidia.com/gpu")
        assert gpu.devices() == {H100: "Healthy"}
        node.plugin("nvidia.com/mig-3g.20gb")  # every resource registered
        os.kill(_driver_helper(plugin), signal.SIGKILL)
        assert gpu.devices(lambda d: d[H100] == "Unhealthy") == {H100: "Unhealthy"}
        again = node.plugin("nvidia.com/gpu", registrations=2)  # NVML back: discovered and registered anew
        assert again.devices(lambda d: d[H100] == "Healthy") == {H100: "Healthy"}


def test_nvml_failing_later_makes_devices_unhealthy_until_it_answers(active_2gpu, plugin_dir: Path,
                                                                      run_plugin) -> None:
    run = run_plugin(active_2gpu.root, "{nvml-retry: 1}")
    in_child(_nvml_dies, plugin_dir, run.process.pid)
    run.wait_log("NVML failed .*: every device unhealthy until it answers again")
    assert run.process.poll() is None

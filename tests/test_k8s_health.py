"""The Kubernetes device plugin (``nvc-py k8s device-plugin``) against a kubelet stand-in, on the fake driver.

The stand-in (tests/harness/kubelet.py) speaks the kubelet's side of the v1beta1 gRPC API on a
temporary kubelet.sock; the plugin runs as the installed ``nvc-py`` in this test's private mount
namespace, where the fake driver (a test double: 2 GPUs, the A100 with 2 MIG devices) is shown at
the real /proc and /dev paths. XIDs are injected through the fake NVML's event file.

Here: a kubelet that drops a stream or restarts, health following XIDs and NVML, the health file.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

from harness.deviceplugin import XID_FILE, PluginRun, in_child, kubelet, plugin_dir, run_plugin  # noqa: F401  (fixtures)
from harness.fakegpus import A100, H100, MIG_2G, MIG_3G

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
        gpu, mig_2g, mig_3g = (
            node.plugin(name) for name in ("nvidia.com/gpu", "nvidia.com/mig-2g.10gb", "nvidia.com/mig-3g.20gb")
        )
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
    assert len(lines) == 1 and lines[0].endswith(
        "libnvidia-ml.so.1: cannot open shared object file: No such file or "
        "directory): advertising no devices; trying again every 1 s"
    ), lines


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
    healthy = {
        "nvidia.com/gpu": (1, 0),
        "nvidia.com/mig-2g.10gb": (1, 0),
        "nvidia.com/mig-3g.20gb": (1, 0),
        "nvc-py.io/gpu-share": (0, 0),
    }
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
            if (
                entry.name.isdigit()
                and (entry / "comm").read_text().strip() == "nvc:[driver]"
                and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == plugin
            ):
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


def test_nvml_failing_later_makes_devices_unhealthy_until_it_answers(active_2gpu, plugin_dir: Path, run_plugin) -> None:
    run = run_plugin(active_2gpu.root, "{nvml-retry: 1}")
    in_child(_nvml_dies, plugin_dir, run.process.pid)
    run.wait_log("NVML failed .*: every device unhealthy until it answers again")
    assert run.process.poll() is None

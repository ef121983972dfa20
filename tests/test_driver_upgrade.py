"""A driver upgrade without restarts, on the fake driver (a test double) upgraded in place
(tests/harness/driverupgrade.py: the root's files and /proc/driver swapped for another version's):
the hook server, the warm driver helper, ``nvc-py cdi refresh``, the device plugin and the DRA driver
serve the new driver's files, each without a restart.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import yaml

from harness.bundle import make_bundle
from harness.deviceplugin import in_child, plugin_dir, run_plugin  # noqa: F401  (fixtures)
from harness.dra import DRIVER, api_server, call, kubelet_dir, run_driver  # noqa: F401  (fixtures)
from harness.driverupgrade import UPGRADED_VERSION, Upgradable, fake_2gpu_upgraded, upgradable  # noqa: F401
from harness.fakegpus import DRIVER_VERSION
from harness.hookserver import client_hook, hook_server
from harness.installed import HOOK, SCRIPTS

# The versioned libcuda files the container gets (a mount point an earlier container's start left in
# the shared rootfs is an empty file: not one)
LIBCUDA = ["sh", "-c", 'for f in /usr/lib/x86_64-linux-gnu/libcuda.so.*.*; do [ -s "$f" ] && basename "$f"; done; true']


def test_the_hook_server_serves_the_upgraded_drivers_files(
    upgradable: Upgradable, runc, debian_rootfs: Path, tmp_path: Path
) -> None:
    """One server process: a container started before the upgrade gets the old driver's libraries, one
    started after it the new driver's (and none of the old's)."""
    config = tmp_path / "config.yaml"
    config.write_text(f"root: {upgradable.root}\nload-kmods: false\nlog: {{file: {tmp_path / 'hook.log'}}}\n")
    sock = tmp_path / "run" / "hook.sock"

    def start(name: str) -> str:
        hook = client_hook(HOOK, sock, [f"NVC_PY_CONFIG={config}"])
        bundle = make_bundle(
            tmp_path / name, debian_rootfs, LIBCUDA, env={"NVIDIA_VISIBLE_DEVICES": "0"}, hooks={"prestart": [hook]}
        )
        result = runc.create_start(bundle, container_id=f"nvc-upgrade-{name}")
        assert result.returncode == 0, result.stderr
        return result.stdout

    with hook_server(HOOK, sock) as server:
        assert start("before").split() == [f"libcuda.so.{DRIVER_VERSION}"]
        upgradable.upgrade()
        assert start("after").split() == [f"libcuda.so.{UPGRADED_VERSION}"]
        assert server.poll() is None
    log = [json.loads(line) for line in (tmp_path / "hook.log").read_text().splitlines()]
    assert [(e["outcome"], e["via"]) for e in log] == [("configured", "server")] * 2


def test_a_warm_driver_helper_started_before_the_upgrade_is_not_used(upgradable: Upgradable) -> None:
    """What the hook server's idle workers keep: a driver helper with NVML loaded from the old driver.
    A call after the upgrade gets a helper of the new driver instead."""
    from nvc.rpc import driver_service

    root = str(upgradable.root)
    assert driver_service.inventory(root, None).driver_version == DRIVER_VERSION
    warm = driver_service.prestart(root)
    warm.settle()
    upgradable.upgrade()
    assert driver_service.inventory(root, None).driver_version == UPGRADED_VERSION


def _nvc_py(*args: str) -> str:
    result = subprocess.run([str(SCRIPTS / "nvc-py"), *args], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _libcuda(spec: dict) -> list[str]:
    return sorted(Path(m["hostPath"]).name for m in spec["containerEdits"]["mounts"] if "/libcuda.so." in m["hostPath"])


def test_cdi_refresh_regenerates_nvc_pys_specs_as_they_were_made(upgradable: Upgradable, tmp_path: Path) -> None:
    """Two specs of nvc-py's (YAML by index, JSON by UUID) and one of someone else's: before the upgrade
    both of nvc-py's are today's; after it each is made again in its own format and naming, with the
    new driver's files, and the other is left alone."""
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    root = ["--root", str(upgradable.root)]
    _nvc_py(*root, "cdi", "generate", "--output", str(cdi / "nvidia.yaml"))
    _nvc_py(*root, "cdi", "generate", "--device-name-strategy", "uuid", "--output", str(cdi / "uuid.json"))
    theirs = "cdiVersion: 0.5.0\nkind: example.com/gpu\ndevices: [{name: x, containerEdits: {env: [A=1]}}]\n"
    (cdi / "theirs.yaml").write_text(theirs)
    refresh = [*root, "cdi", "refresh", "--spec-dir", str(cdi)]
    assert _nvc_py(*refresh) == f"{cdi}/nvidia.yaml: today's already\n{cdi}/uuid.json: today's already\n"
    upgradable.upgrade()
    assert _nvc_py(*refresh) == f"refreshed {cdi}/nvidia.yaml\nrefreshed {cdi}/uuid.json\n"
    by_index = yaml.safe_load((cdi / "nvidia.yaml").read_text())
    by_uuid = json.loads((cdi / "uuid.json").read_text())
    assert _libcuda(by_index) == _libcuda(by_uuid) == [f"libcuda.so.{UPGRADED_VERSION}"]
    assert "0" in [d["name"] for d in by_index["devices"]]
    assert all(d["name"] == "all" or d["name"].startswith(("GPU-", "MIG-")) for d in by_uuid["devices"])
    assert (cdi / "theirs.yaml").read_text() == theirs
    assert _nvc_py(*refresh).count("today's already") == 2


def test_the_device_plugin_discovers_the_upgraded_driver(upgradable: Upgradable, plugin_dir: Path, run_plugin) -> None:
    run = run_plugin(upgradable.root)
    run.wait_log(rf"NVML: driver {DRIVER_VERSION}, 2 GPUs")
    upgradable.upgrade()
    run.wait_log(rf"driver {DRIVER_VERSION} -> {UPGRADED_VERSION}: discovering the devices again")
    run.wait_log(rf"NVML: driver {UPGRADED_VERSION}, 2 GPUs")
    assert run.process.poll() is None


def test_the_dra_driver_prepares_claims_with_the_upgraded_drivers_files(
    upgradable: Upgradable, kubelet_dir: Path, run_driver, api_server
) -> None:
    """A claim prepared after the upgrade gets the new driver's files (the check before a claim is
    prepared: no wait for the loop), and the slices say the new version."""
    run = run_driver(upgradable.root)
    run.wait_log(r"serving " + DRIVER)
    endpoint = str(kubelet_dir / "plugins" / DRIVER / "dra.sock")

    def prepared(name: str) -> list[str]:
        claim = api_server.add_claim(name, ["gpu-0"])
        in_child(call, endpoint, "prepare", [claim])
        return _libcuda(json.loads((run_driver.cdi / f"{DRIVER}-claim_{claim[1]}.json").read_text()))

    assert prepared("before") == [f"libcuda.so.{DRIVER_VERSION}"]
    upgradable.upgrade()
    assert prepared("after") == [f"libcuda.so.{UPGRADED_VERSION}"]
    run.wait_log(rf"driver {DRIVER_VERSION} -> {UPGRADED_VERSION}: discovering the devices again")
    semver = ".".join(str(int(p)) for p in UPGRADED_VERSION.split("."))
    deadline = time.monotonic() + 20
    while _slice_versions(api_server) != {semver} and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _slice_versions(api_server) == {semver}


def _slice_versions(api_server) -> set[str]:  # noqa: ANN001 - harness.dra.ApiServer
    return {d["attributes"]["driverVersion"]["version"] for s in api_server.slices() for d in s["spec"]["devices"]}

"""The native driver helper, native/driver/driver_snapshot.c (``nvc-py-driver-snapshot ROOT UID GID``), against
the Python driver helper (nvc.rpc.driver_service) for the same root and identity: the same answer on every
fake machine and on the real driver, the same errors. Run on the sanitized build too (``make sanitize``);
its confinement is read back in tests/test_confinement.py, its start by the front in test_front_snapshot.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from harness import native
from harness.hookserver import LIBDIR
from nvc import errors
from nvc.rpc.driver_service import open_driver
from nvc.rpc.driver_wire import overflow_ids, snapshot_from_wire

FRONT = LIBDIR / "nvc-py"
# Every fake machine; under the sanitizers (a session of its own, which builds each anew) the one with MIG
# devices, whose snapshot takes every path of the program.
MACHINES = (
    ["active_2gpu"] if native.SANITIZED else ["active_2gpu", "active_3gpu", "active_local_nvidia", "active_debian"]
)


@pytest.fixture(scope="module", autouse=True)
def built() -> None:
    native.build()


def answer_of(root: str) -> dict:
    """The native helper's response for ``root`` as the overflow user (the build's: sanitized in
    ``make sanitize``)."""
    uid, gid = overflow_ids()
    # LeakSanitizer reads /proc at the exit, which the helper's root may lack.
    env = {**os.environ, "ASAN_OPTIONS": "detect_leaks=0"} if native.SANITIZED else None
    argv = [native.DRIVER_SNAPSHOT, root, str(uid), str(gid)]
    done = subprocess.run(argv, capture_output=True, check=True, timeout=30, env=env)
    assert done.stderr == b""
    response = json.loads(done.stdout)
    assert response["v"] == 1 and response["id"] == 0
    return response


def python_helper(root: str) -> dict:
    """The Python driver helper's response for ``root``: its result, or its error as the wire carries it."""
    try:
        with open_driver(root=root) as driver:
            return {"result": driver.helper.call("snapshot")}
    except errors.NvcError as err:
        return {"error": {"kind": err.kind, "message": err.args[0], "code": getattr(err, "code", None)}}


@pytest.mark.parametrize("machine", MACHINES)
def test_the_native_helper_answers_as_the_python_helper(machine: str, request: pytest.FixtureRequest) -> None:
    root = str(request.getfixturevalue(machine).root)
    response = answer_of(root)
    assert response == {"v": 1, "id": 0, **python_helper(root)} and "result" in response
    gpus = snapshot_from_wire(response["result"]).gpus
    assert gpus and all(gpu.brand in ("Nvidia", "NvidiaRTX") for gpu in gpus)
    if machine == "active_2gpu":
        assert [len(gpu.mig_devices) for gpu in gpus] == [0, 2]


def test_the_native_helper_fails_as_the_python_helper(active_2gpu, tmp_path: Path) -> None:
    """A root without NVML, and no root at all: the same error kind, message and code."""
    for root in (str(tmp_path), str(tmp_path / "missing")):
        response = answer_of(root)
        assert "result" not in response and response["error"] == python_helper(root)["error"], root
    assert answer_of(str(tmp_path))["error"]["message"].startswith("load library failed: libnvidia-ml.so.1: ")
    assert answer_of(str(tmp_path / "missing"))["error"]["message"] == (
        f"chroot failed: {tmp_path / 'missing'}: No such file or directory"
    )


@pytest.mark.parametrize(("lost", "call"), [("gpu", "nvmlDeviceGetPciInfo"), ("mig", "nvmlDeviceGetGpuInstanceId")])
def test_a_device_lost_mid_snapshot_fails_both_helpers_alike(
    lost: str, call: str, active_2gpu, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fake driver's GPU 0, or GPU 1's second MIG device, lost once its handle is held: the driver
    error of the call that met it, NVML's code with it."""
    gpus = active_2gpu.machine["gpus"]
    uuid = gpus[0]["uuid"] if lost == "gpu" else gpus[1]["mig"]["devices"][1]["uuid"]
    monkeypatch.setenv("FAKE_NVML_GPU_LOST", uuid)
    root = str(active_2gpu.root)
    response = answer_of(root)
    assert response == {"v": 1, "id": 0, **python_helper(root)}
    assert response["error"] == {"kind": "driver", "message": f"nvml error: gpu is lost ({call})", "code": 15}


def test_the_native_helper_refuses_a_bad_command_line() -> None:
    for argv in ([], ["relative", "1", "1"], ["/", "-1", "1"], ["/", "1", "x"], ["/", "1", "1", "extra"]):
        done = subprocess.run([native.DRIVER_SNAPSHOT, *argv], capture_output=True, text=True, timeout=10)
        assert (done.returncode, done.stdout) == (2, "") and done.stderr.startswith("usage: "), argv


def test_the_native_helper_keeps_none_of_its_starters_files(active_2gpu, tmp_path: Path) -> None:
    """As the Python helper keeps only its socket, NVML loaded from the driver root gets no file of its
    starter's but the answer's pipe: standard input and error are /dev/null, an inherited directory (one
    outside the chroot) is closed. Read while the confined helper waits in NVML's first call."""
    uid, gid = overflow_ids()
    outside = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    env = {**os.environ, "FAKE_NVML_STALL_S": "2", **({"ASAN_OPTIONS": "detect_leaks=0"} if native.SANITIZED else {})}
    argv = [native.DRIVER_SNAPSHOT, str(active_2gpu.root), str(uid), str(gid)]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, pass_fds=(outside,), env=env) as helper:
        os.close(outside)
        status = Path(f"/proc/{helper.pid}/status")
        deadline = time.monotonic() + 10
        while "NoNewPrivs:\t1" not in status.read_text() and time.monotonic() < deadline:
            time.sleep(0.01)
        fds = {int(fd.name): os.readlink(fd) for fd in Path(f"/proc/{helper.pid}/fd").iterdir()}
        assert helper.stdout is not None and json.loads(helper.stdout.read())["result"]["gpus"]
    assert fds[0] == fds[2] == "/dev/null" and fds[1].startswith("pipe:"), fds
    assert not any(str(tmp_path) in target for target in fds.values()), fds


# ---- on a real driver (make test-gpu) --------------------------------------------------------------------


@pytest.mark.gpu
def test_on_the_gpu_the_native_helper_answers_as_the_python_helper() -> None:
    """The real driver at the root /: the native helper's snapshot is the Python helper's, and the installed
    ``nvc-py info`` with no server (the front's native helper) prints what the Python program prints alone."""
    if not Path("/proc/driver/nvidia/version").exists():
        pytest.fail("no NVIDIA driver on this machine: GPU tests need one")
    response = answer_of("/")
    assert response == {"v": 1, "id": 0, **python_helper("/")}
    assert response["result"]["gpus"], "no GPU in the snapshot"
    env = {**os.environ, "NVC_PY_HOOK_SOCKET": "none"}
    runs = [
        subprocess.run([program, "info"], capture_output=True, text=True, timeout=60, env=env)
        for program in (FRONT, LIBDIR / "nvc-py-python")
    ]
    assert runs[0].returncode == runs[1].returncode == 0, (runs[0].stderr, runs[1].stderr)
    assert (runs[0].stdout, runs[0].stderr) == (runs[1].stdout, runs[1].stderr)

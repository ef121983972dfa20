"""`nvc-py doctor`: each finding a platform engineer needs when a container has no GPU, on the fake
driver (a test double) and with podman's configuration given the way podman itself reads it
($CONTAINERS_CONF, $CONTAINERS_STORAGE_CONF: the hooks, CDI and storage of this test's own)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from harness.doctor import doctor as _doctor
from harness.doctor import podman_conf  # noqa: F401 - fixture
from harness.installed import SCRIPTS


def _checks(*args: str, env: dict[str, str] | None = None) -> dict:
    """`nvc-py doctor --json ARGS`'s checks by name; its "ok" agrees with its exit status."""
    status, lines = _doctor("--json", *args, env=env)
    doc = json.loads("\n".join(lines))
    assert doc["ok"] == (status == 0)
    return {c["name"]: c for c in doc["checks"]}


def test_no_driver_is_one_failing_line_that_says_how_to_try_without_a_gpu(tmp_path: Path) -> None:
    env = {"NVC_PY_CONFIG": str(tmp_path / "none.yaml")}
    status, lines = _doctor(env=env)
    checks = _checks(env=env)
    assert status == 1
    assert checks["driver"]["status"] == "fail" and "make try" in checks["driver"]["fix"]
    assert lines[1] == "✗ driver: /proc/driver/nvidia/version: not found: the NVIDIA kernel driver is not loaded"
    assert "NVML" not in checks and lines[-1].endswith("check(s) failed")


def test_podman_hooks_where_podman_does_not_read_them_then_where_it_does(
    podman_conf: dict[str, str], tmp_path: Path
) -> None:
    setup = [str(SCRIPTS / "nvc-py"), "setup", "podman", "--config", podman_conf["NVC_PY_CONFIG"], "--no-server"]
    env = {**os.environ, **podman_conf}
    subprocess.run([*setup, "--hooks-dir", str(tmp_path / "elsewhere")], check=True, env=env, capture_output=True)
    checks = _checks(env=podman_conf)
    assert checks["podman"]["status"] == "fail"
    assert checks["podman"]["detail"] == (
        f"no nvc-py hook where podman reads hooks from {tmp_path}/hooks.d "
        f"({podman_conf['CONTAINERS_CONF']}'s hooks_dir)"
    )
    assert checks["podman"]["fix"] == "nvc-py setup podman"
    assert checks["driver"]["status"] == checks["NVML"]["status"] == checks["device nodes"]["status"] == "ok"
    subprocess.run(setup, check=True, env=env, capture_output=True)
    _, lines = _doctor(env=podman_conf)
    assert f"✓ podman: hook {tmp_path}/hooks.d/oci-nvc-py-hook.json (podman reads hooks from" in "\n".join(lines)


def test_a_cdi_spec_that_no_longer_lists_todays_devices_is_stale(podman_conf: dict[str, str], tmp_path: Path) -> None:
    spec = tmp_path / "cdi" / "nvidia.yaml"
    spec.parent.mkdir()
    env = {**os.environ, **podman_conf}
    subprocess.run(
        [str(SCRIPTS / "nvc-py"), "cdi", "generate", "--output", str(spec)], check=True, env=env, capture_output=True
    )
    assert _checks(env=podman_conf)["CDI"]["status"] == "ok"
    spec.write_text(spec.read_text().replace("name: '1'", "name: '7'"))  # a GPU that is gone, one missing
    checks = _checks(env=podman_conf)
    assert checks["CDI"]["status"] == "fail" and checks["CDI"]["fix"] == f"nvc-py cdi generate --output {spec}"


def test_a_stopped_server_is_found(podman_conf: dict[str, str], tmp_path: Path) -> None:
    """A server killed where it stood leaves its socket behind, with nobody answering on it."""
    from harness.hookserver import hook_server
    from nvc.hook.server.handover import DEFAULT_SOCKET

    with hook_server(SCRIPTS / "nvc-py-hook", Path(DEFAULT_SOCKET)) as server:
        assert _checks(env=podman_conf)["hook server"]["status"] == "ok"
        server.send_signal(signal.SIGKILL)
        server.wait()
        _, lines = _doctor(env=podman_conf)
    assert f"✗ hook server: {DEFAULT_SOCKET}: nobody answers" in "\n".join(lines)
    os.unlink(DEFAULT_SOCKET)


def test_run_starts_a_container_through_podman_and_sees_the_gpu(podman_conf: dict[str, str]) -> None:
    env = {**os.environ, **podman_conf}
    subprocess.run(
        [str(SCRIPTS / "nvc-py"), "setup", "podman", "--config", podman_conf["NVC_PY_CONFIG"], "--no-server"],
        check=True,
        env=env,
        capture_output=True,
    )
    status, lines = _doctor("--run", env=podman_conf)
    assert (
        "✓ podman run: a container asking for GPU 0 sees it: GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-4f6a"
        in "\n".join(lines)
    )


def test_the_containerd_line_names_commands_that_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The containerd line names how to run a container through the registered runtime: the CRI handler
    for a RuntimeClass, and ctr's --runc-binary with the runtime setup registered (ctr's --runtime takes a
    shim's name, and `ctr run --runtime nvc-py` fails: invalid runtime name)."""
    import shutil

    from nvc.doctor import engines
    from nvc.system import programs as entry

    if shutil.which("containerd") is None or shutil.which("ctr") is None:
        pytest.skip("containerd and ctr are not installed")
    main, drop_in = tmp_path / "config.toml", tmp_path / "conf.d" / "99-nvc-py.toml"
    subprocess.run(
        [
            str(SCRIPTS / "nvc-py"),
            "setup",
            "containerd",
            "--config",
            str(main),
            "--drop-in",
            str(drop_in),
            "--no-server",
        ],
        check=True,
        capture_output=True,
        env={**os.environ, "NVC_PY_CONFIG": str(tmp_path / "c.yaml")},
    )
    monkeypatch.setattr(engines, "running", lambda name: [])  # as where none runs: not the suite's own
    line = engines.containerd(str(main))[0]
    runtime = f"{entry.LIBDIR}/nvc-py-runtime"
    assert line.status == "ok" and "ctr --runtime" not in line.detail, line
    assert f"ctr run --runc-binary {runtime} " in line.detail and "runtimeClassName" in line.detail, line
    flags = subprocess.run(["ctr", "run", "--help"], capture_output=True, text=True, check=True).stdout
    assert "--runc-binary" in flags


def test_run_quotes_the_line_that_explains_a_failed_start(podman_conf: dict[str, str], tmp_path: Path) -> None:
    """A start the hook refused: doctor quotes the hook's own error line from podman's output and
    gives the hook log's line for that start with the log's path. A start that failed before any
    hook ran: podman's own error, and the advice says no hook refused it (no log line)."""
    env = {**os.environ, **podman_conf}
    config, log = Path(podman_conf["NVC_PY_CONFIG"]), tmp_path / "hook.log"
    config.write_text(f"root: {tmp_path / 'no-driver'}\nload-kmods: false\nlog: {{file: {log}}}\n")
    subprocess.run(
        [str(SCRIPTS / "nvc-py"), "setup", "podman", "--config", str(config), "--no-server"],
        check=True,
        env=env,
        capture_output=True,
    )
    refused = _checks("--run", env=podman_conf)["podman run"]
    assert refused["status"] == "fail", refused
    assert refused["detail"].startswith("a container asking for GPU 0 does not see GPU 0: nvc-py-hook: "), refused
    line = log.read_text().splitlines()[-1]
    assert (
        '"outcome":"error"' in line
        and refused["fix"] == f"the hook refused it; {log} has its line for that start: {line}"
    ), refused
    conf = Path(podman_conf["CONTAINERS_CONF"])
    conf.write_text(conf.read_text().replace('runtime = "runc"', 'runtime = "nvc-test-no-such-runtime"'))
    before = log.read_text()
    engine = _checks("--run", env=podman_conf)["podman run"]
    assert log.read_text() == before
    assert engine["status"] == "fail" and "nvc-py-hook" not in engine["detail"], engine
    assert engine["detail"].startswith("a container asking for GPU 0 does not see GPU 0: Error: "), engine
    assert "nvc-test-no-such-runtime" in engine["detail"], engine
    assert engine["fix"] == (
        f"the engine's own error: no nvc-py hook refused that start ({log} has no line for that "
        "start); fix what the engine says"
    ), engine


def test_no_server_says_what_a_hook_call_does_then(podman_conf: dict[str, str], tmp_path: Path) -> None:
    """No server runs: doctor says what a hook call does then, and that is what happens: with setup's
    no-server file beside the configuration, a hook call runs the hook itself and leaves no socket."""
    from nvc.hook.server.handover import DEFAULT_SOCKET

    assert not os.path.exists(DEFAULT_SOCKET)
    assert _checks(env=podman_conf)["hook server"]["detail"] == (
        f"not running ({DEFAULT_SOCKET}); a hook call as root in PID 1's namespaces starts one (it stops after 600 s "
        "without a call, 0.5 s where a runtime adopted it); other calls run the hook themselves; nvc-py setup server (or "
        "/usr/lib/nvc-py/nvc-py-hook start-server) starts one that stays"
    )
    env = {**os.environ, **podman_conf}
    subprocess.run(
        [
            str(SCRIPTS / "nvc-py"),
            "setup",
            "podman",
            "--config",
            podman_conf["NVC_PY_CONFIG"],
            "--hooks-dir",
            str(tmp_path / "hooks.d"),
            "--no-server",
        ],
        check=True,
        env=env,
        capture_output=True,
    )
    no_server = tmp_path / "no-server"
    assert no_server.is_file()
    detail = _checks(env=podman_conf)["hook server"]["detail"]
    assert detail == (
        f"not running; hook calls run the hook themselves and start none ({no_server}: setup's --no-server)"
    )
    state = json.dumps(
        {
            "ociVersion": "1.0.2",
            "id": "doctor-no-server",
            "status": "creating",
            "pid": os.getpid(),
            "bundle": str(tmp_path),
        }
    )
    (tmp_path / "config.json").write_text(
        '{"ociVersion": "1.0.2", "process": {"env": [], "args": ["true"], "cwd": "/"}, "root": {"path": "rootfs"}}'
    )
    call = subprocess.run(
        [str(SCRIPTS / "nvc-py-hook"), "prestart"],
        input=state,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "NVC_PY_CONFIG": podman_conf["NVC_PY_CONFIG"]},
    )
    assert call.returncode == 0, call.stderr
    assert not os.path.exists(DEFAULT_SOCKET)


def test_without_systemd_no_reload_takes_a_hooks_gpus() -> None:
    """This machine runs no systemd: the daemon-reload line does not apply (tests/test_systemd_reload.py
    has it fail where systemd is PID 1 and manages podman's cgroups)."""
    from nvc.doctor import SKIP, ok
    from nvc.doctor.engines import systemd_reload

    assert not os.path.exists("/run/systemd/system")
    found = systemd_reload([(ok("podman", "hook"), "podman")], {})
    assert (found.name, found.status) == ("daemon-reload", SKIP) and "systemd is not PID 1" in found.detail


@pytest.mark.parametrize(
    ("doc", "flag", "cgroup2", "driver"),
    [
        ({}, None, True, "systemd"),  # dockerd's default on cgroup v2 (20.10 and later)
        ({}, None, False, "cgroupfs"),
        ({"exec-opts": ["native.cgroupdriver=cgroupfs"]}, None, True, "cgroupfs"),
        ({"exec-opts": ["native.umask=normal", " native.cgroupdriver = systemd"]}, None, False, "systemd"),
        ({"exec-opts": "native.cgroupdriver=cgroupfs"}, "native.cgroupdriver=systemd", False, "systemd"),
    ],
)
def test_dockers_cgroup_driver_decides_whether_gpus_containers_lose_their_gpus(
    doc: dict, flag: str | None, cgroup2: bool, driver: str
) -> None:
    """Where it is systemd, `docker run --gpus` (nvc-py's hook) loses the GPUs on a daemon-reload."""
    from nvc.doctor.engines import docker_cgroup_driver

    assert docker_cgroup_driver(doc, flag, cgroup2) == driver

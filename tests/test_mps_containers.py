"""GPU sharing's MPS backend through container starts: runc containers configured by the hook share
the fake GPU 0 through the fake MPS control daemon (tests/fakedriver/src/mps_control.c), which
nvc-py starts, restarts and stops, and a podman container as a user runs one (setup's hooks.d, podman's
own defaults); the refusals; nothing left after ``setup --remove`` or a purge.
Test double only: nothing here is a GPU result (the fake libcuda tells the fake daemon which MPS
variables each client had at cuInit).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness.bundle import make_bundle
from harness.hookfixtures import default_run_dir  # noqa: F401  (fixture)
from harness.hookserver import umount_when_free
from harness.installed import SCRIPTS
from harness.podman import own_engine_config
from harness.standins import target_process  # noqa: F401  (fixture)
from nvc.apply import mps, sharefiles
from nvc.plan import mps as mpsplan

GPU0 = "GPU-4f6a2c1e-8b3d-5e7f-9a1b-2c3d4e5f6a7b"
GPU1 = "GPU-0d1e2f3a-4b5c-6d7e-8f90-a1b2c3d4e5f6"
WAIT = 20.0  # seconds a test waits for a container to reach a point (a hang fails, never a slow machine)


@pytest.fixture
def mps_dir(default_run_dir) -> Iterator[Path]:  # noqa: F811
    """/run/nvc-py-mps as a tmpfs of this test's mount namespace; daemons left running are killed."""
    path = Path(mpsplan.MPS_DIR)
    created = not path.exists()
    path.mkdir(mode=0o755, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        for state in mps.status() if path.is_dir() else ():
            if state.pid:
                os.kill(state.pid, signal.SIGKILL)
        umount_when_free(path)
        if created:
            path.rmdir()


def _until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not check():
        assert time.monotonic() < deadline, f"waited {WAIT:g} s for {what}"
        time.sleep(0.02)


class Containers:
    """runc containers configured by the installed hook (prestart and poststop), with cuda_probe and
    a shared directory (/barrier) mounted; each runs in a thread until its script ends."""

    def __init__(self, runc, rootfs: Path, fake, tmp_path: Path, programs: dict[str, Path], config: str) -> None:  # noqa: F811
        self.runc, self.rootfs, self.tmp = runc, rootfs, tmp_path
        self.barrier = tmp_path / "barrier"
        self.barrier.mkdir()
        self.probe = programs["cuda_probe"]
        self.config = tmp_path / "config.yaml"
        self.config.write_text(
            f"root: {fake.root}\nload-kmods: false\nlog: {{file: {tmp_path / 'hook.log'}}}\n{config}"
        )
        self.results: dict[str, subprocess.CompletedProcess[str]] = {}
        self.threads: dict[str, threading.Thread] = {}

    def bundle(self, name: str, script: str, env: dict[str, str], uid: int = 0) -> Path:
        hook = {
            "path": str(SCRIPTS / "nvc-py-hook"),
            "args": ["nvc-py-hook", "prestart"],
            "env": [f"NVC_PY_CONFIG={self.config}"],
        }
        hooks = {"prestart": [hook], "poststop": [{**hook, "args": ["nvc-py-hook", "poststop"]}]}
        full_env = {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility", **env}
        bundle = make_bundle(self.tmp / name, self.rootfs, ["sh", "-c", script], env=full_env, hooks=hooks)
        spec = json.loads((bundle / "config.json").read_text())
        spec["mounts"] += [
            {"destination": "/barrier", "type": "bind", "source": str(self.barrier), "options": ["rbind"]},
            {
                "destination": "/usr/local/bin/cuda_probe",
                "type": "bind",
                "source": str(self.probe),
                "options": ["rbind", "ro"],
            },
        ]
        spec["process"]["user"] = {"uid": uid, "gid": uid}
        (bundle / "config.json").write_text(json.dumps(spec))
        return bundle

    def start(self, name: str, script: str, env: dict[str, str], uid: int = 0) -> None:
        bundle = self.bundle(name, script, env, uid)

        def run() -> None:
            self.results[name] = self.runc.create_start(bundle, container_id=f"nvc-mps-{name}", timeout=60)

        self.threads[name] = threading.Thread(target=run)
        self.threads[name].start()

    def finish(self, name: str, go: str = "") -> subprocess.CompletedProcess[str]:
        """Let the container's script end (its wait ``go``, by default its name, returns), then its
        result after poststop."""
        (self.barrier / f"done-{go or name}").touch()
        self.threads[name].join(timeout=90)
        assert not self.threads[name].is_alive(), name
        return self.results[name]

    def reached(self, name: str) -> None:
        _until(lambda: (self.barrier / name).exists(), f"container {name}")


def _waits(name: str) -> str:
    """The script's part that says it got here and waits for the test's go."""
    return f"touch /barrier/{name}; while [ ! -e /barrier/done-{name} ]; do sleep 0.02; done"


@pytest.fixture
def containers(runc, debian_rootfs, fake_2gpu, tmp_path, programs, mps_dir) -> Iterator[Callable[[str], Containers]]:  # noqa: F811
    """Makes the test's Containers; at the end, every container still waiting is let go and removed."""
    made: list[Containers] = []

    def make(config: str = "") -> Containers:
        made.append(Containers(runc, debian_rootfs, fake_2gpu, tmp_path, programs, config))
        return made[-1]

    yield make
    for ctrs in made:
        for name in ctrs.threads:
            for go in ("", "2"):
                (ctrs.barrier / f"done-{name}{go}").touch()
        for name, thread in ctrs.threads.items():
            thread.join(timeout=90)
            runc.delete(f"nvc-mps-{name}")


def _client_lines(device: str) -> list[str]:
    return (Path(mpsplan.MPS_DIR) / device / "log/clients").read_text().splitlines()


def test_two_containers_share_one_daemon_and_get_their_limits(containers) -> None:
    """GPU 0's backend is mps by the configuration: the first container's hook starts one daemon
    (CUDA_VISIBLE_DEVICES its UUID, its directories under /run/nvc-py-mps), the second's finds it;
    both see its pipe directory at /tmp/nvidia-mps and their shares as MPS's client variables
    (the cap as the thread percentage, the memory limit as the pinned limit, the latency class as
    the priority; a lighter weight as the shim's duty cycle, 40 % at 1:3), which the fake daemon receives at their
    cuInit; share status says it runs. The first container's poststop leaves it to the second, whose
    poststop stops it and removes its directory."""
    ctrs = containers(f"sharing: {{backend: {{{GPU0}: mps}}}}\n")
    script = (  # (the image's shell and tools are busybox's, static: cuda_probe shows what a process gets)
        "ls /tmp/nvidia-mps; grep -c memory_limit /var/run/nvc-share/limits; "
        "grep -c compute_ /var/run/nvc-share/limits; grep -c ^mps /var/run/nvc-share/limits; cuda_probe init; {waits}"
    )
    first = {
        "NVC_SHARE_MEMORY_LIMIT": "2Gi",
        "NVC_SHARE_COMPUTE": "30",
        "NVC_SHARE_WEIGHT": "3",
        "NVC_SHARE_PRIORITY": "latency-critical",
    }
    ctrs.start("a", script.format(waits=_waits("a")), first)
    ctrs.reached("a")
    second = {"NVC_SHARE_MEMORY_LIMIT_0": "1Gi", "NVC_SHARE_WEIGHT": "1", f"NVC_SHARE_PRIORITY_{GPU0}": "batch"}
    ctrs.start("b", script.format(waits=_waits("b")), second)
    ctrs.reached("b")

    [state] = mps.status()
    assert state.device == GPU0 and state.pid and [c.container_id for c in state.clients] == ["nvc-mps-a", "nvc-mps-b"]
    log = Path(mpsplan.MPS_DIR) / GPU0 / "log"
    assert (log / "control.log").read_text().count("Starting control daemon") == 1  # started once
    started_with = (log / "env").read_text().splitlines()
    assert sorted(started_with) == sorted(
        f"{k}={v}" for k, v in mpsplan.daemon_env(GPU0, f"{mpsplan.MPS_DIR}/{GPU0}/pipe", str(log)).items()
    )
    clients = [line.split(" ", 3)[3] for line in _client_lines(GPU0)]
    pipe = "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"
    assert clients == [
        f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30 CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=3072M CUDA_MPS_CLIENT_PRIORITY=0 {pipe}",
        f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=- CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2048M CUDA_MPS_CLIENT_PRIORITY=1 {pipe}",
    ]
    shown = subprocess.run([str(SCRIPTS / "nvc-py"), "share", "status"], capture_output=True, text=True, check=True)
    assert (
        f"MPS daemon of {GPU0}: running (pid {state.pid}); containers: nvc-mps-a (uid 0), nvc-mps-b (uid 0)"
        in shown.stdout.splitlines()
    )
    b_limits = shown.stdout.split("container nvc-mps-b\n", 1)[1].splitlines()[0]
    assert "compute cap 40 %" in b_limits, shown.stdout  # its duty cycle, as share status says it

    a = ctrs.finish("a")
    assert a.returncode == 0, a.stderr
    assert a.stdout.splitlines() == [
        "control",
        "nvidia-cuda-mps-control.pid",
        "1",  # the memory limit stays with the shim
        "1",  # its weight, no cap line: MPS shares the SMs, not the shim's slices
        "4",  # the four MPS variables the shim sets
        "init CUDA_SUCCESS",
    ]
    [state_after] = mps.status()  # a's poststop: the daemon stays for b
    assert state_after.pid == state.pid and [c.container_id for c in state_after.clients] == ["nvc-mps-b"]

    b = ctrs.finish("b")
    assert b.returncode == 0, b.stderr
    # its weight, lighter than a's, is a duty cycle: the shim's compute cap (and its weight), no thread percentage
    assert b.stdout.splitlines() == ["control", "nvidia-cuda-mps-control.pid", "1", "2", "3", "init CUDA_SUCCESS"]
    assert "scheduler file" not in b.stderr  # it has one: whether a heavier client is backlogged decides its cap
    _until(lambda: not Path(f"/proc/{state.pid}").exists(), "the daemon to quit")
    assert mps.status() == [] and not (Path(mpsplan.MPS_DIR) / GPU0).exists()


def test_a_lighter_containers_duty_cycle_follows_the_heavier_ones(containers) -> None:
    """Weights 1:3 whichever container starts first: b (weight 1) starts alone and runs free (no compute
    line in its limits file); a (weight 3) comes, and b's limits file, as b sees it, gets the duty cycle
    of 1:3 (40 %); a goes (its poststop), and b runs free again."""
    ctrs = containers(f"sharing: {{backend: {{{GPU0}: mps}}}}\n")
    show = "grep compute_percent /var/run/nvc-share/limits || echo none"
    ctrs.start("b", f"{show}; {_waits('b')}; {show}; {_waits('b2')}; {show}", {"NVC_SHARE_WEIGHT": "1"})
    ctrs.reached("b")
    ctrs.start("a", _waits("a"), {"NVC_SHARE_WEIGHT": "3"})
    ctrs.reached("a")
    (ctrs.barrier / "done-b").touch()
    ctrs.reached("b2")
    a = ctrs.finish("a")
    assert a.returncode == 0, a.stderr
    b = ctrs.finish("b", go="b2")
    assert b.returncode == 0, b.stderr
    assert b.stdout.splitlines() == ["none", "compute_percent=40", "none"]
    assert "keeps its duty cycle" not in a.stderr + b.stderr


def test_a_killed_daemon_is_started_again_by_the_next_container(containers) -> None:
    """The daemon dies with a container attached: that container's next cuInit fails
    (CUDA_ERROR_MPS_CONNECTION_FAILED, as a client that finds no server) and share status says it is
    not running; the next container's hook starts it again, in the same pipe directory, so the
    first container's processes reach it again."""
    ctrs = containers()
    env = {"NVC_SHARE_BACKEND": "mps", "NVC_SHARE_MEMORY_LIMIT": "1Gi"}
    ctrs.start("a", f"{_waits('a')}; cuda_probe init; {_waits('a2')}; cuda_probe init", env)
    ctrs.reached("a")
    [before] = mps.status()
    os.kill(before.pid, signal.SIGKILL)
    _until(lambda: mps.status()[0].pid is None, "the daemon to be seen dead")
    shown = subprocess.run([str(SCRIPTS / "nvc-py"), "share", "status"], capture_output=True, text=True, check=True)
    assert f"MPS daemon of {GPU0}: not running (the next container of the GPU starts it again)" in shown.stdout
    (ctrs.barrier / "done-a").touch()
    ctrs.reached("a2")
    ctrs.start("b", f"cuda_probe init; {_waits('b')}", env)
    ctrs.reached("b")
    [after] = mps.status()
    assert after.pid and after.pid != before.pid
    a, b = ctrs.finish("a", go="a2"), ctrs.finish("b")
    assert a.returncode == 0 and b.returncode == 0, (a.stderr, b.stderr)
    assert a.stdout.splitlines() == ["init CUDA_ERROR_MPS_CONNECTION_FAILED", "init CUDA_SUCCESS"]
    assert b.stdout.splitlines() == ["init CUDA_SUCCESS"]
    assert mps.status() == []


def test_podman_with_its_own_defaults_runs_a_container_on_the_daemon(
    active_2gpu,
    podman,
    programs,  # noqa: F811
    mps_dir,
    tmp_path,
) -> None:
    """The MPS backend as a user has it: `nvc-py setup podman` with GPU 0's backend mps in its configuration,
    then `podman run --rm` with no --hooks-dir and no configuration of the test's. The container's hook
    starts GPU 0's daemon; the container sees its pipe directory and its share as MPS's client variables,
    and its process reaches the daemon; its poststop stops the daemon and removes its directory."""
    own_engine_config(tmp_path)
    config = tmp_path / "config.yaml"
    config.write_text(
        f"root: {active_2gpu.root}\nload-kmods: false\nlog: {{file: {tmp_path / 'hook.log'}}}\n"
        f"sharing: {{backend: {{{GPU0}: mps}}}}\n"
    )
    setup = [str(SCRIPTS / "nvc-py"), "setup", "podman"]
    done = subprocess.run([*setup, "--config", str(config), "--no-server"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    try:
        ran = podman.run(
            podman.image(),
            ["sh", "-c", "ls /tmp/nvidia-mps; grep ^mps /var/run/nvc-share/limits; cuda_probe init"],
            env={"NVIDIA_VISIBLE_DEVICES": "0", "NVC_SHARE_MEMORY_LIMIT": "1Gi", "NVC_SHARE_COMPUTE": "50"},
            extra_args=["-v", f"{programs['cuda_probe']}:/usr/local/bin/cuda_probe:ro"],
            hooks_dirs=None,
        )
    finally:
        subprocess.run([*setup, "--remove"], capture_output=True, timeout=60, check=True)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == [
        "control",
        "nvidia-cuda-mps-control.pid",
        "mps.CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
        "mps.CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50",
        "mps.CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2048M",  # the memory limit and a context's reserve
        "init CUDA_SUCCESS",  # the fake daemon answered its cuInit
    ]
    assert mps.status() == [] and not (Path(mpsplan.MPS_DIR) / GPU0).exists()


def _refused(result: subprocess.CompletedProcess[str], line: str) -> None:
    assert result.returncode != 0
    assert f"nvc-py-hook: container error: {line}" in result.stderr, result.stderr


def test_refusals_leave_nothing(containers, fake_2gpu, runc) -> None:
    """Refused in one line, nothing left of the refused container: a container of another user
    than the daemon's (MPS serves one user at a time), a container with two devices one of them
    mps, a driver without nvidia-cuda-mps-server (the container is refused rather than shared
    without MPS's limits)."""
    ctrs = containers()
    env = {"NVC_SHARE_BACKEND": "mps", "NVC_SHARE_MEMORY_LIMIT": "1Gi"}
    ctrs.start("a", _waits("a"), env)
    ctrs.reached("a")
    other_user = runc.create_start(ctrs.bundle("u", "true", env, uid=1000), container_id="nvc-mps-u")
    _refused(
        other_user,
        f"{GPU0}: its MPS daemon serves uid 0 (containers nvc-mps-a), this container runs as uid 1000: MPS serves "
        "one user at a time (run it as the same user, or share this GPU with backend timeslice)",
    )
    assert [c.container_id for c in mps.status()[0].clients] == ["nvc-mps-a"]
    assert ctrs.finish("a").returncode == 0
    assert mps.status() == []

    both = runc.create_start(ctrs.bundle("two", "true", {**env, "NVIDIA_VISIBLE_DEVICES": "0,1"}), container_id="two")
    _refused(
        both,
        f"{GPU0}, {GPU1}: sharing backend mps serves a container one device (its processes reach one MPS daemon), "
        f"this container has 2: {GPU0}, {GPU1}",
    )
    server = fake_2gpu.root / "usr/bin" / mpsplan.SERVER
    os.rename(server, server.with_name("moved-away"))
    try:
        missing = runc.create_start(ctrs.bundle("nobin", "true", env), container_id="nobin")
    finally:
        os.rename(server.with_name("moved-away"), server)
    _refused(missing, f"{GPU0}: sharing backend mps, but the driver has no {mpsplan.SERVER} (choose backend timeslice")
    assert mps.status() == [] and not os.listdir("/run/nvc-py/share")


def test_setup_remove_and_purge_leave_nothing(containers, fake_2gpu, tmp_path) -> None:
    """A daemon whose container went without its poststop (none registered) stays; `setup server
    --remove` stops it and removes /run/nvc-py-mps; the package's purge does the same to another
    tree's daemons."""
    ctrs = containers()
    bundle = ctrs.bundle("nopoststop", "true", {"NVC_SHARE_BACKEND": "mps", "NVC_SHARE_MEMORY_LIMIT": "1Gi"})
    spec = json.loads((bundle / "config.json").read_text())
    del spec["hooks"]["poststop"]
    (bundle / "config.json").write_text(json.dumps(spec))
    assert ctrs.runc.create_start(bundle, container_id="nvc-mps-left").returncode == 0
    [left] = mps.status()
    assert left.pid
    sharefiles.remove("nvc-mps-left")  # its sharing directory, which no poststop removed
    setup = ["setup", "server", "--unit-dir", str(tmp_path / "units"), "--config", str(ctrs.config), "--remove"]
    removed = subprocess.run(
        [str(SCRIPTS / "nvc-py"), *setup],
        capture_output=True,
        text=True,
        check=True,
    )
    assert f"{GPU0}: MPS daemon {left.pid} stopped" in removed.stdout.splitlines()
    _until(lambda: not Path(f"/proc/{left.pid}").exists(), "the removed daemon to be gone")
    assert os.listdir(mpsplan.MPS_DIR) == []  # (a mount point here)

    from nvc.hook.setup import purge

    tree = tmp_path / "tree"
    mps_dir = tree / purge.MPS_DIR
    control = str(fake_2gpu.root / "usr/bin" / mpsplan.CONTROL)
    mps.attach(mpsplan.MpsClient("stale", GPU0, control, 0, mps_dir=str(mps_dir)), None)
    [stale] = mps.status(str(mps_dir))
    assert purge.purge(str(tree)).left == []
    _until(lambda: not Path(f"/proc/{stale.pid}").exists(), "the purged daemon to exit")
    assert not mps_dir.exists()


def test_the_plan_names_the_daemon_and_a_failed_start_releases_it(
    mps_dir, active_2gpu, make_rootfs, target_process
) -> None:
    """configure's dry run prints the daemon as a host step and changes nothing; a later step of the
    start failing (a mount in the container) takes the container off the daemon again, which, its
    last container gone, is stopped: nothing is left."""
    from nvc.config.options import GlobalOptions
    from nvc.errors import MountError
    from nvc.pipeline import configure
    from nvc.pipeline.apply import apply, ldcache
    from nvc.plan import fromenv
    from nvc.plan.request import HostMount, from_flags

    rootfs = make_rootfs("debian", name="mps-plan-rootfs")
    glob = GlobalOptions(str(active_2gpu.root), "/etc/ld.so.cache", (0, 0), False)
    asked = fromenv.parse_share_env({"NVC_SHARE_BACKEND": "mps", "NVC_SHARE_MEMORY_LIMIT": "1Gi"})
    req = from_flags(str(rootfs), target_process, devices=("0",), capabilities=("compute", "utility"), no_cgroups=True)
    req = req._replace(sharing=asked, container_id="ctr-mps-plan")
    plan = configure.dry_plan(glob, req)
    assert (
        f"mps     host      {mpsplan.MPS_DIR}/{GPU0} (nvidia-cuda-mps-control -d for {GPU0} unless running; "
        "client uid 0, limits added to its limits file)"
    ) in plan.text().splitlines()
    assert f"bind    extra     {mpsplan.MPS_DIR}/{GPU0}/pipe -> /tmp/nvidia-mps [nosuid,nodev]" in plan.text()
    assert os.listdir(mps_dir) == []  # the dry run started nothing
    missing = HostMount(str(mps_dir / "no-such-file"), "/opt/missing")
    failing = configure.dry_plan(glob, req._replace(extra_mounts=(missing,)))
    with pytest.raises(MountError, match="no-such-file"):
        with configure.container(req) as ctr, apply(failing, ctr.handle) as applied:
            ldcache(applied)
    assert mps.status() == [] and os.listdir(mps_dir) == [".lock"]
    assert not os.path.lexists("/run/nvc-py/share/ctr-mps-plan")


def test_where_systemd_runs_the_daemon_is_a_transient_unit(mps_dir, fake_2gpu, tmp_path, monkeypatch) -> None:
    """Where systemd runs, the daemon is started as a transient service of its own through
    systemd-run (out of the hook's cgroup and subreapers), with the daemon's whole environment; a
    stand-in systemd-run records its arguments and starts the command as systemd would."""
    record = tmp_path / "systemd-run.args"
    stand_in = tmp_path / "systemd-run"
    stand_in.write_text(
        f'#!/bin/sh\necho "$@" > {record}\n'
        'while [ $# -gt 0 ]; do case "$1" in --setenv=*) export "${1#--setenv=}";; --*) ;; *) break;; esac; '
        'shift; done\nexec "$@"\n'
    )
    stand_in.chmod(0o755)
    (tmp_path / "systemd").mkdir()
    monkeypatch.setattr(mps, "SYSTEMD_DIR", str(tmp_path / "systemd"))
    monkeypatch.setattr(mps, "SYSTEMD_RUN", str(stand_in))
    control = str(fake_2gpu.root / "usr/bin" / mpsplan.CONTROL)
    client = mpsplan.MpsClient("ctr-unit", GPU0, control, 0)
    mps.attach(client, None)
    env = mpsplan.daemon_env(GPU0, client.pipe_dir, client.log_dir)
    assert record.read_text().split() == [
        f"--unit=nvc-py-mps-{GPU0}",
        "--property=Type=forking",
        "--collect",
        "--quiet",
        *(f"--setenv={name}={value}" for name, value in env.items()),
        control,
        "-d",
    ]
    [state] = mps.status()
    started_with = [line for line in (Path(client.log_dir) / "env").read_text().splitlines() if line[:4] != "PWD="]
    assert state.pid and sorted(started_with) == sorted(
        f"{name}={value}" for name, value in env.items()
    )  # (sh adds PWD)
    mps.release("ctr-unit")
    assert mps.status() == []


def test_a_container_whose_limits_cannot_be_rewritten_keeps_its_duty_cycle(mps_dir, fake_2gpu, tmp_path, caplog):
    """A heavier container attaching beside a lighter one whose limits file is gone (its directory
    removed under it) still starts; the lighter one's duty cycle stays as it was, and the warning names
    it and why."""
    control = str(fake_2gpu.root / "usr/bin" / mpsplan.CONTROL)
    state = str(tmp_path / "state")  # no container directory in it
    mps.attach(mpsplan.MpsClient("light", GPU0, control, 0, weight=1), None, state)
    lines = mps.attach(mpsplan.MpsClient("heavy", GPU0, control, 0, weight=3), None, state)
    assert "compute_percent" not in lines  # the heaviest: no duty cycle of its own
    [warned] = [r.getMessage() for r in caplog.records if "keeps its duty cycle" in r.getMessage()]
    assert (
        warned
        == f"container light keeps its duty cycle: container error: no container light shares a GPU here (no {state}/light)"
    )
    mps.release("heavy", state_dir=state)
    mps.release("light", state_dir=state)
    assert mps.status() == []

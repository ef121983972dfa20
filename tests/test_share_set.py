"""`nvc-py share set`: a running container's share changed without a restart.

Several processes of one "container" (its sharing directory made as a container start makes it, the
processes running under the shim with it) take a new memory limit or compute cap within a second; a
lowered memory limit refuses only new allocations and says what the container holds; a half-written
limits file changes nothing; a pod's container stays within its grant; under MPS the memory changes at
once and the rest is for new processes; only root may. Then the same through the hook, a runc
container and the installed command.
Test double only: nothing here is a GPU result.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from harness.hookfixtures import default_run_dir, fake_driver_config, oci_hooks, setup_dir  # noqa: F401  (fixtures)
from harness.installed import SCRIPTS
from harness.sharedirs import prepared, private_mounts  # noqa: F401  (fixture)
from harness.shim import GIB, MIB, SHIM, foreground, share  # noqa: F401  (fixtures)
from nvc.commands import shareset, sharestatus
from nvc.errors import ContainerError, PrivilegeError
from nvc.plan import share as shareplan
from nvc.plan.share import Change

RELOAD_S = 0.2  # native/shim/process/reload.h NVC_RELOAD_NS
OOM = str(2)  # CUDA_ERROR_OUT_OF_MEMORY


class Driven:
    """A share_app process reading its operations from a pipe: one answer line per operation."""

    def __init__(self, programs: dict[str, Path], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [str(programs["share_app"]), "stdin"],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=foreground,
        )

    def ask(self, *op: object) -> list[str]:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(" ".join(map(str, op)) + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().split()

    def close(self) -> str:
        assert self.proc.stdin and self.proc.stderr
        self.proc.stdin.close()
        assert self.proc.wait(10) == 0
        return self.proc.stderr.read()


@pytest.fixture
def container(share, programs, private_mounts, tmp_path):  # noqa: F811
    """Two processes of container ``ctr`` (memory 1 GiB, cap 50), its sharing files made as a start makes them."""
    state = tmp_path / "state"
    state.mkdir()
    share.dir = prepared(state, "ctr", {"NVC_SHARE_MEMORY_LIMIT": "1Gi", "NVC_SHARE_COMPUTE": "50"}, os.getpid())
    env = share.env({"NVC_SHARE_LOG": "2"})
    procs = [Driven(programs, env), Driven(programs, env)]
    try:
        for p in procs:
            assert p.ask("init") == ["init", "0"]
        yield state, procs
    finally:
        for p in procs:
            p.proc.kill()
            p.proc.wait()


def test_both_processes_take_a_new_memory_limit_within_a_second(container):
    """Raised: the allocation the old limit refused succeeds in the other process at its next call
    (its limits file looked at again within 200 ms), and both report the new total. Lowered below what
    the container holds: said, nothing is taken back, new allocations fail until it is below."""
    state, (a, b) = container
    assert a.ask("alloc", 600 * MIB) == ["alloc", "0", "0"]
    assert b.ask("alloc", 600 * MIB) == ["alloc", OOM, "-1"]

    said = shareset.change("ctr", Change(memory=2 * GIB), str(state))
    assert said == ["ctr: memory 2 GiB, compute cap 50 %"]
    time.sleep(RELOAD_S + 0.05)
    assert b.ask("alloc", 600 * MIB) == ["alloc", "0", "0"]
    for p in (a, b):
        assert p.ask("meminfo")[3] == str(2 * GIB)
    (found,) = sharestatus.status(str(state))
    assert found.limits["memory_limit"] == str(2 * GIB)
    assert found.devices[0].memory_limit == 2 * GIB  # the region as the processes updated it

    said = shareset.change("ctr", Change(memory=1 * GIB), str(state))
    assert said[1].startswith("container ctr holds 1.2 GiB on ")
    assert said[1].endswith(
        "more than its new limit 1 GiB: what it holds stays, new allocations fail until it is below"
    )
    time.sleep(RELOAD_S + 0.05)
    assert a.ask("alloc", MIB) == ["alloc", OOM, "-1"]
    assert a.ask("free", 0) == ["free", "0"]  # the work it held is intact
    assert b.ask("alloc", MIB) == ["alloc", "0", "1"]
    for p in (a, b):
        p.close()


def test_a_half_written_limits_file_changes_nothing(container):
    """The limits file caught truncated (share set writes it in place) is not a limit of nothing: the
    limits in force stay until it parses again."""
    state, (a, b) = container
    limits = state / "ctr" / "shared" / "limits"
    before = limits.read_text()
    with open(limits, "r+") as f:
        f.truncate(0)
    time.sleep(RELOAD_S + 0.05)
    assert a.ask("alloc", 1536 * MIB) == ["alloc", OOM, "-1"]
    limits.write_text(before.replace(f"memory_limit={GIB}", f"memory_limit={2 * GIB}"))
    time.sleep(RELOAD_S + 0.05)
    assert a.ask("alloc", 1536 * MIB) == ["alloc", "0", "0"]
    assert "limits changed: memory default 2147483648" in a.close()


def test_a_cap_change_is_the_running_work_s_next_launches(share, programs, private_mounts, tmp_path):  # noqa: F811
    """A process busy with kernels under cap 20 runs its next kernels unthrottled once its cap is
    raised to 100 while it runs; without the change they stay at 20 %."""
    state = tmp_path / "state"
    state.mkdir()
    share.dir = prepared(state, "busy", {"NVC_SHARE_COMPUTE": "20"}, os.getpid())

    def phases(change: bool) -> tuple[float, float]:
        ops = ["init", "ctx", 0, "launch", 80, 264, 128, "sync", "launch", 80, 264, 128, "sync"]
        proc = subprocess.Popen(
            [str(programs["cuda_probe"]), *map(str, ops)],
            env=share.env({"FAKE_CUDA_KERNEL_US": "3000"}),
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=foreground,
        )
        if change:
            time.sleep(0.3)  # the first phase takes 1.2 s at 20 %
            shareset.change("busy", Change(compute=100), str(state))
        out, _ = proc.communicate(timeout=30)
        lines = [line.split() for line in out.splitlines()]
        first, second = int(lines[2][2]) + int(lines[3][2]), int(lines[4][2]) + int(lines[5][2])
        return 80 * 3000 / first, 80 * 3000 / second

    assert phases(change=False)[1] < 0.35
    assert phases(change=True)[1] > 0.8


def test_the_limits_it_refuses_and_who_may(container, tmp_path):
    """A weight or latency class for a container with no scheduler file, a memory limit for one whose
    memory is not counted, bad input,
    a container that is not there, and anyone but root: refused, the limits file untouched."""
    state, _ = container
    limits = state / "ctr" / "shared" / "limits"
    before = limits.read_text()
    prepared(state, "memory-only", {"NVC_SHARE_MEMORY_LIMIT": "1Gi"})
    for wanted in (Change(weight=3), Change(priority="batch")):
        with pytest.raises(ContainerError, match="no scheduler file: it can be given a compute cap now"):
            shareset.change("memory-only", wanted, str(state))
    prepared(state, "compute-only", {"NVC_SHARE_COMPUTE": "50"})
    with pytest.raises(ContainerError, match="started without a memory limit, so its memory is not counted"):
        shareset.change("compute-only", Change(memory=GIB), str(state))
    with pytest.raises(ContainerError, match="no container nope shares a GPU here"):
        shareset.change("nope", Change(memory=GIB), str(state))
    cli = [str(SCRIPTS / "nvc-py"), "share", "set", "--state-dir", str(state), "ctr"]
    for args, error in (
        (["--memory", "lots"], "--memory='lots': not a size"),
        (["--compute", "0"], "--compute='0': not a percentage"),
        (["--gpu", "GPU-x/y", "--memory", "1G"], "--gpu 'GPU-x/y': not a GPU or MIG UUID, nor an index"),
        ([], "nothing to change"),
    ):
        result = subprocess.run([*cli, *args], capture_output=True, text=True)
        assert (result.returncode, error in result.stderr) == (2, True), result.stderr
    result = subprocess.run(
        [*cli, "--memory", "80G"], capture_output=True, text=True, user=65534, group=65534, extra_groups=[]
    )
    assert result.returncode == 11, result.stderr
    assert "only root changes the share of container ctr" in result.stderr
    assert limits.read_text() == before

    # what docs/sharing.md shows: one GPU's limit, by its UUID, through the installed command
    uuid = "GPU-4f6a2c1e-8b3d-5e7f-9a1b-2c3d4e5f6a7b"
    result = subprocess.run([*cli, "--gpu", uuid, "--compute", "30", "--weight", "3"], capture_output=True, text=True)
    assert (result.returncode, result.stdout) == (
        0,
        f"ctr: memory 1 GiB, compute cap 50 %, compute cap 30 % on {uuid}, weight 3 on {uuid}\n",
    ), result.stderr


def test_a_pod_s_container_stays_within_its_grant(share, private_mounts, tmp_path):  # noqa: F811
    """A pod's container (its spec's CRI annotations) has its start limits recorded as its bounds:
    lowering and raising back within them works, beyond them is refused."""
    from harness.sharedirs import prepare
    from nvc.plan import fromenv

    state = tmp_path / "state"
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    uuid = "GPU-11111111-2222-3333-4444-555555555555"
    asked = fromenv.parse_share_env({f"NVC_SHARE_MEMORY_LIMIT_{uuid}": "4Gi", f"NVC_SHARE_COMPUTE_{uuid}": "50"})
    prepare(asked, "pod-ctr", str(rootfs), None, state_dir=str(state), library=str(SHIM), pod=True)
    start = (state / "pod-ctr" / "shared" / "limits").read_text()
    assert (state / "pod-ctr" / shareplan.BOUNDS_FILE).read_text() == start

    assert shareset.change("pod-ctr", Change(gpu=uuid, memory=2 * GIB), str(state))
    assert shareset.change("pod-ctr", Change(gpu=uuid, memory=4 * GIB, compute=25), str(state))
    assert shareset.change("pod-ctr", Change(memory=GIB), str(state))  # every GPU: 1 GiB is within
    for wanted, over in (
        (Change(gpu=uuid, memory=5 * GIB), f"memory 5368709120 on {uuid} (granted 4294967296)"),
        (Change(compute=100), f"compute 100 on {uuid} (granted 50)"),
        (Change(gpu=uuid, compute=75), f"compute 75 on {uuid} (granted 50)"),
    ):
        with pytest.raises(PrivilegeError, match="would exceed what its pod was granted") as refused:
            shareset.change("pod-ctr", wanted, str(state))
        assert over in str(refused.value)
    text = (state / "pod-ctr" / "shared" / "limits").read_text()
    assert f"memory_limit={GIB}\ncompute_percent.{uuid}=25\n" in text


def test_under_mps_memory_changes_at_once_and_the_rest_for_new_processes(private_mounts, tmp_path):  # noqa: F811
    """A container shared through MPS: its memory limit (the shim's) and its MPS client lines change;
    the compute share and latency class are said to apply to processes started from now on. Its duty
    cycle (a lighter weight's, the shim's compute cap) stays until a cap replaces it."""
    from harness.sharedirs import prepare
    from nvc.apply import sharechange
    from nvc.plan import fromenv, mps

    state = tmp_path / "state"
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    library = tmp_path / "libnvc-share.so"
    library.write_bytes(b"")
    asked = fromenv.parse_share_env({"NVC_SHARE_MEMORY_LIMIT": "4Gi"})
    prepare(asked, "mps-ctr", str(rootfs), None, state_dir=str(state), library=str(library))
    with sharechange.locked("mps-ctr", str(state)) as current:  # as the hook writes an MPS client's file
        lines = mps.limits_lines({mps.PIPE: mps.CONTAINER_PIPE_DIR, mps.THREADS: "50", mps.PINNED: "0=5120M"})
        sharechange.rewrite("mps-ctr", current.limits + "compute_percent=40\n" + lines, None, str(state))

    shareset.change("mps-ctr", Change(memory=3 * GIB), str(state))
    assert "compute_percent=40\n" in (state / "mps-ctr" / "shared" / "limits").read_text()
    said = shareset.change("mps-ctr", Change(memory=2 * GIB, compute=30, priority="latency-critical"), str(state))
    assert said[1].startswith("container mps-ctr shares its GPU through MPS, which fixes a process's thread")
    assert said[1].endswith("they apply to its processes started from now on (memory at once)")
    text = (state / "mps-ctr" / "shared" / "limits").read_text()
    assert f"memory_limit={2 * GIB}\n" in text and "compute_percent" not in text
    for line in (
        "mps.CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30",
        "mps.CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=3072M",
        "mps.CUDA_MPS_CLIENT_PRIORITY=0",
        f"mps.CUDA_MPS_PIPE_DIRECTORY={mps.CONTAINER_PIPE_DIR}",
    ):
        assert line in text.splitlines()
    with pytest.raises(ContainerError, match="through MPS, where its weight, fixed at its start, sets its duty cycle"):
        shareset.change("mps-ctr", Change(weight=2), str(state))


# ---------------------------------------------------------------- a runc container, the installed command


def test_share_set_on_a_runc_container_through_the_hook(
    default_run_dir, fake_2gpu, runc, debian_rootfs, programs, tmp_path
):  # noqa: F811
    """A runc container started through the hook with memory 1 GiB, cap 50 and weight 1 runs two
    processes; `nvc-py share set` raises its memory, then its cap and weight: the process the old
    limit refused allocates at its next call, `share status` shows the new values (a latency class
    too), the other containers' view of its weight and class (its granted file) is the new one."""
    from harness.bundle import make_bundle
    from nvc.plan import share as plan

    hooks = oci_hooks(fake_driver_config(tmp_path / "config.yaml", fake_2gpu.root))
    talk = tmp_path / "talk"
    talk.mkdir()
    for name in ("a", "b"):
        os.mkfifo(talk / f"{name}.in")
    script = "for p in a b; do /programs/share_app stdin < /talk/$p.in > /talk/$p.out 2>&1 & done; wait"
    env = {
        "NVIDIA_VISIBLE_DEVICES": "0",
        "NVC_SHARE_MEMORY_LIMIT": "1Gi",
        "NVC_SHARE_COMPUTE": "50",
        "NVC_SHARE_WEIGHT": "1",
    }
    bundle = make_bundle(tmp_path / "bundle", debian_rootfs, ["sh", "-c", script], env=env, hooks=hooks)
    spec = json.loads((bundle / "config.json").read_text())
    spec["mounts"] += [
        {"destination": "/talk", "source": str(talk), "type": "bind", "options": ["rbind"]},
        {
            "destination": "/programs",
            "source": str(programs["share_app"].parent),
            "type": "bind",
            "options": ["rbind", "ro"],
        },
    ]
    (bundle / "config.json").write_text(json.dumps(spec))
    cid = "nvc-share-set"
    started = subprocess.Popen(
        [runc.binary, "--root", str(runc.state_root), "run", "--bundle", str(bundle), cid],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    writers = {name: os.open(talk / f"{name}.in", os.O_RDWR) for name in ("a", "b")}
    seen = {"a": 0, "b": 0}

    def ask(name: str, op: str) -> list[str]:
        os.write(writers[name], f"{op}\n".encode())
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            out = (talk / f"{name}.out").read_text().splitlines() if (talk / f"{name}.out").exists() else []
            if len(out) > seen[name]:
                seen[name] += 1
                return out[seen[name] - 1].split()
            time.sleep(0.02)
        raise AssertionError(f"{name}: no answer to {op}; runc: {started.poll()}")

    def nvc(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(SCRIPTS / "nvc-py"), "share", *args], capture_output=True, text=True)

    try:
        for name in ("a", "b"):
            assert ask(name, "init") == ["init", "0"]
        assert ask("a", f"alloc {600 * MIB}") == ["alloc", "0", "0"]
        assert ask("b", f"alloc {600 * MIB}") == ["alloc", OOM, "-1"]
        result = nvc("set", cid, "--memory", "2Gi")
        assert (result.returncode, result.stdout) == (0, f"{cid}: memory 2 GiB, compute cap 50 %, weight 1\n"), (
            result.stderr
        )
        time.sleep(RELOAD_S + 0.05)
        assert ask("b", f"alloc {600 * MIB}") == ["alloc", "0", "0"]

        result = nvc("set", cid, "--compute", "80", "--weight", "3", "--priority", "latency-critical")
        assert result.returncode == 0, result.stderr
        granted = Path(plan.sched_dir_for(plan.STATE_DIR)) / plan.GRANTED_DIR / cid
        assert granted.read_text() == "version=1\ncompute_percent=80\ncompute_weight=3\npriority=latency-critical\n"
        time.sleep(RELOAD_S + 0.05)
        assert ask("a", "meminfo")[3] == str(2 * GIB)
        shown = json.loads(nvc("status", "--json").stdout)
        (mine,) = [c for c in shown["containers"] if c["id"] == cid]
        assert (mine["limits"]["memory_limit"], mine["limits"]["compute_percent"]) == (str(2 * GIB), "80")
        device = mine["devices"][0]
        assert (device["compute_percent"], device["weight"], device["latency_class"]) == (80, 3, "latency-critical")
    finally:
        for fd in writers.values():
            os.close(fd)  # end of input: both processes exit
        try:
            started.wait(15)
        finally:
            runc.delete(cid)
            if os.path.ismount(default_run_dir / "gpu-sched"):  # the scheduler's tmpfs, mounted on first use
                subprocess.run(["umount", "-l", str(default_run_dir / "gpu-sched")], check=True)
    assert started.returncode == 0, started.stderr
    assert not (Path(plan.STATE_DIR) / cid).exists()  # poststop removed its files


@pytest.mark.parametrize(
    ("annotations", "pod"),
    [
        ({"io.kubernetes.cri.container-type": "container"}, True),  # containerd's CRI
        ({"io.kubernetes.cri-o.ContainerType": "container"}, True),  # CRI-O
        ({"org.opencontainers.image.title": "x"}, False),
        (None, False),
        (["io.kubernetes.cri.container-type"], False),  # not an object: no annotations
    ],
)
def test_a_pod_s_container_is_known_by_its_runtime_s_annotations(annotations, pod, tmp_path):
    """The hook takes a container for a pod's (its start limits recorded as bounds) by the annotations
    the kubelet's runtimes give a pod's containers."""
    from nvc.hook.oci import spec

    config = {"root": {"path": "rootfs"}, "process": {"env": [], "args": ["true"]}}
    if annotations is not None:
        config["annotations"] = annotations
    assert spec.container(str(tmp_path), config).pod is pod

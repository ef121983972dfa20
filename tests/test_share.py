"""The Python side of GPU sharing (nvc/share.py, nvc-py share status) against the real shim and the
fake driver: the env grammar, the limits file the hook writes as the shim reads it, the host-side
directory and mounts, the image's ld.so.preload read in-root, and status from a live region.
Test double only: nothing here is a GPU result.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from nvc import share, sharestatus
from nvc.errors import ContainerError, InputError
from test_share_native import GIB, GPU0, MIB, meminfo, programs, share as shim  # noqa: F401  (fixtures)

# ---------------------------------------------------------------- the env grammar

SIZES = [("1073741824", GIB), ("1g", GIB), ("1G", GIB), ("1Gi", GIB), ("1024m", GIB), ("1024Mi", GIB),
         ("1048576K", GIB), ("1048576Ki", GIB), ("4096", 4096), ("2T", 2 << 40), ("1ti", 1 << 40)]
JUNK_SIZES = ["", "abc", "0", "00", "1.5G", "0x10", "1 G", " 1G", "-1", "1GiB", "1gb", "1B", "1iG", "G",
              "1e9", "+5", "99999999999999999999", "16777216T", "١٢"]


@pytest.mark.parametrize(("text", "value"), SIZES)
def test_sizes(text, value):
    assert share.parse_size("NVC_SHARE_MEMORY_LIMIT", text) == value


@pytest.mark.parametrize("text", JUNK_SIZES)
def test_junk_sizes_are_refused_naming_the_variable(text):
    with pytest.raises(InputError, match=re.escape(f"NVC_SHARE_MEMORY_LIMIT={text!r}: not a size")):
        share.parse_size("NVC_SHARE_MEMORY_LIMIT", text)


@pytest.mark.parametrize(("env", "memory", "compute"), [
    ({}, None, None),
    ({"NVC_SHARE_MEMORY_LIMIT": "4Gi"}, (("", 4 * GIB),), ()),
    ({"NVC_SHARE_COMPUTE": "50"}, (), (("", 50),)),
    # HAMi's names; NVC_SHARE_* win at the same scope; per-device entries are kept by index
    ({"CUDA_DEVICE_MEMORY_LIMIT": "3g", "NVC_SHARE_MEMORY_LIMIT": "1Gi", "CUDA_DEVICE_MEMORY_LIMIT_1": "2048m"},
     (("", GIB), ("1", 2 * GIB)), ()),
    ({"CUDA_DEVICE_SM_LIMIT": "0"}, (), (("", 100),)),                       # HAMi: 0 = unlimited
    ({"CUDA_DEVICE_SM_LIMIT": "30", "NVC_SHARE_COMPUTE_0": "70"}, (), (("", 30), ("0", 70))),
    ({"NVC_SHARE_MEMORY_LIMIT_007": "1M"}, (("7", MIB),), ()),
    # other HAMi variables sharing a prefix are not limits
    ({"CUDA_DEVICE_MEMORY_SHARED_CACHE": "/tmp/x", "CUDA_DEVICE_SM_LIMIT_POLICY": "force"}, None, None),
])
def test_env_requests(env, memory, compute):
    request = share.parse_share_env({"PATH": "/bin", **env})
    if memory is None:
        assert request is None
    else:
        assert (request.memory, request.compute) == (memory, compute)


@pytest.mark.parametrize(("env", "message"), [
    ({"NVC_SHARE_MEMORY_LIMIT": "lots"}, "NVC_SHARE_MEMORY_LIMIT='lots': not a size"),
    ({"CUDA_DEVICE_MEMORY_LIMIT_0": "0x100"}, "CUDA_DEVICE_MEMORY_LIMIT_0='0x100': not a size"),
    ({"NVC_SHARE_COMPUTE": "0"}, "NVC_SHARE_COMPUTE='0': not a percentage"),
    ({"NVC_SHARE_COMPUTE": "101"}, "not a percentage"),
    ({"CUDA_DEVICE_SM_LIMIT": "50%"}, "CUDA_DEVICE_SM_LIMIT='50%': not a percentage"),
    ({"NVC_SHARE_MEMORY_LIMIT_GPU0": "1G"}, "NVC_SHARE_MEMORY_LIMIT_GPU0: unknown sharing variable"),
    ({"NVC_SHARE_MEMORY_LIMIT_1234": "1G"}, "unknown sharing variable"),
])
def test_junk_env_is_refused(env, message):
    with pytest.raises(InputError, match=message):
        share.parse_share_env(env)


def test_host_defaults_fill_in_what_the_container_left_out():
    own = share.parse_share_env({"NVC_SHARE_COMPUTE": "30", "NVC_SHARE_MEMORY_LIMIT_1": "1G"})
    merged = share.with_defaults(own, "8g", 50)
    assert (merged.memory, merged.compute) == ((("", 8 * GIB), ("1", GIB)), (("", 30),))
    assert share.with_defaults(None, None, 25) == share.ShareRequest(compute=(("", 25),))
    assert share.with_defaults(None, None, None) == share.ShareRequest()          # the shim, unlimited
    with pytest.raises(InputError, match="sharing.device-memory-limit='8 g'"):
        share.with_defaults(None, "8 g", None)


# ---------------------------------------------------------------- the limits file, as the shim reads it

def test_limits_file_round_trip_through_the_shim(shim, tmp_path):
    request = share.parse_share_env({"CUDA_DEVICE_MEMORY_LIMIT_1": "2048m", "NVC_SHARE_MEMORY_LIMIT": "1536Mi",
                                     "NVC_SHARE_COMPUTE": "50"})
    shared = share.write_share_dir(tmp_path, request)
    assert stat.S_IMODE(os.stat(shared / "limits").st_mode) == 0o444
    assert stat.S_IMODE(os.stat(shared / "region").st_mode) == 0o666
    shim.dir = shared
    # The file is the authority: the environment's (larger) limit is ignored, junk in it too.
    out, err = shim.run("cuda_probe", "init", "ctx", 0, "meminfo", "alloc", 1536 * MIB + 1, "ctx", 1, "meminfo",
                        limits={"NVC_SHARE_MEMORY_LIMIT": "60G", "NVC_SHARE_COMPUTE": "junk"})
    assert "FAILED" not in err
    assert meminfo(out[2]) == (1536 * MIB, 1536 * MIB)
    assert out[3] == ["alloc", "CUDA_ERROR_OUT_OF_MEMORY", "-1"]
    assert meminfo(out[5])[1] == 2 * GIB            # memory_limit.1: by NVML index


def test_fake_nvidia_smi_reports_the_written_limit(shim, tmp_path):
    shim.dir = share.write_share_dir(tmp_path, share.parse_share_env({"NVC_SHARE_MEMORY_LIMIT": "4Gi"}))
    holder = shim.holder("alloc", GIB, limits={})
    try:
        result = subprocess.run([str(shim.root / "usr" / "bin" / "nvidia-smi"),
                                 "--query-gpu=memory.total,memory.used", "--format=csv,noheader"],
                                env=shim.env({}), capture_output=True, text=True, timeout=20)
    finally:
        holder.kill()
        holder.wait()
    assert result.stdout.splitlines()[0] == "4096 MiB, 1024 MiB", result.stderr


def test_concurrent_allocations_never_exceed_the_budget(shim, programs):
    """Four processes race 4 MiB allocations into a 1 GiB budget (the lock-free charge path) and
    hold them: together they get exactly 256, never more, and all of it once the budget is full."""
    env = shim.env({"NVC_SHARE_MEMORY_LIMIT": "1Gi"})
    ops = ["init"] + ["alloc", str(4 * MIB)] * 200 + ["hold"]
    procs = [subprocess.Popen([str(programs["share_app"]), *ops], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(4)]
    results = []
    try:
        for proc in procs:
            for line in proc.stdout:
                if line.startswith("holding"):
                    break
                results.append(line.split()[:2])
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert results.count(["alloc", "0"]) == 256
    assert results.count(["alloc", "2"]) == 4 * 200 - 256


# ---------------------------------------------------------------- host side: directory, preload, mounts

@pytest.fixture
def rootfs(tmp_path: Path) -> Path:
    root = tmp_path / "rootfs"
    (root / "etc").mkdir(parents=True)
    return root


def test_preload_keeps_the_image_entries(rootfs):
    assert share.read_image_preload(str(rootfs)) == ""
    (rootfs / "etc" / "ld.so.preload").write_text("/usr/lib/libjemalloc.so.2 /opt/x.so")
    image = share.read_image_preload(str(rootfs))
    assert share.preload_text(image) == f"{share.CONTAINER_LIBRARY}\n/usr/lib/libjemalloc.so.2 /opt/x.so\n"


def test_preload_is_read_inside_the_root(rootfs, tmp_path):
    secret = tmp_path / "host-secret"
    secret.write_text("/host/only.so\n")
    (rootfs / "etc" / "ld.so.preload").symlink_to(secret)       # absolute: lands inside the rootfs
    assert share.read_image_preload(str(rootfs)) == ""
    (rootfs / "etc" / "ld.so.preload").unlink()
    os.mkfifo(rootfs / "etc" / "ld.so.preload")                    # would block a naive read
    with pytest.raises(ContainerError, match="not a regular file"):
        share.read_image_preload(str(rootfs))


def test_prepare_and_remove(rootfs, tmp_path):
    library = tmp_path / "libnvc-share.so"
    library.write_bytes(b"\x7fELF")
    state = tmp_path / "state"
    (rootfs / "etc" / "ld.so.preload").write_text("/usr/lib/libfoo.so\n")
    request = share.parse_share_env({"NVC_SHARE_MEMORY_LIMIT": "4Gi"})
    mounts = share.prepare(request, "ctr1", str(rootfs), library=str(library), state_dir=str(state))
    shared = state / "ctr1" / "shared"
    assert [(m.source, m.target, m.readonly, m.directory) for m in mounts] == [
        (str(library), "/usr/lib/nvc-share/libnvc-share.so", True, False),
        (str(shared), "/var/run/nvc-share", False, True),
        (str(shared / "limits"), "/var/run/nvc-share/limits", True, False),
        (str(state / "ctr1" / "ld.so.preload"), "/etc/ld.so.preload", True, False),
    ]
    assert (state / "ctr1" / "ld.so.preload").read_text() == \
        "/usr/lib/nvc-share/libnvc-share.so\n/usr/lib/libfoo.so\n"
    assert "memory_limit=4294967296\n" in (shared / "limits").read_text()
    with pytest.raises(ContainerError, match="already exists"):
        share.prepare(request, "ctr1", str(rootfs), library=str(library), state_dir=str(state))
    share.remove("ctr1", str(state))
    assert os.listdir(state) == []


def test_prepare_refuses_before_changing_anything(rootfs, tmp_path):
    state = tmp_path / "state"
    request = share.parse_share_env({"NVC_SHARE_COMPUTE": "50"})
    with pytest.raises(ContainerError, match="not installed"):
        share.prepare(request, "ctr", str(rootfs), library=str(tmp_path / "missing.so"), state_dir=str(state))
    with pytest.raises(InputError, match="cannot name a directory"):
        share.prepare(request, "../x", str(rootfs), library=str(Path(share.__file__)), state_dir=str(state))
    assert not state.exists() or os.listdir(state) == []


# ---------------------------------------------------------------- share status

def test_share_status_reads_the_live_region(shim, tmp_path):
    request = share.parse_share_env({"NVC_SHARE_MEMORY_LIMIT": "4Gi", "NVC_SHARE_COMPUTE": "50"})
    state = tmp_path / "state"
    (state / "ctr1").mkdir(parents=True)
    (state / "idle").mkdir()
    shim.dir = share.write_share_dir(state / "ctr1", request)
    share.write_share_dir(state / "idle", request)
    holder = shim.holder("alloc", 600 * MIB, limits={})
    try:
        result = subprocess.run(["nvc-py", "share", "status", "--json", "--state-dir", str(state)],
                                capture_output=True, text=True, timeout=30)
        text = subprocess.run(["nvc-py", "share", "status", "--state-dir", str(state)],
                              capture_output=True, text=True, timeout=30).stdout
    finally:
        holder.kill()
        holder.wait()
    assert result.returncode == 0, result.stderr
    ctr, idle = json.loads(result.stdout)["containers"]
    assert idle["id"] == "idle" and idle["region"].startswith("not initialised")
    assert ctr["region"] == "ok"
    assert ctr["limits"] == {"memory_limit": str(4 * GIB), "compute_percent": "50"}
    key = GPU0[4:]
    (device,) = ctr["devices"]
    assert (device["key"], device["memory_limit"], device["memory_used"], device["compute_percent"]) == \
        (key, 4 * GIB, 600 * MIB, 50)
    assert ctr["processes"] == [{"pid": holder.pid, "host_pid": holder.pid, "used": {key: 600 * MIB}}]
    assert f"{key}: memory 600 MiB used of 4096 MiB; compute 50%" in text
    assert f"pid {holder.pid} (host pid {holder.pid}): {key} 600 MiB" in text


def test_share_status_marks_dead_processes(shim, tmp_path):
    state = tmp_path / "state"
    (state / "c").mkdir(parents=True)
    shim.dir = share.write_share_dir(state / "c", share.parse_share_env({"NVC_SHARE_MEMORY_LIMIT": "1Gi"}))
    holder = shim.holder("alloc", 300 * MIB, limits={})
    holder.kill()
    holder.wait()
    (ctr,) = sharestatus.status(str(state))
    assert [(p.pid, p.host_pid, p.used) for p in ctr.processes] == [(holder.pid, None, {GPU0[4:]: 300 * MIB})]
    assert f"pid {holder.pid} (gone)" in sharestatus.text([ctr])


# ---------------------------------------------------------------- through the hook, in a runc container

def test_hook_injects_the_shim_into_a_runc_container(active_2gpu, fake_2gpu, runc, debian_rootfs, tmp_path):
    """A container asking for 4 GiB gets the shim preloaded, a limits file it cannot change even as
    root, and NVML (the fake nvidia-smi) reporting the limit; poststop removes its directory; junk
    limits refuse the start and leave nothing behind."""
    from harness.bundle import make_bundle
    from test_hook_containers import SCRIPTS

    config = tmp_path / "config.yaml"
    log = f"log: {{file: {tmp_path / 'hook.log'}}}\n"  # not the host's log
    config.write_text(f"root: {fake_2gpu.root}\nload-kmods: false\n{log}")
    hook = {"path": str(SCRIPTS / "nvc-py-hook"), "args": ["nvc-py-hook", "prestart"],
            "env": [f"NVC_PY_CONFIG={config}"]}
    hooks = {"prestart": [hook], "poststop": [{**hook, "args": ["nvc-py-hook", "poststop"]}]}
    script = ("head -1 /etc/ld.so.preload; cat /var/run/nvc-share/limits | grep memory_limit; "
              "(echo memory_limit=80Gi >> /var/run/nvc-share/limits) 2>/dev/null || echo read-only; "
              "nvidia-smi --query-gpu=memory.total --format=csv,noheader")
    env = {"NVIDIA_VISIBLE_DEVICES": "0", "NVC_SHARE_MEMORY_LIMIT": "4Gi"}
    bundle = make_bundle(tmp_path / "ok", debian_rootfs, ["sh", "-c", script], env=env, hooks=hooks)
    result = runc.create_start(bundle, container_id="nvc-share-ok")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [share.CONTAINER_LIBRARY, f"memory_limit={4 * GIB}", "read-only",
                                          "4096 MiB"]
    runc.delete("nvc-share-ok")
    assert not (Path(share.STATE_DIR) / "nvc-share-ok").exists()

    # Sharing enabled on the host: a container that asks for nothing gets the host's default.
    enabled = tmp_path / "enabled.yaml"
    enabled.write_text(f"root: {fake_2gpu.root}\nload-kmods: false\n{log}"
                       "sharing: {enabled: true, device-memory-limit: 2g}\n")
    host_hooks = {stage: [{**h, "env": [f"NVC_PY_CONFIG={enabled}"]} for h in hs] for stage, hs in hooks.items()}
    plain = make_bundle(tmp_path / "plain", debian_rootfs, ["nvidia-smi", "--query-gpu=memory.total",
                        "--format=csv,noheader"], env={"NVIDIA_VISIBLE_DEVICES": "0"}, hooks=host_hooks)
    result = runc.create_start(plain, container_id="nvc-share-default")
    assert (result.returncode, result.stdout) == (0, "2048 MiB\n"), result.stderr

    bad = make_bundle(tmp_path / "bad", debian_rootfs, ["true"], env={**env, "NVC_SHARE_MEMORY_LIMIT": "lots"},
                      hooks=hooks)
    result = runc.create_start(bad, container_id="nvc-share-bad")
    assert result.returncode != 0
    assert "NVC_SHARE_MEMORY_LIMIT='lots': not a size" in result.stderr
    assert not (Path(share.STATE_DIR) / "nvc-share-bad").exists()

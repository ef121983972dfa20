"""``nvc-py share status`` (nvc.commands.sharestatus) over live regions of the real shim on the fake driver,
and over what a container may write in its region or plant in place of its sharing files.
Test double only: nothing here is a GPU result.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from harness.fakegpus import H100 as GPU0
from harness.sharedirs import prepared, private_mounts  # noqa: F401  (fixture)
from harness.shim import GIB, MIB  # noqa: F401  (fixtures)
from harness.shim import share as shim  # noqa: F401  (a fixture)
from nvc.apply import sharefiles
from nvc.commands import sharestatus
from nvc.share.region import SIZE as REGION_SIZE

# ---------------------------------------------------------------- share status


def test_share_status_reads_the_live_region(shim, tmp_path):
    state = tmp_path / "state"
    env = {"NVC_SHARE_MEMORY_LIMIT": "4Gi", "NVC_SHARE_COMPUTE": "50", "NVC_SHARE_WEIGHT": "3"}
    shim.dir = prepared(state, "ctr1", env, os.getpid())  # the "container" in this pid namespace
    prepared(state, "idle", env)
    holder = shim.holder("alloc", 600 * MIB, limits={})
    try:
        result = subprocess.run(
            ["nvc-py", "share", "status", "--json", "--state-dir", str(state)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        text = subprocess.run(
            ["nvc-py", "share", "status", "--state-dir", str(state)], capture_output=True, text=True, timeout=30
        ).stdout
    finally:
        holder.kill()
        holder.wait()
    assert result.returncode == 0, result.stderr
    ctr, idle = json.loads(result.stdout)["containers"]
    assert idle["id"] == "idle" and idle["region"].startswith("not initialised")
    assert ctr["region"] == "ok"
    assert ctr["limits"] == {"memory_limit": str(4 * GIB), "compute_percent": "50", "compute_weight": "3"}
    key = GPU0[4:]
    (device,) = ctr["devices"]
    assert (
        device["key"],
        device["memory_limit"],
        device["memory_used"],
        device["compute_percent"],
        device["weight"],
        device["share_percent"],
    ) == (key, 4 * GIB, 600 * MIB, 50, 3, None)
    assert ctr["processes"] == [{"pid": holder.pid, "host_pid": holder.pid, "used": {key: 600 * MIB}}]
    assert f"{key}: memory 600 MiB used of 4 GiB (15 %); compute cap 50 %, weight 3, idle" in text
    assert "container ctr1\n  limits: memory 4 GiB, compute cap 50 %, weight 3\n" in text
    assert "container idle\n  limits: memory 4 GiB, compute cap 50 %, weight 3\n  usage: none recorded yet (" in text
    assert f"pid {holder.pid} as the container reports it (host pid {holder.pid}): {key} 600 MiB" in text


def test_share_status_marks_dead_processes(shim, tmp_path):
    state = tmp_path / "state"
    shim.dir = prepared(state, "c", {"NVC_SHARE_MEMORY_LIMIT": "1Gi"}, os.getpid())
    holder = shim.holder("alloc", 300 * MIB, limits={})
    holder.kill()
    holder.wait()
    (ctr,) = sharestatus.status(str(state))
    assert [(p.pid, p.host_pid, p.used) for p in ctr.processes] == [(holder.pid, None, {GPU0[4:]: 300 * MIB})]
    assert (
        f"pid {holder.pid} as the container reports it (not running in the container's pid namespace)"
        in sharestatus.text([ctr])
    )


def test_share_status_text_is_in_human_units_and_json_in_the_files_own() -> None:
    """Sizes in binary units, caps and shares in percent, times in seconds; --json keeps the bytes and
    the limits file's entries as they are. An entry the hook does not write is shown as it is, escaped."""
    ctr = sharestatus.ContainerShare(
        "c",
        "/x",
        {
            "memory_limit": str(4 * GIB),
            "compute_percent": "50",
            "memory_limit.1": str(3 * GIB // 2),
            "compute_weight.GPU-abc": "3",
            "future": "a\nb",
        },
        "ok",
        (
            sharestatus.Device("GPU-abc"[4:], 4 * GIB, 600 * MIB, 50, 132, 12.25, 0.5, 10, 3, 24.96),
            sharestatus.Device("def", 0, 0, 100, 132, 0.0, 0.0, 0),
            sharestatus.Device(
                "ghi", 0, 0, 100, 132, 1.0, 0.0, 9, 1, 25.0, duty_percent=50, backlog_percent=96.4, steady_percent=12.5
            ),
        ),
        (sharestatus.Process(5, None, {"abc": 1536 * MIB}),),
    )
    assert sharestatus.text([ctr]) == (
        "container c\n"
        "  limits: memory 4 GiB, compute cap 50 %, memory 1.5 GiB on GPU 1, weight 3 on GPU-abc, future=a\\nb\n"
        "  abc: memory 600 MiB used of 4 GiB (15 %); compute cap 50 %, weight 3, measured share 25.0 %, busy 12.2 s, "
        "throttled 0.5 s over 10 launches\n"
        "  def: memory 0 B used (no limit); no compute cap, busy 0.0 s, throttled 0.0 s over 0 launches\n"
        "  ghi: memory 0 B used (no limit); no compute cap, weight 1, measured share 25.0 %, work queued at 96 % of "
        "its looks (steady 12 %), in a duty cycle of 50 % beside a steadily busy heavier container, busy 1.0 s, "
        "throttled 0.0 s over 9 launches\n"
        "  pid 5 as the container reports it (not running in the container's pid namespace): abc 1.5 GiB\n"
    )
    doc = json.loads(sharestatus.as_json([ctr]))["containers"][0]
    assert doc["limits"]["memory_limit"] == str(4 * GIB) and doc["limits"]["future"] == "a\nb"
    assert doc["devices"][0]["memory_limit"] == 4 * GIB and doc["processes"][0]["used"] == {"abc": 1536 * MIB}
    assert [d["duty_percent"] for d in doc["devices"]] == [None, None, 50]
    assert [(d["backlog_percent"], d["steady_percent"]) for d in doc["devices"]] == [(None, None)] * 2 + [(96.4, 12.5)]
    assert [sharestatus.size_text(n) for n in (0, 1023, 1024, 1536, 80 * GIB, 5 << 50)] == [
        "0 B",
        "1023 B",
        "1 KiB",
        "1.5 KiB",
        "80 GiB",
        "5 PiB",
    ]


def test_share_status_shows_what_a_container_wrote_as_its_word(shim, tmp_path):
    """A container's region is its own to write: a process slot it forges (here a live host process's
    registration, in the host's pid namespace, not the container's) is not shown as a host process,
    and a device key with a newline and terminal escapes is shown escaped, on one line."""
    from nvc.share.region import _HEADER

    state = tmp_path / "state"
    other_ns = subprocess.Popen(["unshare", "--pid", "--fork", "sleep", "60"])
    try:
        deadline = time.monotonic() + 10
        while not (children := Path(f"/proc/{other_ns.pid}/task/{other_ns.pid}/children").read_text().split()):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        shim.dir = prepared(state, "ctr", {"NVC_SHARE_MEMORY_LIMIT": "80Gi"}, int(children[0]))
        holder = shim.holder("alloc", 600 * MIB, limits={})
        try:
            with open(shim.dir / "region", "r+b") as region:  # the device key, as the container may write it
                region.seek(_HEADER.size)
                region.write(b"evil\nforged line\x1b[2J".ljust(40, b"\0"))
            (ctr,) = sharestatus.status(str(state))
            text = sharestatus.text([ctr])
            result = subprocess.run(
                ["nvc-py", "share", "status", "--json", "--state-dir", str(state)],
                capture_output=True,
                text=True,
                timeout=30,
            )
        finally:
            holder.kill()
            holder.wait()
    finally:
        other_ns.kill()
        other_ns.wait()
    assert [(p.pid, p.host_pid) for p in ctr.processes] == [(holder.pid, None)]
    assert f"pid {holder.pid} as the container reports it (not running in the container's pid namespace)" in text
    assert "\x1b" not in text and "\nforged line" not in text
    assert "  evil\\nforged line\\x1b[2J: memory 600 MiB used of 80 GiB (1 %)" in text
    assert result.returncode == 0 and json.loads(result.stdout)["containers"][0]["processes"][0]["host_pid"] is None
    assert "\x1b" not in result.stdout
    sharefiles.remove("ctr", str(state))


def _plant(shared: Path, name: str, what: str, host: Path) -> None:
    """What a container (root in it) can put in place of one of its shared files."""
    path = shared / name
    path.unlink()
    if what == "symlink":
        path.symlink_to(host)
    elif what == "fifo":
        os.mkfifo(path, 0o666)
    elif what == "device":
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 5))  # /dev/zero: endless
    elif what == "huge":
        path.write_bytes(b"")
        os.truncate(path, 1 << 40)  # sparse: fits any tmpfs
    elif what == "not-root":
        path.write_bytes(bytes(REGION_SIZE))
        os.chown(path, 1000, 1000)


@pytest.mark.parametrize(
    ("name", "what", "message"),
    [
        ("region", "symlink", "region is a symbolic link (not followed), not a regular file"),
        ("limits", "symlink", "limits is a symbolic link (not followed), not a regular file"),
        ("region", "fifo", "region is a FIFO, not a regular file"),
        ("region", "device", "region is a character device, not a regular file"),
        ("region", "huge", f"region is {1 << 40} bytes, not {REGION_SIZE} (not read)"),
        ("region", "not-root", "region is owned by uid 1000, not 0"),
    ],
)
def test_share_status_reports_what_the_container_planted(private_mounts, tmp_path, name, what, message):
    """Finding 3: root's `share status` opens nothing the container put in place of its files: a
    symlink to a host file is not followed, a FIFO does not hang it, a device or a huge file is not
    read. It ends promptly and says what it found; the other containers are shown as usual."""
    state = tmp_path / "state"
    host = tmp_path / "host-limits"  # would read as limits (and a region) if followed
    host.write_text("version=1\nmemory_limit=12345\n" + "#" * REGION_SIZE)
    os.truncate(host, REGION_SIZE)
    _plant(prepared(state, "bad", {"NVC_SHARE_MEMORY_LIMIT": "1Gi"}), name, what, host)
    prepared(state, "good", {"NVC_SHARE_MEMORY_LIMIT": "2Gi"})
    result = subprocess.run(
        ["nvc-py", "share", "status", "--json", "--state-dir", str(state)], capture_output=True, text=True, timeout=20
    )
    assert result.returncode == 0, result.stderr
    bad, good = json.loads(result.stdout)["containers"]
    assert bad["region"] == f"unreadable: {state}/bad/shared/{message}"
    assert "12345" not in result.stdout
    assert bad["limits"] == ({} if name == "limits" else {"memory_limit": str(GIB)})
    assert good["region"].startswith("not initialised: no CUDA process") and good["limits"] == {
        "memory_limit": str(2 * GIB)
    }
    text = subprocess.run(
        ["nvc-py", "share", "status", "--state-dir", str(state)], capture_output=True, text=True, timeout=20
    ).stdout
    assert f"  region: unreadable: {state}/bad/shared/{message}\n" in text
    for cid in ("bad", "good"):
        sharefiles.remove(cid, str(state))
    assert os.listdir(state) == [] and host.exists()

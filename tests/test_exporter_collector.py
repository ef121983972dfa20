"""``nvc-py exporter`` (nvc/exporter/): the collector over sharing directories made as the hook makes
them (a live one through the real shim on the fake driver, hostile ones as a container may write
them), the hook server's and the device plugin's state, and a real Prometheus server (Debian's
``prometheus``) scraping the installed exporter. The two tests that run the shim are here together:
its programs are built once per module (tests/harness/shim.py).

Test double only: no figure here is a GPU result.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

from harness.bundle import make_bundle
from harness.exporter import KEY
from harness.exporter import sample as _of
from harness.exporter import samples as _samples
from harness.exporter import scrape as _scrape
from harness.exporter import start as _exporter
from harness.hookserver import hook_server
from harness.installed import SCRIPTS
from harness.sharedirs import prepared, private_mounts  # noqa: F401  (fixture: tmpfs mounts of this test's own)
from harness.shareregion import Device, Entry, Slot, region_bytes, sched_bytes
from harness.shim import GIB, MIB  # noqa: F401  (fixtures)
from harness.shim import share as shim  # noqa: F401  (a fixture)
from nvc.apply import sharefiles
from nvc.exporter import unixdiag
from nvc.exporter.collector import MAX_PROCESSES
from nvc.k8s import published
from nvc.plan import share
from nvc.share.region import SIZE as REGION_SIZE

# ---------------------------------------------------------------- the collector


def test_a_live_container_its_limits_memory_and_processes(shim, tmp_path: Path) -> None:
    """A container made as the hook makes it, a process of it holding 600 MiB through the real shim."""
    state = tmp_path / "state"
    shim.dir = prepared(
        state,
        "tenant",
        {"NVC_SHARE_MEMORY_LIMIT": "4Gi", "NVC_SHARE_COMPUTE": "50", "NVC_SHARE_WEIGHT": "3"},
        os.getpid(),
    )
    prepared(state, "idle", {"NVC_SHARE_MEMORY_LIMIT": "2Gi"})
    holder = shim.holder("alloc", 600 * MIB, limits={})
    try:
        samples = _samples(_scrape(state, tmp_path))
    finally:
        holder.kill()
        holder.wait()
    labels = {"container_id": "tenant", "device": KEY}
    assert _of(samples, "nvc_py_share_containers") == 2
    assert (
        _of(samples, "nvc_py_share_region_ok", container_id="tenant"),
        _of(samples, "nvc_py_share_region_ok", container_id="idle"),
    ) == (1, 0)
    assert _of(samples, "nvc_py_share_memory_limit_bytes", **labels) == 4 * GIB
    assert _of(samples, "nvc_py_share_memory_used_bytes", **labels) == 600 * MIB
    assert _of(samples, "nvc_py_share_process_memory_used_bytes", pid=str(holder.pid), **labels) == 600 * MIB
    assert _of(samples, "nvc_py_share_compute_limit_ratio", **labels) == 0.5
    assert _of(samples, "nvc_py_share_weight", **labels) == 3
    assert _of(samples, "nvc_py_share_measured_ratio", **labels) is None  # no launch: idle
    assert not [k for k in samples if dict(k[1]).get("container_id") == "idle" and k[0] != "nvc_py_share_region_ok"]
    for cid in ("tenant", "idle"):
        sharefiles.remove(cid, str(state))


def _write(path: Path, data: bytes) -> None:
    """What a container does to a file of its shared directory: writes into it (same inode, same owner)."""
    with open(path, "r+b") as f:
        f.write(data)
        f.truncate(len(data))


def test_weighted_tenants_measured_and_fair_shares(private_mounts, tmp_path: Path) -> None:
    """Two busy weighted tenants of one GPU (weights 1 and 3) and an idle one: each one's measured share
    as its scheduler file says, and the share its weight gives it among the busy ones; the lighter's duty
    cycle where its file says it is in one, and each busy one's looks at its backlog (queued, steady)."""
    state = tmp_path / "state"
    sched = Path(share.sched_dir_for(str(state)))
    for cid, weight, permille in (("a", 1, 300), ("b", 3, 700), ("c", 2, 0)):
        shared = prepared(state, cid, {"NVC_SHARE_WEIGHT": str(weight)})
        _write(shared / "region", region_bytes([Device(KEY, busy_ns=5 * 10**9, throttled_ns=10**9, launches=77)]))
        seen = None if permille else time.monotonic_ns() - 5 * 10**9  # c: last launch 5 s ago
        duty, looks = (50, (960, 125)) if cid == "a" else (0, (700, 950))
        _write(
            sched / cid,
            sched_bytes(
                [
                    Entry(
                        KEY,
                        weight,
                        permille,
                        seen,
                        duty_percent=duty,
                        backlog_permille=looks[0],
                        steady_permille=looks[1],
                    )
                ]
            ),
        )
    samples = _samples(_scrape(state, tmp_path))
    for cid, measured, fair in (("a", 0.3, 0.25), ("b", 0.7, 0.75), ("c", None, None)):
        labels = {"container_id": cid, "device": KEY}
        assert _of(samples, "nvc_py_share_measured_ratio", **labels) == measured
        assert _of(samples, "nvc_py_share_fair_ratio", **labels) == fair
        assert _of(samples, "nvc_py_share_duty_ratio", **labels) == (0.5 if cid == "a" else None)
        looks = {"a": (0.96, 0.125), "b": (0.7, 0.95), "c": (None, None)}[cid]  # c idle: nothing now
        assert (
            _of(samples, "nvc_py_share_backlog_ratio", **labels),
            _of(samples, "nvc_py_share_steady_ratio", **labels),
        ) == looks
        assert _of(samples, "nvc_py_share_busy_seconds_total", **labels) == 5.0
        assert _of(samples, "nvc_py_share_throttled_seconds_total", **labels) == 1.0
        assert _of(samples, "nvc_py_share_launches_total", **labels) == 77
    for cid in ("a", "b", "c"):
        sharefiles.remove(cid, str(state))


def test_what_a_container_writes_cannot_break_or_flood_the_output(private_mounts, tmp_path: Path) -> None:
    """A container writing garbage into its region and scheduler file: device keys with quotes,
    newlines and terminal escapes, 16 devices of one key, a header claiming 2^32 devices and slots,
    every slot a forged process of another pid namespace, numbers at their maximum; another one's
    region all random bytes, another's a FIFO. The output parses, each label set once, every device
    label a key or ``invalid``, no escape byte; the honest container is reported as ever."""
    state = tmp_path / "state"
    top = 2**64 - 1
    hostile = prepared(state, "hostile", {"NVC_SHARE_WEIGHT": "2"})
    keys = ['evil"\n\x1b[2J}', "\\", "", "\udcff" * 3] + [KEY] * 12
    slots = [Slot(pid, 1, 4026531836, [top] * 16) for pid in range(1, 1025)]
    _write(
        hostile / "region",
        region_bytes(
            [Device(k, top, 2**32 - 1, top, top, top) for k in keys], slots, ndevices=2**32 - 1, hwm=2**32 - 1
        ),
    )
    _write(
        Path(share.sched_dir_for(str(state))) / "hostile",
        sched_bytes([Entry(KEY, 2**32 - 1, 2**32 - 1), Entry('x"\n', 1, 500)] * 8, ndevices=2**32 - 1),
    )
    _write(prepared(state, "random", {"NVC_SHARE_WEIGHT": "1"}) / "region", os.urandom(REGION_SIZE))
    fifo = prepared(state, "fifo", {"NVC_SHARE_COMPUTE": "50"}) / "region"
    fifo.unlink()
    os.mkfifo(fifo, 0o666)
    shared = prepared(state, "honest", {"NVC_SHARE_MEMORY_LIMIT": "1Gi"})
    _write(shared / "region", region_bytes([Device(KEY, GIB)], [Slot(4242, 1, 1, [GIB // 2])]))
    text = _scrape(state, tmp_path)
    samples = _samples(text)
    assert "\x1b" not in text and len(text) < 20000
    devices = {dict(labels)["device"] for _, labels in samples if "device" in dict(labels)}
    assert devices == {KEY, "invalid"}
    hostile_used = [
        v
        for (name, labels), v in samples.items()
        if name == "nvc_py_share_memory_used_bytes" and dict(labels)["container_id"] == "hostile"
    ]
    assert len(hostile_used) == 2  # one per label set, the first of each kept
    assert not [k for k in samples if k[0] == "nvc_py_share_process_memory_used_bytes"]  # no process of its own pidns
    assert {
        cid: _of(samples, "nvc_py_share_region_ok", container_id=cid) for cid in ("hostile", "random", "fifo", "honest")
    } == {"hostile": 1, "random": 0, "fifo": 0, "honest": 1}
    assert _of(samples, "nvc_py_share_memory_limit_bytes", container_id="honest", device=KEY) == GIB
    assert _of(samples, "nvc_py_share_memory_used_bytes", container_id="honest", device=KEY) == GIB // 2
    for cid in ("hostile", "random", "fifo", "honest"):
        sharefiles.remove(cid, str(state))


def test_processes_shown_are_bounded(private_mounts, tmp_path: Path) -> None:
    """A container of many processes of its own: the largest MAX_PROCESSES are shown."""
    state = tmp_path / "state"
    shared = prepared(state, "many", {"NVC_SHARE_COMPUTE": "50"}, os.getpid())
    pidns = os.stat("/proc/self/ns/pid").st_ino
    procs = [subprocess.Popen(["sleep", "30"]) for _ in range(MAX_PROCESSES + 3)]
    try:
        slots = [
            Slot(
                p.pid,
                int(Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]),
                pidns,
                [(i + 1) * MIB],
            )
            for i, p in enumerate(procs)
        ]
        _write(shared / "region", region_bytes([Device(KEY)], slots))
        samples = _samples(_scrape(state, tmp_path))
    finally:
        for p in procs:
            p.kill()
            p.wait()
    shown = {dict(labels)["pid"] for name, labels in samples if name == "nvc_py_share_process_memory_used_bytes"}
    assert shown == {str(p.pid) for p in procs[3:]}
    sharefiles.remove("many", str(state))


# ---------------------------------------------------------------- the hook server, the device plugin


def test_the_hook_server_is_up_while_its_socket_listens(tmp_path: Path) -> None:
    path = tmp_path / "hook.sock"
    assert not unixdiag.listening(str(path))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.bind(str(path))
    assert not unixdiag.listening(str(path))  # bound, not listening: a dead server's leftover acts alike
    sock.listen(1)
    try:
        assert unixdiag.listening(str(path))
        samples = _samples(_scrape(tmp_path / "none", tmp_path, socket=str(path)))
        assert [v for (name, _), v in samples.items() if name == "nvc_py_hook_server_up"] == [1]
    finally:
        sock.close()
    assert not unixdiag.listening(str(path))


def test_the_device_plugins_file_is_believed_only_from_a_running_plugin(tmp_path: Path) -> None:
    path = tmp_path / "device-plugin.json"
    record = published.this_process(
        (published.ResourceHealth("nvidia.com/gpu", 1, 1), published.ResourceHealth('x"\n\x1b', 0, 2))
    )
    published.write(str(path), record)
    assert published.read(str(path)) == record
    samples = _samples(_scrape(tmp_path / "none", tmp_path, plugin=str(path)))
    assert _of(samples, "nvc_py_device_plugin_up") == 1
    assert _of(samples, "nvc_py_device_plugin_devices", resource="nvidia.com/gpu", health="unhealthy") == 1
    assert _of(samples, "nvc_py_device_plugin_devices", resource='x"\\n\\x1b', health="unhealthy") == 2
    gone = subprocess.Popen(["true"])
    gone.wait()
    published.write(str(path), record._replace(pid=gone.pid))  # a plugin that was killed
    assert published.read(str(path)) is None and published.read(str(path), alive_only=False) is not None
    for junk in (b"{", b'{"pid": 1, "start_time": -1, "resources": []}', b"[]" * 40000):
        path.write_bytes(junk)
        assert published.read(str(path)) is None
    published.write(str(path), record)
    os.chown(path, 1000, 1000)
    assert published.read(str(path)) is None  # only root's own file
    published.remove(str(path), record)
    assert path.exists()  # not this record's file any more (read refuses it): left alone
    samples = _samples(_scrape(tmp_path / "none", tmp_path, plugin=str(path)))
    assert _of(samples, "nvc_py_device_plugin_up") == 0


# ---------------------------------------------------------------- a real Prometheus


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _query(port: int, query: str) -> dict[frozenset, float]:
    url = f"http://127.0.0.1:{port}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
    with urllib.request.urlopen(url, timeout=5) as answer:
        doc = json.load(answer)
    assert doc["status"] == "success", doc
    return {
        frozenset((k, v) for k, v in r["metric"].items() if k not in ("__name__", "instance", "job")): float(
            r["value"][1]
        )
        for r in doc["data"]["result"]
    }


def _ready(port: int, prometheus: subprocess.Popen, timeout: float = 30) -> None:
    """Wait for Prometheus's /-/ready (its storage opened, its configuration loaded)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=5) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        assert time.monotonic() < deadline and prometheus.poll() is None, "prometheus did not start"
        time.sleep(0.1)


def _until(port: int, query: str, want: object = None, timeout: float = 30) -> dict[frozenset, float]:
    """The query's answer once it has a series (and equals ``want``, where given)."""
    deadline = time.monotonic() + timeout
    while True:
        found = _query(port, query)
        if found and (want is None or found == want):
            return found
        assert time.monotonic() < deadline, f"{query}: {found}"
        time.sleep(0.2)


def _hook_start(name: str, tmp_path: Path, config: Path, env: dict[str, str], socket_path: str) -> int:
    """One prestart of a container whose spec has ``env``, as a runtime calls the installed hook."""
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir(exist_ok=True)
    bundle = make_bundle(tmp_path / f"bundle-{name}", rootfs, ["true"], env=env)
    state = json.dumps({"ociVersion": "1.0.2", "id": name, "status": "creating", "pid": 1, "bundle": str(bundle)})
    return subprocess.run(
        [str(SCRIPTS / "nvc-py-hook"), "prestart"],
        input=state,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.environ["PATH"], "NVC_PY_CONFIG": str(config), "NVC_PY_HOOK_SOCKET": socket_path},
    ).returncode


def test_prometheus_scrapes_the_exporter(shim, tmp_path: Path) -> None:
    """Debian's prometheus, on a loopback port with a data directory of its own, scrapes the installed
    exporter every second: the sharing container's limits and the memory its process holds, the fake
    GPUs' memory, a start the hook refused (through the hook server) and one without a GPU (direct);
    then the container writes garbage into its region and the scrapes go on. Both stopped by pid."""
    state = tmp_path / "state"
    shim.dir = prepared(
        state,
        "tenant",
        {"NVC_SHARE_MEMORY_LIMIT": "4Gi", "NVC_SHARE_COMPUTE": "50", "NVC_SHARE_WEIGHT": "3"},
        os.getpid(),
    )
    prepared(state, "idle", {"NVC_SHARE_MEMORY_LIMIT": "2Gi"})
    config = tmp_path / "config.yaml"
    config.write_text(f"root: {shim.root}\nload-kmods: false\nlog: {{file: {tmp_path / 'hook.log'}}}\n")
    server_dir = Path(tempfile.mkdtemp(prefix="nvc-exp-"))  # 0700, and short enough for a socket's path
    sock = server_dir / "hook.sock"
    holder = shim.holder("alloc", 600 * MIB, limits={})
    prometheus: subprocess.Popen | None = None
    exporter: subprocess.Popen | None = None
    try:
        with hook_server(SCRIPTS / "nvc-py-hook", sock):
            assert (
                _hook_start(
                    "refused",
                    tmp_path,
                    config,
                    {"NVIDIA_VISIBLE_DEVICES": "0", "NVC_SHARE_MEMORY_LIMIT": "lots"},
                    str(sock),
                )
                == 2
            )
            assert _hook_start("plain", tmp_path, config, {}, "none") == 0
            exporter, where = _exporter(
                tmp_path,
                "127.0.0.1:0",
                "--state-dir",
                str(state),
                "--hook-socket",
                str(sock),
                "--device-plugin-file",
                str(tmp_path / "no-plugin.json"),
                "--nvml-interval",
                "1",
                env={"NVC_PY_CONFIG": str(config)},
            )
            target = urllib.parse.urlparse(where).netloc
            port = _free_port()
            (tmp_path / "prometheus.yml").write_text(
                "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
                f"scrape_configs:\n  - job_name: nvc-py\n    static_configs: [{{targets: ['{target}']}}]\n"
            )
            prometheus = subprocess.Popen(
                [
                    "prometheus",
                    f"--config.file={tmp_path / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp_path / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=warn",
                ],
                stdout=subprocess.DEVNULL,
                stderr=(tmp_path / "prometheus.log").open("w"),
            )
            _ready(port, prometheus)
            tenant = frozenset({("container_id", "tenant"), ("device", KEY)})
            assert _until(port, 'nvc_py_share_memory_used_bytes{container_id="tenant"}') == {tenant: 600 * MIB}
            assert _query(port, "nvc_py_share_memory_limit_bytes") == {tenant: 4 * GIB}
            assert _query(port, "nvc_py_share_process_memory_used_bytes") == {
                tenant | {("pid", str(holder.pid))}: 600 * MIB
            }
            assert _query(port, "nvc_py_share_compute_limit_ratio") == {tenant: 0.5}
            assert _query(port, "nvc_py_share_weight") == {tenant: 3}
            assert _query(port, "nvc_py_share_region_ok") == {
                frozenset({("container_id", "tenant")}): 1,
                frozenset({("container_id", "idle")}): 0,
            }
            assert {dict(k)["index"]: v for k, v in _query(port, "nvc_py_gpu_memory_total_bytes").items()} == {
                "0": 80 * GIB,
                "1": 40 * GIB,
            }
            assert _query(port, "nvc_py_nvml_up") == {frozenset(): 1}
            starts = {
                (dict(k)["outcome"], dict(k)["via"]): v for k, v in _query(port, "nvc_py_hook_starts_total").items()
            }
            assert {k: v for k, v in starts.items() if v} == {("refused", "server"): 1, ("no-gpu", "direct"): 1}
            assert _query(port, 'nvc_py_hook_start_duration_seconds_count{via="server"}') == {
                frozenset({("via", "server")}): 1
            }
            assert list(_query(port, "nvc_py_hook_server_up").values()) == [1]
            # the container writes garbage into its region; the next scrapes keep going
            _write(
                shim.dir / "region",
                region_bytes(
                    [Device('evil"\n\x1b[2J', 2**64 - 1)] * 16,
                    [Slot(1, 1, 1, [2**64 - 1] * 16)] * 1024,
                    2**32 - 1,
                    2**32 - 1,
                ),
            )
            _write(state / "idle" / "shared" / "region", os.urandom(REGION_SIZE))
            invalid = frozenset({("container_id", "tenant"), ("device", "invalid")})
            assert _until(port, "nvc_py_share_memory_limit_bytes", {invalid: float(2**64 - 1)})
            assert _until(port, 'up{job="nvc-py"}', {frozenset(): 1})
            assert exporter.poll() is None
    finally:
        for proc in (prometheus, exporter):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(15) for proc in (prometheus, exporter) if proc is not None]
        holder.kill()
        holder.wait()
        for cid in ("tenant", "idle"):
            sharefiles.remove(cid, str(state))
        shutil.rmtree(server_dir)
    assert codes == [0, 0], (tmp_path / "prometheus.log").read_text()
    with socket.socket() as s:  # nothing listens there any more
        assert s.connect_ex(("127.0.0.1", port)) != 0

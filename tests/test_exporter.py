"""``nvc-py exporter`` (nvc/exporter/): the hook log's reader, the collector over sharing directories
made as the hook makes them (a live one through the real shim on the fake driver, hostile ones as a
container may write them), and a real Prometheus server (Debian's ``prometheus``) scraping the
installed exporter. Test double only: no figure here is a GPU result.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from harness.bundle import make_bundle
from harness.fakegpus import H100 as GPU0
from harness.hookserver import hook_server
from harness.installed import SCRIPTS
from harness.sharedirs import prepared, private_mounts  # noqa: F401  (fixture: tmpfs mounts of this test's own)
from harness.shareregion import Device, Entry, Slot, region_bytes, sched_bytes
from harness.shim import GIB, MIB, programs, share as shim  # noqa: F401  (fixtures)
from nvc.exporter import hooklog, unixdiag
from nvc.exporter.collector import MAX_PROCESSES, Collector, Sources
from nvc.k8s import published
from nvc.apply import sharefiles
from nvc.plan import share
from nvc.share.region import SIZE as REGION_SIZE

KEY = GPU0[4:].lower()


def _line(**fields: object) -> bytes:
    return json.dumps({"time": "2025-01-01T00:00:00Z", "stage": "prestart", "container": "c", **fields}).encode()


# ---------------------------------------------------------------- the hook's log

@pytest.mark.parametrize(("fields", "start"), [
    ({"outcome": "configured", "duration_ms": 42.5, "via": "server"}, hooklog.Start("configured", "server", 0.0425)),
    ({"outcome": "no-gpu", "duration_ms": 3}, hooklog.Start("no-gpu", "direct", 0.003)),
    ({"outcome": "error", "error": "input error: NVC_SHARE_MEMORY_LIMIT='lots': not a size", "duration_ms": 9},
     hooklog.Start("refused", "direct", 0.009)),
    ({"outcome": "error", "error": "requirement error: cuda>=99 not satisfied"}, hooklog.Start("refused", "direct", None)),
    ({"outcome": "error", "error": "driver error: nvml error: unknown", "duration_ms": "9"},
     hooklog.Start("failed", "direct", None)),
    ({"outcome": "crashed", "duration_ms": float("inf")}, hooklog.Start("failed", "direct", None)),
    ({"outcome": "error", "error": ["input error: not a string"], "duration_ms": -1}, hooklog.Start("failed", "direct", None)),
    ({"stage": "create-symlinks", "outcome": "done"}, None),
])
def test_a_log_line_is_a_start_by_outcome(fields: dict, start: hooklog.Start | None) -> None:
    assert hooklog.parse_line(_line(**fields)) == start


@pytest.mark.parametrize("line", [b"not json", b"[1, 2]", b'{"outcome": "configured"}', _line(outcome="sideways"),
                                  b"\xff\xfe\x1b[2J", b"[" * 100000])
def test_junk_is_not_a_start(line: bytes) -> None:
    with pytest.raises(hooklog.NotHookLine):
        hooklog.parse_line(line)


def _starts(tally: hooklog.Tally) -> dict[tuple[str, str], int]:
    return {k: n for k, n in tally.starts.items() if n}


def test_the_log_is_read_on_across_partial_lines_rotation_truncation_and_junk(tmp_path: Path) -> None:
    log = tmp_path / "hook.log"
    tail = hooklog.LogTail(str(log))
    tail.read()  # no log yet
    assert not tail.open and _starts(tail.tally) == {}
    ok = _line(outcome="configured", duration_ms=20) + b"\n"
    log.write_bytes(ok + b"junk\x1b[2J\n" + ok[:30])  # the last line still being written
    tail.read()
    assert _starts(tail.tally) == {("configured", "direct"): 1} and tail.tally.junk == 1
    with log.open("ab") as f:
        f.write(ok[30:] + b"x" * (hooklog.MAX_LINE + 10))  # the line's end, then an overlong line's start
    tail.read()
    assert _starts(tail.tally) == {("configured", "direct"): 2} and tail.tally.junk == 2
    with log.open("ab") as f:
        f.write(b"y" * 100 + b"\n" + _line(outcome="no-gpu") + b"\n")  # the overlong line ends: skipped
    tail.read()
    assert _starts(tail.tally) == {("configured", "direct"): 2, ("no-gpu", "direct"): 1} and tail.tally.junk == 2
    with log.open("ab") as f:  # logrotate: the old file gets a last line after the rename, then a new file
        os.rename(log, tmp_path / "hook.log.1")
        f.write(_line(outcome="crashed") + b"\n")
    log.write_bytes(_line(outcome="configured", via="server", duration_ms=50000) + b"\n")
    tail.read()
    assert _starts(tail.tally) == {("configured", "direct"): 2, ("no-gpu", "direct"): 1, ("failed", "direct"): 1,
                                   ("configured", "server"): 1}
    assert tail.tally.over["server"] == 1 and tail.tally.seconds["server"] == 50.0
    os.truncate(log, 0)  # copytruncate
    log.write_bytes(_line(outcome="no-gpu", via="server", duration_ms=1) + b"\n")
    tail.read()
    assert _starts(tail.tally)[("no-gpu", "server")] == 1 and tail.tally.buckets["server"][0] == 1
    tail.close()


def test_a_scrape_reads_a_bounded_part_of_a_long_log(tmp_path: Path) -> None:
    line = _line(outcome="configured", duration_ms=20) + b"\n"
    lines = 2 * hooklog.MAX_READ // len(line) + 1
    log = tmp_path / "hook.log"
    log.write_bytes(line * lines)
    tail = hooklog.LogTail(str(log))
    tail.read()
    first = tail.tally.starts[("configured", "direct")]
    assert 0 < first <= hooklog.MAX_READ // len(line)
    for _ in range(3):
        tail.read()
    assert tail.tally.starts[("configured", "direct")] == lines and tail.tally.junk == 0
    tail.close()


def test_a_fifo_at_the_log_path_is_not_read(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "hook.log")
    tail = hooklog.LogTail(str(tmp_path / "hook.log"))
    tail.read()  # would block on open or read
    assert not tail.open


# ---------------------------------------------------------------- the collector

def _scrape(state: Path, tmp_path: Path, **given: str) -> str:
    """One scrape's text from a collector over ``state`` (no NVML), as Prometheus gets it."""
    sources = Sources(str(state), given.get("log", str(tmp_path / "no.log")), given.get("socket", str(tmp_path / "no.sock")),
                      given.get("plugin", str(tmp_path / "no-plugin.json")))
    registry = CollectorRegistry()
    registry.register(Collector(sources, None))
    return generate_latest(registry).decode()


def _samples(text: str) -> dict[tuple[str, frozenset], float]:
    """Every sample by (name, labels); the text must parse, and no label set may come twice."""
    found: dict[tuple[str, frozenset], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            assert key not in found, f"{key} twice"
            found[key] = sample.value
    return found


def _of(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def test_a_live_container_its_limits_memory_and_processes(shim, tmp_path: Path) -> None:
    """A container made as the hook makes it, a process of it holding 600 MiB through the real shim."""
    state = tmp_path / "state"
    shim.dir = prepared(state, "tenant", {"NVC_SHARE_MEMORY_LIMIT": "4Gi", "NVC_SHARE_COMPUTE": "50",
                                          "NVC_SHARE_WEIGHT": "3"}, os.getpid())
    prepared(state, "idle", {"NVC_SHARE_MEMORY_LIMIT": "2Gi"})
    holder = shim.holder("alloc", 600 * MIB, limits={})
    try:
        samples = _samples(_scrape(state, tmp_path))
    finally:
        holder.kill()
        holder.wait()
    labels = {"container_id": "tenant", "device": KEY}
    assert _of(samples, "nvc_py_share_containers") == 2
    assert (_of(samples, "nvc_py_share_region_ok", container_id="tenant"),
            _of(samples, "nvc_py_share_region_ok", container_id="idle")) == (1, 0)
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
    as its scheduler file says, and the share its weight gives it among the busy ones."""
    state = tmp_path / "state"
    sched = Path(share.sched_dir_for(str(state)))
    for cid, weight, permille in (("a", 1, 300), ("b", 3, 700), ("c", 2, 0)):
        shared = prepared(state, cid, {"NVC_SHARE_WEIGHT": str(weight)})
        _write(shared / "region", region_bytes([Device(KEY, busy_ns=5 * 10**9, throttled_ns=10**9, launches=77)]))
        seen = None if permille else time.monotonic_ns() - 5 * 10**9  # c: last launch 5 s ago
        _write(sched / cid, sched_bytes([Entry(KEY, weight, permille, seen)]))
    samples = _samples(_scrape(state, tmp_path))
    for cid, measured, fair in (("a", 0.3, 0.25), ("b", 0.7, 0.75), ("c", None, None)):
        labels = {"container_id": cid, "device": KEY}
        assert _of(samples, "nvc_py_share_measured_ratio", **labels) == measured
        assert _of(samples, "nvc_py_share_fair_ratio", **labels) == fair
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
    _write(hostile / "region", region_bytes([Device(k, top, 2**32 - 1, top, top, top) for k in keys], slots,
                                            ndevices=2**32 - 1, hwm=2**32 - 1))
    _write(Path(share.sched_dir_for(str(state))) / "hostile",
           sched_bytes([Entry(KEY, 2**32 - 1, 2**32 - 1), Entry('x"\n', 1, 500)] * 8, ndevices=2**32 - 1))
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
    hostile_used = [v for (name, labels), v in samples.items()
                    if name == "nvc_py_share_memory_used_bytes" and dict(labels)["container_id"] == "hostile"]
    assert len(hostile_used) == 2  # one per label set, the first of each kept
    assert not [k for k in samples if k[0] == "nvc_py_share_process_memory_used_bytes"]  # no process of its own pidns
    assert {cid: _of(samples, "nvc_py_share_region_ok", container_id=cid)
            for cid in ("hostile", "random", "fifo", "honest")} == {"hostile": 1, "random": 0, "fifo": 0, "honest": 1}
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
        slots = [Slot(p.pid, int(Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]), pidns,
                      [(i + 1) * MIB]) for i, p in enumerate(procs)]
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
    record = published.this_process((published.ResourceHealth("nvidia.com/gpu", 1, 1),
                                     published.ResourceHealth('x"\n\x1b', 0, 2)))
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


# ---------------------------------------------------------------- the command

def _cli_imports(*args: str) -> set[str]:
    launcher = Path("/usr/lib/nvc-py/nvc-py-python")
    interpreter = launcher.read_text().splitlines()[0][2:].split(" ", 1)[0]
    result = subprocess.run([interpreter, "-IS", "-X", "importtime", str(launcher), *args],
                            capture_output=True, text=True, check=True)
    return {line.rpartition("|")[2].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}


@pytest.mark.parametrize("args", [("exporter", "--help"), ("share", "--help")])
def test_the_cli_loads_no_prometheus_client_until_the_exporter_runs(args: tuple[str, ...]) -> None:
    imported = _cli_imports(*args)
    assert "nvc.exporter.command" in imported
    assert not {name for name in imported if name.split(".")[0] == "prometheus_client" or
                name in ("nvc.exporter.collector", "nvc.exporter.serve", "nvc.k8s.published")}


@pytest.mark.parametrize(("listen", "message"), [
    ("9402", "not ADDR:PORT"), ("127.0.0.1:99999", "not ADDR:PORT"), ("localhost:9402", "'localhost' is not an IP"),
    ("::1:9402", "'::1' is not an IP"), ("unix:relative.sock", "needs an absolute path")])
def test_bad_listen_addresses_are_refused(listen: str, message: str) -> None:
    result = subprocess.run([str(SCRIPTS / "nvc-py"), "exporter", "--listen", listen], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_a_state_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "state").write_text("")
    result = subprocess.run([str(SCRIPTS / "nvc-py"), "exporter", "--state-dir", str(tmp_path / "state")],
                            capture_output=True, text=True, timeout=30)
    assert (result.returncode, result.stderr) == (2, f"nvc-py: input error: {tmp_path}/state: --state-dir is not a "
                                                     f"directory\n")


def _exporter(tmp_path: Path, listen: str, *args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """The installed ``nvc-py exporter``, started; and where it says it listens."""
    proc = subprocess.Popen([str(SCRIPTS / "nvc-py"), "exporter", "--listen", listen, *args],
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
    line = proc.stderr.readline()
    found = re.match(r"nvc-py exporter: listening on (\S+)", line)
    assert found, (line, proc.poll())
    return proc, found.group(1)


def test_the_exporter_on_a_unix_socket(tmp_path: Path) -> None:
    import http.client

    path = tmp_path / "exporter.sock"
    proc, where = _exporter(tmp_path, f"unix:{path}", "--no-nvml", "--state-dir", str(tmp_path / "none"),
                            "--hook-log", str(tmp_path / "hook.log"))
    try:
        assert where == f"unix:{path}" and (os.stat(path).st_mode & 0o777) == 0o660

        class Connection(http.client.HTTPConnection):
            def connect(self) -> None:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.sock.connect(str(path))

        conn = Connection("localhost")
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        assert _of(_samples(text), "nvc_py_share_containers") == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    assert not path.exists()


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
    return {frozenset((k, v) for k, v in r["metric"].items() if k not in ("__name__", "instance", "job")):
            float(r["value"][1]) for r in doc["data"]["result"]}


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
    return subprocess.run([str(SCRIPTS / "nvc-py-hook"), "prestart"], input=state, capture_output=True, text=True,
                          timeout=60, env={"PATH": os.environ["PATH"], "NVC_PY_CONFIG": str(config),
                                           "NVC_PY_HOOK_SOCKET": socket_path}).returncode


def test_prometheus_scrapes_the_exporter(shim, tmp_path: Path) -> None:
    """Debian's prometheus, on a loopback port with a data directory of its own, scrapes the installed
    exporter every second: the sharing container's limits and the memory its process holds, the fake
    GPUs' memory, a start the hook refused (through the hook server) and one without a GPU (direct);
    then the container writes garbage into its region and the scrapes go on. Both stopped by pid."""
    state = tmp_path / "state"
    shim.dir = prepared(state, "tenant", {"NVC_SHARE_MEMORY_LIMIT": "4Gi", "NVC_SHARE_COMPUTE": "50",
                                          "NVC_SHARE_WEIGHT": "3"}, os.getpid())
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
            assert _hook_start("refused", tmp_path, config, {"NVIDIA_VISIBLE_DEVICES": "0",
                                                             "NVC_SHARE_MEMORY_LIMIT": "lots"}, str(sock)) == 2
            assert _hook_start("plain", tmp_path, config, {}, "none") == 0
            exporter, where = _exporter(tmp_path, "127.0.0.1:0", "--state-dir", str(state), "--hook-socket", str(sock),
                                        "--device-plugin-file", str(tmp_path / "no-plugin.json"),
                                        "--nvml-interval", "1", env={"NVC_PY_CONFIG": str(config)})
            target = urllib.parse.urlparse(where).netloc
            port = _free_port()
            (tmp_path / "prometheus.yml").write_text(
                "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
                f"scrape_configs:\n  - job_name: nvc-py\n    static_configs: [{{targets: ['{target}']}}]\n")
            prometheus = subprocess.Popen(
                ["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'data'}",
                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("w"))
            _ready(port, prometheus)
            tenant = frozenset({("container_id", "tenant"), ("device", KEY)})
            assert _until(port, 'nvc_py_share_memory_used_bytes{container_id="tenant"}') == {tenant: 600 * MIB}
            assert _query(port, "nvc_py_share_memory_limit_bytes") == {tenant: 4 * GIB}
            assert _query(port, "nvc_py_share_process_memory_used_bytes") == {tenant | {("pid", str(holder.pid))}: 600 * MIB}
            assert _query(port, "nvc_py_share_compute_limit_ratio") == {tenant: 0.5}
            assert _query(port, "nvc_py_share_weight") == {tenant: 3}
            assert _query(port, "nvc_py_share_region_ok") == {frozenset({("container_id", "tenant")}): 1,
                                                             frozenset({("container_id", "idle")}): 0}
            assert {dict(k)["index"]: v for k, v in _query(port, "nvc_py_gpu_memory_total_bytes").items()} == \
                {"0": 80 * GIB, "1": 40 * GIB}
            assert _query(port, "nvc_py_nvml_up") == {frozenset(): 1}
            starts = {(dict(k)["outcome"], dict(k)["via"]): v for k, v in _query(port, "nvc_py_hook_starts_total").items()}
            assert {k: v for k, v in starts.items() if v} == {("refused", "server"): 1, ("no-gpu", "direct"): 1}
            assert _query(port, 'nvc_py_hook_start_duration_seconds_count{via="server"}') == \
                {frozenset({("via", "server")}): 1}
            assert list(_query(port, "nvc_py_hook_server_up").values()) == [1]
            # the container writes garbage into its region; the next scrapes keep going
            _write(shim.dir / "region", region_bytes([Device('evil"\n\x1b[2J', 2**64 - 1)] * 16,
                                                     [Slot(1, 1, 1, [2**64 - 1] * 16)] * 1024, 2**32 - 1, 2**32 - 1))
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


# ---------------------------------------------------------------- deployment

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"


def _exported_names(tmp_path: Path) -> set[str]:
    """The name of every series the exporter can produce (its families, empty ones included)."""
    text = _scrape(tmp_path / "none", tmp_path)
    types = dict(m.groups() for m in re.finditer(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE))
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
    return {name.removesuffix("_total") + suffix for name, kind in types.items() for suffix in suffixes[kind]}


def test_rules_and_dashboard_ask_for_what_the_exporter_serves_and_docs_list_it(tmp_path: Path) -> None:
    """promtool (Debian's prometheus package) checks the alert rules, and every query of the Grafana
    dashboard as a recording rule; each nvc_py_ name they use is one the exporter serves; docs/metrics.md
    lists every metric it serves."""
    import yaml

    served = _exported_names(tmp_path)
    rules = DEPLOY / "prometheus" / "nvc-py-alerts.yaml"
    result = subprocess.run(["promtool", "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    dashboard = json.loads((DEPLOY / "grafana" / "nvc-py-dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    as_rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query{i}", "expr": e.replace("$__rate_interval", "5m").replace("$instance", ".*")}
        for i, e in enumerate(exprs)]}]}
    (tmp_path / "dashboard-rules.yaml").write_text(yaml.safe_dump(as_rules))
    result = subprocess.run(["promtool", "check", "rules", str(tmp_path / "dashboard-rules.yaml")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    used = set(re.findall(r"\bnvc_py_\w+", rules.read_text() + "\n".join(exprs)))
    assert used and used <= served, used - served
    docs = (REPO / "docs" / "metrics.md").read_text()
    documented = set(re.findall(r"`(nvc_py_\w+)`", docs))
    families = {re.sub(r"_(bucket|count|sum)$", "", n) for n in served}
    assert families <= documented and documented <= families | served, (families ^ documented)


def test_the_systemd_unit_and_the_service_monitor(tmp_path: Path) -> None:
    import yaml

    unit = (DEPLOY / "systemd" / "nvc-py-exporter.service").read_text()
    (exec_start,) = [line.partition("=")[2].split() for line in unit.splitlines() if line.startswith("ExecStart=")]
    assert exec_start[:2] == ["/usr/lib/nvc-py/nvc-py", "exporter"]
    help_text = subprocess.run([str(SCRIPTS / "nvc-py"), "exporter", "--help"], capture_output=True, text=True,
                               check=True).stdout
    assert {a for a in exec_start if a.startswith("--")} <= set(help_text.split())
    service, monitor = yaml.safe_load_all((DEPLOY / "kubernetes" / "nvc-py-exporter-monitoring.yaml").read_text())
    daemonset = yaml.safe_load((DEPLOY / "kubernetes" / "nvc-py-device-plugin.yaml").read_text())
    pod = daemonset["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    ports = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", ())}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports
    assert monitor["kind"] == "ServiceMonitor"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {p["name"] for p in service["spec"]["ports"]}

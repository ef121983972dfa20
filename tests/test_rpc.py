"""The helper protocol, the generic forked helper and the NVML driver helper, as real processes.

Hardening is read back from /proc while the helper serves, not assumed from the code.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import prctl
import pytest

from harness.processes import children as _children
from nvc import errors
from nvc.rpc import helper, protocol
from nvc.confinement import CONTAINER_HELPER, DRIVER_HELPER, confine
from nvc.devices import DriverSnapshot
from nvc.rpc.driver_service import brand_name, bus_id, open_driver, overflow_ids, snapshot_from_wire
from nvc.rpc.helper import HelperClient

TEST_UID, TEST_GID = 12345, 23456


# ---- protocol -----------------------------------------------------------------------------


def _payloads(data: bytes) -> Iterator[bytes]:
    """The payloads a reader gets from a peer that sent ``data`` and closed: the real reader,
    :func:`protocol.recv_payload`, over a socketpair, until the clean end of the stream."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.sendall(data)
        theirs.shutdown(socket.SHUT_WR)
        while True:
            try:
                yield protocol.recv_payload(ours, time.monotonic() + 5)
            except protocol.EndOfStream:
                return


def test_request_and_responses_round_trip() -> None:
    messages = [
        protocol.Request(7, "snapshot", {"a": [1, "ü"]}),
        protocol.Response(7, result={"gpus": [], "v": None}),
        protocol.Response(8, error=protocol.RemoteError("driver", "nvml error: gpu is lost", 15)),
    ]
    payloads = list(_payloads(b"".join(protocol.encode(m) for m in messages)))
    assert len(payloads) == 3
    assert protocol.decode_request(payloads[0]) == messages[0]
    assert [protocol.decode_response(p) for p in payloads[1:]] == messages[1:]


def test_frame_is_length_prefixed_compact_json() -> None:
    frame = protocol.encode(protocol.Request(1, "m"))
    payload = b'{"v":1,"id":1,"method":"m","params":{}}'
    assert frame == len(payload).to_bytes(4, "big") + payload


@pytest.mark.parametrize("cut", [3, 4, 10])
def test_truncated_frames_are_reported(cut: int) -> None:
    frame = protocol.encode(protocol.Request(1, "snapshot"))
    with pytest.raises(protocol.TruncatedFrame, match="connection closed after"):
        list(_payloads(frame[:cut]))
    assert list(_payloads(b"")) == []  # closed between frames: the clean end


def test_oversized_frames_are_refused_both_ways() -> None:
    with pytest.raises(protocol.ProtocolError, match="exceeds"):
        protocol.encode(protocol.Response(1, result="x" * protocol.MAX_FRAME))
    with pytest.raises(protocol.ProtocolError, match="exceeds"):
        list(_payloads((protocol.MAX_FRAME + 1).to_bytes(4, "big") + b"{}"))


@pytest.mark.parametrize(
    ("payload", "complaint"),
    [
        (b"{not json", "malformed payload"),
        (b"[1]", "not an object"),
        (b'{"v":2,"id":1,"result":0}', "protocol version 2"),
        (b'{"v":1,"id":"1","result":0}', "not an integer"),
        (b'{"v":1,"id":1,"result":0,"error":{}}', "exactly one"),
        (b'{"v":1,"id":1,"error":{"kind":"driver"}}', "malformed error"),
    ],
)
def test_bad_responses_are_refused(payload: bytes, complaint: str) -> None:
    with pytest.raises(protocol.ProtocolError, match=complaint):
        protocol.decode_response(payload)


def test_bad_requests_are_refused() -> None:
    with pytest.raises(protocol.ProtocolError, match="string method"):
        protocol.decode_request(b'{"v":1,"id":1,"method":3,"params":{}}')


def test_socket_helpers_tell_clean_close_from_truncation_and_timeout() -> None:
    a, b = socket.socketpair()
    with a, b:
        protocol.send_message(a, protocol.Request(1, "x"), time.monotonic() + 1)
        assert protocol.decode_request(protocol.recv_payload(b, time.monotonic() + 1)).method == "x"
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            protocol.recv_payload(b, start + 0.1)
        assert 0.09 < time.monotonic() - start < 1
        a.sendall(protocol.encode(protocol.Request(2, "y"))[:6])
        a.shutdown(socket.SHUT_WR)
        with pytest.raises(protocol.TruncatedFrame, match="after 2 of"):
            protocol.recv_payload(b, time.monotonic() + 1)
    c, d = socket.socketpair()
    with c, d:
        c.close()
        with pytest.raises(protocol.EndOfStream):
            protocol.recv_payload(d, time.monotonic() + 1)


# ---- generic helper -----------------------------------------------------------------------


def _test_service(root: str) -> dict:
    """A confined service with test-only methods; the production helpers have none of these."""
    confine(DRIVER_HELPER, root, (TEST_UID, TEST_GID), rearm=helper.die_with_parent)

    def fail(kind: str, message: str, code: int | None = None) -> None:
        exc = next(c for c in (errors.NvcError, *errors.NvcError.__subclasses__()) if c.kind == kind)(message)
        exc.code = code
        raise exc

    def shutdown() -> None:
        Path("/shut-down").write_text("cleanup ran\n")

    return {
        "echo": lambda **params: params,
        "sleep": lambda seconds: time.sleep(seconds),
        "exit": lambda status: os._exit(status),
        "fail": fail,
        "crash": lambda: 1 / 0,
        "unencodable": lambda: {1, 2},
        "shutdown": shutdown,
    }


def _status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {key: value.strip() for key, value in (line.split(":", 1) for line in lines)}


@pytest.fixture
def jail(tmp_path: Path) -> Path:
    """An empty directory the unprivileged helper can write to, as its root."""
    root = tmp_path / "root"
    root.mkdir(mode=0o777)
    root.chmod(0o777)
    return root


@pytest.fixture
def spawn(jail: Path):
    """Start test helpers; afterwards check that none is left behind, not even as a zombie."""
    before = _children()
    clients: list[HelperClient] = []

    def start(**options) -> HelperClient:
        client = HelperClient.spawn("test", lambda: _test_service(str(jail)), failure=errors.DriverError, **options)
        clients.append(client)
        return client

    yield start
    for client in clients:
        client.close()
    assert _children() == before


def test_helper_runs_confined(spawn, jail: Path) -> None:
    client = spawn()
    assert client.call("echo", a=1, b=["x"]) == {"a": 1, "b": ["x"]}
    status = _status(client.pid)
    assert status["CapEff"] == status["CapPrm"] == status["CapInh"] == "0000000000000000"
    assert status["CapBnd"] == status["CapAmb"] == "0000000000000000"
    assert status["NoNewPrivs"] == "1"
    assert status["Uid"].split() == [str(TEST_UID)] * 4
    assert status["Gid"].split() == [str(TEST_GID)] * 4
    assert status["Groups"] == ""
    assert status["PPid"] == str(os.getpid())
    assert Path(f"/proc/{client.pid}/comm").read_text() == "nvc:[test]\n"
    assert os.readlink(f"/proc/{client.pid}/root") == str(jail)
    assert os.readlink(f"/proc/{client.pid}/cwd") == str(jail)
    assert sorted(int(fd) for fd in os.listdir(f"/proc/{client.pid}/fd")) == [0, 1, 2, 3]
    assert os.readlink(f"/proc/{client.pid}/fd/0") == "/dev/null"


def test_errors_come_back_as_their_class(spawn) -> None:
    client = spawn()
    with pytest.raises(errors.DeviceError) as caught:
        client.call("fail", kind="device", message="unknown device id: 7", code=42)
    assert str(caught.value) == "device error: unknown device id: 7"
    assert caught.value.code == 42
    with pytest.raises(errors.DriverError, match=r"^driver error: crash failed: ZeroDivisionError"):
        client.call("crash")
    with pytest.raises(errors.DriverError, match="unknown rpc method: nope"):
        client.call("nope")
    with pytest.raises(errors.DriverError, match="unencodable failed: TypeError"):
        client.call("unencodable")
    with pytest.raises(errors.DriverError, match="sleep failed: TypeError"):
        client.call("sleep", no_such_param=1)
    assert client.call("echo", still="serving") == {"still": "serving"}


def test_a_helper_bug_keeps_its_service_kind() -> None:
    """An exception that is no NvcError comes back as the service's own kind: a bug in the
    container (mount) helper is a mount error, never a driver error."""
    from nvc.rpc.container_service import open_container

    with open_container(5.0) as container:
        with pytest.raises(errors.MountError, match=r"^mount error: mount failed: KeyError: 'operations'"):
            container.helper.call("mount", plan={"rootfs": "/", "pid": None, "owner": [0, 0]})


def test_setup_errors_are_raised_by_spawn_and_leave_no_process() -> None:
    before = _children()

    def setup() -> dict:
        raise errors.InitializationError("load library failed: libnvidia-ml.so.1: nope")

    with pytest.raises(errors.InitializationError, match="^initialization error: load library failed"):
        HelperClient.spawn("test", setup, failure=errors.DriverError)
    assert _children() == before


def test_unwaited_spawn_raises_setup_errors_at_the_first_call() -> None:
    """``wait=False`` returns before the child's setup ends; its failure surfaces at the first call."""
    before = _children()

    def setup() -> dict:
        time.sleep(0.2)  # the parent must not wait for this
        raise errors.InitializationError("load library failed: libnvidia-ml.so.1: nope")

    t0 = time.monotonic()
    client = HelperClient.spawn("test", setup, wait=False, failure=errors.DriverError)
    assert time.monotonic() - t0 < 0.15
    with pytest.raises(errors.InitializationError, match="^initialization error: load library failed"):
        client.call("echo")
    with pytest.raises(errors.DriverError, match="helper is not running"):
        client.call("echo")
    assert _children() == before


def test_unwaited_spawn_serves_once_ready(spawn) -> None:
    client = spawn(wait=False)
    assert client.call("echo", a=1) == {"a": 1}
    assert client.call("echo", b=2) == {"b": 2}


def test_preforked_helper_serves_after_start() -> None:
    """prefork: ``warm`` runs before the parameters exist; ``setup(**params)`` once start() sends them."""
    before = _children()

    def setup(value: int) -> dict:
        return {"get": lambda: {"value": value, "warm": sys.modules.get("colorsys") is not None}}

    client = HelperClient.prefork("test", setup, warm=lambda: __import__("colorsys"), failure=errors.DriverError)
    client.start(value=7)
    assert client.call("get") == {"value": 7, "warm": True}
    client.close()
    assert os.WIFEXITED(client.status) and os.WEXITSTATUS(client.status) == 0
    assert _children() == before


def test_preforked_helper_never_started_exits_cleanly() -> None:
    before = _children()
    client = HelperClient.prefork("test", lambda: {}, failure=errors.DriverError)
    client.close()
    assert os.WIFEXITED(client.status) and os.WEXITSTATUS(client.status) == 0
    assert _children() == before


def test_preforked_helper_setup_error_comes_back_at_the_first_call() -> None:
    before = _children()

    def setup(root: str) -> dict:
        raise errors.InitializationError(f"load library failed: libnvidia-ml.so.1: not in {root}")

    client = HelperClient.prefork("test", setup, failure=errors.DriverError)
    client.start(root="/nowhere")
    with pytest.raises(errors.InitializationError, match="not in /nowhere"):
        client.call("get")
    assert _children() == before


def test_killed_mid_call_is_reported_with_the_signal(spawn) -> None:
    client = spawn()
    pid = client.pid
    threading.Timer(0.2, os.kill, (pid, signal.SIGKILL)).start()
    with pytest.raises(errors.DriverError, match=r"^driver error: test rpc error: helper killed by signal SIGKILL"):
        client.call("sleep", seconds=30)
    assert not Path(f"/proc/{pid}").exists()  # reaped: not even a zombie
    with pytest.raises(errors.DriverError, match="helper is not running"):
        client.call("echo")


def test_helper_exit_status_is_reported(spawn) -> None:
    client = spawn()
    with pytest.raises(errors.DriverError, match="helper exited with status 3 in exit"):
        client.call("exit", status=3)
    assert not Path(f"/proc/{client.pid}").exists()


def test_timeout_kills_the_helper(spawn) -> None:
    client = spawn(timeout=0.3)
    start = time.monotonic()
    with pytest.raises(errors.DriverError, match=r"test rpc error: timed out after 0\.3 s in sleep"):
        client.call("sleep", seconds=30)
    assert time.monotonic() - start < 2
    assert not Path(f"/proc/{client.pid}").exists()
    assert client.status is not None and os.WTERMSIG(client.status) == signal.SIGKILL


def test_shutdown_runs_cleanup_and_leaves_no_process(spawn, jail: Path) -> None:
    with spawn() as client:
        pid = client.pid
    assert not Path(f"/proc/{pid}").exists()
    assert os.WIFEXITED(client.status) and os.WEXITSTATUS(client.status) == 0
    marker = jail / "shut-down"  # written at "/shut-down" inside the helper's root
    assert marker.read_text() == "cleanup ran\n"
    assert marker.stat().st_uid == TEST_UID


def test_deferred_reaping_waits_until_asked(jail: Path) -> None:
    """A hook server's worker answers its caller before it waits for the helpers it closed: close()
    then only says "shutdown"; reap_deferred() waits for the clean exit; later closes reap at once."""
    before = _children()
    first = HelperClient.spawn("test", lambda: _test_service(str(jail)), failure=errors.DriverError)
    second = HelperClient.spawn("test", lambda: _test_service(str(jail)), failure=errors.DriverError)
    helper.defer_reaping()
    try:
        first.close()
        assert first.status is None
    finally:
        helper.reap_deferred()
    assert os.WIFEXITED(first.status) and os.WEXITSTATUS(first.status) == 0  # its cleanup ran, no SIGKILL
    assert (jail / "shut-down").read_text() == "cleanup ran\n"
    second.close()
    assert second.status is not None and _children() == before


def test_hung_shutdown_is_killed_after_grace(jail: Path) -> None:
    def setup() -> dict:
        return {"shutdown": lambda: time.sleep(30)}

    client = HelperClient.spawn("test", setup, grace=0.05, failure=errors.DriverError)
    start = time.monotonic()
    client.close()
    assert time.monotonic() - start < 1
    assert os.WTERMSIG(client.status) == signal.SIGKILL
    assert not Path(f"/proc/{client.pid}").exists()


@pytest.mark.parametrize("confined", [False, True], ids=["plain", "confined"])
def test_helper_dies_with_its_parent(confined: bool) -> None:
    """PDEATHSIG: a parent killed without any cleanup still takes its helper with it; also a
    helper that switched to another uid (NVML's), which clears PDEATHSIG until armed again."""
    become = f"confine(DRIVER_HELPER, '/', ({TEST_UID}, {TEST_GID}), rearm=helper.die_with_parent)" if confined else "None"
    script = textwrap.dedent(
        f"""
        import time
        from nvc import errors
        from nvc.rpc import helper, protocol
        from nvc.confinement import DRIVER_HELPER, confine
        from nvc.rpc.helper import HelperClient
        client = HelperClient.spawn("orphan", lambda: ({become}, {{"sleep": lambda: time.sleep(60)}})[1], failure=errors.DriverError)
        # Queued before the parent dies, so the helper is busy, not reading: an EOF on its
        # socket cannot be what ends it.
        protocol.send_message(client._sock, protocol.Request(1, "sleep"))
        print(client.pid, flush=True)
        time.sleep(60)
        """
    )
    prctl.set_child_subreaper(1)  # the orphaned helper is re-parented to us: we can reap it
    try:
        with subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) as parent:
            helper = int(parent.stdout.readline())
            assert Path(f"/proc/{helper}/comm").read_text() == "nvc:[orphan]\n"
            parent.kill()
        deadline = time.monotonic() + 5
        while (reaped := os.waitpid(helper, os.WNOHANG)) == (0, 0) and time.monotonic() < deadline:
            time.sleep(0.01)
        if reaped == (0, 0):
            os.kill(helper, signal.SIGKILL)
            os.waitpid(helper, 0)
            pytest.fail(f"helper {helper} outlived its parent")
        assert os.WTERMSIG(reaped[1]) == signal.SIGKILL
    finally:
        prctl.set_child_subreaper(0)


# ---- driver helper ------------------------------------------------------------------------


def test_brand_names_follow_nvml_values() -> None:
    import pynvml

    assert brand_name(pynvml, pynvml.NVML_BRAND_NVIDIA) == "Nvidia"
    assert brand_name(pynvml, 0) == "Unknown"
    assert brand_name(pynvml, 2) == "Tesla"
    assert brand_name(pynvml, 11) == "CloudGaming"
    assert brand_name(pynvml, 16) == "TitanRTX"
    assert brand_name(pynvml, pynvml.NVML_BRAND_NVIDIA_NPU) == "Unknown"


def test_bus_id_is_normalised() -> None:
    assert bus_id(0, 0x3B, 0) == "00000000:3B:00.0"
    assert bus_id(0x10000, 0xA, 0x1F) == "00010000:0A:1F.0"


def test_snapshot_from_wire_builds_records() -> None:
    gpu = {
        "index": 0, "minor": 3, "model": "M", "brand": "Tesla", "uuid": "GPU-1", "bus_id": "00000000:01:00.0",
        "architecture": "8.0", "memory_total": 5, "mig_enabled": True,
        "mig_devices": [{"index": 0, "gpu_instance_id": 1, "compute_instance_id": 0, "uuid": "MIG-1",
                         "memory_total": 2}],
    }  # fmt: skip
    snap = snapshot_from_wire({"driver_version": "1.2", "cuda_version": 12040, "gpus": [gpu]})
    assert isinstance(snap, DriverSnapshot) and snap.cuda_version == 12040
    (only,) = snap.gpus
    assert only.minor == 3 and only.mig_devices[0].uuid == "MIG-1" and only.mig_devices[0].gi_caps_path is None


def test_overflow_ids_are_the_kernel_values() -> None:
    assert overflow_ids() == (
        int(Path("/proc/sys/kernel/overflowuid").read_text()),
        int(Path("/proc/sys/kernel/overflowgid").read_text()),
    )


def test_root_without_nvml_is_an_initialization_error(jail: Path) -> None:
    before = _children()
    with pytest.raises(errors.InitializationError) as caught:
        with open_driver(root=str(jail)):
            pass
    assert str(caught.value).startswith("initialization error: load library failed: libnvidia-ml.so.1: ")
    assert "cannot open shared object file" in str(caught.value)
    assert _children() == before


def test_snapshot_of_the_two_gpu_mig_machine(active_2gpu) -> None:
    root = str(active_2gpu.root)
    with open_driver(root=root) as driver:
        status = _status(driver.pid)
        assert status["CapEff"] == status["CapPrm"] == status["CapBnd"] == "0000000000000000"
        assert status["NoNewPrivs"] == "1"
        assert status["Uid"].split() == [str(overflow_ids()[0])] * 4
        assert Path(f"/proc/{driver.pid}/comm").read_text() == "nvc:[driver]\n"
        assert os.readlink(f"/proc/{driver.pid}/root") == os.path.realpath(root)
        snap = driver.snapshot()
        pid = driver.pid
    assert not Path(f"/proc/{pid}").exists()

    machine = active_2gpu.machine
    assert snap.driver_version == machine["driver_version"] == "580.95.05"
    assert snap.cuda_version == 13000
    assert [g.index for g in snap.gpus] == [0, 1]
    for gpu, described in zip(snap.gpus, machine["gpus"]):
        assert (gpu.minor, gpu.model, gpu.uuid, gpu.bus_id, gpu.architecture) == (
            described["minor"],
            described["name"],
            described["uuid"],
            described["pci_bus_id"],
            described["compute_capability"],
        )
        assert gpu.brand == "Nvidia"
    h100, a100 = snap.gpus
    assert h100.memory_total == 80 << 30 and not h100.mig_enabled and h100.mig_devices == ()
    assert a100.mig_enabled and a100.memory_total == 40 << 30
    assert [(m.index, m.gpu_instance_id, m.compute_instance_id, m.memory_total) for m in a100.mig_devices] == [
        (0, 1, 0, 10 << 30),
        (1, 2, 0, 20 << 30),
    ]
    assert [m.uuid for m in a100.mig_devices] == [d["uuid"] for d in machine["gpus"][1]["mig"]["devices"]]


def test_a_prestarted_helper_is_taken_for_the_same_options_only(active_2gpu) -> None:
    """The hook server's idle workers start NVML ahead (driver_service.prestart); a call asking for
    the same root and user takes that helper, any other gets a new one and the first is closed."""
    from nvc.rpc import driver_service

    root = str(active_2gpu.root)
    driver_service.prestart(root=root)
    ahead = driver_service._ahead.kept.pid
    with open_driver(root=root) as driver:
        assert driver.pid == ahead and len(driver.snapshot().gpus) == 2
    assert not Path(f"/proc/{ahead}").exists()
    driver_service.prestart(root=root, user=(12345, 12345))
    other = driver_service._ahead.kept.pid
    with open_driver(root=root) as driver:
        assert driver.pid != other and len(driver.snapshot().gpus) == 2
        assert not Path(f"/proc/{other}").exists()  # closed and reaped


def _status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {key: value.strip() for key, value in (line.split(":", 1) for line in lines)}


def test_a_prestarted_container_helper_is_confined_before_any_call_and_taken_once() -> None:
    """The hook server's idle workers fork the container helper ahead (container_service.prestart):
    before any call it holds only the mount capabilities, none effective, with NO_NEW_PRIVS; the
    next open_container takes it (no fork on the call's path), the one after forks its own."""
    from nvc.rpc import container_service

    container_service.prestart()
    ahead = container_service._ahead.kept.pid
    bounding = sum(1 << getattr(prctl, f"CAP_{name.upper()}") for name in CONTAINER_HELPER.permitted)
    deadline = time.monotonic() + 5
    while _status(ahead)["NoNewPrivs"] != "1":
        assert time.monotonic() < deadline, "the prestarted helper never confined itself"
        time.sleep(0.01)
    status = _status(ahead)
    assert status["Name"] == "nvc:[container]"
    assert int(status["CapBnd"], 16) == bounding and int(status["CapPrm"], 16) == bounding
    assert int(status["CapEff"], 16) == 0 and int(status["CapInh"], 16) == 0
    with container_service.open_container() as taken:
        assert taken.helper.pid == ahead
        with container_service.open_container() as another:
            assert another.helper.pid != ahead
    assert not Path(f"/proc/{ahead}").exists()  # shut down and reaped

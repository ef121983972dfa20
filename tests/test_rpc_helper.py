"""The generic forked helper, as real processes: confined, its errors, its start (waited, unwaited,
preforked), its end (killed, exit status, timeout, shutdown, its parent's death).

Hardening is read back from /proc while the helper serves, not assumed from the code.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import prctl
import pytest

from harness.helperroot import jail  # noqa: F401  (fixture)
from harness.processes import children as _children
from harness.processes import status as _status
from nvc import errors
from nvc.rpc import helper
from nvc.rpc.helper import HelperClient
from nvc.system.confinement import DRIVER_HELPER, confine

TEST_UID, TEST_GID = 12345, 23456


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


def test_a_helper_waiting_runs_its_idle_until_the_call_comes() -> None:
    """``idle`` runs once no call has come for IDLE_AFTER seconds and learns from ``busy()`` that
    one has: the call is answered once it returns, and what idle did is there."""
    from nvc.rpc.pool import WarmHelper

    def idle(busy) -> None:  # noqa: ANN001 - the helper's look at its socket
        while not busy():
            time.sleep(0.001)
        sys.modules["nvc_idle_done"] = sys  # what the call reads back: idle ran, and stopped for it

    ahead = WarmHelper(
        "test", lambda: {"idled": lambda: "nvc_idle_done" in sys.modules}, failure=errors.DriverError, idle=idle
    )
    ahead.prepare()
    time.sleep(helper.IDLE_AFTER * 5)
    with ahead.take({}, 5.0, wait=True) as client:
        assert client.call("idled") is True
    # forked for its call, a helper never idles
    with ahead.take({}, 5.0, wait=True) as client:
        assert client.call("idled") is False


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
    become = (
        f"confine(DRIVER_HELPER, '/', ({TEST_UID}, {TEST_GID}), rearm=helper.die_with_parent)" if confined else "None"
    )
    script = textwrap.dedent(
        f"""
        import time
        from nvc import errors
        from nvc.rpc import helper, protocol
        from nvc.system.confinement import DRIVER_HELPER, confine
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

"""The confinement table against the processes that run: each row read back from a live process.

What a process holds is read from /proc/PID (capability sets, NO_NEW_PRIVS, seccomp mode, ids,
root) and its rlimits through prlimit, while it runs, and compared with what its row of
:mod:`nvc.system.confinement` says, so that the table cannot drift from the code that drops privileges.
A row's None ("kept") means: as its parent holds it.
"""

from __future__ import annotations

import ast
import inspect
import os
import resource
import shutil
import subprocess
import sysconfig
import tempfile
import time
from pathlib import Path

import prctl
import pytest

from harness.hookserver import hook_server
from harness.processes import status as _status
from nvc.system import confinement
from nvc.system.confinement import CONTAINER_HELPER, DRIVER_HELPER, LDCONFIG_SANDBOX, SERVER_WORKER, STEPS, Confinement

REPO = Path(__file__).resolve().parent.parent
SETS = {"CapBnd": "bounding", "CapPrm": "permitted", "CapEff": "effective", "CapInh": "inheritable"}
LIMITS = {
    resource.RLIMIT_CPU: "Max cpu time",
    resource.RLIMIT_DATA: "Max data size",
    resource.RLIMIT_AS: "Max address space",
    resource.RLIMIT_NOFILE: "Max open files",
    resource.RLIMIT_FSIZE: "Max file size",
    resource.RLIMIT_NPROC: "Max processes",
}


def _mask(names: tuple[str, ...]) -> int:
    return sum(1 << getattr(prctl, f"CAP_{name.upper()}") for name in names)


def held(pid: int) -> dict[str, object]:
    """What process ``pid`` holds now, in the terms of a row."""
    status = _status(pid)
    return {
        **{key: int(status[key], 16) for key in (*SETS, "CapAmb")},
        "NoNewPrivs": status["NoNewPrivs"],
        "Seccomp": status["Seccomp"],
        "Uid": status["Uid"].split(),
        "Gid": status["Gid"].split(),
        "Groups": status["Groups"],
        "rlimits": _limits(pid),
    }


def _limits(pid: int) -> dict[int, tuple[int, int]]:
    """(soft, hard) of each of LIMITS, from /proc/PID/limits (prlimit needs more than root's uid)."""
    found = {}
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        for limit, name in LIMITS.items():
            if line.startswith(name + " "):
                soft, hard = line[len(name) :].split()[:2]
                found[limit] = tuple(resource.RLIM_INFINITY if v == "unlimited" else int(v) for v in (soft, hard))
    return found  # type: ignore[return-value]


def expected(row: Confinement, parent: dict[str, object], user: tuple[int, int] | None = None) -> dict[str, object]:
    """What a process confined by ``row`` holds, its parent holding ``parent`` (see :func:`held`)."""
    want = dict(parent)
    for key, field in SETS.items():
        names = getattr(row, field)
        if names is not None:
            want[key] = _mask(names)
    if row.inheritable is not None:
        want["CapAmb"] = 0  # the kernel's rule: ambient stays within inheritable
    if row.no_new_privs:
        want["NoNewPrivs"] = "1"
    if row.seccomp is not None:
        want["Seccomp"] = "2"
    if row.identity == "given":
        assert user is not None
        want["Uid"], want["Gid"], want["Groups"] = [str(user[0])] * 4, [str(user[1])] * 4, ""
    want["rlimits"] = {**parent["rlimits"], **{limit: (value, value) for limit, value in row.rlimits}}  # type: ignore[dict-item]
    return want


def test_the_driver_helper_holds_its_row(active_2gpu) -> None:
    from nvc.rpc.driver_service import open_driver
    from nvc.rpc.driver_wire import overflow_ids

    root = str(active_2gpu.root)
    with open_driver(root=root) as driver:
        assert held(driver.pid) == expected(DRIVER_HELPER, held(os.getpid()), overflow_ids())
        assert DRIVER_HELPER.root == "chroot" and os.readlink(f"/proc/{driver.pid}/root") == os.path.realpath(root)


def test_the_native_driver_helper_holds_the_driver_helpers_row(active_2gpu) -> None:
    """The C driver helper the front starts for ``info`` (native/driver/confine.c), looked at while the
    fake driver stalls its first snapshot call: what the Python driver helper holds."""
    from harness.hookserver import LIBDIR
    from nvc.rpc.driver_wire import overflow_ids

    root, (uid, gid) = str(active_2gpu.root), overflow_ids()
    helper = subprocess.Popen(
        [LIBDIR / "nvc-py-driver-snapshot", root, str(uid), str(gid)],
        stdout=subprocess.PIPE,
        env={**os.environ, "FAKE_NVML_STALL_S": "3"},
    )
    try:
        deadline = time.monotonic() + 2
        while _status(helper.pid)["NoNewPrivs"] != "1" and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)  # NO_NEW_PRIVS is its last step
        assert held(helper.pid) == expected(DRIVER_HELPER, held(os.getpid()), (uid, gid))
        assert os.readlink(f"/proc/{helper.pid}/root") == os.path.realpath(root)
        assert _status(helper.pid)["Name"] == "nvc:[driver]"
    finally:
        helper.kill()
        helper.communicate()


def test_the_container_helper_holds_its_row() -> None:
    from nvc.rpc.container_service import open_container

    with open_container(5.0) as client:
        assert held(client.helper.pid) == expected(CONTAINER_HELPER, held(os.getpid()))
        assert CONTAINER_HELPER.root == "kept" and os.readlink(f"/proc/{client.helper.pid}/root") == "/"


# A static program that waits (5 s at most) for /go to appear in its root, so it can be looked at.
WAITER_C = r"""
#include <time.h>
#include <unistd.h>
int main(void) {
    time_t end = time(0) + 5;
    while (access("/go", F_OK) != 0 && time(0) < end) {}
    return 0;
}
"""


def test_the_ldconfig_sandbox_holds_its_row(tmp_path: Path) -> None:
    """A host "ldconfig" that waits stands for the real one, run through the sandbox's steps."""
    from nvc.apply.ldconfig import start_ldconfig

    (tmp_path / "waiter.c").write_text(WAITER_C)
    subprocess.run(["gcc", "-static", "-O1", "-o", str(tmp_path / "waiter"), str(tmp_path / "waiter.c")], check=True)
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir(mode=0o755)
    rootfs.chmod(0o755)
    pending = start_ldconfig(f"@{tmp_path / 'waiter'}", str(rootfs), [], owner=(1000, 1001))
    pid = pending._child
    try:
        pending.start()
        deadline = time.monotonic() + 5
        while not os.readlink(f"/proc/{pid}/exe").startswith("/memfd:nvc-ldconfig"):  # exec'd: every step taken
            assert time.monotonic() < deadline, "the sandbox never ran its program"
            time.sleep(0.01)
        state = held(pid)
    finally:
        (rootfs / "go").touch()
    assert pending.wait() is True
    assert state == expected(LDCONFIG_SANDBOX, held(os.getpid()), (1000, 1001))


def test_the_server_worker_holds_its_row(active_2gpu) -> None:
    """A spare worker (what takes the next call) holds what the server holds: the worker row keeps
    everything, and the peer check (nvc.hook.peer) serves only callers that hold as much. (The fake
    driver: a server starts only where its warm-up finds one.)"""
    hook = Path(sysconfig.get_path("scripts")) / "nvc-py-hook"
    sock = Path(tempfile.mkdtemp(prefix="nvc-confine-")) / "hook.sock"  # 0700, short enough for a socket
    with hook_server(hook, sock) as server:
        deadline = time.monotonic() + 10
        while not (spares := _children(server.pid)):
            assert time.monotonic() < deadline, "the server forked no spare worker"
            time.sleep(0.01)
        for spare in spares:
            assert held(spare) == expected(SERVER_WORKER, held(server.pid))
            assert os.readlink(f"/proc/{spare}/root") == os.readlink(f"/proc/{server.pid}/root")
    shutil.rmtree(sock.parent)


def _children(pid: int) -> list[int]:
    """The server's worker children (its helpers, named nvc:[...], left out)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and _status(int(entry.name))["PPid"] == str(pid):
                if not (entry / "comm").read_text().startswith("nvc:["):
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def _step_calls(function: object) -> list[str]:
    """The names of the confinement steps ``function`` calls, in the order its source has them."""
    names = {step.__name__ for step in STEPS}
    tree = ast.parse(inspect.getsource(function).lstrip())  # type: ignore[arg-type]
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    called = [getattr(call.func, "attr", getattr(call.func, "id", "")) for call in calls]
    return [
        name for _, name in sorted(zip([(c.lineno, c.col_offset) for c in calls], called, strict=True)) if name in names
    ]


def test_every_step_is_taken_in_the_tables_order() -> None:
    """confine() and the ldconfig sandbox (which calls the steps one by one, with its own work
    between them) take every step, once each, in STEPS' order."""
    from nvc.apply import ldconfig

    order = [step.__name__ for step in STEPS]
    assert _step_calls(confinement.confine) == order
    assert _step_calls(ldconfig._sandbox_child) == order


def test_the_container_helper_raises_only_capabilities_its_row_keeps() -> None:
    """Each step of the applier raises capabilities (applier.raised) that the helper still holds."""
    tree = ast.parse((REPO / "nvc" / "apply" / "applier.py").read_text())
    raised = {
        arg.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "raised"
        for arg in node.args
        if isinstance(arg, ast.Constant)
    }
    assert raised and raised <= set(CONTAINER_HELPER.permitted)


@pytest.mark.parametrize("row", confinement.TABLE, ids=lambda row: row.process)
def test_each_row_is_consistent(row: Confinement) -> None:
    """Effective within permitted, permitted within bounding; a seccomp filter needs NO_NEW_PRIVS."""
    if row.permitted is not None:
        assert set(row.effective or ()) <= set(row.permitted) <= set(row.bounding or ())
    assert row.seccomp is None or (row.no_new_privs and row.seccomp in confinement.SECCOMP_FILTERS)
    assert row.root in ("kept", "chroot", "private") and row.identity in ("kept", "given")

"""``nvc-py info`` with no server through the installed front (native/client/driver_start.c), which starts the
native driver helper, and the program's side (nvc.rpc.native_snapshot), on the fake driver: the output is
what the Python program prints alone, taking the native helper's answer where it was started for the
call's options and the Python helper's otherwise; every way the named helper can fail to answer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.hookserver import LIBDIR
from nvc import errors
from nvc.config import driverguess
from nvc.rpc import driver_service, native_snapshot
from nvc.rpc.driver_wire import overflow_ids, snapshot_from_wire
from nvc.system import runcache

PROGRAM = LIBDIR / "nvc-py-driver-snapshot"  # installed: what the installed front starts
FRONT = LIBDIR / "nvc-py"


def at_root(
    fake, command: list[str], env: dict[str, str] | None = None, pass_fds: tuple[int, ...] = ()
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """``command`` run with the fake driver's libraries where the host's loader finds them (an overlay on the
    host's library directory, in a mount namespace of its own: the fake at the root /), with no server: its
    result, and the program each child of its process ran, sorted (read from /proc while it ran; the
    overlay's mount left out)."""
    libdir = next(p.parent for p in fake.root.rglob("libnvidia-ml.so.1") if "x86_64" in str(p))
    host = "/usr/lib/x86_64-linux-gnu"
    script = f'mount -t overlay overlay -o lowerdir={libdir}:{host} {host} && exec "$@"'
    proc = subprocess.Popen(
        ["unshare", "-m", "sh", "-c", script, "sh", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "NVC_PY_HOOK_SOCKET": "none", **(env or {})},
        pass_fds=pass_fds,
    )
    children: dict[int, str] = {}
    while proc.poll() is None:
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == proc.pid:
                    children[int(entry.name)] = os.readlink(entry / "exe")  # the last seen: after any exec
            except (OSError, ValueError):
                continue
        time.sleep(0.01)
    out, err = proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), sorted(
        child for child in children.values() if os.path.basename(child) != "mount"
    )


def test_info_through_the_front_takes_the_native_helpers_answer(active_2gpu) -> None:
    """The installed ``nvc-py info`` with no server: the native helper answers (the front's only child, seen
    while NVML stalls its first call), and the output is what the Python program prints alone."""
    alone, _ = at_root(active_2gpu, [str(LIBDIR / "nvc-py-python"), "info"])
    assert alone.returncode == 0 and "MIG UUID:" in alone.stdout, alone.stderr
    served, children = at_root(active_2gpu, [str(FRONT), "info"], {"FAKE_NVML_STALL_S": "1"})
    assert (served.returncode, served.stdout, served.stderr) == (0, alone.stdout, alone.stderr)
    assert children == [str(PROGRAM)]


@pytest.mark.parametrize("option", ["--json", "--csv"])
def test_info_with_its_own_options_takes_the_native_helpers_answer(option: str, active_2gpu) -> None:
    """``info``'s own options (click's path) change no driver helper: the front's is taken there too."""
    alone, _ = at_root(active_2gpu, [str(LIBDIR / "nvc-py-python"), "info", option])
    served, children = at_root(active_2gpu, [str(FRONT), "info", option], {"FAKE_NVML_STALL_S": "1"})
    assert (served.returncode, served.stdout, served.stderr) == (0, alone.stdout, alone.stderr)
    assert alone.stdout and children == [str(PROGRAM)]


# Runs its arguments as a subreaper: a process they leave behind is reparented to it, and it says how many
# of its children are left once the command was reaped.
SUBREAPER = """
import ctypes, os, subprocess, sys, time
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
done = subprocess.run(sys.argv[1:])
time.sleep(0.2)
me = str(os.getpid())
left = [p for p in os.listdir("/proc") if p.isdigit() and open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1] == me]
print(f"left behind: {len(left)}", file=sys.stderr)
sys.exit(done.returncode)
"""


def test_a_helper_the_command_does_not_take_is_reaped_by_the_program(active_2gpu) -> None:
    """``info --help`` takes no snapshot: the program kills and reaps the native helper as it ends, while
    NVML stalls, leaving no process to its parent's reaper."""
    started = time.monotonic()
    command = [sys.executable, "-c", SUBREAPER, str(FRONT), "info", "--help"]
    done, _ = at_root(active_2gpu, command, {"FAKE_NVML_STALL_S": "20"})
    assert done.returncode == 0 and "--json" in done.stdout and time.monotonic() - started < 10
    assert done.stderr.endswith("left behind: 0\n"), done.stderr


def test_a_caller_that_is_not_root_gets_its_answer_with_its_groups(active_2gpu) -> None:
    """A caller that is not root runs the driver helper as itself, with the supplementary groups it cannot
    drop: the native helper (the front's only child) and the Python one answer it alike."""
    as_user = ["setpriv", "--reuid", "1000", "--regid", "1000", "--groups", "27"]
    served, children = at_root(active_2gpu, [*as_user, str(FRONT), "info"], {"FAKE_NVML_STALL_S": "1"})
    alone, _ = at_root(active_2gpu, [*as_user, str(LIBDIR / "nvc-py-python"), "info"])
    assert served.returncode == alone.returncode == 0, (served.stderr, alone.stderr)
    assert served.stdout == alone.stdout and "MIG UUID:" in served.stdout
    assert children == [str(PROGRAM)]


def test_info_through_the_front_for_another_root_is_a_native_helper_started_for_it(active_2gpu, tmp_path: Path) -> None:
    """A configuration that names another root than the native helper was started for: the program kills
    that one and starts the native helper for its root, whose answer is what ``--root`` prints."""
    config = tmp_path / "config.yaml"
    config.write_text(f"root: {active_2gpu.root}\n")
    env = {"NVC_PY_CONFIG": str(config), "FAKE_NVML_STALL_S": "1"}
    served, children = at_root(active_2gpu, [str(FRONT), "info"], env)
    given, _ = at_root(active_2gpu, [str(LIBDIR / "nvc-py-python"), "--root", str(active_2gpu.root), "info"])
    assert (served.returncode, served.stdout, served.stderr) == (0, given.stdout, given.stderr)
    assert "MIG UUID:" in served.stdout and children == [str(PROGRAM)] * 2  # the front's, and the program's


@pytest.mark.parametrize(
    ("before", "guessed"),
    [
        ([], True),
        (["--root", "{root}"], True),
        (["--root={root}"], True),
        (["-r", "{root}", "--ldcache", "/etc/ld.so.cache"], True),
        (["-l", "/etc/ld.so.cache", "--ldcache=/etc/ld.so.cache", "-r", "{root}"], True),
        (["-d", "/dev/null", "--root", "{root}"], True),
        (["--debug=/dev/null", "-l", "/etc/ld.so.cache"], True),
        (["-k", "--root", "{root}"], True),
        (["--load-kmods"], True),
        (["--root", "{root}", "--user=65534:65534"], False),
    ],
)
def test_the_front_guesses_info_after_the_root_alone(before: list[str], guessed: bool, active_2gpu) -> None:
    """The front starts the native helper for ``info`` after ``--root``, ``--ldcache``, ``--debug`` and
    ``--load-kmods`` (the root given), in plain's spellings, and for no other global option. Told by a helper the caller names itself with
    a canned answer: the front's own replaces it where it guesses; else the program takes the caller's."""
    root = str(active_2gpu.root)
    words = [word.format(root=root) for word in before]
    canned = {"v": 1, "id": 0, "result": {"driver_version": "999.99", "cuda_version": 12000, "gpus": []}}
    read, write = os.pipe()
    os.write(write, json.dumps(canned).encode())
    os.close(write)
    uid, gid = overflow_ids()
    env = {native_snapshot.ENV: f"{read} 1 {uid} {gid} {root}", "FAKE_NVML_STALL_S": "1"}
    try:
        done, children = at_root(active_2gpu, [str(FRONT), *words, "info"], env, pass_fds=(read,))
    finally:
        os.close(read)
    assert done.returncode == 0, done.stderr
    assert ("999.99" not in done.stdout and "MIG UUID:" in done.stdout) is guessed, done.stdout
    assert ("999.99" in done.stdout) is not guessed, done.stdout
    assert children == ([str(PROGRAM)] if guessed else [])


@pytest.mark.parametrize("twice", [False, True], ids=["plain", "click"])
def test_nodes_load_kmods_makes_end_the_helper_started_before_them(twice: bool, active_2gpu, tmp_path: Path) -> None:
    """``--load-kmods info`` for a root that lacks the driver's nodes: the helper started before them (here a
    caller-named one with a canned answer) may have found none, so the program ends it once it made them and
    its own answers (NVML is not in the empty root: the error); the next call makes none and takes it. Alike
    on click's path (an option given twice)."""
    uid, gid = overflow_ids()
    canned = {"v": 1, "id": 0, "result": {"driver_version": "999.99", "cuda_version": 12000, "gpus": []}}
    debug = ["-d", "/dev/null", "-d", "/dev/null"] if twice else []
    command = [str(LIBDIR / "nvc-py-python"), *debug, "-k", "--root", str(tmp_path), "info"]
    results = []
    for _ in range(2):
        read, write = os.pipe()
        os.write(write, json.dumps(canned).encode())
        os.close(write)
        try:
            env = {native_snapshot.ENV: f"{read} 1 {uid} {gid} {tmp_path}"}
            results.append(at_root(active_2gpu, command, env, pass_fds=(read,))[0])
        finally:
            os.close(read)
    made, kept = results
    assert made.returncode != 0 and "999.99" not in made.stdout, (made.stdout, made.stderr)
    assert (tmp_path / "dev/nvidia0").is_char_device()
    assert kept.returncode == 0 and "999.99" in kept.stdout, kept.stderr


@pytest.fixture
def no_guess() -> Iterator[Path]:
    """The driver guess root's programs record (nvc.config.driverguess), removed before and after."""
    cache = Path(driverguess.CACHE_PATH)
    cache.unlink(missing_ok=True)
    yield cache
    cache.unlink(missing_ok=True)


def test_the_front_guesses_the_configured_root_once_root_recorded_it(
    active_2gpu, tmp_path: Path, no_guess: Path
) -> None:
    """A configuration naming another root: the first ``info``'s front guesses /, the program starts the
    native helper for the configuration's root and records it; the next ``info``'s front guesses it. An
    edit to the file (another identity), or a record that is not root's own, is a guess of / again."""
    config = tmp_path / "config.yaml"
    config.write_text(f"root: {active_2gpu.root}\n")
    env = {"NVC_PY_CONFIG": str(config), "FAKE_NVML_STALL_S": "1"}

    def helpers() -> list[str]:
        done, children = at_root(active_2gpu, [str(FRONT), "info"], env)
        assert done.returncode == 0 and "MIG UUID:" in done.stdout, done.stderr
        return children

    assert helpers() == [str(PROGRAM)] * 2 and no_guess.exists()
    uid, gid = overflow_ids()
    fields = no_guess.read_bytes().split(b"\0")
    recorded = [str(config), runcache.identity(str(config)), str(active_2gpu.root), str(uid), str(gid), ""]
    assert fields[1:] == [os.fsencode(field) for field in recorded]
    assert helpers() == [str(PROGRAM)]
    no_guess.chmod(0o644)  # another user may have written it: not believed
    assert helpers() == [str(PROGRAM)] * 2 and no_guess.stat().st_mode & 0o777 == 0o600  # recorded anew
    assert helpers() == [str(PROGRAM)]
    config.write_text(f"root: {active_2gpu.root}\n# edited\n")
    assert helpers() == [str(PROGRAM)] * 2
    assert helpers() == [str(PROGRAM)]


def test_info_through_the_front_says_what_the_python_program_says_without_nvml(tmp_path: Path) -> None:
    """No NVML at the root /: the native helper's error is the one the Python program prints alone."""
    if Path("/proc/driver/nvidia").exists():
        pytest.skip("a real NVIDIA driver is loaded")
    env = {**os.environ, "NVC_PY_HOOK_SOCKET": "none"}
    runs = [
        subprocess.run([program, "info"], capture_output=True, text=True, timeout=60, env=env)
        for program in (FRONT, LIBDIR / "nvc-py-python")
    ]
    assert runs[0].returncode == runs[1].returncode == errors.InitializationError.exit_code
    assert runs[0].stderr == runs[1].stderr and "load library failed" in runs[0].stderr


# ---- nvc.rpc.native_snapshot: what the front names, as the program takes it ------------------------------


def hand(answer: str | None, delay: float = 0.0) -> subprocess.Popen[bytes]:
    """A child standing for the native helper: it writes ``answer`` (None: nothing) after ``delay``
    seconds on a pipe, which :data:`native_snapshot.ENV` names with it, as the front does; taken."""
    read, write = os.pipe()
    script = f'sleep "$1"; printf %s "$2" >/dev/fd/{write}' if answer is not None else 'exec sleep "$1"'
    child = subprocess.Popen(["sh", "-c", script, "sh", str(delay), answer or ""], pass_fds=(write,))
    os.close(write)
    uid, gid = overflow_ids()
    os.environ[native_snapshot.ENV] = f"{read} {child.pid} {uid} {gid} /"
    native_snapshot.take()
    assert native_snapshot.ENV not in os.environ and native_snapshot.handed()
    return child


def gone(child: subprocess.Popen[bytes]) -> bool:
    """Whether the child was reaped (by native_snapshot, not by Popen)."""
    return not Path(f"/proc/{child.pid}").exists()


@pytest.fixture
def no_program(monkeypatch: pytest.MonkeyPatch) -> None:
    """No native helper to start: what the front named is all the program has."""
    monkeypatch.setattr(native_snapshot, "PROGRAM", "/nonexistent/nvc-py-driver-snapshot")


def test_the_program_takes_the_native_helpers_result(active_2gpu, no_program) -> None:
    uid, gid = overflow_ids()
    argv = [PROGRAM, str(active_2gpu.root), str(uid), str(gid)]
    answer = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30).stdout
    child = hand(answer)
    snap = native_snapshot.snapshot("/", None)
    assert snap == snapshot_from_wire(json.loads(answer)["result"]) and gone(child)
    assert not native_snapshot.handed() and native_snapshot.snapshot("/", None) is None


def test_the_program_raises_the_native_helpers_error() -> None:
    error = {"kind": "driver", "message": "nvml error: gpu is lost (nvmlDeviceGetUUID)", "code": 15}
    child = hand(json.dumps({"v": 1, "id": 0, "error": error}))
    with pytest.raises(errors.DriverError) as raised:
        native_snapshot.snapshot("/", None)
    assert (raised.value.args[0], raised.value.code) == (error["message"], 15) and gone(child)  # type: ignore[attr-defined]


@pytest.mark.parametrize("answer", [None, "", "not json", '{"v": 1, "id": 0}'])
def test_no_answer_leaves_the_call_to_the_python_helper(answer: str | None) -> None:
    child = hand(answer)
    assert native_snapshot.snapshot("/", None) is None and gone(child)


def test_a_helper_started_for_other_options_is_killed_at_once(active_2gpu, tmp_path: Path) -> None:
    """Asked for another root or user, the helper the front named is killed at once and one started for
    them: its answer (a root without NVML: the Python helper's error), or none where there is no program."""
    child = hand(None, delay=30)
    started = time.monotonic()
    with pytest.raises(errors.InitializationError, match="load library failed: libnvidia-ml.so.1: "):
        native_snapshot.snapshot(str(tmp_path), None)
    assert time.monotonic() - started < 5 and gone(child) and not native_snapshot.handed()
    child = hand(None, delay=30)
    native_snapshot.PROGRAM, program = "/nonexistent/nvc-py-driver-snapshot", native_snapshot.PROGRAM
    try:
        assert native_snapshot.snapshot("/", (12345, 12345)) is None and gone(child)
    finally:
        native_snapshot.PROGRAM = program


def test_a_helper_a_signal_ended_fails_as_the_python_helpers_call(no_program) -> None:
    """Killed (or crashed in NVML) before its answer: the Python helper's call would say so, and no
    other helper is tried."""
    child = hand(None, delay=30)
    child.kill()
    with pytest.raises(
        errors.DriverError, match=r"^driver error: driver rpc error: helper killed by signal SIGKILL in snapshot$"
    ):
        native_snapshot.snapshot("/", None)
    assert gone(child)


def test_a_silent_helper_times_out_as_the_python_helpers_call() -> None:
    child = hand(None, delay=30)
    with pytest.raises(
        errors.DriverError, match=r"^driver error: driver rpc error: timed out after 0\.3 s in snapshot$"
    ):
        native_snapshot.snapshot("/", None, timeout=0.3)
    assert gone(child)


def test_a_pid_that_is_no_child_is_left_alone() -> None:
    """ENV may come from the caller: a process that is not this one's child is never signalled."""
    read, write = os.pipe()
    os.write(write, b"")
    os.close(write)
    uid, gid = overflow_ids()
    os.environ[native_snapshot.ENV] = f"{read} 1 {uid} {gid} /"
    native_snapshot.take()
    assert native_snapshot.snapshot("/", None) is None and Path("/proc/1").exists()


def test_discard_ends_a_helper_not_taken() -> None:
    child = hand(None, delay=30)
    native_snapshot.discard()
    assert gone(child) and not native_snapshot.handed()
    native_snapshot.discard()  # nothing handed: nothing to do


@pytest.mark.parametrize("value", ["", "3 4 5", "a b c d /", "3 4 5 6 relative", "999 4 5 6 /", "3 4 5 6"])
def test_a_malformed_name_is_dropped(value: str) -> None:
    os.environ[native_snapshot.ENV] = value
    native_snapshot.take()
    assert native_snapshot.ENV not in os.environ and not native_snapshot.handed()


# ---- the program's own start: every inventory no warm Python helper answers ------------------------------


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A program standing for the native helper that answers nothing: it leaves a file saying it ran."""
    ran, program = tmp_path / "ran", tmp_path / "stand-in"
    program.write_text(f'#!/bin/sh\necho "$@" > {ran}\n')
    program.chmod(0o755)
    monkeypatch.setattr(native_snapshot, "PROGRAM", str(program))
    return ran


def test_an_inventory_asks_the_native_helper_first(active_2gpu, monkeypatch: pytest.MonkeyPatch) -> None:
    """``driver_service.inventory`` starts the native helper for its root and identity; it answers alone."""
    monkeypatch.setattr(driver_service, "open_driver", None)  # a Python helper would fail the call
    inv = driver_service.inventory(str(active_2gpu.root), None)
    assert [len(gpu.mig_devices) for gpu in inv.gpus] == [0, 2] and not native_snapshot.handed()


def test_without_a_native_answer_an_inventory_is_the_python_helpers(active_2gpu, stand_in: Path) -> None:
    uid, gid = overflow_ids()
    inv = driver_service.inventory(str(active_2gpu.root), None)
    assert stand_in.read_text() == f"{active_2gpu.root} {uid} {gid}\n"  # started, said nothing
    assert [len(gpu.mig_devices) for gpu in inv.gpus] == [0, 2]


def test_a_python_helper_kept_warm_answers_before_a_native_one(
    active_2gpu, stand_in: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hook server's worker keeps a Python helper with NVML loaded: an inventory for its options takes
    it, and starts no native helper; a snapshot for other options does."""
    monkeypatch.setattr(native_snapshot, "_warm", None)  # what prestart registers is this test's only
    root = str(active_2gpu.root)
    warm = driver_service.prestart(root)
    inv = driver_service.inventory(root, None)
    assert not stand_in.exists() and warm.kept is None  # taken
    assert [len(gpu.mig_devices) for gpu in inv.gpus] == [0, 2]
    assert native_snapshot.snapshot(root, (12345, 12345)) is None
    assert stand_in.read_text() == f"{root} 12345 12345\n"

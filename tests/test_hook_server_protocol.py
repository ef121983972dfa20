"""``nvc-py-hook serve``'s hand-over exchange: the call message parsed and refused, and raw calls to
a real server (malformed, with a forged proof, with odd environment entries, naming a program it
does not run), each answered with a status and at most one line.

The server is started inside the test's private mount namespace where the fake driver (a test
double) is active, so its workers see the fake GPUs, as runc's hooks do.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from harness.hookcalls import call_directly, call_raw, message
from harness.hookfixtures import served  # noqa: F401  (fixture)
from harness.hookserver import BUILT_CLIENT as CLIENT
from harness.installed import HOOK
from nvc.hook.server import handover


def test_parse_call_reads_argv_and_drops_loader_variables() -> None:
    argv, env = handover.parse_call(
        message([str(HOOK), "prestart"], ["PATH=/usr/bin", "LD_PRELOAD=/x.so", "GCONV_PATH=/g", "A=b=c", "junk"])
    )
    assert argv == [str(HOOK), "prestart"]
    assert env == {"PATH": "/usr/bin", "A": "b=c"}


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"nvc-py-hook/1\x001\x000\x00/h",  # not NUL-terminated
        b"other/1\x001\x000\x00/h\x00",  # another protocol
        message(["/h", "prestart"], [], argc=3),  # counts do not match
        message([], []),  # no argv
        b"nvc-py-hook/1\x00x\x000\x00/h\x00",  # count not a number
    ],
)
def test_parse_call_refuses_malformed_messages(raw: bytes) -> None:
    with pytest.raises(handover.CallError):
        handover.parse_call(raw)


def test_only_nvc_py_programs_are_run(served: Path) -> None:
    result = subprocess.run(
        [str(CLIENT), "/bin/true"], capture_output=True, text=True, env={handover.SOCKET_ENV: str(served)}, timeout=30
    )
    assert result.returncode == 2
    assert (
        result.stderr
        == "nvc-py-hook serve: refused a call: /bin/true: not one of nvc-py-hook, nvc-py, nvc-py-runtime\n"
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["/x/nvc-py-hook", "serve"],
        ["/x/nvc-py", "hook", "serve"],
        ["/x/nvc-py", "--root", "/", "hook", "serve", "--socket", "/tmp/other.sock"],
    ],
)
def test_a_worker_never_becomes_a_server(served: Path, argv: list[str]) -> None:
    """The clients never hand ``serve`` over; the server tells a caller that does to run it itself."""
    answers, err = call_directly(served, argv)
    assert (answers, err) == ([b"fall back"], "")
    assert served.exists()


def raw_fields(argv: list[bytes], env: list[bytes]) -> bytes:
    return b"".join(f + b"\0" for f in [handover.MAGIC, str(len(argv)).encode(), str(len(env)).encode(), *argv, *env])


REFUSED = b"refused 2\nnvc-py-hook serve: refused a call: "
POSTSTART = raw_fields([b"/x/nvc-py-hook", b"poststart"], [])
BOGUS = raw_fields(
    [b"/x/nvc-py", b"info", b"--bogus"], []
)  # served (nvc.hook.server.scope); its line cannot be written:
# its status still says what it was (2, a usage error: nvc.system.stdio drops what stderr refuses)


@pytest.mark.parametrize(
    "data, fds, go, go_fds, answers",
    [
        (POSTSTART, "file", b"go", "streams", [REFUSED + b"the working directory's descriptor is not a directory\n"]),
        (POSTSTART, "none", b"go", "streams", [REFUSED + b"truncated message or not 1 descriptor\n"]),
        (POSTSTART, "two", b"go", "streams", [REFUSED + b"truncated message or not 1 descriptor\n"]),
        (
            raw_fields([b"/x/nvc-py-hook", b"poststart"], [b"X=" + b"x" * handover.MAX_MESSAGE]),
            "cwd",
            b"go",
            "streams",
            [REFUSED + b"truncated message or not 1 descriptor\n"],
        ),
        (POSTSTART[:-1], "cwd", b"go", "streams", [REFUSED + b"message not NUL-terminated\n"]),
        (
            raw_fields([b"/x/nvc-py-hook", b"poststart"], [b"A=b"])[:-4],
            "cwd",
            b"go",
            "streams",
            [REFUSED + b"counts do not match the strings\n"],
        ),
        (
            raw_fields([b"/bin/true"], []),
            "cwd",
            b"go",
            "streams",
            [REFUSED + b"/bin/true: not one of nvc-py-hook, nvc-py, nvc-py-runtime\n"],
        ),
        (POSTSTART, "cwd", b"go", "two", [b"ready", REFUSED + b"truncated message or not 4 descriptors\n"]),
        (POSTSTART, "cwd", b"went", "streams", [b"ready", REFUSED + b"no go\n"]),
        (BOGUS, "cwd", b"go", "read-only-stderr", [b"ready", b"exit 2"]),
        (BOGUS, "cwd", b"go", "closed-stderr", [b"ready", b"exit 2"]),
        (POSTSTART, "cwd", b"go", "streams", [b"ready", b"exit 0"]),
    ],
    ids=[
        "file-as-cwd",
        "no-descriptor",
        "two-descriptors",
        "truncated",
        "unterminated",
        "bad-counts",
        "not-nvc-py",
        "two-streams",
        "no-go",
        "read-only-stderr",
        "closed-stderr",
        "well-formed",
    ],
)
def test_a_malformed_call_gets_one_line_and_a_status(
    served: Path, tmp_path: Path, data: bytes, fds: str, go: bytes, go_fds: str, answers: list[bytes]
) -> None:
    """Raw messages to a real server: each answered with a status (and one line the client writes
    on its stderr), never a worker ending in silence."""
    null = os.open(os.devnull, os.O_RDWR)
    read_only = os.open(os.devnull, os.O_RDONLY)
    regular = os.open(tmp_path / "file", os.O_RDWR | os.O_CREAT)
    cwd = os.open("/", os.O_PATH)
    closed_r, closed_w = os.pipe()
    os.close(closed_r)  # writing there: EPIPE
    first = {"file": [regular], "none": [], "two": [cwd, cwd], "cwd": [cwd]}[fds]
    streams = {
        "streams": [null, null, null],
        "two": [null, null],
        "read-only-stderr": [null, null, read_only],
        "closed-stderr": [null, null, closed_w],
    }[go_fds]
    try:
        assert call_raw(served, data, first, go, streams) == answers
    finally:
        for fd in (null, read_only, regular, cwd, closed_w):
            os.close(fd)


@pytest.mark.parametrize("proof", ["callers-end", "workers-environ", "workers-stdin", "regular-file"])
def test_go_without_the_workers_own_connection_is_told_to_fall_back(served: Path, tmp_path: Path, proof: str) -> None:
    """Only the worker's end of the connection, opened through /proc/WORKER/fd/N, proves that no
    Landlock domain confines the caller more than the worker: anything else a Landlocked caller
    could open (its own end, what /proc lets it read of the worker, a file) gets ``fall back``,
    and the worker runs nothing (a poststart call would answer ``exit 0``)."""

    def forged(pid: int, fd: int, conn: socket.socket) -> int:
        path = {
            "callers-end": f"/proc/self/fd/{conn.fileno()}",
            "workers-environ": f"/proc/{pid}/environ",
            "workers-stdin": f"/proc/{pid}/fd/0",
            "regular-file": str(tmp_path / "file"),
        }[proof]
        return os.open(path, os.O_RDWR | os.O_CREAT if proof == "regular-file" else os.O_PATH)

    null, cwd = os.open(os.devnull, os.O_RDWR), os.open("/", os.O_PATH)
    try:
        assert call_raw(served, POSTSTART, [cwd], go_fds=[null] * 3, proof=forged) == [b"ready", b"fall back"]
        assert call_raw(served, POSTSTART, [cwd], go_fds=[null] * 3) == [b"ready", b"exit 0"]
    finally:
        os.close(null)
        os.close(cwd)


def test_a_call_with_odd_environment_entries_is_served_as_the_program_would_run(served: Path, tmp_path: Path) -> None:
    """Entries the program's own interpreter ignores (no `=`, an empty name) are ignored, not
    refused; a value that is not UTF-8 is kept; of a name given twice the first counts (the hook's
    log line goes to the first configuration's log)."""
    log = tmp_path / "first.log"
    config = tmp_path / "first.yaml"
    config.write_text(f"log: {{file: {log}}}\n")
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(
        json.dumps({"ociVersion": "1.0.2", "process": {"args": ["true"], "env": []}, "root": {"path": "rootfs"}})
    )
    state = json.dumps(
        {"ociVersion": "1.0.2", "id": "odd-env", "status": "creating", "pid": os.getpid(), "bundle": str(bundle)}
    ).encode()
    env = [
        b"=x",
        b"junk",
        b"",
        b"==y",
        b"BYTES=\xff\xfe",
        f"NVC_PY_CONFIG={config}".encode(),
        b"NVC_PY_CONFIG=/nonexistent/second.yaml",
    ]
    in_r, in_w = os.pipe()
    os.write(in_w, state)
    os.close(in_w)
    err_r, err_w = os.pipe()
    null, cwd = os.open(os.devnull, os.O_RDWR), os.open("/", os.O_PATH)
    try:
        got = call_raw(served, raw_fields([b"/x/nvc-py-hook", b"prestart"], env), [cwd], go_fds=[in_r, null, err_w])
    finally:
        for fd in (in_r, null, err_w, cwd):
            os.close(fd)
    with os.fdopen(err_r) as err:
        assert (got, err.read()) == ([b"ready", b"exit 0"], "")
    record = json.loads(log.read_text())
    assert (record["container"], record["outcome"], record["via"]) == ("odd-env", "no-gpu", "server")

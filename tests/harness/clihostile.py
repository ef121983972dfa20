"""The hostile-input table of tests/test_cli_hostile_*.py: every command and option of the installed
programs, called carelessly, must give one line, a stable exit code, an end within a bound, nothing
left running.

The cases are generated: ``nvc-py``'s from its click command tree (every command, every option
and argument that takes a value, and every eager flag such as ``--help`` and ``--version``, so a
new option is covered without editing a test file), ``nvc-py-hook``'s stages and ``nvc-py-runtime``
by hand (neither is a click program), and the configuration file's keys from its NamedTuples.
Each is run with a table of hostile values: numbers of 4000 digits (int() takes them) and 5000
(it refuses them), 5000-character paths, a FIFO, a character device (/dev/zero's and /dev/full's
numbers, made in the case's directory), a directory or a binary file where a file is expected,
text with a newline and a terminal escape, bytes that are not UTF-8; and every program's output
with its stdout closed (``>&-``) or full (``> /dev/full``), its stderr too or its stdin closed (the
closed cases run through the native fronts, which pass a closed stream on read-only).

Every case runs in a directory of its own, with every path option the command would write to
pointed there (tests/test_cli_hostile_nvc_py.py's ``BASE``; an option this table does not know whose default is an absolute path
gets a scratch path too, never the host's), under a 2 GiB address-space limit (an unbounded
read dies instead of filling the machine), in a session of its own that must be empty when it ends.

The rules (:func:`check`): no traceback; an exit status among nvc/errors.py's (0, 2 to 12; doctor's
1 is its answer, tests/test_cli_hostile_nvc_py.py's ``VERDICTS``); on failure exactly one line on stderr, naming the program; on
success none, or one warning (the hook's log, a hooks directory the engine does not read); ``--help``/``--version`` and every command whose normal run prints something fail with
:class:`~nvc.errors.OutputError`'s status when stdout is closed or full. Daemons (the device plugin,
the hook server) that accept a value are stopped with SIGTERM after :data:`DAEMON_S` and must end
with a stable status (0, or 12 where their debug log was lost). The base invocation of every command
must itself succeed, so that each hostile value is the only thing wrong with its case.

Test double: the GPUs are the fake driver's (tests/fakedriver); nothing here is a GPU result.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sysconfig
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness.bundle import make_bundle
from nvc import config as config_file
from nvc import errors
from nvc.containerenv import sharing

SCRIPTS = Path(sysconfig.get_path("scripts"))
NVC_PY, HOOK, RUNTIME = (str(SCRIPTS / name) for name in ("nvc-py", "nvc-py-hook", "nvc-py-runtime"))
BOUND_S = 20.0  # a case still running after this hangs (the machine runs several at once)
DAEMON_S = 3.0  # a daemon still running after this accepted its values: it is stopped
MEMORY_KIB = 2 << 20  # each case's address space (ulimit -v)
WORKERS = 6  # cases at once (each mostly an interpreter's start)
DAEMON_WORKERS = 16  # daemons at once: mostly waiting to be stopped
OUTPUT_CODE = errors.OutputError.exit_code
WARNING = re.compile(r"(nvc-py(-hook|-runtime)?: )?warning: ")  # the one line a success may print on stderr


def _codes(kind: type[errors.NvcError]) -> set[int]:
    return {kind.exit_code}.union(*(_codes(sub) for sub in kind.__subclasses__()))


STABLE_CODES = {0} | _codes(errors.NvcError) - {errors.NvcError.exit_code}  # 1: no kind of error named


# ---- hostile values ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Scratch:
    """One case's directory, with the hostile files made fresh for it."""

    dir: Path
    config: Path  # a valid configuration file (the base of every case), in the case's directory
    root: Path  # the fake driver's root

    def path(self, name: str) -> str:
        return str(self.dir / name)


Value = Callable[[Scratch], "str | bytes"]

LONG_PATH: Value = lambda s: str(s.dir) + ("/" + "n" * 250) * 20  # noqa: E731 - 5000+ characters
PATH_VALUES: dict[str, Value] = {
    "long": LONG_PATH,
    "fifo": lambda s: s.path("fifo"),
    "zero": lambda s: s.path("zero"),
    "full": lambda s: s.path("full"),
    "dir": lambda s: s.path("adir"),
    "binary": lambda s: s.path("binary"),
    "newline": lambda s: s.path("a\nb\x1b[2J"),
    "not-utf8": lambda s: os.fsencode(s.path("")) + b"\xff\xfe",
}
WORD_VALUES: dict[str, Value] = {
    "digits-5000": lambda s: "9" * 5000,
    "long": lambda s: "w" * 5000,
    "newline": lambda s: "a\nb\x1b[2J",
    "not-utf8": lambda s: b"\xff\xfe",
}
NUMBER_VALUES: dict[str, Value] = {
    "digits-5000": lambda s: "9" * 5000,
    "digits-4000": lambda s: "9" * 4000,
    "long": lambda s: "w" * 5000,
}
CHOICE_VALUES: dict[str, Value] = {"long": lambda s: "w" * 5000}


def _hostile_files(directory: Path) -> None:
    os.mkfifo(directory / "fifo")
    os.mknod(directory / "zero", 0o666 | stat.S_IFCHR, os.makedev(1, 5))
    os.mknod(directory / "full", 0o666 | stat.S_IFCHR, os.makedev(1, 7))
    (directory / "adir").mkdir()
    (directory / "binary").write_bytes(bytes(range(256)) * 64)
    (directory / "device-plugins").mkdir()  # the kubelet's: the device plugin makes none


# ---- cases ---------------------------------------------------------------------------------------


@dataclass
class Case:
    """One call: ``argv`` (values may depend on the case's directory), how its streams are set up
    and what its outcome must be."""

    name: str
    argv: Callable[[Scratch], list[str | bytes]]
    env: Callable[[Scratch], dict[str, str]] = lambda s: {}
    stdin: Callable[[Scratch], bytes] = lambda s: b""
    stdout: str = "pipe"  # pipe, closed, full, both-closed (stdout and stderr), stdin-closed
    daemon: bool = False  # may run until stopped
    verdict: bool = False  # status 1 with nothing on stderr is an answer (VERDICTS)
    must_fail_output: bool = False  # stdout closed/full must give OutputError's status
    must_succeed: bool = False  # a base invocation
    prints: bool = False  # filled in from the base run: the command's normal run prints
    setup: Callable[[Scratch], None] = lambda s: None


@dataclass
class Outcome:
    case: Case
    code: int | None
    stdout: bytes
    stderr: bytes
    seconds: float
    stopped: bool  # a daemon stopped by SIGTERM
    problems: list[str] = field(default_factory=list)


def _run(case: Case, scratch: Scratch) -> Outcome:
    """Run ``case`` in its own session and directory, bounded in time and memory."""
    argv = [os.fsencode(a) for a in case.argv(scratch)]
    redirect = {"closed": " >&-", "both-closed": " >&- 2>&-", "stdin-closed": " <&-"}.get(case.stdout, "")
    shell = [b"/bin/sh", b"-c", f'ulimit -v {MEMORY_KIB}; exec "$@"{redirect}'.encode(), b"sh", *argv]
    env = {
        **os.environ,
        "NVC_PY_CONFIG": str(scratch.config),
        "PATH": f"{scratch.dir / 'bin'}:{os.environ['PATH']}",
        **case.env(scratch),
    }
    out_file = open("/dev/full", "wb") if case.stdout == "full" else None  # noqa: SIM115
    started = time.monotonic()
    proc = subprocess.Popen(
        shell,
        stdin=subprocess.PIPE,
        stdout=out_file or subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={os.fsencode(k): os.fsencode(v) for k, v in env.items()},
        cwd=scratch.dir,
        start_new_session=True,
    )
    problems = []
    stopped = False
    try:
        try:
            out, err = proc.communicate(case.stdin(scratch), timeout=DAEMON_S if case.daemon else BOUND_S)
        except subprocess.TimeoutExpired:
            stopped = case.daemon
            if not case.daemon:
                problems.append(f"still running after {BOUND_S} s")
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                out, err = proc.communicate(timeout=BOUND_S)
            except subprocess.TimeoutExpired:
                problems.append(f"did not end within {BOUND_S} s of SIGTERM")
                os.killpg(proc.pid, signal.SIGKILL)
                out, err = proc.communicate()
    finally:
        if out_file is not None:
            out_file.close()
    left = _session_left(proc.pid)
    if left:
        problems.append(f"left running: {left}")
    return Outcome(case, proc.returncode, out or b"", err or b"", time.monotonic() - started, stopped, problems)


def _session_left(sid: int, wait_s: float = 2.0) -> list[str]:
    """The processes of session ``sid`` still alive after ``wait_s``, killed."""
    deadline = time.monotonic() + wait_s
    while True:
        members = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    text = f.read()
            except OSError:
                continue
            comm, fields = text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :].split()
            if int(fields[3]) == sid and fields[0] != "Z":
                members.append((int(entry), comm))
        if not members or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for pid, _ in members:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return [f"{pid} ({comm})" for pid, comm in members]


def check(outcome: Outcome) -> list[str]:
    """What is wrong with ``outcome`` (nothing: an empty list)."""
    case, code, err = outcome.case, outcome.code, outcome.stderr.decode(errors="replace")
    problems = list(outcome.problems)
    if "Traceback" in err:
        problems.append("traceback")
    answer = case.verdict and code == 1 and not err
    if code not in STABLE_CODES and not answer:
        problems.append(f"exit status {code} not one of nvc/errors.py's")
    lines = err.splitlines()
    if outcome.stopped:  # a daemon's log is on stderr; its status 0, or 12 where its debug log was lost
        return problems
    if code and case.stdout != "both-closed" and not answer:
        if len(lines) != 1 or not err.endswith("\n"):
            problems.append(f"{len(lines)} lines on stderr, not one")
        elif not lines[0].startswith(("nvc-py: ", "nvc-py-hook: ", "nvc-py-runtime: ")):
            problems.append("the line does not name the program")
    if code == 0 and lines and not (len(lines) == 1 and WARNING.match(lines[0])):
        problems.append(f"{len(lines)} lines on stderr on success")
    output_lost = case.stdout in ("closed", "full", "both-closed") and (case.must_fail_output or case.prints)
    if output_lost and code != OUTPUT_CODE:
        problems.append(f"exit status {code} with its output lost, not {OUTPUT_CODE}")
    if case.must_succeed and code != 0 and not answer:
        problems.append(f"the base invocation failed (exit status {code})")
    return problems


def run_all(cases: list[Case], tmp_path: Path, root: Path) -> list[Outcome]:
    """Run ``cases`` in parallel, each in its own scratch directory."""
    base_config = tmp_path / "config.yaml"

    def one(index_case: tuple[int, Case]) -> Outcome:
        index, case = index_case
        directory = tmp_path / f"c{index}"
        directory.mkdir()
        scratch = Scratch(directory, directory / "config.yaml", root)
        shutil.copy(base_config, scratch.config)
        _hostile_files(directory)
        for name in ("rootfs/etc", "rootfs/lib", "bin"):
            (directory / name).mkdir(parents=True)
        for runtime in config_file.DEFAULT_RUNTIMES:  # nvc-py-runtime's without a configuration file
            (directory / "bin" / runtime).symlink_to("/bin/true")
        case.setup(scratch)
        return _run(case, scratch)

    # Daemons mostly wait to be stopped: they get a pool of their own, wider than the machine.
    with ThreadPoolExecutor(WORKERS) as pool, ThreadPoolExecutor(DAEMON_WORKERS) as daemons:
        futures = [(daemons if case.daemon else pool).submit(one, (i, case)) for i, case in enumerate(cases)]
        return [future.result() for future in futures]


def assert_all(outcomes: list[Outcome]) -> None:
    failed = []
    for outcome in outcomes:
        problems = check(outcome)
        if problems:
            err = outcome.stderr.decode(errors="replace")
            failed.append(
                f"{outcome.case.name}: {'; '.join(problems)} (exit {outcome.code}, "
                f"{outcome.seconds:.1f} s): {err[-600:]!r}"
            )
    assert not failed, f"{len(failed)} of {len(outcomes)} cases:\n" + "\n".join(failed)


def run_phases(make: Callable[[], tuple[list[Case], list[Case]]], tmp_path: Path, root: Path) -> None:
    """Base cases first (each must succeed; whether it prints sets what a lost stdout must give),
    then the rest."""
    bases, rest = make()
    base_outcomes = run_all(bases, tmp_path / "base", root)
    printed = {o.case.name for o in base_outcomes if o.code == 0 and o.stdout}
    for case in rest:
        case.prints = case.name.split(" | ")[0] in printed and case.stdout != "pipe"
    outcomes = base_outcomes + run_all(rest, tmp_path / "rest", root)
    assert_all(outcomes)


# ---- the base configuration ------------------------------------------------------------------------


def write_base_config(tmp_path: Path, root: Path) -> None:
    """Every case's configuration: the fake driver's root, the hook's log in the case directory's
    parent, /bin/true as the runtime nvc-py-runtime execs."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.yaml").write_text(
        f"root: {root}\nload-kmods: false\nlog: {{file: {tmp_path / 'hook.log'}}}\nruntimes: [/bin/true]\n"
    )


@pytest.fixture
def table_dir(tmp_path: Path, active_2gpu) -> Path:
    write_base_config(tmp_path / "base", active_2gpu.root)
    write_base_config(tmp_path / "rest", active_2gpu.root)
    return tmp_path


def scratch_bundle(scratch: Scratch, env: dict[str, str] | None = None) -> Path:
    bundle = scratch.dir / "bundle"
    if not bundle.exists():
        make_bundle(bundle, scratch.dir / "rootfs", ["true"], env=env or {})
    return bundle


def hook_state(scratch: Scratch, bundle: Path | None = None) -> bytes:
    return json.dumps(
        {
            "ociVersion": "1.0.2",
            "id": "cli-hostile",
            "status": "creating",
            "bundle": str(bundle or scratch_bundle(scratch)),
        }
    ).encode()


GPU_ENV = {"NVIDIA_VISIBLE_DEVICES": "0"}
# The variables a container sets for the hook: the sharing ones (nvc/containerenv/sharing.py's names) and NVIDIA's.
HOOK_ENV_NAMES = (
    *(prefix for prefix, _, _ in sharing.VARIABLES),
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "NVIDIA_REQUIRE_CUDA",
    "NVIDIA_IMEX_CHANNELS",
    "NVIDIA_MIG_CONFIG_DEVICES",
)
ENV_VALUES: dict[str, Value] = {**NUMBER_VALUES, "newline": WORD_VALUES["newline"]}


def asking_gpu_with(name: str, value: Value) -> Callable[[Scratch], None]:
    """A case's set-up: its bundle asks for GPU 0, with ``name`` set to ``value`` in its env."""

    def setup(scratch: Scratch) -> None:
        scratch_bundle(scratch, {**GPU_ENV, name: value(scratch)})

    return setup

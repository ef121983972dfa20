"""Every command and option of the installed programs, called carelessly: one line, a stable exit code,
an end within a bound, nothing left running.

The cases are generated: ``nvc-py``'s from its click command tree (every command, every option
and argument that takes a value, and every eager flag such as ``--help`` and ``--version``, so a
new option is covered without editing this file), ``nvc-py-hook``'s stages and ``nvc-py-runtime``
by hand (neither is a click program), and the configuration file's keys from its NamedTuples.
Each is run with a table of hostile values: numbers of 4000 digits (int() takes them) and 5000
(it refuses them), 5000-character paths, a FIFO, a character device (/dev/zero's and /dev/full's
numbers, made in the case's directory), a directory or a binary file where a file is expected,
text with a newline and a terminal escape, bytes that are not UTF-8; and every program's output
with its stdout closed (``>&-``) or full (``> /dev/full``), its stderr too or its stdin closed (the
closed cases run through the native fronts, which pass a closed stream on read-only).

Every case runs in a directory of its own, with every path option the command would write to
pointed there (:data:`BASE`; an option this table does not know whose default is an absolute path
gets a scratch path too, never the host's), under a 2 GiB address-space limit (an unbounded
read dies instead of filling the machine), in a session of its own that must be empty when it ends.

The rules (:func:`check`): no traceback; an exit status among nvc/errors.py's (0, 2 to 12; doctor's
1 is its answer, :data:`VERDICTS`); on failure exactly one line on stderr, naming the program; on
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
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import pytest

from harness.bundle import make_bundle
from harness.clitree import commands, takes_value as _takes_value
from nvc import config as config_file
from nvc import errors
from nvc.commands.cli import cli
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
    env = {**os.environ, "NVC_PY_CONFIG": str(scratch.config),
           "PATH": f"{scratch.dir / 'bin'}:{os.environ['PATH']}", **case.env(scratch)}
    out_file = open("/dev/full", "wb") if case.stdout == "full" else None  # noqa: SIM115
    started = time.monotonic()
    proc = subprocess.Popen(shell, stdin=subprocess.PIPE, stdout=out_file or subprocess.PIPE, stderr=subprocess.PIPE,
                            env={os.fsencode(k): os.fsencode(v) for k, v in env.items()}, cwd=scratch.dir,
                            start_new_session=True)
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
            comm, fields = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()
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
            failed.append(f"{outcome.case.name}: {'; '.join(problems)} (exit {outcome.code}, "
                          f"{outcome.seconds:.1f} s): {err[-600:]!r}")
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
        f"root: {root}\nload-kmods: false\nlog: {{file: {tmp_path / 'hook.log'}}}\nruntimes: [/bin/true]\n")


# ---- nvc-py: the click tree ------------------------------------------------------------------------

# The base value of each option a command writes to or reads a file from: the case's own directory
# (by command words and option name; a name alone for every command). An option missing here whose
# default is an absolute path gets ``<scratch>/<name>``; any other is left at its default.
BASE: dict[tuple[str, ...], Callable[[Scratch], str]] = {
    ("config_path",): lambda s: str(s.config),
    ("setup", "containerd", "config_path"): lambda s: s.path("containerd.toml"),
    ("setup", "docker", "config_path"): lambda s: s.path("daemon.json"),
    ("path",): lambda s: str(s.config),
    ("hooks_dir",): lambda s: s.path("hooks.d"),
    ("unit_dir",): lambda s: s.path("units"),
    ("systemctl",): lambda s: "/bin/false",
    ("drop_in",): lambda s: s.path("drop-in.toml"),
    ("state_dir",): lambda s: s.path("share"),
    ("device_plugin_dir",): lambda s: s.path("device-plugins"),
    ("rootfs",): lambda s: s.path("rootfs"),
    ("listen",): lambda s: f"unix:{s.path('metrics.sock')}",  # the exporter's: no port shared between cases
}
BASE_FLAGS = {("configure",): ["--dry-run"]}  # standalone configure would mount into the scratch rootfs
DAEMONS = {("k8s", "device-plugin"), ("exporter",)}
# Where every hostile value of the global options is tried (the group reads --debug for all; a driver
# command and the device plugin resolve --root, --ldcache and --user, each its own way); every other
# command gets the first value of each.
ALL_GLOBAL_VALUES = {("list",), ("k8s", "device-plugin")}
VERDICTS = {("doctor",)}  # status 1 is their answer ("a check failed"), said on stdout, not an error
SKIPPED = {("hook",)}  # nvc-py-hook's stages: test_hook_stages
PATH_METAVARS = ("PATH", "ROOTFS")


def _scratch(scratch: Scratch, name: str, directory: bool) -> str:
    if directory:
        (scratch.dir / name).mkdir(exist_ok=True)
    return scratch.path(name)


def _base_value(words: tuple[str, ...], param: click.Parameter) -> Callable[[Scratch], str] | None:
    for key in ((*words, param.name), (param.name,)):
        if key in BASE:
            return BASE[key]
    default = param.default if not callable(param.default) else None
    if isinstance(default, str) and default.lstrip("@").startswith("/"):  # a directory for a directory
        return lambda s, name=param.name, d=os.path.isdir(default): _scratch(s, f"default-{name}", d)
    if param.required:
        return lambda s, name=param.name: s.path(name)
    return None


def _values(param: click.Parameter) -> dict[str, Value]:
    if isinstance(param.type, click.Choice):
        return CHOICE_VALUES
    if isinstance(param.type, (click.types.IntParamType, click.types.FloatParamType)):
        return NUMBER_VALUES
    metavar = (param.metavar or "").upper() if isinstance(param, click.Option) else param.name.upper()
    default = param.default if isinstance(param.default, str) else ""
    if any(m in metavar for m in PATH_METAVARS) or default.lstrip("@").startswith("/") or param.name in (
            *(key[-1] for key in BASE), "root", "ldcache", "debug", "output"):
        return PATH_VALUES
    return WORD_VALUES


def _argv(words: tuple[str, ...], command: click.Command, scratch: Scratch, hostile: tuple[click.Parameter, Any] | None,
          global_hostile: tuple[click.Parameter, Any] | None = None) -> list[str | bytes]:
    """``nvc-py [global option] WORDS [base options] [hostile option] [arguments]``."""
    argv: list[str | bytes] = [NVC_PY]
    if global_hostile is not None:
        argv.append(os.fsencode(global_hostile[0].opts[-1]) + b"=" + os.fsencode(global_hostile[1]))
    argv += list(words) + BASE_FLAGS.get(words, [])
    arguments: list[str | bytes] = []
    for param in command.params:
        if not _takes_value(param):
            continue
        value: Any = None
        if hostile is not None and param is hostile[0]:
            value = hostile[1]
        else:
            base = _base_value(words, param)
            value = base(scratch) if base is not None else None
        if value is None:
            continue
        if isinstance(param, click.Argument):
            arguments.append(value)
        else:  # --name=VALUE: a bare --user takes no value (nvc.commands.cli._optional_user_value)
            argv.append(os.fsencode(param.opts[-1]) + b"=" + os.fsencode(value))
    return argv + (["--"] if arguments else []) + arguments


def _value_params(command: click.Command) -> list[click.Parameter]:
    return [p for p in command.params if _takes_value(p) and not getattr(p, "is_eager", False)]


def _eager_flags(command: click.Command) -> list[str]:
    """``--help`` and the command's other eager flags (``--version``)."""
    return ["--help", *(p.opts[-1] for p in command.params if isinstance(p, click.Option) and p.is_eager and p.is_flag)]


def nvc_py_cases() -> tuple[list[Case], list[Case]]:
    bases: list[Case] = []
    rest: list[Case] = []
    leaves = [(w, c) for w, c in commands(cli) if not isinstance(c, click.Group) and w not in SKIPPED]
    for words, command in commands(cli):
        if words in SKIPPED:
            continue
        label = " ".join(("nvc-py", *words))
        for flag in _eager_flags(command):
            flag_argv = lambda s, w=words, f=flag: [NVC_PY, *w, f]  # noqa: E731
            for mode in ("pipe", "closed", "full", "both-closed"):
                rest.append(Case(f"{label} {flag} | {mode}", flag_argv, stdout=mode, must_succeed=mode == "pipe",
                                 must_fail_output=mode != "pipe"))
    for words, command in leaves:
        label = " ".join(("nvc-py", *words))
        kind = {"daemon": words in DAEMONS, "verdict": words in VERDICTS}
        plain = lambda s, w=words, c=command: _argv(w, c, s, None)  # noqa: E731
        bases.append(Case(label, plain, must_succeed=not kind["daemon"], **kind))
        for mode in ("closed", "full", "both-closed", "stdin-closed"):
            rest.append(Case(f"{label} | {mode}", plain, stdout=mode, **kind))
        for param in _value_params(command):
            for value_name, value in _values(param).items():
                rest.append(Case(f"{label} {param.name}={value_name}",
                                 lambda s, w=words, c=command, p=param, v=value: _argv(w, c, s, (p, v(s))), **kind))
        for param in _value_params(cli):  # the global options: one value before every command, all before some
            values = list(_values(param).items())
            for value_name, value in values if words in ALL_GLOBAL_VALUES else values[:1]:
                rest.append(Case(f"nvc-py --{param.name}={value_name} {' '.join(words)}",
                                 lambda s, w=words, c=command, p=param, v=value: _argv(w, c, s, None, (p, v(s))),
                                 **kind))
    return bases, rest


@pytest.fixture
def table_dir(tmp_path: Path, active_2gpu) -> Path:
    write_base_config(tmp_path / "base", active_2gpu.root)
    write_base_config(tmp_path / "rest", active_2gpu.root)
    return tmp_path


def test_every_nvc_py_command_and_option(active_2gpu, table_dir: Path) -> None:
    run_phases(nvc_py_cases, table_dir, active_2gpu.root)


# ---- nvc-py-hook and nvc-py-runtime ------------------------------------------------------------------


def _bundle(scratch: Scratch, env: dict[str, str] | None = None) -> Path:
    bundle = scratch.dir / "bundle"
    if not bundle.exists():
        make_bundle(bundle, scratch.dir / "rootfs", ["true"], env=env or {})
    return bundle


def _state(scratch: Scratch, bundle: Path | None = None) -> bytes:
    return json.dumps({"ociVersion": "1.0.2", "id": "cli-hostile", "status": "creating",
                       "bundle": str(bundle or _bundle(scratch))}).encode()


GPU_ENV = {"NVIDIA_VISIBLE_DEVICES": "0"}
# The variables a container sets for the hook: the sharing ones (nvc/containerenv/sharing.py's names) and NVIDIA's.
HOOK_ENV_NAMES = (*(prefix for prefix, _, _ in sharing.VARIABLES),
                  "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "NVIDIA_REQUIRE_CUDA",
                  "NVIDIA_IMEX_CHANNELS", "NVIDIA_MIG_CONFIG_DEVICES")
ENV_VALUES: dict[str, Value] = {**NUMBER_VALUES, "newline": WORD_VALUES["newline"]}


def _asking_gpu_with(name: str, value: Value) -> Callable[[Scratch], None]:
    """A case's set-up: its bundle asks for GPU 0, with ``name`` set to ``value`` in its env."""
    def setup(scratch: Scratch) -> None:
        _bundle(scratch, {**GPU_ENV, name: value(scratch)})

    return setup


def hook_cases() -> tuple[list[Case], list[Case]]:
    bases: list[Case] = []
    rest: list[Case] = []
    for program in ([HOOK], [NVC_PY, "hook"]):
        label = " ".join(Path(w).name if i == 0 else w for i, w in enumerate(program))
        for flag in ("--help", "-h"):
            for mode in ("pipe", "closed", "full", "both-closed"):
                rest.append(Case(f"{label} {flag} | {mode}", lambda s, p=program, f=flag: [*p, f], stdout=mode,
                                 must_succeed=mode == "pipe", must_fail_output=mode != "pipe"))
        for stage in ("prestart", "poststart", "poststop"):
            name = f"{label} {stage}"
            argv = lambda s, p=program, st=stage: [*p, st]  # noqa: E731
            bases.append(Case(name, argv, stdin=_state, must_succeed=True))
            for mode in ("closed", "full", "both-closed", "stdin-closed"):
                rest.append(Case(f"{name} | {mode}", argv, stdin=_state, stdout=mode))
    # The CDI hooks: links and ld cache in the case's own rootfs (the state names its bundle, no pid).
    cdi = {"create-symlinks": ("--link", lambda v: b"libx.so::/" + v),
           "update-ldcache": ("--folder", lambda v: b"/" + v)}
    for stage, (option, make) in cdi.items():
        argv = lambda s, st=stage, o=option, m=make: [HOOK, st, o, m(b"lib")]  # noqa: E731
        bases.append(Case(f"nvc-py-hook {stage}", argv, stdin=_state, must_succeed=True))
        for value_name, value in WORD_VALUES.items():
            rest.append(Case(f"nvc-py-hook {stage} {option}={value_name}",
                             lambda s, st=stage, o=option, m=make, v=value: [HOOK, st, o, m(os.fsencode(v(s)))],
                             stdin=_state))
    for value_name, value in PATH_VALUES.items():
        rest.append(Case(f"nvc-py-hook serve --socket={value_name}",
                         lambda s, v=value: [HOOK, "serve", "--socket", v(s)], daemon=True))
    # What a container's env says, for a container asking for GPU 0 (refused before anything is done).
    for name in HOOK_ENV_NAMES:
        for value_name, value in ENV_VALUES.items():
            rest.append(Case(f"nvc-py-hook prestart env {name}={value_name}", lambda s: [HOOK, "prestart"],
                             stdin=_state, setup=_asking_gpu_with(name, value)))
    return bases, rest


def test_hook_stages(active_2gpu, table_dir: Path) -> None:
    run_phases(hook_cases, table_dir, active_2gpu.root)


def runtime_cases() -> tuple[list[Case], list[Case]]:
    bases: list[Case] = []
    rest: list[Case] = []
    for flag in ("--help", "-h", "--version", "-v"):
        for mode in ("pipe", "closed", "full", "both-closed"):
            rest.append(Case(f"nvc-py-runtime {flag} | {mode}", lambda s, f=flag: [RUNTIME, f], stdout=mode,
                             must_succeed=mode == "pipe", must_fail_output=mode != "pipe"))
    create = lambda s: [RUNTIME, "create", "--bundle", str(_bundle(s)), "ctr"]  # noqa: E731
    bases.append(Case("nvc-py-runtime create", create, must_succeed=True))
    for mode in ("closed", "full", "both-closed", "stdin-closed"):
        rest.append(Case(f"nvc-py-runtime create | {mode}", create, stdout=mode))
    for value_name, value in PATH_VALUES.items():
        rest.append(Case(f"nvc-py-runtime create --bundle={value_name}",
                         lambda s, v=value: [RUNTIME, "create", "--bundle", v(s), "ctr"]))
        # The log gets the error of a create that fails (a bundle without config.json).
        rest.append(Case(f"nvc-py-runtime --log={value_name} create (failing)",
                         lambda s, v=value: [RUNTIME, "--log", v(s), "create", "--bundle", s.path("adir"), "ctr"]))
    for name in HOOK_ENV_NAMES:
        for value_name, value in ENV_VALUES.items():
            rest.append(Case(f"nvc-py-runtime create env {name}={value_name}", create,
                             setup=_asking_gpu_with(name, value)))
    return bases, rest


def test_runtime(active_2gpu, table_dir: Path) -> None:
    run_phases(runtime_cases, table_dir, active_2gpu.root)


# ---- the configuration file ------------------------------------------------------------------------------

# Commands that read the configuration (the hook and the runtime with the base bundle: no GPU asked for).
CONFIG_READERS: dict[str, tuple[Callable[[Scratch], list[str | bytes]], bool]] = {
    "config show": (lambda s: [NVC_PY, "config", "show"], False),
    "list": (lambda s: [NVC_PY, "list"], False),
    "cdi generate": (lambda s: [NVC_PY, "cdi", "generate"], False),
    "k8s device-plugin": (lambda s: [NVC_PY, "k8s", "device-plugin", "--device-plugin-dir", s.path("device-plugins")],
                          True),
    "hook prestart": (lambda s: [HOOK, "prestart"], False),
    "runtime create": (lambda s: [RUNTIME, "create", "--bundle", str(_bundle(s)), "ctr"], False),
}
SECTIONS = {"": config_file.Config, "sharing": config_file.Sharing, "k8s": config_file.K8s}


def _config_keys(kind: type) -> Iterator[tuple[str, str]]:
    """(section, key) of every setting whose default is of ``kind`` (a tuple: its entries')."""
    for section, fields in SECTIONS.items():
        for name, default in fields._field_defaults.items():
            if isinstance(default, tuple) and default and not isinstance(default, (config_file.Sharing,
                                                                                    config_file.K8s)):
                default = default[0]
            if isinstance(default, kind) and not isinstance(default, bool):
                yield section, name.replace("_", "-")


def _config_with(scratch: Scratch, section: str, key: str, value: str) -> str:
    """The base configuration with ``key`` of ``section`` (the log's keys are log_file and log_level in
    :class:`~nvc.config.Config`, ``log: {file, level}`` in the file) set to ``value``."""
    if not section and key.startswith("log-"):
        section, key = "log", key.removeprefix("log-")
    top = {"load-kmods": "false", "runtimes": "[/bin/true]", "root": str(scratch.root),
           "log": f"{{file: {scratch.path('hook.log')}}}"}
    if section:
        top[section] = f"{{{key}: {value}}}"
    else:
        top[key] = value
    return "".join(f"{name}: {text}\n" for name, text in top.items())


def config_cases() -> tuple[list[Case], list[Case]]:
    texts: dict[str, Callable[[Scratch], str]] = {}
    for section, key in [*_config_keys(int), ("sharing", "device-sm-limit")]:
        is_list = isinstance(getattr(SECTIONS[section](), key.replace("-", "_")), tuple)
        for value_name in ("digits-5000", "digits-4000"):
            digits = NUMBER_VALUES[value_name]
            texts[f"{section or 'top'}.{key}={value_name}"] = (
                lambda s, sec=section, k=key, d=digits, lst=is_list: _config_with(
                    s, sec, k, f"[{d(s)}]" if lst else str(d(s))))
    for section, key in _config_keys(str):
        if not str(getattr(SECTIONS[section](), key.replace("-", "_"))).startswith("/"):
            continue  # not a path
        for value_name, value in PATH_VALUES.items():
            if value_name in ("newline", "not-utf8"):
                continue  # other YAML text than the path (the file is UTF-8)
            texts[f"{section or 'top'}.{key}={value_name}"] = lambda s, sec=section, k=key, v=value: _config_with(
                s, sec, k, json.dumps(v(s)))
    bases: list[Case] = []
    rest: list[Case] = []
    for reader, (argv, daemon) in CONFIG_READERS.items():
        bases.append(Case(f"{reader} (base configuration)", argv, stdin=_state, daemon=daemon, must_succeed=not daemon))
        for text_name, text in texts.items():
            def setup(s: Scratch, t: Callable[[Scratch], str] = text) -> None:
                s.config.write_text(t(s))
            rest.append(Case(f"{reader} with {text_name}", argv, stdin=_state, daemon=daemon, setup=setup))
        for value_name, value in PATH_VALUES.items():
            rest.append(Case(f"{reader} with NVC_PY_CONFIG={value_name}", argv, stdin=_state, daemon=daemon,
                             env=lambda s, v=value: {"NVC_PY_CONFIG": os.fsdecode(v(s))}))
    return bases, rest


def test_configuration_values(active_2gpu, table_dir: Path) -> None:
    run_phases(config_cases, table_dir, active_2gpu.root)


# ---- what the lines say ----------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [[NVC_PY, "--version"], [HOOK, "--help"], [RUNTIME, "--version"]],
                         ids=["nvc-py", "nvc-py-hook", "nvc-py-runtime"])
@pytest.mark.parametrize(("mode", "reason"), [("full", "No space left on device"), ("closed", "Bad file descriptor")])
def test_lost_output_says_so(tmp_path: Path, argv: list[str], mode: str, reason: str) -> None:
    """stdout full or closed: OutputError's line and status (see nvc/stdio.py), for each program."""
    write_base_config(tmp_path, tmp_path)
    prog = Path(argv[0]).name
    with open("/dev/full", "wb") as full:
        result = subprocess.run(["/bin/sh", "-c", 'exec "$@" >&-', "sh", *argv] if mode == "closed" else argv,
                                stdout=full, stderr=subprocess.PIPE, text=True, timeout=BOUND_S,
                                env={**os.environ, "NVC_PY_CONFIG": str(tmp_path / "config.yaml")})
    assert (result.returncode, result.stderr) == (
        OUTPUT_CODE, f"{prog}: output error: cannot write standard output: {reason}\n")


def test_a_debug_log_that_cannot_be_written(active_2gpu, tmp_path: Path) -> None:
    """The command's work and output stand; its status says the log was lost, in one line. A FIFO
    without a reader is refused at once."""
    listed = subprocess.run([NVC_PY, "--root", str(active_2gpu.root), "list"], capture_output=True, text=True,
                            timeout=BOUND_S)
    result = subprocess.run([NVC_PY, "--root", str(active_2gpu.root), "--debug", "/dev/full", "list"],
                            capture_output=True, text=True, timeout=BOUND_S)
    assert (result.returncode, result.stdout, result.stderr) == (
        OUTPUT_CODE, listed.stdout, "nvc-py: output error: /dev/full: debug log not written: No space left on device\n")
    os.mkfifo(tmp_path / "fifo")
    result = subprocess.run([NVC_PY, "--debug", str(tmp_path / "fifo"), "config", "show"], capture_output=True,
                            text=True, timeout=BOUND_S)
    assert (result.returncode, result.stderr) == (errors.InputError.exit_code, f"nvc-py: input error: {tmp_path}/fifo: "
                                                  "cannot open debug log: No such device or address\n")


def test_a_usage_error_is_one_line() -> None:
    """click's words, with where to read more instead of its usage lines."""
    result = subprocess.run([NVC_PY, "list", "--bogus"], capture_output=True, text=True, timeout=BOUND_S)
    assert result.returncode == errors.InputError.exit_code
    assert re.fullmatch(r"nvc-py: input error: [^\n]*--bogus[^\n]* \(see 'nvc-py list --help'\)\n", result.stderr)

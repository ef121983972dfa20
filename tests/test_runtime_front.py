"""nvc-py-runtime's front passes calls that need nothing of nvc-py straight to the runtime, as the Python
program would: the same runtime, arguments, environment, descriptors, stdin, process (signals reach the
runtime) and exit status; a create whose spec could ask for a GPU goes to a hook server's worker for its
spec, then the front executes the runtime (no server: the program runs it); --help/--version, and any
doubt about the runtime cache go to the program (native/client/runtime_front.c, hook/oci/runtimecache.py)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from harness.hookfixtures import default_run_dir, served  # noqa: F401  (fixtures)
from harness.hookserver import LIBDIR, hook_server
from harness.installed import HOOK
from nvc import __version__
from nvc.hook.oci.runtimecache import CACHE_PATH as CACHE

RUNTIME = LIBDIR / "nvc-py-runtime"
STANDIN = """#!/bin/sh
# A runtime that says what it got: its pid, arguments, environment, descriptors and stdin; exits 7.
out={out}
echo $$ > $out/pid
printf '%s\\n' "$@" > $out/args
env -0 > $out/env
ls /proc/$$/fd > $out/fds
cat > $out/stdin
exit 7
"""


@pytest.fixture
def standin(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """(environment naming a configuration whose runtime is the stand-in, the stand-in's output directory)."""
    out = tmp_path / "out"
    out.mkdir()
    program = tmp_path / "standin-runtime"
    program.write_text(STANDIN.format(out=out))
    program.chmod(0o755)
    config = tmp_path / "config.yaml"
    config.write_text(f"runtimes: [{program}]\n")
    return {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "NVC_PY_CONFIG": str(config),
        "KEPT": "x y",
        "LD_LIBRARY_PATH": str(tmp_path / "engine-libs"),  # the engine's own: the runtime gets it, Python not
        "PYTHONDONTWRITEBYTECODE": "1",
    }, out


def received_env(out: Path) -> dict[str, str]:
    got = dict(entry.split("=", 1) for entry in (out / "env").read_text().split("\0") if entry)
    return {k: v for k, v in got.items() if k != "PWD"}


def cache_stamp() -> tuple[int, int] | None:
    """The runtime cache's inode and change time: the program writes it anew (a rename) at every run."""
    try:
        st = os.lstat(CACHE)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_ctime_ns


def run(args: list[str], env: dict[str, str], **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(RUNTIME), *args], env=env, capture_output=True, text=True, timeout=60, **kwargs)


def bundle_with(tmp_path: Path, spec: dict | str) -> Path:
    bundle = tmp_path / "bundle"
    bundle.mkdir(exist_ok=True)
    (bundle / "config.json").write_text(spec if isinstance(spec, str) else json.dumps(spec))
    return bundle


def plain_spec(**env: str) -> dict:
    return {
        "ociVersion": "1.0.2",
        "root": {"path": "rootfs"},
        "process": {"args": ["/bin/true"], "cwd": "/", "env": [f"{k}={v}" for k, v in env.items()]},
    }


@pytest.mark.parametrize(
    "args",
    [
        ["state", "c1"],
        ["--root", "/x", "--log", "/y", "kill", "c1", "KILL"],
        ["delete", "--force", "c1"],
        ["list"],
        ["ps", "c1"],
        ["events", "--stats", "c1"],
        ["features"],
        ["--debug", "start", "c1"],
        ["--log-format=json", "exec", "c1", "ls"],
    ],
    ids=lambda a: " ".join(a),
)
def test_a_pass_through_call_is_the_runtime_itself(standin, args: list[str]) -> None:
    env, out = standin
    first = run(args, env, input="in")  # the program resolves the runtime and writes the cache
    assert first.returncode == 7 and cache_stamp(), first.stderr
    assert received_env(out) == env  # the program's exec hands it on whole too
    before = cache_stamp()
    proc = subprocess.Popen(
        [str(RUNTIME), *args], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    _, err = proc.communicate("the stdin", timeout=60)
    assert proc.returncode == 7, err
    assert cache_stamp() == before  # no Python: the program would have written the cache again
    assert int((out / "pid").read_text()) == proc.pid  # the same process: a signal to it reaches the runtime
    assert (out / "args").read_text().splitlines() == args
    assert (out / "stdin").read_text() == "the stdin"
    assert received_env(out) == env


@pytest.mark.parametrize("locale", [{}, {"LC_CTYPE": "POSIX"}, {"LC_ALL": "C"}], ids=["none", "LC_CTYPE", "LC_ALL"])
def test_the_program_hands_the_runtime_the_callers_locale(standin, locale: dict[str, str]) -> None:
    """Python sets LC_CTYPE itself where the locale is C (PEP 538): the runtime still gets the caller's."""
    env, out = standin
    env = {**env, **locale}
    assert run(["--version"], env).returncode == 7  # the program answers, then executes the runtime
    assert received_env(out) == env


def test_preserved_descriptors_and_a_console_socket_reach_the_runtime(standin, tmp_path: Path) -> None:
    env, out = standin
    args = [
        "create",
        "--bundle",
        str(bundle_with(tmp_path, plain_spec())),
        "--console-socket",
        str(tmp_path / "console.sock"),
        "--preserve-fds",
        "2",
        "c1",
    ]
    pipes = [os.pipe(), os.pipe()]
    extra = tuple(read for read, _ in pipes)
    try:
        for _ in range(2):  # the first writes the cache
            result = subprocess.run(
                [str(RUNTIME), *args], env=env, capture_output=True, text=True, timeout=60, pass_fds=extra
            )
            assert result.returncode == 7, result.stderr
    finally:
        for pair in pipes:
            for fd in pair:
                os.close(fd)
    assert {str(fd) for fd in extra} <= set((out / "fds").read_text().split())
    assert (out / "args").read_text().splitlines() == args


def test_a_create_without_gpu_passes_through_untouched(standin, tmp_path: Path) -> None:
    env, out = standin
    bundle = bundle_with(tmp_path, plain_spec(PATH="/bin"))
    text = (bundle / "config.json").read_bytes()
    args = ["create", "--bundle", str(bundle), "c1"]
    assert run(args, env).returncode == 7
    before = cache_stamp()
    assert run(args, env).returncode == 7
    assert cache_stamp() == before and (bundle / "config.json").read_bytes() == text


@pytest.mark.parametrize(
    "spec",
    [
        plain_spec(NVIDIA_VISIBLE_DEVICES="void"),
        plain_spec(CUDA_VERSION="12.0"),
        json.dumps(plain_spec(NVIDIA_X="1")).replace("NVIDIA_X", "\\u004eVIDIA_VISIBLE_DEVICES"),
        {**plain_spec(), "mounts": [{"destination": "/var/run/nvidia-container-devices/0", "source": "/dev/null"}]},
        "[1]",
        "not json",
    ],
    ids=["visible-devices", "legacy", "escaped", "volume", "array", "garbage"],
)
def test_a_create_that_could_ask_for_a_gpu_goes_to_the_program(standin, tmp_path: Path, spec) -> None:
    env, _ = standin
    args = ["create", "--bundle", str(bundle_with(tmp_path, spec)), "c1"]
    run(["state", "c1"], env)
    before = cache_stamp()
    result = run(args, env)
    if isinstance(spec, str) and not spec.startswith("{"):  # today's one-line refusal, from the program
        assert result.returncode == 2 and result.stderr.startswith("nvc-py-runtime: input error:"), result.stderr
    elif result.returncode == 7:  # the program found no GPU asked for, and ran the stand-in
        assert cache_stamp() != before
    else:  # the program took it as a GPU container, and this host has no driver
        assert result.stderr.startswith("nvc-py-runtime: initialization error:"), result.stderr


@pytest.mark.parametrize("option", ["--version", "--help", "-v", "-h"])
def test_help_and_version_say_what_nvc_py_runtime_is_first(standin, option: str) -> None:
    """The program says what nvc-py-runtime is, then the runtime answers; once the program stored its
    answer in the runtime cache the front gives the same without Python. Among other words it is the
    program's (runc takes --version only alone)."""
    env, out = standin
    Path(CACHE).unlink(missing_ok=True)
    by_program = run([option], env)
    assert by_program.returncode == 7 and by_program.stdout.startswith("nvc-py-runtime "), by_program.stdout
    assert by_program.stdout.endswith("'runtimes' key).\n\n") and (out / "args").read_text().splitlines() == [option]
    (out / "args").unlink()
    before = cache_stamp()
    by_front = run([option], env)
    assert cache_stamp() == before  # no Python: the program writes the cache anew at every run
    assert (by_front.returncode, by_front.stdout, by_front.stderr) == (7, by_program.stdout, by_program.stderr)
    assert (out / "args").read_text().splitlines() == [option]
    assert run(["--debug", option], env).returncode == 7 and cache_stamp() != before  # the program's


def test_an_older_programs_cache_is_not_believed(standin) -> None:
    """An upgrade's front believes no runtime cache an older program wrote (its about text says the older
    version): the magic carries nvc-py's version."""
    env, _ = standin
    assert run(["state", "c1"], env).returncode == 7
    text = Path(CACHE).read_bytes()
    older = text.replace(f"nvc-py-runtime/2 {__version__}\0".encode(), b"nvc-py-runtime/2 0.0.1\0", 1)
    assert older != text
    Path(CACHE).write_bytes(older)
    before = cache_stamp()
    assert run(["state", "c1"], env).returncode == 7 and cache_stamp() != before  # the program ran


def test_a_changed_configuration_or_path_is_seen_at_once(standin, tmp_path: Path) -> None:
    env, _ = standin
    earlier = tmp_path / "bin"
    earlier.mkdir()
    env = {**env, "PATH": f"{earlier}:{env['PATH']}"}
    assert run(["state", "c1"], env).returncode == 7  # the stand-in
    Path(env["NVC_PY_CONFIG"]).write_text("runtimes: [runc]\n")
    state = ["--root", str(tmp_path / "state"), "state", "c1"]
    assert run(state, env).returncode == 1  # the host's runc: no such container
    before = cache_stamp()
    assert run(state, env).returncode == 1 and cache_stamp() == before  # passed through
    (earlier / "runc").write_text("#!/bin/sh\nexit 3\n")
    (earlier / "runc").chmod(0o755)
    assert run(state, env).returncode == 3  # a runtime installed earlier in PATH is found at once


@pytest.mark.parametrize("tamper", ["group-writable", "not-roots", "symlink", "other-format"])
def test_only_roots_own_cache_is_believed(standin, tmp_path: Path, tamper: str) -> None:
    env, out = standin
    assert run(["state", "c1"], env).returncode == 7
    if tamper == "group-writable":
        os.chmod(CACHE, 0o620)
    elif tamper == "not-roots":
        os.chown(CACHE, 1000, 1000)
    elif tamper == "symlink":
        copy = tmp_path / "copy"
        copy.write_bytes(Path(CACHE).read_bytes())
        os.unlink(CACHE)
        os.symlink(copy, CACHE)
    else:
        Path(CACHE).write_bytes(Path(CACHE).read_bytes().replace(b"nvc-py-runtime/2", b"nvc-py-runtime/0"))
    before = cache_stamp()
    assert run(["state", "c1"], env).returncode == 7  # the program ran the stand-in, and rewrote the cache
    assert cache_stamp() != before and os.stat(CACHE).st_mode & 0o777 == 0o600


def test_a_spec_without_process_asking_no_gpu_gets_the_runtimes_own_answer(tmp_path: Path) -> None:
    """runc's own error and status (not the wrapper's parse of the spec), as an OCI conformance run expects."""
    spec = plain_spec()
    del spec["process"]
    bundle = bundle_with(tmp_path, spec)
    (bundle / "rootfs").mkdir()
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "NVC_PY_CONFIG": str(tmp_path / "none.yaml")}
    args = ["--root", str(tmp_path / "state"), "create", "--bundle", str(bundle), "noproc"]
    direct = subprocess.run(["runc", *args], capture_output=True, text=True, timeout=60)
    run(["--root", str(tmp_path / "state"), "list"], env)  # the program resolves runc, and writes the cache
    wrapped = run(args, env)
    assert (wrapped.returncode, wrapped.stderr.split("msg=")[-1]) == (
        direct.returncode,
        direct.stderr.split("msg=")[-1],
    )
    assert "nvc-py" not in wrapped.stderr


@pytest.mark.parametrize("case", ["gpu-without-driver", "bad-configuration"])
def test_a_refused_call_appends_its_line_to_the_hook_log(tmp_path: Path, case: str) -> None:
    """A start the runtime refuses is in the log as every refused hook call is (issue #49's finding 5)."""
    hook_log = tmp_path / "hook.log"
    config = tmp_path / "config.yaml"
    config.write_text(f"log: {{file: {hook_log}}}\n" if case == "gpu-without-driver" else "runtimes: 5\n")
    bundle = bundle_with(tmp_path, plain_spec(NVIDIA_VISIBLE_DEVICES="0"))
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "NVC_PY_CONFIG": str(config)}
    if case == "bad-configuration":  # its own log.file is unknown: the default (the suite's private /var/log)
        hook_log = Path("/var/log/nvc-py.log")
    result = run(["--root", str(tmp_path / "state"), "create", "--bundle", str(bundle), "refused-1"], env)
    assert result.returncode in (2, 3), result.stderr
    line = json.loads(hook_log.read_text().splitlines()[-1])
    assert (line["stage"], line["command"], line["container"], line["outcome"]) == (
        "runtime",
        "create",
        "refused-1",
        "error",
    )
    assert line["error"] and line["error"] in result.stderr and line["bundle"] == str(bundle)


@pytest.mark.parametrize("socket", ["default", "named"])
@pytest.mark.parametrize("asked", ["0", "7"], ids=["gpu", "no-such-gpu"])
def test_a_gpu_create_is_rewritten_by_the_hook_server_and_run_here(
    active_2gpu, standin, tmp_path: Path, asked: str, socket: str, request: pytest.FixtureRequest
) -> None:
    """With a hook server up (at /run/nvc-py/hook.sock, where the fronts look with nothing set, or at the
    socket NVC_PY_HOOK_SOCKET names), a create that asks for a GPU is handed over: a worker rewrites its
    spec (the hook, the device nodes) and the front then executes the runtime itself with the call's
    arguments, environment and descriptors; no program runs (the runtime cache, which the program writes anew at every
    run, stays). A GPU the host does not have is refused with the program's own line (on stderr and in the
    runtime's --log) and status, and no runtime runs."""
    env, out = standin
    Path(env["NVC_PY_CONFIG"]).write_text(f"root: {active_2gpu.root}\nruntimes: [{tmp_path / 'standin-runtime'}]\n")
    with contextlib.ExitStack() as stack:
        if socket == "default":
            run_dir = request.getfixturevalue("default_run_dir")
            stack.enter_context(hook_server(HOOK, run_dir / "hook.sock"))
            served_env = env
        else:
            served_env = {**env, "NVC_PY_HOOK_SOCKET": str(request.getfixturevalue("served"))}
        run(["state", "c1"], {**env, "NVC_PY_HOOK_SOCKET": "none"})  # the program writes the runtime cache
        bundle = bundle_with(tmp_path, plain_spec(NVIDIA_VISIBLE_DEVICES=asked))
        log = tmp_path / "runtime.log"
        args = ["--log", str(log), "create", "--bundle", str(bundle), "c1"]
        kept, write_end = os.pipe()  # a descriptor the caller passes on (as --preserve-fds would have it)
        stack.callback(os.close, kept)
        stack.callback(os.close, write_end)
        by_program = run(args, {**env, "NVC_PY_HOOK_SOCKET": "none"}, pass_fds=(kept,))
        program_spec = json.loads((bundle / "config.json").read_text())
        program_fds = (out / "fds").read_text() if (out / "fds").exists() else None
        bundle_with(tmp_path, plain_spec(NVIDIA_VISIBLE_DEVICES=asked))
        for name in ("args", "env", "fds"):
            (out / name).unlink(missing_ok=True)
        before = cache_stamp()
        served_call = run(args, served_env, pass_fds=(kept,))
        assert cache_stamp() == before
    assert (served_call.returncode, served_call.stderr) == (by_program.returncode, by_program.stderr)
    spec = json.loads((bundle / "config.json").read_text())
    assert spec == program_spec
    if asked == "7":
        assert (served_call.returncode, served_call.stderr) == (6, "nvc-py-runtime: device error: 7: unknown device\n")
        assert not (out / "args").exists() and "hooks" not in spec
        logged = [line.split(" level=", 1)[1] for line in log.read_text().splitlines()]
        assert logged == ['error msg="nvc-py-runtime: device error: 7: unknown device"'] * 2
        return
    assert served_call.returncode == 7
    assert (out / "args").read_text().splitlines() == args
    assert program_fds is not None and (out / "fds").read_text() == program_fds
    assert str(kept) in program_fds.split()
    assert received_env(out) == served_env
    assert [os.path.basename(h["path"]) for h in spec["hooks"]["prestart"]] in (["nvc-py-hook"], ["nvc-py-hook-client"])
    assert "/dev/nvidia0" in {d["path"] for d in spec["linux"]["devices"]}


@pytest.mark.parametrize(
    ("env", "config", "poststop"),
    [
        ({}, "", False),
        ({"NVC_SHARE_MEMORY_LIMIT": "1g"}, "", True),
        ({}, "sharing: {enabled: true}\n", True),
        ({"NVC_SHARE_MEMORY_LIMIT": "lots"}, "", True),  # the prestart hook refuses it with its own line
    ],
    ids=["not shared", "shared", "shared by the configuration", "limits that do not parse"],
)
def test_the_poststop_hook_only_where_the_container_may_share(
    active_2gpu, standin, tmp_path: Path, env: dict[str, str], config: str, poststop: bool
) -> None:
    """The poststop hook only drops a sharing container's files: a container sharing nothing is spared a
    hook call at its delete."""
    caller_env, _ = standin
    Path(caller_env["NVC_PY_CONFIG"]).write_text(
        f"root: {active_2gpu.root}\nruntimes: [{tmp_path / 'standin-runtime'}]\n{config}"
    )
    bundle = bundle_with(tmp_path, plain_spec(NVIDIA_VISIBLE_DEVICES="0", **env))
    result = run(["create", "--bundle", str(bundle), "c1"], {**caller_env, "NVC_PY_HOOK_SOCKET": "none"})
    assert result.returncode == 7, result.stderr
    hooks = json.loads((bundle / "config.json").read_text())["hooks"]
    assert "prestart" in hooks and ("poststop" in hooks) == poststop

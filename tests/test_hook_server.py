"""``nvc-py-hook serve`` and ``nvc-py-hook-client``: hook calls run by workers of a warm server.

The server is started inside the test's private mount namespace where the fake driver (a test
double) is active, so its workers see the fake GPUs, as runc's hooks do.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest

from harness.bundle import make_bundle
from harness.hookserver import BUILT_CLIENT as CLIENT
from harness.hookserver import LIBDIR, client_hook, hook_server, umount_when_free
from harness.landlock import landlock_abi, landlocked
from nvc import __version__
from nvc.hook import handover
from test_hook_containers import A100, H100, SHOW, _uuids, assert_image_libraries_never_load
from test_hook_containers import setup_dir  # noqa: F401  (fixture)

HOOK = Path(sysconfig.get_path("scripts")) / "nvc-py-hook"
FRONT = HOOK.with_name("nvc-py")  # the native front, once make install replaced the console script (so is HOOK)
PYTHON_PROGRAM = LIBDIR / "nvc-py-python"  # what the front runs without a server


def message(argv: list[str], env: list[str], argc: int | None = None) -> bytes:
    fields = [handover.MAGIC.decode(), str(len(argv) if argc is None else argc), str(len(env)), *argv, *env]
    return "".join(f"{f}\0" for f in fields).encode()


def test_parse_call_reads_argv_and_drops_loader_variables() -> None:
    argv, env = handover.parse_call(message([str(HOOK), "prestart"],
                                          ["PATH=/usr/bin", "LD_PRELOAD=/x.so", "GCONV_PATH=/g", "A=b=c", "junk"]))
    assert argv == [str(HOOK), "prestart"]
    assert env == {"PATH": "/usr/bin", "A": "b=c"}


@pytest.mark.parametrize("raw", [
    b"",
    b"nvc-py-hook/1\x001\x000\x00/h",                  # not NUL-terminated
    b"other/1\x001\x000\x00/h\x00",                    # another protocol
    message(["/h", "prestart"], [], argc=3),           # counts do not match
    message([], []),                                    # no argv
    b"nvc-py-hook/1\x00x\x000\x00/h\x00",              # count not a number
])
def test_parse_call_refuses_malformed_messages(raw: bytes) -> None:
    with pytest.raises(handover.CallError):
        handover.parse_call(raw)


@pytest.fixture
def served(active_2gpu) -> Iterator[Path]:
    """A running ``nvc-py-hook serve`` (in this test's mount namespace); yields its socket, in a
    directory of its own under /tmp (which other users can reach, once it is opened to them)."""
    top = Path(tempfile.mkdtemp(prefix="nvc-hook-server-"))
    sock = top / "run" / "hook.sock"
    try:
        with hook_server(HOOK, sock) as proc:
            yield sock
        assert proc.returncode == 0 and not sock.exists()
    finally:
        shutil.rmtree(top)


def hook_entry(setup_dir: Path, sock: Path, stage: str = "prestart", *env: str) -> dict:
    return client_hook(HOOK, sock, [f"NVC_PY_CONFIG={setup_dir / 'config.yaml'}", *env], stage)


def last_log_line(setup_dir: Path) -> dict:
    return json.loads((setup_dir / "hook.log").read_text().splitlines()[-1])


def test_socket_is_root_only(served: Path) -> None:
    assert served.stat().st_mode & 0o777 == 0o600 and served.parent.stat().st_mode & 0o777 == 0o700


def test_container_gets_its_gpu_through_the_server(served: Path, runc, debian_rootfs: Path, setup_dir: Path,
                                                   tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "bundle", debian_rootfs, SHOW, env={"NVIDIA_VISIBLE_DEVICES": "1"},
                         hooks={"prestart": [hook_entry(setup_dir, served)]})
    result = runc.create_start(bundle, container_id="nvc-served")
    assert result.returncode == 0, result.stderr
    assert _uuids(result.stdout) == [A100]
    last = last_log_line(setup_dir)
    assert (last["container"], last["devices"], last["outcome"], last["via"]) == ("nvc-served", ["1"], "configured",
                                                                                  "server")


@pytest.fixture
def default_run_dir(active_2gpu) -> Iterator[Path]:
    """/run/nvc-py, where the registered client looks for the server by default, as a tmpfs seen only
    in this test's private mount namespace (a server of the host's own stays out of sight)."""
    run_dir = Path(handover.DEFAULT_SOCKET).parent
    created = not run_dir.exists()
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0700", "tmpfs", str(run_dir)], check=True)
    try:
        yield run_dir
    finally:
        umount_when_free(run_dir)
        if created:
            run_dir.rmdir()


def test_podman_with_setup_podman_hooks_reaches_the_server_at_its_default_socket(
        default_run_dir: Path, podman, setup_dir: Path) -> None:
    """The recommended set-up end to end: `nvc-py setup podman`'s hooks.d file (no socket named) and
    a server on the default socket."""
    with hook_server(HOOK, Path(handover.DEFAULT_SOCKET)):
        result = podman.run(podman.image(), SHOW, env={"NVIDIA_VISIBLE_DEVICES": "0"},
                            hooks_dirs=[setup_dir / "hooks.d"])
    assert result.returncode == 0, result.stderr
    assert _uuids(result.stdout) == [H100]
    last = last_log_line(setup_dir)
    assert (last["outcome"], last["devices"], last["via"]) == ("configured", ["0"], "server")


def test_refusal_reaches_the_runtime_through_the_client(served: Path, runc, debian_rootfs: Path, setup_dir: Path,
                                                        tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "bundle", debian_rootfs, SHOW,
                         env={"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_REQUIRE_CUDA": "cuda>=99.0"},
                         hooks={"prestart": [hook_entry(setup_dir, served)]})
    result = runc.create_start(bundle, container_id="nvc-served-refused")
    assert result.returncode != 0
    assert "requirement error: unsatisfied condition: cuda>=99.0" in result.stderr
    last = last_log_line(setup_dir)
    assert (last["outcome"], last["via"]) == ("error", "server")


def test_loader_variables_of_the_hook_env_load_nothing(served: Path, runc, debian_rootfs: Path, setup_dir: Path,
                                                       tmp_path: Path) -> None:
    """The client is static (no loader); the worker drops LD_* before anything it starts sees them."""
    def hook(evil: Path) -> dict:
        return hook_entry(setup_dir, served, "prestart", f"LD_LIBRARY_PATH={evil}", f"LD_PRELOAD={evil}/libffi.so.8")

    assert_image_libraries_never_load(runc, debian_rootfs, tmp_path, hook,
                                      ("libc.so.6", "libffi.so.8", "libseccomp.so.2", "libnvidia-ml.so.1"))


def test_without_a_server_the_client_runs_the_hook_itself(active_2gpu, runc, debian_rootfs: Path, setup_dir: Path,
                                                          tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "bundle", debian_rootfs, SHOW, env={"NVIDIA_VISIBLE_DEVICES": "0"},
                         hooks={"prestart": [hook_entry(setup_dir, tmp_path / "absent.sock")]})
    result = runc.create_start(bundle, container_id="nvc-unserved")
    assert result.returncode == 0, result.stderr
    assert _uuids(result.stdout) == [H100]
    last = last_log_line(setup_dir)
    assert last["container"] == "nvc-unserved" and "via" not in last


def test_concurrent_calls_and_streams(served: Path) -> None:
    """Each worker answers on its own caller's streams, with its own status."""
    env = {handover.SOCKET_ENV: str(served), "PATH": "/usr/bin:/bin"}

    def call(stage: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(CLIENT), str(HOOK), stage], capture_output=True, text=True, env=env,
                              input="", timeout=30)

    stages = ["poststart", "bogus"] * 8
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(call, stages))
    for stage, result in zip(stages, results):
        if stage == "poststart":
            assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
        else:
            assert result.returncode == 2 and result.stderr.startswith("usage: nvc-py-hook prestart")


def test_other_users_are_refused(served: Path) -> None:
    """Even given access to the socket, a caller without the server's uid gets no worker's help
    (a worker would answer 0 for poststart, and so would the hook the client falls back to)."""
    served.parent.parent.chmod(0o755)
    served.parent.chmod(0o755)
    served.chmod(0o666)
    result = subprocess.run([str(CLIENT), str(HOOK), "poststart"], capture_output=True, text=True, user=65534,
                            env={handover.SOCKET_ENV: str(served)}, timeout=30)
    assert result.returncode == 126, result.stderr


def test_client_usage() -> None:
    result = subprocess.run([str(CLIENT), "nvc-py-hook", "prestart"], capture_output=True, text=True)
    assert result.returncode == 2 and result.stderr.startswith("usage: nvc-py-hook-client /ABSOLUTE/PATH")
    assert os.access(CLIENT, os.X_OK)


def test_an_idle_spare_worker_goes_with_the_server(active_2gpu) -> None:
    """The workers forked ahead of the next calls (a pool of SPARES) must not outlive a server killed outright."""
    from nvc.hook.server.loop import SPARES

    top = Path(tempfile.mkdtemp(prefix="nvc-hook-server-"))
    try:
        with hook_server(HOOK, top / "hook.sock") as proc:
            children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
            deadline = time.monotonic() + 10
            while len(children.read_text().split()) < SPARES and time.monotonic() < deadline:
                time.sleep(0.05)
            spares = children.read_text().split()
            assert len(spares) == SPARES >= 2
            proc.kill()
            proc.wait()
            deadline = time.monotonic() + 5
            while any(Path(f"/proc/{pid}").exists() for pid in spares) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not [pid for pid in spares if Path(f"/proc/{pid}").exists()]
    finally:
        shutil.rmtree(top)


def test_an_idle_spare_keeps_a_container_helper_ready(served: Path) -> None:
    """A spare left idle forks the container helper its call's configure takes (and the NVML
    helper), so no helper fork is on a call's path; the spare itself stays the server's child."""
    from nvc.hook.server.loop import SPARES

    server = next(p for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline(p).endswith(f"serve --socket {served}")
                  and _ppid(p) == os.getpid())
    deadline = time.monotonic() + 10
    while True:
        spares = (server / "task" / server.name / "children").read_text().split()
        helpers = {pid: _names(pid) for pid in spares}
        if len(spares) == SPARES and all("nvc:[container]" in names for names in helpers.values()):
            break
        assert time.monotonic() < deadline, helpers
        time.sleep(0.05)


def test_the_server_forks_at_a_higher_priority_than_its_workers_run(served: Path) -> None:
    """In a start storm the server's one job, forking the next spare, must not wait for a CPU behind
    the runtimes and workers: it runs SERVER_NICE_BOOST below the nice value it was started with,
    its spares (the workers to be) at that value."""
    from nvc.hook.server.loop import SERVER_NICE_BOOST

    server = next(p for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline(p).endswith(f"serve --socket {served}")
                  and _ppid(p) == os.getpid())
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    assert _nice(server) == max(-20, ours - SERVER_NICE_BOOST)
    deadline = time.monotonic() + 5
    while True:  # a spare sets its own value first thing after the fork
        spares = {pid: _nice(Path(f"/proc/{pid}")) for pid in (server / "task" / server.name / "children").read_text().split()}
        if spares and all(nice == ours for nice in spares.values()):
            break
        assert time.monotonic() < deadline, spares
        time.sleep(0.02)


def _nice(proc: Path) -> int:
    return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[16])


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def _ppid(proc: Path) -> int:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _names(pid: str) -> list[str]:
    """The names (comm) of the children of process ``pid``."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    names = []
    for child in children:
        try:
            names.append(Path(f"/proc/{child}/comm").read_text().strip())
        except OSError:
            continue
    return names


def test_setup_server_writes_the_systemd_units(tmp_path: Path) -> None:
    config = tmp_path / "other.yaml"  # setup refuses a configuration file the hooks could not read
    config.write_text("load-kmods: false\n")
    out = subprocess.run([str(HOOK.with_name("nvc-py")), "setup", "server", "--unit-dir", str(tmp_path),
                          "--config", str(config)], capture_output=True, text=True, check=True)
    unit = tmp_path / "nvc-py-hook.service"
    assert out.stdout.splitlines()[:2] == [f"wrote {tmp_path / 'nvc-py-hook.socket'}", f"wrote {unit}"]
    lines = unit.read_text().splitlines()
    assert f"ExecStart={LIBDIR / 'nvc-py-hook-python'} serve" in lines and "KillMode=process" in lines
    assert "Requires=nvc-py-hook.socket" in lines
    assert "RestartPreventExitStatus=2" in lines  # a refused socket directory: no restart loop
    # systemd replaces a wedged server: SIGKILL, which a stopped one does not hold back
    assert {"WatchdogSec=10", "WatchdogSignal=SIGKILL", "NotifyAccess=main", "Restart=on-failure"} <= set(lines)
    assert [line for line in lines if line.startswith("Environment=")] == [
        "Environment=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        f"Environment=NVC_PY_CONFIG={config}"]


def test_nvc_py_configure_through_the_server_in_a_prestart_hook(active_2gpu, served: Path, runc, debian_rootfs: Path,
                                                                tmp_path: Path) -> None:
    """A hook script may hand ``nvc-py configure`` to the server too. The server runs its own nvc-py
    whatever path the call names: a fallback would have to exec /nonexistent/nvc-py and fail."""
    from test_configure import GPU0, HOOK, _run

    script = tmp_path / "hook.sh"
    script.write_text(HOOK.format(prefix=f"NVC_PY_HOOK_SOCKET={served} {CLIENT}", nvc="/nonexistent/nvc-py",
                                  root=active_2gpu.root, args="--device=0 --compute --utility", rootfs=debian_rootfs,
                                  log=tmp_path / "hook.log"))
    script.chmod(0o755)
    hook = {"path": str(script), "args": ["hook.sh"], "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"]}
    out = _run(runc, tmp_path, debian_rootfs, hook, "nvidia-smi -L").stdout
    assert out.splitlines() == [f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {GPU0})"]


def test_cli_call_runs_in_the_callers_directory_and_streams(active_2gpu, served: Path, tmp_path: Path) -> None:
    result = subprocess.run([str(CLIENT), "/nonexistent/nvc-py", "--root", str(active_2gpu.root), "--debug",
                             "relative.log", "list"], capture_output=True, text=True, cwd=tmp_path,
                            env={handover.SOCKET_ENV: str(served)}, timeout=30)
    assert result.returncode == 0, result.stderr
    assert f"{active_2gpu.root}/dev/nvidiactl" in result.stdout.splitlines()
    assert (tmp_path / "relative.log").stat().st_size > 0


def test_only_nvc_py_programs_are_run(served: Path) -> None:
    result = subprocess.run([str(CLIENT), "/bin/true"], capture_output=True, text=True,
                            env={handover.SOCKET_ENV: str(served)}, timeout=30)
    assert result.returncode == 2
    assert result.stderr == "nvc-py-hook serve: refused a call: /bin/true: not one of nvc-py-hook, nvc-py\n"


def test_a_caller_in_another_mount_namespace_runs_the_program_itself(active_2gpu, served: Path) -> None:
    """Paths and process ids would mean something else to a worker: the server tells such a caller
    to fall back, and the client executes the path it was given (here: one that does not exist)."""
    env = {handover.SOCKET_ENV: str(served), "PATH": "/usr/bin:/bin"}
    call = [str(CLIENT), "/nonexistent/nvc-py", "--root", str(active_2gpu.root), "list"]
    here = subprocess.run(call, capture_output=True, text=True, env=env, timeout=30)
    assert here.returncode == 0 and f"{active_2gpu.root}/dev/nvidiactl\n" in here.stdout
    elsewhere = subprocess.run(["unshare", "--mount", *call],
                               capture_output=True, text=True, env=env, timeout=30)
    assert elsewhere.returncode == 127
    assert elsewhere.stderr == "nvc-py-hook-client: cannot execute /nonexistent/nvc-py: No such file or directory\n"


def console_script(tmp_path: Path) -> list[str]:
    """nvc-py as pip alone installs it: the Python console script (make install replaces it)."""
    script = tmp_path / "nvc-py"
    script.write_text(f"#!{sys.executable}\nfrom nvc.__main__ import run\nrun()\n")
    script.chmod(0o755)
    return [str(script)]


@pytest.mark.parametrize("command, served_there", [
    (lambda _: [str(FRONT)], True),                 # what make install leaves as nvc-py
    (console_script, True),                          # pip's console script
    (lambda _: [str(PYTHON_PROGRAM)], False),        # the front's fallback: never hands over again
    (lambda _: [sys.executable, "-m", "nvc"], False),  # not a program the server runs
], ids=["native-front", "console-script", "python-program", "python-m"])
def test_nvc_py_hands_its_call_to_the_server(active_2gpu, served: Path, tmp_path: Path, command,
                                            served_there: bool) -> None:
    """nvc-py hands a call over when root's server answers; its output is the direct run's. The
    debug log's pid tells where it ran."""
    root = str(active_2gpu.root)
    log = tmp_path / "debug.log"
    env = {handover.SOCKET_ENV: str(served), "PATH": "/usr/bin:/bin"}
    proc = subprocess.Popen([*command(tmp_path), "--root", root, "--debug", str(log), "info"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and err == ""
    golden = (Path(__file__).parent / "golden" / "two-gpu-mig-info.txt").read_text()
    assert out.replace(root, "<root>") == golden
    pids = {int(line.split()[2]) for line in log.read_text().splitlines() if line[:1] in "DI"}
    assert (pids != {proc.pid}) is served_there


def test_the_native_front_without_a_server_runs_the_python_program(active_2gpu, tmp_path: Path) -> None:
    """No server (or a caller in other namespaces than the server's): the front executes the Python
    program in its own process, with its arguments, environment and streams."""
    assert FRONT.read_bytes()[:4] == b"\x7fELF"
    root = str(active_2gpu.root)
    log = tmp_path / "debug.log"
    proc = subprocess.Popen([str(FRONT), "--root", root, "--debug", str(log), "info", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={handover.SOCKET_ENV: str(tmp_path / "absent.sock"), "PATH": "/usr/bin:/bin"})
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and err == ""
    assert out.replace(root, "<root>") == (Path(__file__).parent / "golden" / "two-gpu-mig-info-json.txt").read_text()
    assert {int(line.split()[2]) for line in log.read_text().splitlines() if line[:1] in "DI"} == {proc.pid}
    bad = subprocess.run([str(FRONT), "--root", "relative", "info"], capture_output=True, text=True,
                         env={handover.SOCKET_ENV: str(tmp_path / "absent.sock")})
    assert (bad.returncode, bad.stdout) == (2, "")
    assert bad.stderr == "nvc-py: input error: relative: invalid driver root (must be an absolute path to a directory)\n"


def test_the_native_front_runs_serve_and_foreign_callers_itself(served: Path) -> None:
    """``serve`` is never handed over (a worker would refuse it), and a caller in another mount
    namespace is told to fall back: both run the Python program here."""
    env = {handover.SOCKET_ENV: str(served), "PATH": "/usr/bin:/bin"}
    serve = subprocess.run([str(FRONT), "hook", "serve", "--socket"], capture_output=True, text=True, env=env,
                           timeout=30)
    assert serve.returncode == 2 and serve.stderr.startswith("usage: nvc-py-hook prestart")
    elsewhere = subprocess.run(["unshare", "--mount", str(FRONT), "--version"], capture_output=True, text=True,
                               env=env, timeout=30)
    assert (elsewhere.returncode, elsewhere.stdout, elsewhere.stderr) == (0, f"nvc-py {__version__}\n", "")


def test_nvc_py_hook_registered_directly_hands_a_container_start_to_the_server(
        served: Path, runc, debian_rootfs: Path, setup_dir: Path, tmp_path: Path) -> None:
    """nvc-py-hook registered directly (a CDI hook, an older hooks.d file) is served too, whatever
    the hook's args[0] (the front knows its name from its file)."""
    assert HOOK.read_bytes()[:4] == b"\x7fELF"
    hook = {"path": str(HOOK), "args": ["oci-hook", "prestart"],
            "env": [f"NVC_PY_CONFIG={setup_dir / 'config.yaml'}", f"{handover.SOCKET_ENV}={served}"]}
    bundle = make_bundle(tmp_path / "bundle", debian_rootfs, SHOW, env={"NVIDIA_VISIBLE_DEVICES": "0"},
                         hooks={"prestart": [hook]})
    result = runc.create_start(bundle, container_id="nvc-python-served")
    assert result.returncode == 0, result.stderr
    assert _uuids(result.stdout) == [H100]
    last = last_log_line(setup_dir)
    assert (last["container"], last["outcome"], last["via"]) == ("nvc-python-served", "configured", "server")


def worker_connection(pid: int, fd: int, conn: socket.socket) -> int:
    """The proof a client sends with ``go``: the worker's end of the connection, through /proc."""
    return os.open(f"/proc/{pid}/fd/{fd}", os.O_PATH)


def call_raw(sock: Path, data: bytes, fds: list[int], go: bytes = handover.GO,
             go_fds: list[int] | None = None, proof: Callable[[int, int, socket.socket], int] = worker_connection
             ) -> list[bytes]:
    """Send ``data`` with ``fds`` to the server, as the clients do but without their checks, and
    answer ``ready PID FD`` with ``go``, ``go_fds`` and the descriptor ``proof(PID, FD, connection)``
    opens (as the clients do by default): the server's answers, ``ready PID FD`` as ``ready``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
        conn.settimeout(30)
        conn.connect(str(sock))
        socket.send_fds(conn, [data], fds)
        answers = []
        for _ in range(2):
            answer, worker, _, _ = socket.recv_fds(conn, 1024, 1)
            word, *numbers = answer.split(b" ")
            answers.append(word if word == handover.READY else answer)
            for fd in worker:
                os.close(fd)
            if word != handover.READY:
                break
            reach = proof(*map(int, numbers), conn)
            try:
                socket.send_fds(conn, [go], [*(go_fds or []), reach])
            finally:
                os.close(reach)
    return answers


def call_directly(sock: Path, argv: list[str], env: list[str] | None = None) -> tuple[list[bytes], str]:
    """Hand ``argv`` to the server with /dev/null as stdin and stdout: (answers, stderr)."""
    err_r, err_w = os.pipe()
    null, cwd = os.open(os.devnull, os.O_RDWR), os.open("/", os.O_PATH)
    try:
        answers = call_raw(sock, message(argv, env or []), [cwd], go_fds=[null, null, err_w])
    finally:
        for fd in (null, err_w, cwd):
            os.close(fd)
    with os.fdopen(err_r) as err:
        return answers, err.read()


def test_a_server_whose_installed_code_changed_stops_serving_it(active_2gpu, tmp_path: Path) -> None:
    """An upgrade replaces files in the installed package: the next call is told to fall back (its
    caller runs the new code itself) and the server stops (an on-demand one's socket goes with it,
    so the next hook call starts a server of the new code; systemd restarts a socket-activated one)."""
    import nvc.hook

    sock = tmp_path / "run" / "hook.sock"
    with hook_server(HOOK, sock) as proc:
        assert call_directly(sock, ["/x/nvc-py-hook", "poststart"]) == ([b"ready", b"exit 0"], "")
        marker = Path(nvc.hook.__file__).with_name(f".upgrade-{os.getpid()}")
        marker.touch()  # what an upgrade does to the package's directory: it changes
        marker.unlink()
        assert call_directly(sock, ["/x/nvc-py-hook", "poststart"]) == ([b"fall back"], "")
        assert proc.wait(timeout=10) == 0
    assert not sock.exists()


@pytest.mark.parametrize("argv", [["/x/nvc-py-hook", "serve"], ["/x/nvc-py", "hook", "serve"],
                                  ["/x/nvc-py", "--root", "/", "hook", "serve", "--socket", "/tmp/other.sock"]])
def test_a_worker_never_becomes_a_server(served: Path, argv: list[str]) -> None:
    """The clients never hand ``serve`` over; the server tells a caller that does to run it itself."""
    answers, err = call_directly(served, argv)
    assert (answers, err) == ([b"fall back"], "")
    assert served.exists()


# Issue 17: the server lends root's full power only to callers that have it, and only root answers.

SBIN = "/usr/sbin:/usr/bin:/sbin:/bin"
MISSING = "/nonexistent/nvc-py"  # a fallback target that says so: exit 127, "cannot execute"
CANNOT_EXECUTE = f"nvc-py-hook-client: cannot execute {MISSING}: No such file or directory\n"
SERVED_HELP = ["info", "--help"]  # a command the server runs (nvc.hook.server.scope) that needs no driver


@pytest.mark.parametrize("drop", ["all", "cap_sys_admin"])
def test_a_root_caller_lacking_capabilities_runs_the_program_itself(served: Path, drop: str) -> None:
    """A uid-0 caller without the server's capabilities is told to fall back (here: to a path that
    does not exist, so the fallback shows); with them it is served."""
    env = {handover.SOCKET_ENV: str(served), "PATH": "/usr/bin:/bin"}
    full = subprocess.run([str(CLIENT), MISSING, *SERVED_HELP], capture_output=True, text=True, env=env, timeout=30)
    assert full.returncode == 0 and full.stdout.startswith("Usage: nvc-py info")
    weak = subprocess.run([shutil.which("capsh", path=SBIN), f"--drop={drop}", "--", "-c",
                           f"exec {CLIENT} {MISSING} {' '.join(SERVED_HELP)}"],
                          capture_output=True, text=True, env=env, timeout=30)
    assert (weak.returncode, weak.stdout, weak.stderr) == (127, "", CANNOT_EXECUTE)


def test_a_root_caller_under_seccomp_runs_the_program_itself(served: Path) -> None:
    """A seccomp filter may forbid what a call does (here: mount); the server, under none, lends
    its power only to callers under none."""
    code = (f"import errno, os, pyseccomp\n"
            f"f = pyseccomp.SyscallFilter(pyseccomp.ALLOW)\n"
            f"f.add_rule(pyseccomp.ERRNO(errno.EPERM), 'mount')\n"
            f"f.load()\n"
            f"os.execv({str(CLIENT)!r}, [{str(CLIENT)!r}, {MISSING!r}, '--version'])\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={handover.SOCKET_ENV: str(served)}, timeout=30)
    assert (result.returncode, result.stdout, result.stderr) == (127, "", CANNOT_EXECUTE)


def test_a_root_caller_with_no_new_privs_runs_the_program_itself(served: Path) -> None:
    """no_new_privs is a sandbox's mark (the caller's programs gain nothing on exec; a worker's
    helpers would): with every capability still, such a caller is told to fall back."""
    from nvc.hook.server import peer

    if peer.own_standing().no_new_privs:
        pytest.skip("the server would run with no_new_privs too: this process has it")
    result = subprocess.run([shutil.which("setpriv", path=SBIN), "--no-new-privs", str(CLIENT), MISSING, *SERVED_HELP],
                            capture_output=True, text=True, env={handover.SOCKET_ENV: str(served)}, timeout=30)
    assert (result.returncode, result.stdout, result.stderr) == (127, "", CANNOT_EXECUTE)


def test_the_peer_check_refuses_no_new_privs_and_another_lsm_label(tmp_path: Path) -> None:
    """The rules that this kernel cannot show with real processes (no LSM with labels here: both
    sides read none, which counts as equal), on the server's own standing changed one field at a
    time; an AppArmor profile in unconfined mode reads as unconfined (files stand for /proc/PID/attr)."""
    from nvc.hook.server import peer

    ours = peer.own_standing()._replace(no_new_privs=False)
    assert peer.shortfall(ours, ours) is None
    assert peer.parse_status("NoNewPrivs:\t1\n")[2] and not peer.parse_status("NoNewPrivs:\t0\n")[2]
    assert peer.parse_status("Name:\tx\n")[2]  # no line: as if set (refused, never served by mistake)
    sandboxed = ours._replace(no_new_privs=True)
    assert peer.shortfall(sandboxed, ours) == "no_new_privs set"
    assert peer.shortfall(sandboxed, sandboxed) is None and peer.shortfall(ours, sandboxed) is None
    selinux = ours._replace(labels=(b"system_u:system_r:container_t:s0:c1,c2\0", *ours.labels[1:]))
    apparmor = ours._replace(labels=(ours.labels[0], b"docker-default (enforce)\n", ours.labels[2]))
    assert peer.shortfall(selinux, ours) == "another LSM label (attr/current)"
    assert peer.shortfall(apparmor, ours) == "another LSM label (attr/apparmor/current)"
    assert peer.shortfall(ours, apparmor) == "another LSM label (attr/apparmor/current)"  # not ordered
    assert peer.shortfall(apparmor, apparmor) is None
    (tmp_path / "attr").mkdir()
    proc = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for written, read in ((b"runc (unconfined)\n", b"unconfined\n"), (b"unconfined\n", b"unconfined\n"),
                              (b"runc (enforce)\n", b"runc (enforce)\n"), (None, None)):
            (tmp_path / "attr" / "current").unlink(missing_ok=True)
            if written is not None:
                (tmp_path / "attr" / "current").write_bytes(written)
            assert peer.read_label(proc, "attr/current") == read
    finally:
        os.close(proc)


needs_landlock = pytest.mark.skipif(landlock_abi() < 1, reason="this kernel has no Landlock")


@needs_landlock
@pytest.mark.parametrize("client", ["native", "python"])
def test_a_landlocked_root_caller_runs_the_program_itself(served: Path, client: str) -> None:
    """Landlock shows in no /proc file: a caller with every capability, in the server's namespaces,
    but under a ruleset that lets it write nowhere, cannot open the worker's connection through
    /proc, so it runs the program itself; unconfined, the same call is served."""
    if client == "native":
        command, ran_here = [str(CLIENT), MISSING, *SERVED_HELP], (127, "", CANNOT_EXECUTE)
    else:
        code = ("from nvc.hook.handover import hand_over; "
                f"hand_over(['/x/nvc-py', {', '.join(map(repr, SERVED_HELP))}]); print('ran here')")
        command, ran_here = [sys.executable, "-c", code], (0, "ran here\n", "")
    env = {handover.SOCKET_ENV: str(served)}
    free = subprocess.run(command, capture_output=True, text=True, env=env, timeout=30)
    assert free.returncode == 0 and free.stdout.startswith("Usage: nvc-py info"), free.stderr
    confined = subprocess.run(landlocked(command), capture_output=True, text=True, env=env, timeout=30)
    assert (confined.returncode, confined.stdout, confined.stderr) == ran_here


@needs_landlock
@pytest.mark.parametrize("where", ["container", "own-namespace"])
def test_a_landlocked_root_configure_is_not_served_and_fails_in_one_line(active_2gpu, runc, debian_rootfs: Path,
                                                                         tmp_path: Path, where: str) -> None:
    """The issue's case: `nvc-py configure` run with every capability and the host's namespaces,
    but under Landlock (no writes anywhere), got its GPU mounted by a worker. No worker runs it now
    (the one that took the call records no answer: its caller ran the program itself): it fails as
    with no server at all, in one line, without a traceback; for a container (a prestart hook's
    --pid) or a rootfs in its own mount namespace (no --pid: there the direct run once died with a
    traceback, unable to open /dev/null for ldconfig)."""
    import shlex

    from test_configure import HOOK as CONFIGURE_HOOK

    sock, stats = tmp_path / "run" / "hook.sock", tmp_path / "stats.jsonl"
    args = "--device=0 --compute --utility"
    errors = {}
    with hook_server(HOOK, sock, stats=stats):
        for name, path in (("served", sock), ("direct", tmp_path / "absent.sock")):
            log = tmp_path / f"{name}.log"
            if where == "own-namespace":
                with log.open("w") as err:
                    result = subprocess.run(landlocked([str(FRONT), "--root", str(active_2gpu.root), "configure",
                                                        *args.split(), str(debian_rootfs)]), stderr=err,
                                            env={handover.SOCKET_ENV: str(path), "PATH": SBIN}, timeout=60)
            else:
                script = tmp_path / f"{name}.sh"
                script.write_text(CONFIGURE_HOOK.format(
                    prefix=f"NVC_PY_HOOK_SOCKET={path}", nvc=shlex.join(landlocked([str(FRONT)])),
                    root=active_2gpu.root, args=args, rootfs=debian_rootfs, log=log))
                script.chmod(0o755)
                hook = {"path": str(script), "args": [script.name], "env": [f"PATH={SBIN}"]}
                bundle = make_bundle(tmp_path / f"bundle-{name}", debian_rootfs, SHOW, hooks={"prestart": [hook]})
                result = runc.create_start(bundle, container_id=f"nvc-landlocked-{name}")
            assert result.returncode != 0
            errors[name] = re.sub(r"/proc/[0-9]+/", "/proc/PID/", log.read_text())
        deadline = time.monotonic() + 10  # the worker records its call once the caller is gone
        while not stats.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [json.loads(line)["answer"] for line in stats.read_text().splitlines()] == [None]
    assert errors["served"] == errors["direct"]
    assert errors["served"].startswith("nvc-py: ") and errors["served"].count("\n") == 1, errors["served"]
    assert str(debian_rootfs) not in Path("/proc/self/mountinfo").read_text()


def test_the_peer_check_without_a_pidfd_reads_a_live_process_and_refuses_a_gone_one() -> None:
    """Kernels without SO_PEERPIDFD: /proc/PID read through one descriptor, the process checked
    alive after; a status without capability lines reads as nothing held."""
    from nvc.hook.server import peer

    ours = peer.own_standing()
    assert peer.caller_shortfall(os.getpid(), None, ours) is None
    child = subprocess.Popen(["true"])
    child.wait()
    assert peer.caller_shortfall(child.pid, None, ours) is not None
    weak = peer.Standing(*peer.parse_status("Name:\tx\n"), ours.labels, ours.root, ours.namespaces)
    assert peer.shortfall(weak, ours) == f"CapPrm lacks {ours.capabilities[0]:#x}"


def capless_hook(setup_dir: Path, sock: Path) -> dict:
    """The registered client run by a uid-0 process that dropped every capability."""
    return {"path": shutil.which("capsh", path=SBIN),
            "args": ["capsh", "--drop=all", "--", "-c", f"exec {CLIENT} {HOOK} prestart"],
            "env": [f"NVC_PY_CONFIG={setup_dir / 'config.yaml'}", f"{handover.SOCKET_ENV}={sock}",
                    "PATH=/usr/sbin:/usr/bin:/sbin:/bin"]}


def test_a_capless_root_hook_fails_as_it_would_without_the_server(served: Path, runc, debian_rootfs: Path,
                                                                   setup_dir: Path, tmp_path: Path) -> None:
    """The issue's case: a capability-less root hook got a container configured through the server.
    Now it runs the hook itself and fails with EPERM, exactly as with no server at all."""
    results = {}
    for name, sock in (("served", served), ("direct", tmp_path / "absent.sock")):
        bundle = make_bundle(tmp_path / name, debian_rootfs, SHOW, env={"NVIDIA_VISIBLE_DEVICES": "0"},
                             hooks={"prestart": [capless_hook(setup_dir, sock)]})
        results[name] = runc.create_start(bundle, container_id=f"nvc-capless-{name}")
        last = last_log_line(setup_dir)
        assert (last["container"], last["outcome"]) == (f"nvc-capless-{name}", "error") and "via" not in last
        results[name + " error"] = re.sub(r"/proc/[0-9]+/", "/proc/PID/", last["error"])
    assert results["served"].returncode != 0 and results["direct"].returncode != 0
    assert results["served error"] == results["direct error"]
    assert "Permission denied" in results["served error"] or "not permitted" in results["served error"]


def test_a_chrooted_root_caller_cannot_read_outside_its_chroot(served: Path, tmp_path: Path) -> None:
    """Through the server, a chrooted caller's call would run with the server's root directory (and
    read files outside its chroot). It is told to fall back, and its fallback cannot run: the same
    command is served for the caller outside."""
    argv = [MISSING, *SERVED_HELP]
    outside = subprocess.run([str(CLIENT), *argv], capture_output=True, text=True,
                             env={handover.SOCKET_ENV: str(served)}, timeout=30)
    assert outside.returncode == 0 and outside.stdout.startswith("Usage: nvc-py info")  # served
    jail = tmp_path / "jail"
    (jail / "bin").mkdir(parents=True)
    (jail / "run").mkdir()
    shutil.copy(CLIENT, jail / "bin" / CLIENT.name)
    subprocess.run(["mount", "--bind", str(served.parent), str(jail / "run")], check=True)
    try:
        inside = subprocess.run([shutil.which("chroot", path=SBIN), str(jail), f"/bin/{CLIENT.name}", *argv], capture_output=True, text=True,
                                env={handover.SOCKET_ENV: f"/run/{served.name}"}, timeout=30)
    finally:
        subprocess.run(["umount", str(jail / "run")], check=True)
    assert (inside.returncode, inside.stdout, inside.stderr) == (127, "", CANNOT_EXECUTE)


@pytest.mark.parametrize("kind", ["another-users", "mode-0755", "symlink-to-another-users"])
def test_the_server_refuses_a_socket_directory_it_does_not_own_alone(tmp_path: Path, kind: str) -> None:
    """Whoever can write the socket's directory could answer root's calls: the server refuses to
    start there, with one line and status 2, and changes nothing of it."""
    other = tmp_path / "other"
    other.mkdir()
    other.chmod(0o755 if kind == "mode-0755" else 0o700)
    if kind != "mode-0755":
        os.chown(other, 1000, 1000)
    directory = other
    if kind.startswith("symlink"):
        directory = tmp_path / "run"
        directory.symlink_to(other)
    before = other.stat()
    result = subprocess.run([str(HOOK), "serve", "--socket", str(directory / "hook.sock")], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and result.stderr.endswith("; refusing to serve there\n")
    assert f"nvc-py-hook: input error: {directory}: socket directory " in result.stderr
    after = other.stat()
    assert list(other.iterdir()) == [] and (after.st_mode, after.st_uid) == (before.st_mode, before.st_uid)


FAKE_SERVER = r"""
import json, os, select, socket, sys
path, uid = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.bind(path)  # as root: the socket file is root's
os.setresgid(uid, uid, uid)
os.setresuid(uid, uid, uid)
s.listen(8)  # the credentials a client reads (SO_PEERCRED) are the listener's now: uid's
print("listening", flush=True)
got = []
while select.select([s, sys.stdin], [], [])[0] != [sys.stdin]:
    conn, _ = s.accept()
    conn.settimeout(5)
    try:
        got.append(len(conn.recv(1 << 17)))
    except OSError:
        got.append(-1)
    conn.close()
print(json.dumps(got), flush=True)
"""


@pytest.fixture(params=["listener-of-uid-1000", "socket-of-uid-1000", "directory-of-uid-1000",
                        "directory-others-write", "directory-a-symlink"])
def fake_server(request, tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    """A "server" a root client might use, though another user could stand behind it: listening as
    uid 1000, or (each file case) as root but on a socket or in a directory that is not root's
    alone, so that only the client's checks of the files keep it from sending. (socket, process);
    it prints how many bytes each connection brought when its stdin closes."""
    directory = tmp_path / "run"
    if request.param == "directory-a-symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        directory.symlink_to(tmp_path / "elsewhere")
    else:
        directory.mkdir(mode=0o700)
    sock = directory / "hook.sock"
    uid = 1000 if request.param == "listener-of-uid-1000" else 0
    proc = subprocess.Popen([sys.executable, "-c", FAKE_SERVER, str(sock), str(uid)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "listening\n"
        if request.param == "socket-of-uid-1000":
            os.chown(sock, 1000, 1000)
        elif request.param == "directory-of-uid-1000":
            os.chown(directory, 1000, 1000)
        elif request.param == "directory-others-write":
            directory.chmod(0o1777)
        yield sock, proc
    finally:
        proc.kill()
        proc.wait()


def fake_server_got(proc: subprocess.Popen[str]) -> list[int]:
    out, _ = proc.communicate("", timeout=30)
    return json.loads(out)


def test_the_client_sends_nothing_to_a_server_that_is_not_roots(fake_server) -> None:
    sock, proc = fake_server
    result = subprocess.run([str(CLIENT), MISSING, "--version"], capture_output=True, text=True,
                            env={handover.SOCKET_ENV: str(sock)}, timeout=30)
    assert result.returncode == 127
    first, second = result.stderr.splitlines(keepends=True)
    assert first.startswith(f"nvc-py-hook-client: not handing over to the hook server ({sock}: ")
    assert first.endswith(f"; running {MISSING}\n") and second == CANNOT_EXECUTE
    assert set(fake_server_got(proc)) <= {0}  # a connection (to read its credentials), never a byte


def test_the_python_client_sends_nothing_to_a_server_that_is_not_roots(fake_server) -> None:
    sock, proc = fake_server
    code = "from nvc.hook.handover import hand_over; hand_over(['/x/nvc-py', '--version']); print('ran here')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={handover.SOCKET_ENV: str(sock)}, timeout=30)
    assert (result.returncode, result.stdout) == (0, "ran here\n")
    assert result.stderr.startswith("nvc-py: not handing over to the hook server (") and \
        result.stderr.endswith("); running here\n") and result.stderr.count("\n") == 1
    assert set(fake_server_got(proc)) <= {0}


def test_a_caller_that_cannot_reach_roots_socket_runs_the_program_silently(served: Path) -> None:
    """A user other than root (nvc-py's front, run by anyone) cannot even look into root's socket
    directory: that is no server of another user's, so no line, just the program."""
    result = subprocess.run([str(CLIENT), MISSING, "--version"], capture_output=True, text=True, user=65534,
                            env={handover.SOCKET_ENV: str(served)}, timeout=30)
    assert (result.returncode, result.stderr) == (127, CANNOT_EXECUTE)


def test_an_older_servers_refusal_of_the_exchange_makes_the_client_run_the_program(tmp_path: Path) -> None:
    """A server of the previous exchange (one message, ``exit N`` at once; still running after an
    upgrade until it restarts) refuses the new message without running anything: the client runs
    the program itself rather than failing every container's start."""
    import socket
    import threading

    directory = tmp_path / "run"
    directory.mkdir(mode=0o700)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(str(directory / "hook.sock"))
    listener.listen(1)

    def old_server() -> None:
        conn, _ = listener.accept()
        with conn:
            _, fds, _, _ = socket.recv_fds(conn, handover.MAX_MESSAGE, 4)
            for fd in fds:
                os.close(fd)
            conn.send(b"exit 2")  # what it answered a message with too few descriptors

    thread = threading.Thread(target=old_server)
    thread.start()
    try:
        result = subprocess.run([str(CLIENT), MISSING, "--version"], capture_output=True, text=True,
                                env={handover.SOCKET_ENV: str(directory / "hook.sock")}, timeout=30)
    finally:
        thread.join(timeout=30)
        listener.close()
    assert (result.returncode, result.stderr) == (127, CANNOT_EXECUTE)


def raw_fields(argv: list[bytes], env: list[bytes]) -> bytes:
    return b"".join(f + b"\0" for f in [handover.MAGIC, str(len(argv)).encode(), str(len(env)).encode(), *argv, *env])


REFUSED = b"refused 2\nnvc-py-hook serve: refused a call: "
POSTSTART = raw_fields([b"/x/nvc-py-hook", b"poststart"], [])
BOGUS = raw_fields([b"/x/nvc-py", b"info", b"--bogus"], [])  # served (nvc.hook.server.scope); its line cannot be written:
# its status still says what it was (2, a usage error: nvc.stdio drops what stderr refuses)


@pytest.mark.parametrize("data, fds, go, go_fds, answers", [
    (POSTSTART, "file", b"go", "streams", [REFUSED + b"the working directory's descriptor is not a directory\n"]),
    (POSTSTART, "none", b"go", "streams", [REFUSED + b"truncated message or not 1 descriptor\n"]),
    (POSTSTART, "two", b"go", "streams", [REFUSED + b"truncated message or not 1 descriptor\n"]),
    (raw_fields([b"/x/nvc-py-hook", b"poststart"], [b"X=" + b"x" * handover.MAX_MESSAGE]), "cwd", b"go", "streams",
     [REFUSED + b"truncated message or not 1 descriptor\n"]),
    (POSTSTART[:-1], "cwd", b"go", "streams", [REFUSED + b"message not NUL-terminated\n"]),
    (raw_fields([b"/x/nvc-py-hook", b"poststart"], [b"A=b"])[:-4], "cwd", b"go", "streams",
     [REFUSED + b"counts do not match the strings\n"]),
    (raw_fields([b"/bin/true"], []), "cwd", b"go", "streams", [REFUSED + b"/bin/true: not one of nvc-py-hook, nvc-py\n"]),
    (POSTSTART, "cwd", b"go", "two", [b"ready", REFUSED + b"truncated message or not 4 descriptors\n"]),
    (POSTSTART, "cwd", b"went", "streams", [b"ready", REFUSED + b"no go\n"]),
    (BOGUS, "cwd", b"go", "read-only-stderr", [b"ready", b"exit 2"]),
    (BOGUS, "cwd", b"go", "closed-stderr", [b"ready", b"exit 2"]),
    (POSTSTART, "cwd", b"go", "streams", [b"ready", b"exit 0"]),
], ids=["file-as-cwd", "no-descriptor", "two-descriptors", "truncated", "unterminated", "bad-counts", "not-nvc-py",
        "two-streams", "no-go", "read-only-stderr", "closed-stderr", "well-formed"])
def test_a_malformed_call_gets_one_line_and_a_status(served: Path, tmp_path: Path, data: bytes, fds: str, go: bytes,
                                                    go_fds: str, answers: list[bytes]) -> None:
    """Raw messages to a real server: each answered with a status (and one line the client writes
    on its stderr), never a worker ending in silence."""
    null = os.open(os.devnull, os.O_RDWR)
    read_only = os.open(os.devnull, os.O_RDONLY)
    regular = os.open(tmp_path / "file", os.O_RDWR | os.O_CREAT)
    cwd = os.open("/", os.O_PATH)
    closed_r, closed_w = os.pipe()
    os.close(closed_r)  # writing there: EPIPE
    first = {"file": [regular], "none": [], "two": [cwd, cwd], "cwd": [cwd]}[fds]
    streams = {"streams": [null, null, null], "two": [null, null], "read-only-stderr": [null, null, read_only],
               "closed-stderr": [null, null, closed_w]}[go_fds]
    try:
        assert call_raw(served, data, first, go, streams) == answers
    finally:
        for fd in (null, read_only, regular, cwd, closed_w):
            os.close(fd)


@pytest.mark.parametrize("proof", ["callers-end", "workers-environ", "workers-stdin", "regular-file"])
def test_go_without_the_workers_own_connection_is_told_to_fall_back(served: Path, tmp_path: Path,
                                                                   proof: str) -> None:
    """Only the worker's end of the connection, opened through /proc/WORKER/fd/N, proves that no
    Landlock domain confines the caller more than the worker: anything else a Landlocked caller
    could open (its own end, what /proc lets it read of the worker, a file) gets ``fall back``,
    and the worker runs nothing (a poststart call would answer ``exit 0``)."""
    def forged(pid: int, fd: int, conn: socket.socket) -> int:
        path = {"callers-end": f"/proc/self/fd/{conn.fileno()}", "workers-environ": f"/proc/{pid}/environ",
                "workers-stdin": f"/proc/{pid}/fd/0", "regular-file": str(tmp_path / "file")}[proof]
        return os.open(path, os.O_RDWR | os.O_CREAT if proof == "regular-file" else os.O_PATH)

    null, cwd = os.open(os.devnull, os.O_RDWR), os.open("/", os.O_PATH)
    try:
        assert call_raw(served, POSTSTART, [cwd], go_fds=[null] * 3, proof=forged) == [b"ready", b"fall back"]
        assert call_raw(served, POSTSTART, [cwd], go_fds=[null] * 3) == [b"ready", b"exit 0"]
    finally:
        os.close(null)
        os.close(cwd)


def test_a_call_with_odd_environment_entries_is_served_as_the_program_would_run(served: Path,
                                                                                tmp_path: Path) -> None:
    """Entries the program's own interpreter ignores (no `=`, an empty name) are ignored, not
    refused; a value that is not UTF-8 is kept; of a name given twice the first counts (the hook's
    log line goes to the first configuration's log)."""
    log = tmp_path / "first.log"
    config = tmp_path / "first.yaml"
    config.write_text(f"log: {{file: {log}}}\n")
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps({"ociVersion": "1.0.2", "process": {"args": ["true"], "env": []},
                                                    "root": {"path": "rootfs"}}))
    state = json.dumps({"ociVersion": "1.0.2", "id": "odd-env", "status": "creating", "pid": os.getpid(),
                        "bundle": str(bundle)}).encode()
    env = [b"=x", b"junk", b"", b"==y", b"BYTES=\xff\xfe", f"NVC_PY_CONFIG={config}".encode(),
           b"NVC_PY_CONFIG=/nonexistent/second.yaml"]
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


def stop(pids: list[int]) -> None:
    """SIGSTOP to each of ``pids``, and back once each is stopped (signals are asynchronous: a spare
    still running in accept() could take a call made right after the kill)."""
    import signal

    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    for pid in pids:
        while Path(f"/proc/{pid}/stat").read_text().rpartition(") ")[2][:1] != "T" and time.monotonic() < deadline:
            time.sleep(0.005)


def spare_pids(server: subprocess.Popen[str]) -> list[int]:
    """The spare workers of a server with no call running, once it forked them all (and a worker
    that served a call before is gone)."""
    from nvc.hook.server.loop import SPARES

    children = Path(f"/proc/{server.pid}/task/{server.pid}/children")
    deadline = time.monotonic() + 10
    while len(children.read_text().split()) != SPARES and time.monotonic() < deadline:
        time.sleep(0.05)
    return [int(pid) for pid in children.read_text().split()]


def hook_command(client: str, tmp_path: Path) -> tuple[list[str], str]:
    """nvc-py-hook run through the native client or as pip's console script (the Python client):
    (command, the name its lines begin with)."""
    if client == "native":
        return [str(CLIENT), str(HOOK)], CLIENT.name
    script = tmp_path / "nvc-py-hook"
    script.write_text(f"#!{sys.executable}\nfrom nvc.hook.program import run\nrun()\n")
    script.chmod(0o755)
    return [str(script)], "nvc-py-hook"


@contextmanager
def stopped_server(setup_dir: Path, *, listener: bool = True) -> Iterator[tuple[subprocess.Popen[str], dict[str, str],
                                                                               Callable[[], None]]]:
    """A server whose spare workers are stopped (SIGSTOP), and with ``listener`` the server itself:
    (the server, the environment of a call that reaches it, what continues them). Continued at the end."""
    import signal

    top = Path(tempfile.mkdtemp(prefix="nvc-hook-server-"))
    env = {handover.SOCKET_ENV: str(top / "run" / "hook.sock"), "NVC_PY_CONFIG": str(setup_dir / "config.yaml"),
           "PATH": "/usr/bin:/bin"}

    def resume() -> None:
        for pid in stopped:
            with suppress(ProcessLookupError):  # a continued spare that served a call is gone
                os.kill(pid, signal.SIGCONT)

    try:
        with hook_server(HOOK, top / "run" / "hook.sock") as server:
            stopped = [*([server.pid] if listener else []), *spare_pids(server)]
            stop(stopped)
            try:
                yield server, env, resume
            finally:
                resume()
    finally:
        shutil.rmtree(top)


def hook_log_lines(setup_dir: Path) -> list[str]:
    log = setup_dir / "hook.log"
    return log.read_text().splitlines() if log.exists() else []


@pytest.mark.parametrize("client", ["native", "python"])
def test_a_stopped_server_is_seen_at_once_and_runs_nothing(active_2gpu, setup_dir: Path, tmp_path: Path,
                                                           client: str) -> None:
    """Server and spare worker stopped (SIGSTOP): the client sees the listener stopped as it connects,
    runs the hook itself at once, and the worker, once continued, runs nothing of that call."""
    with stopped_server(setup_dir) as (server, env, resume):
        lines = len(hook_log_lines(setup_dir))
        started = time.monotonic()
        command, name = hook_command(client, tmp_path)
        result = subprocess.run([*command, "prestart"], capture_output=True, text=True, env=env, input="",
                                timeout=60)
        took = time.monotonic() - started
        print(f"stopped server: the call ran the hook itself after {took:.2f} s")
        running = HOOK if client == "native" else "here"
        assert result.stderr.startswith(f"{name}: the hook server (pid {server.pid}) is stopped; running {running}\n")
        assert result.stderr.count("is stopped") == 1  # the program run after it did not try again
        assert result.returncode == 2  # the hook's own answer to an empty state
        resume()
        again = subprocess.run([str(CLIENT), str(HOOK), "poststart"], capture_output=True, text=True, env=env,
                               timeout=30)
        assert (again.returncode, again.stderr) == (0, "")
        time.sleep(0.5)  # the continued worker had its chance to run the abandoned call
    new = hook_log_lines(setup_dir)[lines:]
    assert len(new) == 1 and "via" not in json.loads(new[0])


def concurrent_calls(command: list[str], env: dict[str, str], count: int) -> list[tuple[int, str, float]]:
    """``count`` calls of ``command prestart`` (an empty OCI state: the hook's status 2) at once:
    (status, stderr, seconds) of each."""
    def call(_: int) -> tuple[int, str, float]:
        started = time.monotonic()
        result = subprocess.run([*command, "prestart"], capture_output=True, text=True, env=env, input="", timeout=120)
        return result.returncode, result.stderr, time.monotonic() - started

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(call, range(count)))


@pytest.mark.parametrize("client", ["native", "python"])
def test_a_stopped_server_costs_16_concurrent_calls_the_timeout_once_at_most(active_2gpu, setup_dir: Path,
                                                                             tmp_path: Path, client: str) -> None:
    """The issue's case: a wedged server (here stopped) on a busy node. Each call waited out the
    hand-over timeout on its own before running the hook itself; now at most one does."""
    command, name = hook_command(client, tmp_path)
    with stopped_server(setup_dir) as (server, env, _):
        results = concurrent_calls(command, env, 16)
    waited = [err for _, err, _ in results if "did not answer in" in err]
    print(f"16 calls on a stopped server: {len(waited)} waited the timeout; slowest {max(t for *_, t in results):.2f} s")
    assert len(waited) <= 1, waited
    assert [code for code, _, _ in results] == [2] * 16
    assert all(err.startswith(f"{name}: the hook server (pid {server.pid}) is stopped; running ")
               for _, err, _ in results if err not in waited)


@pytest.mark.parametrize("client", ["native", "python"])
def test_a_call_left_unanswered_keeps_the_next_calls_from_waiting(active_2gpu, setup_dir: Path, tmp_path: Path,
                                                                  client: str) -> None:
    """A server wedged otherwise (here its spare workers stopped, its listener running): the first
    call waits the hand-over timeout and leaves a marker beside the socket (root's, 0600); 16
    concurrent calls after it run the hook at once. Once the marker is older than wedge.RETRY one
    call tries the server again, and a server that answers it removes the marker."""
    from nvc.hook import wedge

    command, name = hook_command(client, tmp_path)
    with stopped_server(setup_dir, listener=False) as (_, env, resume):
        marker = Path(env[handover.SOCKET_ENV]).with_name(wedge.MARKER)
        first = subprocess.run([*command, "prestart"], capture_output=True, text=True, env=env, input="", timeout=60)
        assert f"{name}: the hook server did not answer in {handover.ACK_TIMEOUT:g} s; running " in first.stderr
        st = marker.lstat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode), stat.S_ISREG(st.st_mode)) == (0, 0o600, True)
        results = concurrent_calls(command, env, 16)
        print(f"16 calls after a timeout: slowest {max(t for *_, t in results):.2f} s")
        assert [(code, err.split("; running ")[0]) for code, err, _ in results] == [
            (2, f"{name}: the hook server left a call unanswered less than {wedge.RETRY} s ago")] * 16
        resume()
        lines = len(hook_log_lines(setup_dir))
        old = time.time() - wedge.RETRY - 1
        os.utime(marker, (old, old))
        again = subprocess.run([*command, "prestart"], capture_output=True, text=True, env=env, input="", timeout=60)
        assert again.returncode == 2 and "hook server" not in again.stderr
        assert json.loads(hook_log_lines(setup_dir)[lines])["via"] == "server"  # tried again, and served
        assert not marker.exists()


@pytest.mark.parametrize("plant", ["another-users", "group-writable", "symlink", "fifo"])
@pytest.mark.parametrize("client", ["native", "python"])
def test_a_marker_that_is_no_file_of_roots_alone_is_ignored(served: Path, setup_dir: Path, tmp_path: Path,
                                                            client: str, plant: str) -> None:
    """The marker is trusted under the socket directory's rules: anything but a regular file of
    root's that group and others cannot write keeps no call away, and is never written through."""
    from nvc.hook import wedge

    marker = served.with_name(wedge.MARKER)
    target = tmp_path / "target"
    target.write_text("")
    if plant == "symlink":
        marker.symlink_to(target)
    elif plant == "fifo":
        os.mkfifo(marker, 0o600)
    else:
        marker.write_text("")
        marker.chmod(0o620 if plant == "group-writable" else 0o600)
        os.chown(marker, 1000 if plant == "another-users" else 0, 0)
    before = (marker.lstat(), target.stat())
    command, _ = hook_command(client, tmp_path)
    env = {handover.SOCKET_ENV: str(served), "NVC_PY_CONFIG": str(setup_dir / "config.yaml"), "PATH": "/usr/bin:/bin"}
    result = subprocess.run([*command, "prestart"], capture_output=True, text=True, env=env, input="", timeout=60)
    assert result.returncode == 2 and "hook server" not in result.stderr
    assert json.loads(hook_log_lines(setup_dir)[-1])["via"] == "server"
    assert (marker.lstat(), target.stat()) == before


def keep_alives(manager: socket.socket, seconds: float) -> list[bytes]:
    """The sd_notify datagrams ``manager`` (systemd's end of $NOTIFY_SOCKET) got within ``seconds``."""
    got, deadline = [], time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        manager.settimeout(left)
        try:
            got.append(manager.recv(4096))
        except TimeoutError:
            break
    return got


def test_the_server_keeps_systemds_watchdog_fed_only_while_its_workers_take_calls(active_2gpu,
                                                                                  tmp_path: Path) -> None:
    """With WatchdogSec= (here 0.4 s: WATCHDOG_USEC) the server sends WATCHDOG=1 every half of it
    from its accept loop; while a call waits in its queue and no worker takes it (its spares
    stopped), it sends none, so systemd replaces it; once the workers take calls again, it sends
    again. A server not named by WATCHDOG_PID sends nothing."""
    import signal

    manager = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    manager.bind(str(tmp_path / "notify"))
    sock = tmp_path / "run" / "hook.sock"
    env = {"NOTIFY_SOCKET": str(tmp_path / "notify"), "WATCHDOG_USEC": "400000"}
    wrapper = ["env", *(f"{name}={value}" for name, value in env.items())]
    with hook_server(HOOK, sock, wrapper=wrapper) as server:
        assert keep_alives(manager, 1.0).count(b"WATCHDOG=1") >= 3
        spares = spare_pids(server)
        stop(spares)
        queued = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        queued.connect(str(sock))  # a call no worker takes
        keep_alives(manager, 0.3)  # the one due before it was seen
        assert keep_alives(manager, 1.0) == []
        for pid in spares:
            os.kill(pid, signal.SIGCONT)
        assert keep_alives(manager, 1.0).count(b"WATCHDOG=1") >= 3
        queued.close()
    with hook_server(HOOK, sock, wrapper=[*wrapper, "WATCHDOG_PID=1"]):
        assert keep_alives(manager, 0.6) == []
    manager.close()


def test_a_server_clears_a_marker_as_it_starts(active_2gpu, setup_dir: Path) -> None:
    """Calls that found its predecessor wedged try a new server at once."""
    from nvc.hook import wedge

    top = Path(tempfile.mkdtemp(prefix="nvc-hook-server-"))
    try:
        (top / "run").mkdir(mode=0o700)
        (top / "run" / wedge.MARKER).write_text("")
        with hook_server(HOOK, top / "run" / "hook.sock"):
            assert not (top / "run" / wedge.MARKER).exists()
    finally:
        shutil.rmtree(top)


@pytest.mark.parametrize("client", ["native", "python"])
def test_a_wedged_worker_fails_the_call_after_the_timeout(served: Path, setup_dir: Path, tmp_path: Path,
                                                          client: str) -> None:
    """Once the worker has the call (`go` sent), the client never falls back: a worker that gives
    no status in $NVC_PY_HOOK_TIMEOUT seconds (here: waiting on a stdin nobody writes) is killed
    (the caller's streams it held close: capture_output returns) and the call fails with one line."""
    stdin_r, stdin_w = os.pipe()
    env = {handover.SOCKET_ENV: str(served), handover.TIMEOUT_ENV: "1",
           "NVC_PY_CONFIG": str(setup_dir / "config.yaml")}
    try:
        started = time.monotonic()
        command, name = hook_command(client, tmp_path)
        result = subprocess.run([*command, "prestart"], capture_output=True, text=True, env=env, stdin=stdin_r,
                                timeout=60)
        print(f"wedged worker: the call failed after {time.monotonic() - started:.2f} s")
    finally:
        os.close(stdin_r)
        os.close(stdin_w)
    assert (result.returncode, result.stderr) == (1, f"{name}: the hook server's worker gave no status in 1 s "
                                                     "(killed)\n")


@pytest.mark.parametrize("text, micro", [
    ("60", 60_000_000), ("0.5", 500_000), (".5", 500_000), ("5.", 5_000_000), ("007", 7_000_000),
    ("0.0000001", 1), ("0.000001", 1), ("0.0000011", 2), ("0.9999999", 1_000_000), ("999999999", 999_999_999_000_000),
    ("0." + "0" * 29 + "1", 1), ("1000000000", None), ("0", None), ("0.000", None), ("", None), (".", None),
    ("-1", None), ("+1", None), (" 1", None), ("1 ", None), ("1e-7", None), ("0x10", None), ("inf", None),
    ("nan", None), ("1.2.3", None), ("\u0663", None), ("1" * 5000, None), ("0." + "0" * 4997 + "1", None),
])
def test_nvc_py_hook_timeout_grammar(text: str, micro: int | None) -> None:
    """Decimal seconds rounded up to whole microseconds; anything else (None) means the default."""
    assert handover.timeout_us(text) == micro


# $NVC_PY_HOOK_TIMEOUT and the seconds a client then waits for ``ready``: min(ACK_TIMEOUT, it), the
# default (60 s) for what the grammar refuses.
TIMEOUTS = [("0.0000001", 1e-06), ("0.000001", 1e-06), ("0.3", 0.3), (".25", 0.25), ("1.", 1.0), ("0", 2.0),
            ("-1", 2.0), ("1e-7", 2.0), ("junk", 2.0), ("9" * 10, 2.0), ("1" * 5000, 2.0),
            ("0." + "0" * 4997 + "1", 2.0)]


def test_both_clients_read_nvc_py_hook_timeout_alike(tmp_path: Path) -> None:
    """One grammar (handover.timeout_us) in both clients: against a wedged server (a listening
    socket nobody accepts on, one per call: a call that times out marks its server wedged for the
    calls after it) each value bounds the wait for ``ready`` alike, and both say so in the same
    words; none waits for ever, as a value under 1 µs once did in the native client (its socket
    timeout rounded to 0, which means none)."""
    code = "from nvc.hook.handover import hand_over; hand_over(['/x/nvc-py', '--version']); print('ran here')"
    commands = {"native": ([str(CLIENT), MISSING, "--version"], (127, "", f"running {MISSING}\n{CANNOT_EXECUTE}")),
                "python": ([sys.executable, "-c", code], (0, "ran here\n", "running here\n"))}
    cases = [(client, value) for client in commands for value, _ in TIMEOUTS]
    wedged = []
    for number in range(len(cases)):
        (tmp_path / str(number)).mkdir(mode=0o700)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener.bind(str(tmp_path / str(number) / "hook.sock"))
        listener.listen(1)
        wedged.append(listener)

    def call(number: int) -> tuple[str, float, subprocess.CompletedProcess[str]]:
        client, value = cases[number]
        started = time.monotonic()
        result = subprocess.run(commands[client][0], capture_output=True, text=True, timeout=30,
                                env={handover.SOCKET_ENV: str(tmp_path / str(number) / "hook.sock"),
                                     handover.TIMEOUT_ENV: value})
        return client, time.monotonic() - started, result

    try:
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(call, range(len(cases))))
    finally:
        for listener in wedged:
            listener.close()
    for (client, took, result), (value, waited) in zip(results, TIMEOUTS * 2):
        code, out, err_end = commands[client][1]
        said = re.fullmatch(r"[\w-]+: the hook server did not answer in (\S+) s; (.*\n)+", result.stderr)
        assert said and said.group(1) == f"{waited:g}", (client, value[:20], result.stderr)
        assert (result.returncode, result.stdout) == (code, out) and result.stderr.endswith(err_end)
        assert took < waited + 3, (client, value[:20], took)


def test_served_call_time(served: Path) -> None:
    """Not an assertion: what a served call costs end to end with the checks (printed with -s)."""
    env = {handover.SOCKET_ENV: str(served)}
    times = []
    for _ in range(20):
        started = time.monotonic()
        subprocess.run([str(CLIENT), MISSING, *SERVED_HELP], capture_output=True, env=env, timeout=30, check=True)
        times.append(time.monotonic() - started)
    times.sort()
    print(f"served nvc-py info --help: median {times[10] * 1000:.1f} ms, best {times[0] * 1000:.1f} ms")


def test_queue_wait_is_read_from_the_clients_stamp_which_the_program_never_sees() -> None:
    from nvc.hook.server.exchange import queue_wait_ms

    env = {"PATH": "/bin", handover.CONNECTED_ENV: "00000000000001000000"}
    assert queue_wait_ms(env, 3_500_000) == 2.5 and env == {"PATH": "/bin"}
    assert queue_wait_ms(env, 3_500_000) is None  # no stamp (an older client)
    assert queue_wait_ms({handover.CONNECTED_ENV: "junk"}, 1) is None
    assert queue_wait_ms({handover.CONNECTED_ENV: "9" * 20}, 1) is None  # another clock (a time namespace)


def test_the_server_records_each_calls_queue_wait_worker_time_and_cpu(active_2gpu, tmp_path: Path) -> None:
    """With $NVC_PY_SERVE_STATS each served call leaves one JSON line, from both clients (native and
    Python), an inherited stamp replaced by the caller's own. Plausible, not timed: each call's
    queue wait and worker time fit in the wall time its caller saw, and its worker used CPU."""
    sock, stats = tmp_path / "run" / "hook.sock", tmp_path / "stats.jsonl"
    env = {handover.SOCKET_ENV: str(sock), "PATH": "/usr/bin:/bin"}
    calls = [[str(CLIENT), str(HOOK), "poststart"]] * 6 + [[*console_script(tmp_path), "--root",
                                                            str(active_2gpu.root), "info"]]

    def call(argv: list[str]) -> float:
        t0 = time.monotonic()
        result = subprocess.run(argv, capture_output=True, text=True, input="", timeout=60,
                                env={**env, handover.CONNECTED_ENV: "1"})  # a stale stamp, inherited
        assert result.returncode == 0, result.stderr
        return (time.monotonic() - t0) * 1000

    with hook_server(HOOK, sock, stats=stats):
        with ThreadPoolExecutor(len(calls)) as pool:
            walls = list(pool.map(call, calls))
        deadline = time.monotonic() + 30  # a worker writes its line after answering and reaping its helpers
        while (len(stats.read_text().splitlines()) if stats.exists() else 0) < len(calls):
            assert time.monotonic() < deadline, "not every call left its line"
            time.sleep(0.05)
    lines = [json.loads(line) for line in stats.read_text().splitlines()]
    assert len(lines) == len(calls) and len({line["pid"] for line in lines}) == len(calls)
    for line in lines:
        assert line["answer"] == "exit 0"
        assert line["queue_ms"] is not None and line["queue_ms"] >= 0
        assert 0 < line["worker_ms"] and line["queue_ms"] + line["worker_ms"] < max(walls)
        assert line["cpu_ms"] > 0

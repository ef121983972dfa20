"""``nvc-py-hook serve`` and ``nvc-py-hook-client``: hook calls run by workers of a warm server.

The server is started inside the test's private mount namespace where the fake driver (a test
double) is active, so its workers see the fake GPUs, as runc's hooks do.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from harness.bundle import make_bundle
from harness.hookserver import BUILT_CLIENT as CLIENT
from harness.hookserver import LIBDIR, client_hook, hook_server
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
        subprocess.run(["umount", str(run_dir)], check=True)
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
    """The worker forked ahead of the next call must not outlive a server killed outright."""
    top = Path(tempfile.mkdtemp(prefix="nvc-hook-server-"))
    try:
        with hook_server(HOOK, top / "hook.sock") as proc:
            children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
            deadline = time.monotonic() + 10
            while not children.read_text().split() and time.monotonic() < deadline:
                time.sleep(0.05)
            spares = children.read_text().split()
            assert len(spares) == 1
            proc.kill()
            proc.wait()
            deadline = time.monotonic() + 5
            while Path(f"/proc/{spares[0]}").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not Path(f"/proc/{spares[0]}").exists()
    finally:
        shutil.rmtree(top)


def test_setup_server_writes_the_systemd_units(tmp_path: Path) -> None:
    out = subprocess.run([str(HOOK.with_name("nvc-py")), "setup", "server", "--unit-dir", str(tmp_path),
                          "--config", "/etc/nvc-py/other.yaml"], capture_output=True, text=True, check=True)
    unit = tmp_path / "nvc-py-hook.service"
    assert out.stdout.splitlines()[:2] == [f"wrote {tmp_path / 'nvc-py-hook.socket'}", f"wrote {unit}"]
    lines = unit.read_text().splitlines()
    assert f"ExecStart={LIBDIR / 'nvc-py-hook-python'} serve" in lines and "KillMode=process" in lines
    assert "Requires=nvc-py-hook.socket" in lines
    assert [line for line in lines if line.startswith("Environment=")] == [
        "Environment=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "Environment=NVC_PY_CONFIG=/etc/nvc-py/other.yaml"]


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
    assert (elsewhere.returncode, elsewhere.stdout, elsewhere.stderr) == (0, "nvc-py 0.1.0\n", "")


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


def call_directly(sock: Path, argv: list[str]) -> tuple[bytes, str]:
    """Hand ``argv`` to the server as the clients do, without their checks: (answer, stderr)."""
    import socket

    err_r, err_w = os.pipe()
    null, cwd = os.open(os.devnull, os.O_RDWR), os.open("/", os.O_PATH)
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
        conn.connect(str(sock))
        socket.send_fds(conn, [handover.encode_call(argv, {})], [null, null, err_w, cwd])
        for fd in (null, err_w, cwd):
            os.close(fd)
        answer = conn.recv(64)
    with os.fdopen(err_r) as err:
        return answer, err.read()


@pytest.mark.parametrize("argv", [["/x/nvc-py-hook", "serve"], ["/x/nvc-py", "hook", "serve"],
                                  ["/x/nvc-py", "--root", "/", "hook", "serve", "--socket", "/tmp/other.sock"]])
def test_a_worker_never_becomes_a_server(served: Path, argv: list[str]) -> None:
    """The clients never hand ``serve`` over; the server tells a caller that does to run it itself."""
    answer, err = call_directly(served, argv)
    assert (answer, err) == (b"fall back", "")
    assert served.exists()

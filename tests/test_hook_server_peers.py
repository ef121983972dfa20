"""Whom ``nvc-py-hook serve`` serves (issue 17): it lends root's full power only to callers that have
it (its capabilities, no seccomp filter, no no_new_privs, its LSM label, no Landlock domain, its
root directory and namespaces; others run the program themselves, as without a server), only in
a socket directory of root's alone, and only root answers: a client sends nothing to a server, a
socket or a directory that is not root's alone.

The server is started inside the test's private mount namespace where the fake driver (a test
double) is active, so its workers see the fake GPUs, as runc's hooks do.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.bundle import make_bundle
from harness.fakegpus import SHOW
from harness.hookcalls import CANNOT_EXECUTE, MISSING, SERVED_HELP
from harness.hookfixtures import last_log_line, served, setup_dir  # noqa: F401  (fixtures)
from harness.hookserver import BUILT_CLIENT as CLIENT
from harness.hookserver import hook_server
from harness.installed import FRONT, HOOK
from harness.landlock import landlock_abi, landlocked
from nvc.hook.server import handover


def test_other_users_are_refused(served: Path) -> None:
    """Even given access to the socket, a caller without the server's uid gets no worker's help
    (a worker would answer 0 for poststart, and so would the hook the client falls back to)."""
    served.parent.parent.chmod(0o755)
    served.parent.chmod(0o755)
    served.chmod(0o666)
    result = subprocess.run(
        [str(CLIENT), str(HOOK), "poststart"],
        capture_output=True,
        text=True,
        user=65534,
        env={handover.SOCKET_ENV: str(served)},
        timeout=30,
    )
    assert result.returncode == 126, result.stderr


SBIN = "/usr/sbin:/usr/bin:/sbin:/bin"


@pytest.mark.parametrize("drop", ["all", "cap_sys_admin"])
def test_a_root_caller_lacking_capabilities_runs_the_program_itself(served: Path, drop: str) -> None:
    """A uid-0 caller without the server's capabilities is told to fall back (here: to a path that
    does not exist, so the fallback shows); with them it is served."""
    env = {handover.SOCKET_ENV: str(served), "PATH": "/usr/bin:/bin"}
    full = subprocess.run([str(CLIENT), MISSING, *SERVED_HELP], capture_output=True, text=True, env=env, timeout=30)
    assert full.returncode == 0 and full.stdout.startswith("Usage: nvc-py info")
    weak = subprocess.run(
        [
            shutil.which("capsh", path=SBIN),
            f"--drop={drop}",
            "--",
            "-c",
            f"exec {CLIENT} {MISSING} {' '.join(SERVED_HELP)}",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert (weak.returncode, weak.stdout, weak.stderr) == (127, "", CANNOT_EXECUTE)


def test_a_root_caller_under_seccomp_runs_the_program_itself(served: Path) -> None:
    """A seccomp filter may forbid what a call does (here: mount); the server, under none, lends
    its power only to callers under none."""
    code = (
        f"import errno, os, pyseccomp\n"
        f"f = pyseccomp.SyscallFilter(pyseccomp.ALLOW)\n"
        f"f.add_rule(pyseccomp.ERRNO(errno.EPERM), 'mount')\n"
        f"f.load()\n"
        f"os.execv({str(CLIENT)!r}, [{str(CLIENT)!r}, {MISSING!r}, '--version'])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={handover.SOCKET_ENV: str(served)}, timeout=30
    )
    assert (result.returncode, result.stdout, result.stderr) == (127, "", CANNOT_EXECUTE)


def test_a_root_caller_with_no_new_privs_runs_the_program_itself(served: Path) -> None:
    """no_new_privs is a sandbox's mark (the caller's programs gain nothing on exec; a worker's
    helpers would): with every capability still, such a caller is told to fall back."""
    from nvc.hook.server import peer

    if peer.own_standing().no_new_privs:
        pytest.skip("the server would run with no_new_privs too: this process has it")
    result = subprocess.run(
        [shutil.which("setpriv", path=SBIN), "--no-new-privs", str(CLIENT), MISSING, *SERVED_HELP],
        capture_output=True,
        text=True,
        env={handover.SOCKET_ENV: str(served)},
        timeout=30,
    )
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
        for written, read in (
            (b"runc (unconfined)\n", b"unconfined\n"),
            (b"unconfined\n", b"unconfined\n"),
            (b"runc (enforce)\n", b"runc (enforce)\n"),
            (None, None),
        ):
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
        code = (
            "from nvc.hook.server.handover import hand_over; "
            f"hand_over(['/x/nvc-py', {', '.join(map(repr, SERVED_HELP))}]); print('ran here')"
        )
        command, ran_here = [sys.executable, "-c", code], (0, "ran here\n", "")
    env = {handover.SOCKET_ENV: str(served)}
    free = subprocess.run(command, capture_output=True, text=True, env=env, timeout=30)
    assert free.returncode == 0 and free.stdout.startswith("Usage: nvc-py info"), free.stderr
    confined = subprocess.run(landlocked(command), capture_output=True, text=True, env=env, timeout=30)
    assert (confined.returncode, confined.stdout, confined.stderr) == ran_here


@needs_landlock
@pytest.mark.parametrize("where", ["container", "own-namespace"])
def test_a_landlocked_root_configure_is_not_served_and_fails_in_one_line(
    active_2gpu, runc, debian_rootfs: Path, tmp_path: Path, where: str
) -> None:
    """The issue's case: `nvc-py configure` run with every capability and the host's namespaces,
    but under Landlock (no writes anywhere), got its GPU mounted by a worker. No worker runs it now
    (the one that took the call records no answer: its caller ran the program itself): it fails as
    with no server at all, in one line, without a traceback; for a container (a prestart hook's
    --pid) or a rootfs in its own mount namespace (no --pid: there the direct run once died with a
    traceback, unable to open /dev/null for ldconfig)."""
    import shlex

    from harness.configurehook import HOOK as CONFIGURE_HOOK

    sock, stats = tmp_path / "run" / "hook.sock", tmp_path / "stats.jsonl"
    args = "--device=0 --compute --utility"
    errors = {}
    with hook_server(HOOK, sock, stats=stats):
        for name, path in (("served", sock), ("direct", tmp_path / "absent.sock")):
            log = tmp_path / f"{name}.log"
            if where == "own-namespace":
                with log.open("w") as err:
                    result = subprocess.run(
                        landlocked(
                            [
                                str(FRONT),
                                "--root",
                                str(active_2gpu.root),
                                "configure",
                                *args.split(),
                                str(debian_rootfs),
                            ]
                        ),
                        stderr=err,
                        env={handover.SOCKET_ENV: str(path), "PATH": SBIN},
                        timeout=60,
                    )
            else:
                script = tmp_path / f"{name}.sh"
                script.write_text(
                    CONFIGURE_HOOK.format(
                        prefix=f"NVC_PY_HOOK_SOCKET={path}",
                        nvc=shlex.join(landlocked([str(FRONT)])),
                        root=active_2gpu.root,
                        args=args,
                        rootfs=debian_rootfs,
                        log=log,
                    )
                )
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
    return {
        "path": shutil.which("capsh", path=SBIN),
        "args": ["capsh", "--drop=all", "--", "-c", f"exec {CLIENT} {HOOK} prestart"],
        "env": [
            f"NVC_PY_CONFIG={setup_dir / 'config.yaml'}",
            f"{handover.SOCKET_ENV}={sock}",
            "PATH=/usr/sbin:/usr/bin:/sbin:/bin",
        ],
    }


def test_a_capless_root_hook_fails_as_it_would_without_the_server(
    served: Path, runc, debian_rootfs: Path, setup_dir: Path, tmp_path: Path
) -> None:
    """The issue's case: a capability-less root hook got a container configured through the server.
    Now it runs the hook itself and fails with EPERM, exactly as with no server at all."""
    results = {}
    for name, sock in (("served", served), ("direct", tmp_path / "absent.sock")):
        bundle = make_bundle(
            tmp_path / name,
            debian_rootfs,
            SHOW,
            env={"NVIDIA_VISIBLE_DEVICES": "0"},
            hooks={"prestart": [capless_hook(setup_dir, sock)]},
        )
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
    outside = subprocess.run(
        [str(CLIENT), *argv], capture_output=True, text=True, env={handover.SOCKET_ENV: str(served)}, timeout=30
    )
    assert outside.returncode == 0 and outside.stdout.startswith("Usage: nvc-py info")  # served
    jail = tmp_path / "jail"
    (jail / "bin").mkdir(parents=True)
    (jail / "run").mkdir()
    shutil.copy(CLIENT, jail / "bin" / CLIENT.name)
    subprocess.run(["mount", "--bind", str(served.parent), str(jail / "run")], check=True)
    try:
        inside = subprocess.run(
            [shutil.which("chroot", path=SBIN), str(jail), f"/bin/{CLIENT.name}", *argv],
            capture_output=True,
            text=True,
            env={handover.SOCKET_ENV: f"/run/{served.name}"},
            timeout=30,
        )
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
    result = subprocess.run(
        [str(HOOK), "serve", "--socket", str(directory / "hook.sock")], capture_output=True, text=True, timeout=60
    )
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


@pytest.fixture(
    params=[
        "listener-of-uid-1000",
        "socket-of-uid-1000",
        "directory-of-uid-1000",
        "directory-others-write",
        "directory-a-symlink",
    ]
)
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
    proc = subprocess.Popen(
        [sys.executable, "-c", FAKE_SERVER, str(sock), str(uid)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
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
    result = subprocess.run(
        [str(CLIENT), MISSING, "--version"],
        capture_output=True,
        text=True,
        env={handover.SOCKET_ENV: str(sock)},
        timeout=30,
    )
    assert result.returncode == 127
    first, second = result.stderr.splitlines(keepends=True)
    assert first.startswith(f"nvc-py-hook-client: not handing over to the hook server ({sock}: ")
    assert first.endswith(f"; running {MISSING}\n") and second == CANNOT_EXECUTE
    assert set(fake_server_got(proc)) <= {0}  # a connection (to read its credentials), never a byte


def test_the_python_client_sends_nothing_to_a_server_that_is_not_roots(fake_server) -> None:
    sock, proc = fake_server
    code = "from nvc.hook.server.handover import hand_over; hand_over(['/x/nvc-py', '--version']); print('ran here')"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={handover.SOCKET_ENV: str(sock)}, timeout=30
    )
    assert (result.returncode, result.stdout) == (0, "ran here\n")
    assert (
        result.stderr.startswith("nvc-py: not handing over to the hook server (")
        and result.stderr.endswith("); running here\n")
        and result.stderr.count("\n") == 1
    )
    assert set(fake_server_got(proc)) <= {0}


def test_a_caller_that_cannot_reach_roots_socket_runs_the_program_silently(served: Path) -> None:
    """A user other than root (nvc-py's front, run by anyone) cannot even look into root's socket
    directory: that is no server of another user's, so no line, just the program."""
    result = subprocess.run(
        [str(CLIENT), MISSING, "--version"],
        capture_output=True,
        text=True,
        user=65534,
        env={handover.SOCKET_ENV: str(served)},
        timeout=30,
    )
    assert (result.returncode, result.stderr) == (127, CANNOT_EXECUTE)

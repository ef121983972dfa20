"""Served by default under systemd: the server started by the socket unit on the socket it hands
over, the units ``nvc-py setup`` writes (podman, containerd), and a pip reinstall that leaves the
registered hook served.

Every server here runs in the test's private mount namespace with its socket in the test's temporary
directory; the on-demand ones are told (NVC_PY_HOST_PID) that this test process stands for the
host, and are killed at the end of their test.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from harness.hookfixtures import default_run_dir  # noqa: F401  (fixtures)
from harness.hookserver import REPO, hook_server
from harness.installed import FRONT, HOOK
from harness.ondemand import (
    log_lines,
    no_gpu_state,  # noqa: F401  (fixture)
)
from nvc.hook.server import handover

# What setup says where systemd does not run, in the suite's private mount namespace (not PID 1's):
# no server that stays can start there (tests/test_hook_server_start.py starts them where it can).
NOT_STARTED = (
    "no hook server started on /run/nvc-py/hook.sock: not in the host's namespaces (PID 1's mount, pid, "
    "user and network namespaces): the hook calls start one on demand"
)


def systemd_socket(path: Path, kind: int = socket.SOCK_SEQPACKET) -> socket.socket:
    """A listening socket as systemd's socket unit makes it."""
    path.parent.mkdir(mode=0o700)
    sock = socket.socket(socket.AF_UNIX, kind)
    sock.bind(str(path))
    sock.listen(16)
    return sock


def activated(fd: int) -> list[str]:
    """A wrapper that hands the server ``fd`` as systemd does: as fd 3, LISTEN_PID its pid."""
    move = "" if fd == 3 else f"exec 3<&{fd} {fd}<&-; "
    return ["bash", "-c", f'{move}LISTEN_PID=$$ LISTEN_FDS=1 exec "$@"', "bash"]


def test_a_socket_activated_server_serves_the_inherited_socket(active_2gpu, tmp_path: Path) -> None:
    path = tmp_path / "run" / "hook.sock"
    listening = systemd_socket(path)
    with (
        listening,
        hook_server(HOOK, tmp_path / "unused.sock", activated(listening.fileno()), (listening.fileno(),)) as proc,
    ):
        result = subprocess.run(
            [str(FRONT), "--root", str(active_2gpu.root), "--debug", str(tmp_path / "debug.log"), "list"],
            capture_output=True,
            text=True,
            env={handover.SOCKET_ENV: str(path)},
            timeout=30,
        )
        assert result.returncode == 0, result.stderr
        pids = {int(line.split()[2]) for line in (tmp_path / "debug.log").read_text().splitlines() if line[:1] in "DI"}
        assert pids and os.getpid() not in pids and proc.pid not in pids  # a worker's
    assert proc.returncode == 0 and path.exists()  # systemd's socket: not unlinked, never bound here
    assert not (tmp_path / "unused.sock").exists()


@pytest.mark.parametrize("kind", [socket.SOCK_STREAM, socket.SOCK_DGRAM])
def test_a_socket_activated_server_refuses_another_kind_of_socket(active_2gpu, tmp_path: Path, kind: int) -> None:
    path = tmp_path / "run" / "hook.sock"
    sock = socket.socket(socket.AF_UNIX, kind)
    path.parent.mkdir(mode=0o700)
    sock.bind(str(path))
    with sock:
        result = subprocess.run(
            [*activated(sock.fileno()), str(HOOK), "serve", "--socket", str(path)],
            capture_output=True,
            text=True,
            pass_fds=(sock.fileno(),),
            timeout=60,
        )
    assert result.returncode == 2
    assert result.stderr.endswith("fd 3 from systemd: not a listening AF_UNIX SOCK_SEQPACKET socket\n")


def setup_podman(tmp_path: Path, *args: str, wrap: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    (tmp_path / "config.yaml").touch()  # setup refuses a configuration file the hooks could not read
    command = [
        *wrap,
        str(FRONT),
        "setup",
        "podman",
        "--hooks-dir",
        str(tmp_path / "hooks.d"),
        "--config",
        str(tmp_path / "config.yaml"),
        *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, check=True, timeout=60)


def test_setup_podman_writes_the_socket_unit(tmp_path: Path) -> None:
    out = setup_podman(tmp_path, "--unit-dir", str(tmp_path / "units")).stdout.splitlines()
    socket_unit, service = tmp_path / "units" / "nvc-py-hook.socket", tmp_path / "units" / "nvc-py-hook.service"
    assert out[2:] == [
        f"wrote {socket_unit}",
        f"wrote {service}",
        "not enabled (systemd is not running): systemctl enable --now nvc-py-hook.socket",
        NOT_STARTED,
    ]
    lines = socket_unit.read_text().splitlines()
    for line in (
        "ListenSequentialPacket=/run/nvc-py/hook.sock",
        "SocketMode=0600",
        "DirectoryMode=0700",
        "SocketUser=root",
        "SocketGroup=root",
        "WantedBy=sockets.target",
    ):
        assert line in lines
    assert "Requires=nvc-py-hook.socket" in service.read_text().splitlines()
    assert not (tmp_path / "no-server").exists()


def test_setup_podman_where_systemd_runs_enables_the_socket(tmp_path: Path) -> None:
    """systemd "runs" in a private mount namespace: /run/systemd/system and the system's unit
    directory are tmpfs there; the systemctl run is a stand-in that records its arguments."""
    record = tmp_path / "systemctl.log"
    systemctl = tmp_path / "systemctl"
    systemctl.write_text(f'#!/bin/sh\necho "$@" >> {record}\n')
    systemctl.chmod(0o755)
    wrap = (
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        "mount -t tmpfs tmpfs /run && mkdir -p /run/systemd/system && "
        'mount -t tmpfs tmpfs /etc/systemd/system && "$@" && cat /etc/systemd/system/nvc-py-hook.socket',
        "sh",
    )
    out = setup_podman(tmp_path, "--systemctl", str(systemctl), wrap=wrap).stdout
    assert (
        "wrote /etc/systemd/system/nvc-py-hook.socket\nwrote /etc/systemd/system/nvc-py-hook.service\n"
        "enabled and started nvc-py-hook.socket\n" in out
    )
    assert "ListenSequentialPacket=/run/nvc-py/hook.sock\n" in out
    assert record.read_text() == "daemon-reload\nenable --now nvc-py-hook.socket\ntry-restart nvc-py-hook.service\n"
    assert not Path("/etc/systemd/system/nvc-py-hook.socket").exists()


def test_setup_podman_no_server(tmp_path: Path) -> None:
    out = setup_podman(tmp_path, "--no-server", "--unit-dir", str(tmp_path / "units")).stdout.splitlines()
    assert out[2:] == [f"wrote {tmp_path / 'no-server'}"] and not (tmp_path / "units").exists()
    out = setup_podman(tmp_path).stdout.splitlines()  # served again: the hooks may start a server
    assert out[2:] == [
        "systemd is not running: no units written",
        NOT_STARTED,
        f"removed {tmp_path / 'no-server'}",
    ]


def test_pip_reinstall_leaves_the_registered_hook_served(
    default_run_dir: Path,
    no_gpu_state,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A pip reinstall writes no console script (the package declares none) and leaves make install's
    links to the fronts as they are; the hooks.d entry names the front in /usr/lib/nvc-py, which pip
    never writes, so the hook is still handed to the server."""
    env, bundle = no_gpu_state
    setup_podman(tmp_path)
    entry = json.loads((tmp_path / "hooks.d" / "oci-nvc-py-hook.json").read_text())["hook"]
    try:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-deps",
                "--no-index",
                "--no-build-isolation",
                "--force-reinstall",
                str(REPO),
            ],
            check=True,
            capture_output=True,
            cwd=tmp_path,
            env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
            timeout=300,
        )
        assert HOOK.read_bytes()[:4] == b"\x7fELF"  # still the link to the front: no console script
        assert Path(entry["path"]).read_bytes()[:4] == b"\x7fELF"
        with hook_server(HOOK, Path(handover.DEFAULT_SOCKET)):
            state = json.dumps(
                {
                    "ociVersion": "1.0.2",
                    "id": "after-pip",
                    "pid": os.getpid(),
                    "bundle": str(bundle),
                    "status": "creating",
                }
            )
            result = subprocess.run(
                [entry["path"], *entry["args"][1:]],
                executable=entry["path"],
                input=state,
                capture_output=True,
                text=True,
                env=dict(e.split("=", 1) for e in entry["env"]),
                timeout=60,
            )
        assert (result.returncode, result.stderr) == (0, "")
        assert log_lines(env)[-1] == {**log_lines(env)[-1], "container": "after-pip", "via": "server"}
    finally:  # as make install leaves them: its fronts, and a code cache of the files pip rewrote
        subprocess.run(
            ["make", "-C", str(REPO), "--no-print-directory", "fronts", "code-cache"], check=True, capture_output=True
        )
    assert HOOK.read_bytes()[:4] == b"\x7fELF"


def test_setup_containerd_sets_up_the_server_for_the_runtimes_configuration(tmp_path: Path) -> None:
    """The runtime's hooks read $NVC_PY_CONFIG (else the default file): the no-server file goes beside it."""
    env = {**os.environ, "NVC_PY_CONFIG": str(tmp_path / "nvc" / "config.yaml")}

    def setup(*args: str) -> list[str]:
        return subprocess.run(
            [
                str(FRONT),
                "setup",
                "containerd",
                "--config",
                str(tmp_path / "config.toml"),
                "--drop-in",
                str(tmp_path / "drop-in.toml"),
                *args,
            ],
            capture_output=True,
            text=True,
            check=True,
            env=env,
            timeout=60,
        ).stdout.splitlines()[2:]

    assert setup("--no-server") == [f"wrote {tmp_path / 'nvc' / 'no-server'}"]
    units = tmp_path / "units"
    assert setup("--unit-dir", str(units)) == [
        f"wrote {units / 'nvc-py-hook.socket'}",
        f"wrote {units / 'nvc-py-hook.service'}",
        "not enabled (systemd is not running): systemctl enable --now nvc-py-hook.socket",
        NOT_STARTED,
        f"removed {tmp_path / 'nvc' / 'no-server'}",
    ]
    assert (
        f"Environment=NVC_PY_CONFIG={tmp_path / 'nvc' / 'config.yaml'}" in (units / "nvc-py-hook.service").read_text()
    )

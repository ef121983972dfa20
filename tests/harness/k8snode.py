"""The test cluster's node (tests/harness/k8scluster.py): private mount, network and PID namespaces that
every program of the cluster runs in, so that nothing it does reaches the host and all of it ends with
the namespaces' first process. Run as a script:

``k8snode.py hold SPEC`` (as PID 1 of the namespaces ``unshare`` made: SPEC is a JSON file) sets the node
up: loopback and a veth pair, one end with the node's address (the kubelet refuses a loopback node IP), a
fresh tmpfs on /run and a tmpfs overlay on /var/lib (where containerd's CNI, the kubelet and the CNI
plugins write at fixed paths), the fake driver at the real /proc and /dev paths, and the kernel settings
the kubelet insists on shown as files in /proc/sys (it would set them host-wide otherwise); then it reaps
orphans until SIGTERM, and its end ends every process in the namespaces.

``k8snode.py exec PID COMMAND...`` runs COMMAND in the namespaces of the node whose first process is PID
(host view) and passes SIGTERM, SIGINT and SIGHUP on to it: ``nsenter`` would leave its child running.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fakedriver.activate import bind, show  # noqa: E402

CLONE_NEWNS, CLONE_NEWNET, CLONE_NEWPID = 0x00020000, 0x40000000, 0x20000000
NAMESPACES = (("mnt", CLONE_NEWNS), ("net", CLONE_NEWNET), ("pid", CLONE_NEWPID))
INTERFACE = "nvc0"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True)


def _mount(fstype: str, target: str | Path, options: str) -> None:
    subprocess.run(["mount", "-t", fstype, "-o", options, fstype, str(target)], check=True)


def _overlay(target: str, scratch: Path) -> None:
    """``target`` as it is, its changes going to a tmpfs under ``scratch``."""
    scratch.mkdir(parents=True, exist_ok=True)
    _mount("tmpfs", scratch, "mode=0755")
    for name in ("upper", "work"):
        (scratch / name).mkdir()
    _mount("overlay", target, f"lowerdir={target},upperdir={scratch}/upper,workdir={scratch}/work")


def hold(spec_file: str) -> None:
    spec = json.loads(Path(spec_file).read_text())
    _ip("link", "set", "lo", "up")
    _ip("link", "add", INTERFACE, "type", "veth", "peer", "name", f"{INTERFACE}-peer")  # not every kernel has dummy
    _ip("addr", "add", spec["address"], "dev", INTERFACE)
    _ip("link", "set", f"{INTERFACE}-peer", "up")
    _ip("link", "set", INTERFACE, "up")
    _ip("route", "add", "default", "dev", INTERFACE)
    scratch = Path(spec["scratch"])
    _mount("tmpfs", "/run", "mode=0755")
    _overlay("/var/lib", scratch / "var-lib")
    (scratch / "dev").mkdir()
    show(SimpleNamespace(root=Path(spec["root"]), proc=Path(spec["proc"]), sys=Path(spec["sys"])), scratch / "dev")
    (scratch / "sysctl").mkdir()
    for name, value in spec["sysctls"].items():
        fake = scratch / "sysctl" / name.replace("/", ".")
        fake.write_text(f"{value}\n")
        bind(fake, f"/proc/sys/{name}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    Path(spec["ready"]).write_text(str(os.getpid()))
    while True:
        try:
            os.wait()
        except ChildProcessError:
            signal.pause()


def execute(pid: str, command: list[str]) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    cwd = os.getcwd()
    # all opened first: once in the node's mount namespace, /proc is the node's, where PID is 1
    opened = [(name, flag, os.open(f"/proc/{pid}/ns/{name}", os.O_RDONLY | os.O_CLOEXEC)) for name, flag in NAMESPACES]
    for name, flag, fd in opened:
        if libc.setns(fd, flag) != 0:
            raise OSError(ctypes.get_errno(), f"setns {name} of {pid}")
        os.close(fd)
    child = os.fork()  # a PID namespace is entered by the children only
    if child == 0:
        os.chdir(cwd)
        os.execvp(command[0], command)
    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(number, lambda received, _: os.kill(child, received))
    _, status = os.waitpid(child, 0)  # retried after each signal passed on (PEP 475)
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


if __name__ == "__main__":
    if sys.argv[1] == "hold":
        hold(sys.argv[2])
    else:
        sys.exit(execute(sys.argv[2], sys.argv[3:]))

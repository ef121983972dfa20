"""A one-node Kubernetes cluster for tests/test_k8s_*cluster.py: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, containerd 2 (CRI, CDI enabled, every pod through nvc-py-runtime and its hook) and the
kubelet, built at pinned releases by tools/k8s-cluster-bin.sh into /var/cache/nvc-py-k8s, with the fake
two-GPU machine (tests/fakedriver/machines/two-gpu-mig.yaml) as the node's GPUs.

Everything runs in the private mount, network and PID namespaces of tests/harness/k8snode.py: the node has
an address of its own, the cluster's ports, routes, iptables chains, mounts and processes are nobody
else's, and they all end with the namespaces. The kubelet's pods go to cgroups under a root of the
session's own, removed at the end; the fixture's teardown fails the run if a process, mount, cgroup or
iptables rule of the cluster is left.

Images: the busybox and glibc rootfs of tests/harness/rootfs.py as :data:`IMAGE`, and the same as the pause
image, imported with ctr (there is no registry): pods say ``imagePullPolicy: Never``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

from harness import k8scerts, k8sconfig
from harness.image import build_oci_archive
from harness.installed import SCRIPTS
from harness.k8sconfig import ADDRESS, NODE, SERVICE_IP
from harness.rootfs import RootfsCache, image_ref

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "tools" / "k8s-cluster-bin.sh"
NODE_SCRIPT = Path(__file__).with_name("k8snode.py")
IMAGE = image_ref("debian")
PAUSE = image_ref("pause")
PAUSE_CMD = ["/bin/sh", "-c", "trap 'exit 0' TERM INT; sleep 2147483647 & wait"]
CGROUP_ROOT = "/sys/fs/cgroup"
# What the kubelet sets host-wide unless it reads these values (protectKernelDefaults: false), and refuses
# to start without (true): the node's /proc/sys shows them as files.
KUBELET_SYSCTLS = {
    "vm/overcommit_memory": 1,
    "vm/panic_on_oom": 0,
    "kernel/panic": 10,
    "kernel/panic_on_oops": 1,
    "kernel/keys/root_maxkeys": 1000000,
    "kernel/keys/root_maxbytes": 25000000,
}
IPTABLES_MARKS = ("10.88.", "10.99.", "cni0", "nvc0", "KUBE-", "CNI-")  # k8sconfig's networks, k8snode's veth
T = TypeVar("T")


def wait_until(what: str, probe: Callable[[], T], timeout: float) -> T:
    """``probe()``'s first true answer, asked until ``timeout`` seconds pass (then the test fails naming ``what``)."""
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} after {timeout} s")
        time.sleep(0.25)


def programs() -> Path | None:
    """The directory of the cluster's programs, if tools/k8s-cluster-bin.sh built them (it is not run
    here: `make test` builds them before the session, which must not change /var/cache)."""
    done = subprocess.run(["sh", str(BUILD), "--check"], capture_output=True, text=True)
    return Path(done.stdout.strip()) if done.returncode == 0 else None


def _cgroup_hierarchies() -> list[Path]:
    """Each cgroup hierarchy's mount point (cgroup v1: one per controller set; v2: the one)."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        fstype = fields[fields.index("-") + 1]
        if fstype in ("cgroup", "cgroup2") and fields[4].startswith(CGROUP_ROOT):
            found.append(Path(fields[4]))
    return found


def _iptables() -> set[str]:
    """The host network namespace's iptables rules and chains that could be the cluster's: its networks',
    its interfaces', Kubernetes' and the CNI plugins' (others, dockerd's, come and go meanwhile)."""
    if not shutil.which("iptables-save"):
        return set()
    out = subprocess.run(["iptables-save"], capture_output=True, text=True).stdout
    return {line for line in out.splitlines() if any(mark in line for mark in IPTABLES_MARKS)}


class Cluster:
    """The running cluster; :meth:`stop` must be called (the fixture does)."""

    def __init__(self, directory: Path, bin_dir: Path, fake: Any, rootfs: RootfsCache, marker: str) -> None:
        self.directory = directory
        self.bin = bin_dir
        self.fake = fake
        self.marker = marker  # in every process's environment: tests/hostcheck.py's own_processes
        self.kubelet_dir = directory / "kubelet"
        # the kubelet's own, whatever its --root-dir (in the node's /var/lib, a tmpfs overlay)
        self.device_plugin_dir = Path("/var/lib/kubelet/device-plugins")
        self.cdi_dir = directory / "cdi"
        self.nvc_config = directory / "nvc-config.yaml"
        self.kubeconfig = directory / "kubeconfig"
        self.cgroup = f"/nvc-py-{directory.name}-{os.getpid()}"  # a second cluster of the session has its own
        self.processes: dict[str, subprocess.Popen] = {}
        self.holder: subprocess.Popen | None = None
        self.node_pid = 0
        self.node_pid_namespace = ""
        self.iptables = _iptables()
        for path in (self.kubelet_dir, self.cdi_dir, directory / "logs", directory / "cni"):
            path.mkdir(parents=True)
        self.configure_nvc("")
        self.certs = k8scerts.make(directory / "pki", (ADDRESS, "127.0.0.1", SERVICE_IP))
        self.kubeconfig.write_text(k8sconfig.kubeconfig(self.certs))
        self._images(rootfs)

    # ------------------------------------------------------------ the node and its programs

    def node_command(self, command: list[str]) -> list[str]:
        """``command`` as run in the node's namespaces."""
        return [sys.executable, str(NODE_SCRIPT), "exec", str(self.node_pid), *command]

    def _start_node(self) -> None:
        scratch = self.directory / "node"
        ready = self.directory / "node-ready"
        spec = self.directory / "node.json"
        spec.write_text(
            json.dumps(
                {
                    "address": f"{ADDRESS}/24",
                    "scratch": str(scratch),
                    "root": str(self.fake.root),
                    "proc": str(self.fake.proc),
                    "sys": str(self.fake.sys),
                    "sysctls": KUBELET_SYSCTLS,
                    "ready": str(ready),
                }
            )
        )
        with (self.directory / "logs" / "node.log").open("wb") as log:
            self.holder = subprocess.Popen(
                ["unshare", "--mount", "--net", "--pid", "--fork", "--mount-proc", "--propagation", "private",
                 "--kill-child", sys.executable, str(NODE_SCRIPT), "hold", str(spec)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self._env(),
            )  # fmt: skip
        wait_until("node namespaces", lambda: ready.exists() or self.holder.poll() is not None, 30)
        assert self.holder.poll() is None, (self.directory / "logs" / "node.log").read_text()
        children = Path(f"/proc/{self.holder.pid}/task/{self.holder.pid}/children").read_text().split()
        self.node_pid = int(children[0])
        self.node_pid_namespace = os.readlink(f"/proc/{self.node_pid}/ns/pid")
        for hierarchy in _cgroup_hierarchies():
            (hierarchy / self.cgroup.lstrip("/")).mkdir()

    def _env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        path = f"{self.bin}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
        return {**os.environ, "PATH": path, "NVC_TEST_SESSION": self.marker, **(extra or {})}

    def start(self, name: str, command: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        """``command`` in the node, logging to logs/<name>.log."""
        with (self.directory / "logs" / f"{name}.log").open("ab") as log:
            process = subprocess.Popen(
                self.node_command(command),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self._env(env),
            )
        self.processes[name] = process
        return process

    def stop_program(self, name: str, timeout: float = 20) -> None:
        process = self.processes.pop(name)
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def log(self, name: str) -> str:
        return (self.directory / "logs" / f"{name}.log").read_text(errors="replace")

    def _running(self, name: str) -> None:
        assert self.processes[name].poll() is None, f"{name} exited:\n{self.log(name)[-4000:]}"

    def boot(self) -> None:
        self._start_node()
        d, bin_dir, certs = self.directory, self.bin, self.certs
        self.start("etcd", k8sconfig.etcd(bin_dir, d))
        self.start("kube-apiserver", k8sconfig.apiserver(bin_dir, d, certs))
        wait_until("API server", self._ready, 90)
        self.start("kube-controller-manager", k8sconfig.controller_manager(bin_dir, d, certs, self.kubeconfig))
        self.start("kube-scheduler", k8sconfig.scheduler(bin_dir, d, self.kubeconfig))
        self._start_containerd()
        self.start_kubelet()
        wait_until("Ready node", self._node_ready, 120)

    def _ready(self) -> bool:
        self._running("kube-apiserver")
        return self.kubectl("get", "--raw", "/readyz", check=False) == "ok"

    def _node_ready(self) -> bool:
        self._running("kubelet")
        node = self.kubectl("get", "node", NODE, "-o", "json", check=False)
        if not node.startswith("{"):
            return False
        conditions = json.loads(node)["status"].get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def _start_containerd(self) -> None:
        d = self.directory
        runtime = d / "nvc-py-runtime.sh"  # containerd hands shims no environment of our choosing
        runtime.write_text(f'#!/bin/sh\nNVC_PY_CONFIG={self.nvc_config} exec {SCRIPTS / "nvc-py-runtime"} "$@"\n')
        runtime.chmod(0o755)
        (d / "cni" / "10-nvc-test.conflist").write_text(k8sconfig.cni_config())
        config = d / "containerd.toml"
        config.write_text(
            k8sconfig.containerd_config(d, self.containerd_socket, self.cdi_dir, runtime, self.bin, PAUSE)
        )
        self.start("containerd", [str(self.bin / "containerd"), "--config", str(config)])

        def serving() -> bool:
            self._running("containerd")
            return self._ctr("version").returncode == 0

        wait_until("containerd", serving, 30)
        for archive in self.image_archives:
            done = self._ctr("images", "import", "--local", "--snapshotter", "native", str(archive))
            assert done.returncode == 0, done.stderr

    @property
    def containerd_socket(self) -> Path:
        return self.directory / "containerd.sock"

    def _ctr(self, *args: str) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin / "ctr"), "--address", str(self.containerd_socket), "--namespace", "k8s.io", *args]
        return subprocess.run(self.node_command(command), capture_output=True, text=True, env=self._env())

    def start_kubelet(self) -> None:
        config = self.directory / "kubelet.yaml"
        config.write_text(k8sconfig.kubelet_config(self.directory, self.certs, self.cgroup, self.containerd_socket))
        self.start("kubelet", k8sconfig.kubelet(self.bin, self.directory, self.kubeconfig, self.kubelet_dir, config))

    def restart_kubelet(self) -> None:
        """The kubelet stopped and started again (its pods keep running in containerd)."""
        self.stop_program("kubelet")
        self.start_kubelet()

    def stop(self) -> list[str]:
        """Everything stopped: the namespaces' first process ends, and every process in them with it.
        What is left of the cluster on the host, one line each (nothing: an empty list)."""
        for name in ("kubelet", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
            if name in self.processes:
                self.stop_program(name)
        if self.holder is not None and self.holder.poll() is None:
            os.kill(self.node_pid, signal.SIGTERM)  # unshare ignores it; its child (--kill-child) ends with it
            try:
                self.holder.wait(30)
            except subprocess.TimeoutExpired:
                self.holder.kill()
                self.holder.wait()
        for name in list(self.processes):
            self.stop_program(name)
        left = []
        if self.node_pid and Path(f"/proc/{self.node_pid}").exists():
            left.append(f"the node's first process {self.node_pid} still runs")
        mounts = Path("/proc/self/mountinfo").read_text()
        left += [f"mount: {line}" for line in mounts.splitlines() if str(self.directory) in line]
        for hierarchy in _cgroup_hierarchies():
            top = hierarchy / self.cgroup.lstrip("/")
            if top.exists():
                stuck = self._remove_cgroups(top)
                left += [f"cgroup {path} still holds processes" for path in stuck]
        if _iptables() != self.iptables:
            left.append(f"iptables: {sorted(_iptables() ^ self.iptables)}")
        return left

    def node_processes(self) -> set[tuple[int, str]]:
        """The node's processes as (pid, start time): those in its PID namespace and in its pods' cgroups."""
        found = set()
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and (
                    os.readlink(entry / "ns" / "pid") == self.node_pid_namespace
                    or f"{self.cgroup}/" in (entry / "cgroup").read_text()
                ):
                    found.add((int(entry.name), (entry / "stat").read_text().rsplit(")", 1)[1].split()[19]))
            except OSError:
                continue  # gone meanwhile
        return found

    @staticmethod
    def _remove_cgroups(top: Path) -> list[Path]:
        """``top`` and the cgroups below it removed, deepest first (a cgroup ends once its last process has
        gone: retried for a while); those that could not be."""
        deadline = time.monotonic() + 10
        for path in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [top]:
            while True:
                try:
                    path.rmdir()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.1)
        return [top] if top.exists() else []

    # ------------------------------------------------------------ configuration and images

    def configure_nvc(self, yaml_text: str) -> None:
        """nvc-py's configuration on the node (the hook's, the plugin's, the driver's): the fake driver's
        root, the hook's log, then ``yaml_text``."""
        self.nvc_config.write_text(
            f"root: {self.fake.root}\nload-kmods: false\nlog: {{file: {self.directory / 'logs' / 'hook.log'}}}\n"
            + yaml_text
        )

    def _images(self, rootfs: RootfsCache) -> None:
        layer = rootfs.tarball("debian")
        self.image_archives = [
            build_oci_archive(layer, IMAGE, self.directory / "image.tar"),
            build_oci_archive(layer, PAUSE, self.directory / "pause.tar", cmd=PAUSE_CMD),
        ]

    # ------------------------------------------------------------ the API

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:  # noqa: A002
        """kubectl's output (the test fails on an error unless ``check`` is false: then its output is "")."""
        command = [str(self.bin / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args]
        done = subprocess.run(
            self.node_command(command), input=input, capture_output=True, text=True, env=self._env(), timeout=180
        )
        if done.returncode != 0:
            assert not check, f"kubectl {' '.join(args)}: {done.stderr}"
            return ""
        return done.stdout

    def get(self, kind: str, name: str | None = None, namespace: str | None = None) -> dict[str, Any]:
        args = ["get", kind, *([name] if name else []), *(["-n", namespace] if namespace else []), "-o", "json"]
        return json.loads(self.kubectl(*args))

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        return self.get("pod", name, namespace)

    def apply(self, *objects: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))

    def logs(self, namespace: str, pod: str) -> str:
        return self.kubectl("logs", "-n", namespace, pod)

    @contextmanager
    def namespace(self, prefix: str) -> Iterator[str]:
        """A namespace of its own for the body (its ServiceAccount made: pods are admitted), deleted with
        what is in it at the end (awaited: a claim it held is free for the next test)."""
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        self.kubectl("create", "namespace", name)
        wait_until(
            f"default ServiceAccount in {name}",
            lambda: self.kubectl("get", "sa", "default", "-n", name, check=False),
            30,
        )
        try:
            yield name
        finally:
            self.kubectl("delete", "namespace", name, "--wait=true", "--timeout=120s")

    def wait_phase(self, namespace: str, name: str, phase: str, timeout: float = 90) -> dict[str, Any]:
        """The pod once in ``phase``; the test fails if it ends in another."""

        def reached() -> dict[str, Any] | None:
            pod = self.pod(namespace, name)
            now = pod.get("status", {}).get("phase")
            ended = now in ("Succeeded", "Failed") and now != phase
            if ended:
                logs = self.kubectl("logs", "-n", namespace, name, check=False)
                raise AssertionError(f"pod {namespace}/{name} is {now}: {json.dumps(pod['status'])}\n{logs}")
            return pod if now == phase else None

        try:
            return wait_until(f"pod {namespace}/{name} {phase}", reached, timeout)
        except AssertionError as timed_out:
            described = self.kubectl("describe", "pod", "-n", namespace, name, check=False)
            raise AssertionError(f"{timed_out}\n{described[-3000:]}") from None


@pytest.fixture(scope="session")
def k8s_cluster(
    tmp_path_factory: pytest.TempPathFactory, fake_2gpu: Any, rootfs_cache: RootfsCache, session_dir: str
) -> Iterator[Cluster]:
    """The cluster, started once for the session; its teardown fails if anything of it is left."""
    bin_dir = programs()
    if bin_dir is None:
        pytest.skip("the test cluster's programs are not built: make k8s-cluster-bin (needs Go and the module proxy)")
    cluster = Cluster(tmp_path_factory.mktemp("k8s"), bin_dir, fake_2gpu, rootfs_cache, session_dir)
    try:
        cluster.boot()
        yield cluster
    finally:
        left = cluster.stop()
    assert not left, "the test cluster left behind:\n" + "\n".join(left)

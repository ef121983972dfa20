"""What the test cluster's programs (tests/harness/k8scluster.py) are started with: their command lines and
configuration files, made from the cluster's directory, its programs' directory and its certificates."""

from __future__ import annotations

import json
from pathlib import Path

from harness.k8scerts import Certificates

NODE = "nvc-node"
ADDRESS = "10.99.0.1"  # the node's, on its veth (the kubelet refuses a loopback node IP)
SERVICE_IP = "10.96.0.1"
ETCD = "http://127.0.0.1:2379"
DISABLED_PLUGINS = (  # what needs a kernel module, a tool or a collector this machine has not
    "io.containerd.snapshotter.v1.btrfs",
    "io.containerd.snapshotter.v1.zfs",
    "io.containerd.snapshotter.v1.devmapper",
    "io.containerd.tracing.processor.v1.otlp",
    "io.containerd.internal.v1.tracing",
)


def etcd(bin_dir: Path, d: Path) -> list[str]:
    return [
        str(bin_dir / "etcd"), "--data-dir", str(d / "etcd"), "--listen-client-urls", ETCD, "--advertise-client-urls",
        ETCD, "--listen-peer-urls", "http://127.0.0.1:2380", "--unsafe-no-fsync", "--log-level", "warn",
    ]  # fmt: skip


def apiserver(bin_dir: Path, d: Path, certs: Certificates) -> list[str]:
    return [
        str(bin_dir / "kube-apiserver"), "--etcd-servers", ETCD, "--advertise-address", ADDRESS,
        "--secure-port", "6443", "--cert-dir", str(d / "apiserver"),
        "--tls-cert-file", str(certs.cert("apiserver")), "--tls-private-key-file", str(certs.key("apiserver")),
        "--client-ca-file", str(certs.ca), "--service-account-issuer", "https://kubernetes.default.svc",
        "--service-account-key-file", str(certs.cert("sa")), "--service-account-signing-key-file", str(certs.key("sa")),
        "--service-cluster-ip-range", f"{SERVICE_IP.rsplit('.', 1)[0]}.0/24", "--authorization-mode", "Node,RBAC",
        "--kubelet-client-certificate", str(certs.cert("admin")), "--kubelet-client-key", str(certs.key("admin")),
        "--kubelet-preferred-address-types", "InternalIP", "--allow-privileged", "--profiling=false",
    ]  # fmt: skip


def controller_manager(bin_dir: Path, d: Path, certs: Certificates, kubeconfig: Path) -> list[str]:
    return [
        str(bin_dir / "kube-controller-manager"), "--kubeconfig", str(kubeconfig), "--leader-elect=false",
        "--profiling=false", "--cert-dir", str(d / "controller-manager"),
        "--service-account-private-key-file", str(certs.key("sa")), "--root-ca-file", str(certs.ca),
        "--use-service-account-credentials=false",
    ]  # fmt: skip


def scheduler(bin_dir: Path, d: Path, kubeconfig: Path) -> list[str]:
    return [
        str(bin_dir / "kube-scheduler"), "--kubeconfig", str(kubeconfig), "--leader-elect=false", "--profiling=false",
        "--cert-dir", str(d / "scheduler"),
    ]  # fmt: skip


def kubelet(bin_dir: Path, d: Path, kubeconfig: Path, root: Path, config: Path) -> list[str]:
    return [
        str(bin_dir / "kubelet"), "--config", str(config), "--kubeconfig", str(kubeconfig), "--root-dir", str(root),
        "--cert-dir", str(d / "kubelet-pki"), "--hostname-override", NODE, "--node-ip", ADDRESS, "--v", "2",
    ]  # fmt: skip


def kubelet_config(d: Path, certs: Certificates, cgroup: str, socket: Path) -> str:
    """The kubelet's: x509 clients of the CA (the API server's logs and exec), pods' cgroups under ``cgroup``
    (cgroupfs), no image garbage collection (there is no registry to pull them again from), no eviction
    for a full disk of others', capacity changes reported within 2 s."""
    return json.dumps(
        {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(certs.ca)},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": cgroup,
            "containerRuntimeEndpoint": f"unix://{socket}",
            "failSwapOn": False,
            "readOnlyPort": 0,
            "podLogsDir": str(d / "pod-logs"),
            "resolvConf": "",
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "nodeStatusUpdateFrequency": "2s",
            "maxPods": 20,
        }
    )


def containerd_config(d: Path, socket: Path, cdi: Path, runtime: Path, bin_dir: Path, pause: str) -> str:
    """containerd 2's (version 3): CRI with CDI specs read from ``cdi``, ``runtime`` (nvc-py-runtime) as the
    default runtime's runc, the native snapshotter (any backing filesystem), ``pause`` as the sandbox
    image, CNI from ``d``/cni; ``oom_score_adj`` no lower than its own (root without CAP_SYS_RESOURCE
    cannot lower it: runc fails the pause container's -998)."""
    cri = "plugins.'io.containerd.cri.v1"
    disabled = ", ".join(f'"{plugin}"' for plugin in DISABLED_PLUGINS)
    return (
        f'version = 3\nroot = "{d / "containerd"}"\nstate = "/run/containerd/state"\ndisabled_plugins = [{disabled}]\n'
        f'[grpc]\n  address = "{socket}"\n[ttrpc]\n  address = "{socket}.ttrpc"\n'
        '[debug]\n  address = ""\n[metrics]\n  address = ""\n'
        f'[{cri}.images\']\n  snapshotter = "native"\n[{cri}.images\'.pinned_images]\n  sandbox = "{pause}"\n'
        f'[{cri}.runtime\']\n  enable_cdi = true\n  cdi_spec_dirs = ["{cdi}"]\n  restrict_oom_score_adj = true\n'
        f'[{cri}.runtime\'.containerd]\n  default_runtime_name = "nvc-py"\n'
        f'[{cri}.runtime\'.containerd.runtimes.nvc-py]\n  runtime_type = "io.containerd.runc.v2"\n'
        f'[{cri}.runtime\'.containerd.runtimes.nvc-py.options]\n  BinaryName = "{runtime}"\n'
        f'[{cri}.runtime\'.cni]\n  bin_dirs = ["{bin_dir}"]\n  conf_dir = "{d / "cni"}"\n'
    )


def cni_config() -> str:
    """One bridge in the node's network namespace, no masquerading (no iptables rule)."""
    bridge = {
        "type": "bridge",
        "bridge": "cni0",
        "isGateway": True,
        "ipMasq": False,
        "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.88.0.0/16"}]]},
    }
    return json.dumps({"cniVersion": "1.0.0", "name": "nvc-test", "plugins": [bridge]})


def kubeconfig(certs: Certificates) -> str:
    """kubectl's, the components' and nvc-py's driver's: the admin client certificate (system:masters)."""
    return (
        "apiVersion: v1\nkind: Config\ncurrent-context: test\n"
        f"clusters: [{{name: test, cluster: {{server: 'https://{ADDRESS}:6443', certificate-authority: '{certs.ca}'}}}}]\n"
        f"users: [{{name: admin, user: {{client-certificate: '{certs.cert('admin')}', "
        f"client-key: '{certs.key('admin')}'}}}}]\n"
        "contexts: [{name: test, context: {cluster: test, user: admin}}]\n"
    )

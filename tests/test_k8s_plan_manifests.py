"""The device plugin's surroundings: --help, the DaemonSet manifest (against the Kubernetes API's
schema), the systemd unit, and a CLI that loads no gRPC until the plugin runs.

No gRPC server or channel here (tests/harness/deviceplugin.py says why those run in a child process).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sysconfig
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = Path(sysconfig.get_path("scripts"))


def _help(*command: str) -> str:
    return subprocess.run(
        [str(SCRIPTS / "nvc-py"), *(command or ("k8s", "device-plugin")), "--help"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def test_help_documents_every_flag() -> None:
    from nvc.k8s.command import device_plugin

    text = " ".join(_help().split())
    for param in device_plugin.params:
        assert param.help and all(opt in text for opt in param.opts), param.name
        assert " ".join(param.help.split())[:40] in text, param.name


DEPLOY = REPO / "deploy"


def _flags(argv: list[str]) -> list[str]:
    return [arg.partition("=")[0] for arg in argv if arg.startswith("--")]


# The part of the Kubernetes API the DaemonSet uses (apps/v1 DaemonSet, core/v1 PodSpec), as its
# reference documents it: a dict lists the fields allowed, a list holds items of one shape, a tuple
# the values allowed, a type the type.
_LABELS = {str: str}
_META = {"name": str, "namespace": str, "labels": _LABELS}
_CONTAINER = {
    "name": str,
    "image": str,
    "command": [str],
    "args": [str],
    "securityContext": {"privileged": bool},
    "ports": [{"name": str, "containerPort": int, "protocol": ("TCP", "UDP", "SCTP")}],
    "resources": {"requests": {"cpu": str, "memory": str}, "limits": {"cpu": str, "memory": str}},
    "volumeMounts": [
        {
            "name": str,
            "mountPath": str,
            "readOnly": bool,
            "mountPropagation": ("None", "HostToContainer", "Bidirectional"),
        }
    ],
}
_POD = {
    "priorityClassName": str,
    "hostNetwork": bool,
    "containers": [_CONTAINER],
    "tolerations": [
        {
            "key": str,
            "operator": ("Exists", "Equal"),
            "value": str,
            "effect": ("NoSchedule", "PreferNoSchedule", "NoExecute"),
        }
    ],
    "volumes": [
        {
            "name": str,
            "hostPath": {"path": str, "type": ("", "Directory", "DirectoryOrCreate", "File", "FileOrCreate", "Socket")},
        }
    ],
}
_DAEMONSET = {
    "apiVersion": ("apps/v1",),
    "kind": ("DaemonSet",),
    "metadata": _META,
    "spec": {
        "selector": {"matchLabels": _LABELS},
        "updateStrategy": {"type": ("RollingUpdate", "OnDelete")},
        "template": {"metadata": _META, "spec": _POD},
    },
}


def _schema_problems(value: object, schema: object, path: str = "") -> list[str]:
    if isinstance(schema, dict) and set(schema) == {str}:
        ok = isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
        return [] if ok else [f"{path}: want a map of strings"]
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            return [f"{path}: want an object"]
        problems: list[str] = []
        for key, item in value.items():
            problems += (
                _schema_problems(item, schema[key], f"{path}.{key}")
                if key in schema
                else [f"{path}.{key}: unknown field"]
            )
        return problems
    if isinstance(schema, list):
        if not isinstance(value, list):
            return [f"{path}: want a list"]
        return [p for i, item in enumerate(value) for p in _schema_problems(item, schema[0], f"{path}[{i}]")]
    if isinstance(schema, tuple):
        return [] if value in schema else [f"{path}: {value!r} not one of {schema}"]
    return [] if isinstance(value, schema) else [f"{path}: want {schema.__name__}"]  # type: ignore[union-attr]


def test_daemonset_manifest_validates() -> None:
    """Against the API's fields and types for what it uses (always), and with kubectl where one is
    installed: kubectl decodes it into its typed object (no API server: `set env --local`), and a field
    it does not know, or of the wrong type, is missing from its output or fails. The plugin's command
    line uses only flags the plugin documents."""
    manifest = DEPLOY / "kubernetes/nvc-py-device-plugin.yaml"
    original = yaml.safe_load(manifest.read_text())
    assert _schema_problems(original, _DAEMONSET) == []
    template = original["spec"]["template"]
    assert original["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    plugin, exporter = template["spec"]["containers"]
    for container in (plugin, exporter):
        assert {m["name"] for m in container["volumeMounts"]} <= {v["name"] for v in template["spec"]["volumes"]}
    kubectl = shutil.which("kubectl")
    if kubectl is not None:
        typed = subprocess.run(
            [kubectl, "set", "env", "--local", "-f", str(manifest), "NVC_PY_CHECKED=1", "-o", "json"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        assert _missing(original, json.loads(typed)) == []
    command = plugin["command"] + plugin.get("args", [])
    assert command[:5] == ["chroot", "/host", "/usr/local/bin/nvc-py", "k8s", "device-plugin"]
    assert set(_flags(command)) <= set(_help().split())
    command = exporter["command"]
    assert command[:4] == ["chroot", "/host", "/usr/local/bin/nvc-py", "exporter"]
    assert set(_flags(command)) <= set(_help("exporter").split())
    port = command[command.index("--listen") + 1].rpartition(":")[2]
    assert exporter["ports"] == [{"name": "metrics", "containerPort": int(port), "protocol": "TCP"}]
    assert template["spec"]["hostNetwork"] is True  # the hook server's socket is the node's network namespace's
    for container in (plugin, exporter):
        assert container["securityContext"]["privileged"] is True
        assert "/host" in {m["mountPath"] for m in container["volumeMounts"]}


def test_the_schema_check_finds_what_kubectl_would_refuse() -> None:
    manifest = yaml.safe_load((DEPLOY / "kubernetes/nvc-py-device-plugin.yaml").read_text())
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    container["volumeMount"] = container.pop("volumeMounts")  # a misspelt field
    container["securityContext"]["privileged"] = "yes"  # a wrong type
    manifest["spec"]["updateStrategy"]["type"] = "Rolling"  # a value it does not take
    assert sorted(_schema_problems(manifest, _DAEMONSET)) == [
        ".spec.template.spec.containers[0].securityContext.privileged: want bool",
        ".spec.template.spec.containers[0].volumeMount: unknown field",
        ".spec.updateStrategy.type: 'Rolling' not one of ('RollingUpdate', 'OnDelete')",
    ]


def _missing(original: object, decoded: object, path: str = "") -> list[str]:
    """Paths of ``original`` that ``decoded`` lacks or has otherwise (typed decoding drops unknown fields)."""
    if isinstance(original, dict):
        if not isinstance(decoded, dict):
            return [path]
        return [p for key, value in original.items() for p in _missing(value, decoded.get(key), f"{path}.{key}")]
    if isinstance(original, list):
        if not isinstance(decoded, list) or len(decoded) != len(original):
            return [path]
        return [p for i, value in enumerate(original) for p in _missing(value, decoded[i], f"{path}[{i}]")]
    return [] if original == decoded else [path]


def test_systemd_unit_runs_the_plugin_with_documented_flags() -> None:
    unit = (DEPLOY / "systemd/nvc-py-device-plugin.service").read_text()
    (exec_start,) = [line.partition("=")[2].split() for line in unit.splitlines() if line.startswith("ExecStart=")]
    assert exec_start[:3] == ["/usr/lib/nvc-py/nvc-py", "k8s", "device-plugin"]
    assert set(_flags(exec_start)) <= set(_help().split())
    assert "Restart=always" in unit and "After=kubelet.service" in unit


def test_the_cli_loads_no_grpc_until_the_plugin_runs() -> None:
    """`nvc-py k8s --help` (and every other command) imports the k8s group only: no gRPC, no protobuf."""
    launcher = Path("/usr/lib/nvc-py/nvc-py-python")
    interpreter = launcher.read_text().splitlines()[0][2:].split(" ", 1)[0]
    result = subprocess.run(
        [interpreter, "-IS", "-X", "importtime", str(launcher), "k8s", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "device-plugin" in result.stdout
    imported = {
        line.rpartition("|")[2].strip() for line in result.stderr.splitlines() if line.startswith("import time:")
    }
    assert "nvc.k8s.command" in imported
    assert not {
        name
        for name in imported
        if name.split(".")[0] in ("grpc", "google")
        or name in ("nvc.k8s.service", "nvc.k8s.daemon", "nvc.k8s.resources")
    }

"""``nvc-py exporter`` as a command (what it imports, the addresses and directories it refuses, a
unix socket) and its deployment (alert rules, dashboard, docs/metrics.md, systemd unit, service
monitor).

Test double only: no figure here is a GPU result.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from harness.exporter import sample as _of
from harness.exporter import samples as _samples
from harness.exporter import scrape as _scrape
from harness.exporter import start as _exporter
from harness.installed import SCRIPTS

# ---------------------------------------------------------------- the command


def _cli_imports(*args: str) -> set[str]:
    launcher = Path("/usr/lib/nvc-py/nvc-py-python")
    interpreter = launcher.read_text().splitlines()[0][2:].split(" ", 1)[0]
    result = subprocess.run(
        [interpreter, "-IS", "-X", "importtime", str(launcher), *args], capture_output=True, text=True, check=True
    )
    return {line.rpartition("|")[2].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}


@pytest.mark.parametrize(
    ("args", "command"),
    [(("exporter", "--help"), "nvc.exporter.command"), (("share", "--help"), "nvc.commands.sharecli")],
)
def test_the_cli_loads_no_prometheus_client_until_the_exporter_runs(args: tuple[str, ...], command: str) -> None:
    imported = _cli_imports(*args)
    assert command in imported
    assert not {
        name
        for name in imported
        if name.split(".")[0] == "prometheus_client"
        or name in ("nvc.exporter.collector", "nvc.exporter.serve", "nvc.k8s.published")
    }


@pytest.mark.parametrize(
    ("listen", "message"),
    [
        ("9402", "not ADDR:PORT"),
        ("127.0.0.1:99999", "not ADDR:PORT"),
        ("localhost:9402", "'localhost' is not an IP"),
        ("::1:9402", "'::1' is not an IP"),
        ("unix:relative.sock", "needs an absolute path"),
    ],
)
def test_bad_listen_addresses_are_refused(listen: str, message: str) -> None:
    result = subprocess.run(
        [str(SCRIPTS / "nvc-py"), "exporter", "--listen", listen], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_a_state_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "state").write_text("")
    result = subprocess.run(
        [str(SCRIPTS / "nvc-py"), "exporter", "--state-dir", str(tmp_path / "state")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (result.returncode, result.stderr) == (
        2,
        f"nvc-py: input error: {tmp_path}/state: --state-dir is not a directory\n",
    )


def test_the_exporter_on_a_unix_socket(tmp_path: Path) -> None:
    import http.client

    path = tmp_path / "exporter.sock"
    proc, where = _exporter(
        tmp_path,
        f"unix:{path}",
        "--no-nvml",
        "--state-dir",
        str(tmp_path / "none"),
        "--hook-log",
        str(tmp_path / "hook.log"),
    )
    try:
        assert where == f"unix:{path}" and (os.stat(path).st_mode & 0o777) == 0o660

        class Connection(http.client.HTTPConnection):
            def connect(self) -> None:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.sock.connect(str(path))

        conn = Connection("localhost")
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        assert _of(_samples(text), "nvc_py_share_containers") == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    assert not path.exists()


# ---------------------------------------------------------------- deployment

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"


def _exported_names(tmp_path: Path) -> set[str]:
    """The name of every series the exporter can produce (its families, empty ones included)."""
    text = _scrape(tmp_path / "none", tmp_path)
    types = dict(m.groups() for m in re.finditer(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE))
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
    return {name.removesuffix("_total") + suffix for name, kind in types.items() for suffix in suffixes[kind]}


def test_rules_and_dashboard_ask_for_what_the_exporter_serves_and_docs_list_it(tmp_path: Path) -> None:
    """promtool (Debian's prometheus package) checks the alert rules, and every query of the Grafana
    dashboard as a recording rule; each nvc_py_ name they use is one the exporter serves; docs/metrics.md
    lists every metric it serves."""
    import yaml

    served = _exported_names(tmp_path)
    rules = DEPLOY / "prometheus" / "nvc-py-alerts.yaml"
    result = subprocess.run(["promtool", "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    dashboard = json.loads((DEPLOY / "grafana" / "nvc-py-dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    as_rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {
                        "record": f"dashboard:query{i}",
                        "expr": e.replace("$__rate_interval", "5m").replace("$instance", ".*"),
                    }
                    for i, e in enumerate(exprs)
                ],
            }
        ]
    }
    (tmp_path / "dashboard-rules.yaml").write_text(yaml.safe_dump(as_rules))
    result = subprocess.run(
        ["promtool", "check", "rules", str(tmp_path / "dashboard-rules.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    used = set(re.findall(r"\bnvc_py_\w+", rules.read_text() + "\n".join(exprs)))
    assert used and used <= served, used - served
    docs = (REPO / "docs" / "metrics.md").read_text()
    documented = set(re.findall(r"`(nvc_py_\w+)`", docs))
    families = {re.sub(r"_(bucket|count|sum)$", "", n) for n in served}
    assert families <= documented and documented <= families | served, families ^ documented


def test_the_systemd_unit_and_the_service_monitor(tmp_path: Path) -> None:
    import yaml

    unit = (DEPLOY / "systemd" / "nvc-py-exporter.service").read_text()
    (exec_start,) = [line.partition("=")[2].split() for line in unit.splitlines() if line.startswith("ExecStart=")]
    assert exec_start[:2] == ["/usr/lib/nvc-py/nvc-py", "exporter"]
    help_text = subprocess.run(
        [str(SCRIPTS / "nvc-py"), "exporter", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert {a for a in exec_start if a.startswith("--")} <= set(help_text.split())
    service, monitor = yaml.safe_load_all((DEPLOY / "kubernetes" / "nvc-py-exporter-monitoring.yaml").read_text())
    daemonset = yaml.safe_load((DEPLOY / "kubernetes" / "nvc-py-device-plugin.yaml").read_text())
    pod = daemonset["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    ports = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", ())}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports
    assert monitor["kind"] == "ServiceMonitor"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {p["name"] for p in service["spec"]["ports"]}

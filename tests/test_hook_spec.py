"""The hook's reading of the OCI state and bundle spec, and its log lines (no containers needed)."""

from __future__ import annotations

import json
import subprocess
import sysconfig
import threading
from pathlib import Path

import pytest

from nvc.errors import InputError
from nvc.hook import log, spec
from nvc.hook.prestart import main


def test_state_bundle_and_legacy_bundle_path() -> None:
    assert spec.parse_state('{"id": "c1", "pid": 42, "bundle": "/b"}') == spec.State("c1", 42, "/b")
    assert spec.parse_state('{"id": "c1", "pid": 42, "bundlePath": "/old"}').bundle == "/old"


@pytest.mark.parametrize(("text", "message"), [
    ("not json", "not valid JSON"),
    ("[]", "expected a JSON object"),
    ('{"pid": 1}', "no absolute 'bundle' path"),
    ('{"pid": 1, "bundle": "relative"}', "no absolute 'bundle' path"),
    ('{"pid": -3, "bundle": "/b"}', "invalid pid -3"),
    ('{"pid": true, "bundle": "/b"}', "invalid pid True"),
])
def test_bad_state(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        spec.parse_state(text)


def _bundle(tmp_path: Path, doc: dict) -> str:
    (tmp_path / "config.json").write_text(json.dumps(doc))
    return str(tmp_path)


def test_container_from_spec(tmp_path: Path) -> None:
    doc = {"ociVersion": "1.0.2", "root": {"path": "rootfs"},
           "process": {"env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=0", "X=a=b"],
                       "capabilities": {"bounding": ["CAP_CHOWN", "CAP_SYS_ADMIN"]}},
           "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
           "annotations": {"a": "b"}}
    ctr = spec.container(str(tmp_path), spec.load_config(_bundle(tmp_path, doc)))
    assert ctr.rootfs == str(tmp_path / "rootfs") and ctr.privileged
    assert ctr.env == {"PATH": "/bin", "NVIDIA_VISIBLE_DEVICES": "0", "X": "a=b"}
    assert ctr.mounts[0]["destination"] == "/proc" and ctr.annotations == {"a": "b"}
    doc["root"]["path"] = "/abs/rootfs"
    doc["process"]["capabilities"]["bounding"] = ["CAP_CHOWN"]
    ctr = spec.container(str(tmp_path), doc)
    assert ctr.rootfs == "/abs/rootfs" and not ctr.privileged


def test_spec_missing_members(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no 'root' in the OCI spec"):
        spec.load_config(_bundle(tmp_path, {"ociVersion": "1.0.2", "process": {}}))
    with pytest.raises(InputError, match="config.json: cannot read"):
        spec.load_config(str(tmp_path / "absent"))


def test_log_levels_and_concurrent_lines(tmp_path: Path) -> None:
    path = tmp_path / "hook.log"
    log.write(str(path), "warning", False, container="quiet")  # a success below the level: nothing
    assert not path.exists()
    threads = [threading.Thread(target=log.write, args=(str(path), "info", False),
                                kwargs={"container": f"c{i}", "padding": "x" * 3000}) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log.write(str(path), "error", True, container="failed")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert sorted(line["container"] for line in lines[:-1]) == sorted(f"c{i}" for i in range(32))
    assert lines[-1]["container"] == "failed" and lines[-1]["time"].endswith("Z")


def test_cli_hook_subcommand_is_the_hook(tmp_path: Path) -> None:
    """`nvc-py hook` runs the same entry point, with its exit status."""
    nvc_py = str(Path(sysconfig.get_path("scripts")) / "nvc-py")
    (tmp_path / "c.yaml").write_text(f"log: {{file: {tmp_path / 'hook.log'}}}\n")
    env = {"NVC_PY_CONFIG": str(tmp_path / "c.yaml")}
    assert subprocess.run([nvc_py, "hook", "poststart"], capture_output=True, env=env).returncode == 0
    bad = subprocess.run([nvc_py, "hook", "prestart"], input=b"{}", capture_output=True, env=env)
    assert bad.returncode == 2 and bad.stderr == b"nvc-py-hook: input error: OCI state on stdin: no absolute 'bundle' path\n"


def test_hook_stages_and_no_gpu_container(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(f"log: {{file: {tmp_path / 'hook.log'}}}\naccept-envvar-when-unprivileged: false\n")
    monkeypatch.setenv("NVC_PY_CONFIG", str(config))
    assert main(["poststart"], b"") == 0 and main(["poststop"], b"") == 0
    assert main(["bogus"], b"") == 2
    doc = {"ociVersion": "1.0.2", "root": {"path": "rootfs"}, "process": {"env": ["NVIDIA_VISIBLE_DEVICES=0"]}}
    bundle = _bundle(tmp_path, doc)
    state = json.dumps({"id": "c9", "pid": 1, "bundle": bundle}).encode()
    assert main(["prestart"], state) == 0
    err = capsys.readouterr().err
    assert "nvc-py-hook: warning: NVIDIA_VISIBLE_DEVICES ignored: unprivileged container" in err
    line = json.loads((tmp_path / "hook.log").read_text())
    assert (line["container"], line["outcome"], line["stage"]) == ("c9", "no-gpu", "prestart")
    assert line["warnings"] and line["duration_ms"] >= 0

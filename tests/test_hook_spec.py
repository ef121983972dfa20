"""The hook's reading of the OCI state and bundle spec, and its log lines (no containers needed)."""

from __future__ import annotations

import json
import os
import subprocess
import sysconfig
import threading
from pathlib import Path

import pytest

from nvc.errors import InputError
from nvc.hook.oci import log, spec
from nvc.hook.oci.prestart import main


def short_id(value: object) -> str | None:
    """A readable test id for a long parameter (pytest would print all of it)."""
    if isinstance(value, (str, bytes)) and len(value) > 40:
        return f"{value[:20]!r}...{len(value)}"
    return None


def test_state_bundle_and_legacy_bundle_path() -> None:
    assert spec.parse_state('{"id": "c1", "pid": 42, "bundle": "/b"}') == spec.State("c1", 42, "/b")
    assert spec.parse_state('{"id": "c1", "pid": 42, "bundlePath": "/old"}').bundle == "/old"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json", "not valid JSON"),
        ("[]", "expected a JSON object"),
        ('{"pid": 1}', "no absolute 'bundle' path"),
        ('{"pid": 1, "bundle": "relative"}', "no absolute 'bundle' path"),
        ('{"pid": -3, "bundle": "/b"}', "invalid pid -3"),
        ('{"pid": true, "bundle": "/b"}', "invalid pid true"),
        ('{"pid": [1], "bundle": "/b"}', "invalid pid an array"),
        ('{"pid": 4194304, "bundle": "/b"}', "invalid pid 4194304"),
        ('{"id": "c", "bundle": "/b\\u0000x"}', "no absolute 'bundle' path"),
        ('{"id": "c", "bundle": "/b\\ud800"}', "no absolute 'bundle' path"),
        ("[" * 100_000 + "]" * 100_000, r"not valid JSON \(nested too deeply\)"),
        (b'{"id": "\xff", "bundle": "/b"}', "not valid JSON"),
        (b" " * (5 << 20) + b"{}", "larger than 4194304 bytes"),
    ],
    ids=short_id,
)
def test_bad_state(text: str | bytes, message: str) -> None:
    with pytest.raises(InputError, match=message):
        spec.parse_state(text)


GOOD_IDS = [
    "0" * 64,
    "a1b2c3" * 10 + "d4e5",
    "nvc-test-1a2b3c4d5e6f",
    "k8s_POD_web-0_default_5f1c-2b_0",
    "default.my_ctr",
    "my+ctr,1",
    "_x",
    "x" * 255,
]
BAD_IDS = [
    "",
    "-rf",
    "--help",
    "a/b",
    "/abs",
    "..",
    ".",
    ".hidden",
    "a\nlevel=info msg=forged",
    "a\x1b[2J",
    "a b",
    "x" * 256,
    "caf\u00e9",
    "\u0661",
]


@pytest.mark.parametrize("cid", GOOD_IDS)
def test_real_container_ids_are_accepted(cid: str) -> None:
    assert spec.parse_state(json.dumps({"id": cid, "bundle": "/b"})).id == cid
    assert spec.stopped(json.dumps({"id": cid, "pid": 0})) == (cid, "")


@pytest.mark.parametrize("cid", [*BAD_IDS, 7, None, ["a"]])
def test_bad_container_ids_are_refused(cid: object) -> None:
    with pytest.raises(InputError, match="invalid container id") as err:
        spec.parse_state(json.dumps({"id": cid, "bundle": "/b"}))
    assert str(err.value).isprintable()  # the id shows escaped
    with pytest.raises(InputError, match="invalid container id"):
        spec.stopped(json.dumps({"id": cid}))


def _bundle(tmp_path: Path, doc: dict) -> str:
    (tmp_path / "config.json").write_text(json.dumps(doc))
    return str(tmp_path)


def test_container_from_spec(tmp_path: Path) -> None:
    doc = {
        "ociVersion": "1.0.2",
        "root": {"path": "rootfs"},
        "process": {
            "env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=0", "X=a=b"],
            "capabilities": {"bounding": ["CAP_CHOWN", "CAP_SYS_ADMIN"]},
        },
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
    }
    ctr = spec.container(str(tmp_path), spec.load_config(_bundle(tmp_path, doc)))
    assert ctr.rootfs == str(tmp_path / "rootfs") and ctr.privileged
    assert ctr.env == {"PATH": "/bin", "NVIDIA_VISIBLE_DEVICES": "0", "X": "a=b"}
    assert ctr.mounts[0]["destination"] == "/proc"
    doc["root"]["path"] = "/abs/rootfs"
    doc["process"]["capabilities"]["bounding"] = ["CAP_CHOWN"]
    ctr = spec.container(str(tmp_path), doc)
    assert ctr.rootfs == "/abs/rootfs" and not ctr.privileged


SPEC = {"ociVersion": "1.0.2", "root": {"path": "rootfs"}, "process": {"env": ["NVIDIA_VISIBLE_DEVICES=0"]}}
WRONG_SHAPES = [
    ("process", "x", "process: expected an object, got 'x'"),
    ("process", ["x"], "process: expected an object, got an array"),
    ("process", 3, "process: expected an object, got 3"),
    ("process", None, "process: expected an object, got null"),
    ("root", "rootfs", "root: expected an object, got 'rootfs'"),
    ("root", None, "root: expected an object, got null"),
    ("ociVersion", 1, "ociVersion: expected a string, got 1"),
    ("mounts", "x", "mounts: expected an array, got 'x'"),
    ("mounts", ["x"], r"mounts\[0\]: expected an object, got 'x'"),
    ("hooks", {"prestart": {}}, r"hooks\['prestart'\]: expected an array, got an object"),
    ("hooks", {"prestart": ["x"]}, r"hooks.prestart\[0\]: expected an object, got 'x'"),
    ("linux", [], "linux: expected an object, got an array"),
    ("linux", {"devices": {}}, "linux.devices: expected an array, got an object"),
    ("linux", {"resources": {"devices": [3]}}, r"linux.resources.devices\[0\]: expected an object, got 3"),
]


@pytest.mark.parametrize(("member", "value", "message"), WRONG_SHAPES)
def test_spec_members_of_the_wrong_type_are_named(tmp_path: Path, member: str, value: object, message: str) -> None:
    with pytest.raises(InputError, match=f"config.json: {message}$"):
        spec.load_config(_bundle(tmp_path, {**SPEC, member: value}))


@pytest.mark.parametrize(
    ("process", "message"),
    [
        ({"env": "A=B"}, "process.env: expected an array, got 'A=B'"),
        ({"env": ["A=B", None]}, r"process.env\[1\]: expected a string, got null"),
        ({"capabilities": []}, "process.capabilities: expected an object, got an array"),
        ({"capabilities": {"bounding": "CAP_SYS_ADMIN"}}, "process.capabilities.bounding: expected an array"),
    ],
)
def test_process_members_of_the_wrong_type_are_named(tmp_path: Path, process: dict, message: str) -> None:
    with pytest.raises(InputError, match=message):
        spec.load_config(_bundle(tmp_path, {**SPEC, "process": process}))


def test_null_optional_members_mean_absent(tmp_path: Path) -> None:
    doc = {**SPEC, "mounts": None, "hooks": None, "linux": None, "process": {"env": None, "capabilities": None}}
    loaded = spec.load_config(_bundle(tmp_path, doc))
    assert "hooks" not in loaded and "linux" not in loaded
    ctr = spec.container(str(tmp_path), loaded)
    assert (ctr.env, ctr.mounts, ctr.privileged) == ({}, (), False)


def test_spec_file_that_is_not_a_small_json_file(tmp_path: Path) -> None:
    """(A FIFO: test_fifo_as_config_json_does_not_hang_the_hook, in a process that a timeout can end.)"""
    with open(tmp_path / "config.json", "wb") as f:
        f.truncate(spec.MAX_SPEC_SIZE + 1)  # sparse: refused by its size, nothing read
    with pytest.raises(InputError, match="config.json: larger than"):
        spec.load_config(str(tmp_path))
    (tmp_path / "config.json").write_bytes(b'{"ociVersion": "1.0.2", "process": {"env": ["A=\xff"]}}')
    with pytest.raises(InputError, match="config.json: not valid JSON"):
        spec.load_config(str(tmp_path))
    (tmp_path / "config.json").write_text('{"a":' * 50_000 + "1" + "}" * 50_000)
    with pytest.raises(InputError, match=r"config.json: not valid JSON \(nested too deeply\)"):
        spec.load_config(str(tmp_path))


@pytest.mark.parametrize(
    ("member", "value", "message"),
    [
        ("linux", [], "linux: expected an object, got an array"),
        ("hooks", {"prestart": "nvc-py-hook"}, "hooks['prestart']: expected an array, got 'nvc-py-hook'"),
        ("linux", {"resources": {"devices": {}}}, "linux.resources.devices: expected an array, got an object"),
    ],
)
def test_runtime_wrapper_refuses_a_spec_of_the_wrong_shape(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    member: str,
    value: object,
    message: str,
) -> None:
    """nvc-py-runtime edits hooks and linux of a GPU spec: a wrong type there is one line, not a traceback."""
    from nvc.hook.oci import runtime

    (tmp_path / "c.yaml").write_text("load-kmods: false\n")
    monkeypatch.setenv("NVC_PY_CONFIG", str(tmp_path / "c.yaml"))
    bundle = _bundle(tmp_path, {**SPEC, member: value})
    assert runtime.main(["create", "--bundle", bundle, "ctr"]) == InputError.exit_code
    assert capsys.readouterr().err == f"nvc-py-runtime: input error: {bundle}/config.json: {message}\n"


def test_spec_missing_members(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no 'root' in the OCI spec"):
        spec.load_config(_bundle(tmp_path, {"ociVersion": "1.0.2", "process": {}}))
    with pytest.raises(InputError, match="config.json: cannot read"):
        spec.load_config(str(tmp_path / "absent"))


def test_log_levels_and_concurrent_lines(tmp_path: Path) -> None:
    path = tmp_path / "hook.log"
    log.write(str(path), "warning", False, container="quiet")  # a success below the level: nothing
    assert not path.exists()
    threads = [
        threading.Thread(
            target=log.write, args=(str(path), "info", False), kwargs={"container": f"c{i}", "padding": "x" * 3000}
        )
        for i in range(32)
    ]
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
    assert (
        bad.returncode == 2
        and bad.stderr == b"nvc-py-hook: input error: OCI state on stdin: no absolute 'bundle' path\n"
    )


def test_hook_stages_and_no_gpu_container(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
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


def test_log_line_is_bounded_and_escaped(tmp_path: Path) -> None:
    path = tmp_path / "hook.log"
    forged = "compute\nlevel=info msg=forged\x1b[2J\x07" + "y" * (1 << 20)
    log.write(
        str(path),
        "info",
        True,
        container="c",
        error=forged,
        devices=["x"] * 100_000,
        share={f"k{i}": i for i in range(100)},
    )
    raw = path.read_bytes()
    assert raw.count(b"\n") == 1 and b"\x1b" not in raw and len(raw) < 4096
    line = json.loads(raw)
    assert line["error"].startswith("compute\\nlevel=info msg=forged\\x1b[2J\\x07yyy")
    assert line["error"].endswith(f"... (+{len(forged) - log.MAX_STRING} more characters)")
    assert line["devices"] == ["x"] * log.MAX_ITEMS + [f"... (+{100_000 - log.MAX_ITEMS} more)"]
    assert len(line["share"]) == log.MAX_ITEMS + 1 and line["share"]["..."] == f"+{100 - log.MAX_ITEMS} more"


# --- hostile input through the real nvc-py-hook program: one line, a stable code, no traceback ------

HOOK = str(Path(sysconfig.get_path("scripts")) / "nvc-py-hook")


@pytest.fixture
def hook_env(tmp_path: Path) -> dict[str, str]:
    """A configuration that loads no modules and logs to tmp_path/hook.log."""
    config = tmp_path / "c.yaml"
    config.write_text(f"load-kmods: false\nlog: {{file: {tmp_path / 'hook.log'}}}\n")
    return {"NVC_PY_CONFIG": str(config)}


def run_hook(env: dict[str, str], state: bytes, stage: str = "prestart") -> subprocess.CompletedProcess[bytes]:
    """The hook program on ``state``; the timeout is only a safety net against a hang."""
    return subprocess.run([HOOK, stage], input=state, capture_output=True, env=env, timeout=60)


def assert_one_line(result: subprocess.CompletedProcess[bytes], code: int, message: str) -> str:
    err = result.stderr.decode()
    assert (result.returncode, err.count("\n")) == (code, 1), err[:2000]
    assert err.startswith("nvc-py-hook: ") and err.endswith("\n") and err[:-1].isprintable()
    assert "Traceback" not in err and message in err and len(err) < 1200
    return err


def hostile_bundle(tmp_path: Path, doc: dict | bytes) -> bytes:
    """A bundle with an empty rootfs and ``doc`` as config.json; the state naming it."""
    bundle = tmp_path / "bundle"
    (bundle / "rootfs").mkdir(parents=True, exist_ok=True)
    (bundle / "config.json").write_bytes(doc if isinstance(doc, bytes) else json.dumps(doc).encode())
    return json.dumps({"ociVersion": "1.0.2", "id": "hostile", "bundle": str(bundle)}).encode()


def _gpu_spec(*env: str) -> dict:
    return {"ociVersion": "1.0.2", "root": {"path": "rootfs"}, "process": {"env": ["NVIDIA_VISIBLE_DEVICES=0", *env]}}


NINES = "9" * 4400  # past int()'s 4300-digit limit
HOSTILE_STATES = [
    ("[" * 100_000 + "]" * 100_000, "not valid JSON (nested too deeply)"),
    ('{"id": "a\\nlevel=info msg=forged", "bundle": "/b"}', "invalid container id 'a\\nlevel=info msg=forged'"),
    ('{"id": "-rf", "bundle": "/b"}', "invalid container id '-rf'"),
    ('{"id": "../../etc", "bundle": "/b"}', "invalid container id '../../etc'"),
    ('{"id": "x", "pid": "1", "bundle": "/b"}', "invalid pid '1'"),
    ('{"id": "\xff", "bundle": "/b"}', "not valid JSON"),
]


@pytest.mark.parametrize(("state", "message"), HOSTILE_STATES, ids=short_id)
def test_hostile_state_through_the_hook(hook_env: dict[str, str], tmp_path: Path, state: str, message: str) -> None:
    data = state.encode("latin-1") if "\xff" in state else state.encode()
    assert_one_line(run_hook(hook_env, data), InputError.exit_code, message)
    line = json.loads((tmp_path / "hook.log").read_text())
    assert line["outcome"] == "error" and line["container"] is None  # a bad id never reaches the log


@pytest.mark.parametrize(
    ("doc", "code", "message"),
    [
        ({**SPEC, "process": "x"}, 2, "config.json: process: expected an object, got 'x'"),
        (
            {**SPEC, "process": ["NVIDIA_VISIBLE_DEVICES=all"]},
            2,
            "config.json: process: expected an object, got an array",
        ),
        ({**SPEC, "process": None}, 2, "config.json: process: expected an object, got null"),
        ({**SPEC, "root": 5}, 2, "config.json: root: expected an object, got 5"),
        ({**SPEC, "mounts": [[]]}, 2, "config.json: mounts[0]: expected an object, got an array"),
        ({**SPEC, "process": {"env": [1]}}, 2, "config.json: process.env[0]: expected a string, got 1"),
        (b'{"ociVersion": "1.0.2", "process": {"env": ["A=\xff"]}, "root": {"path": "rootfs"}}', 2, "not valid JSON"),
        (_gpu_spec("NVIDIA_VISIBLE_DEVICES=\u00b2"), 6, "device error: \u00b2: unknown device"),
        (_gpu_spec(f"NVIDIA_VISIBLE_DEVICES={NINES}"), 6, "device error: 999"),
        (_gpu_spec("NVIDIA_VISIBLE_DEVICES=0:\u00b2"), 6, "unknown device"),
        (_gpu_spec("NVIDIA_IMEX_CHANNELS=\u00b2"), 2, "unsupported IMEX channel value '\u00b2'"),
        (_gpu_spec(f"NVIDIA_IMEX_CHANNELS={NINES}"), 2, "unsupported IMEX channel value '999"),
        (_gpu_spec(f"NVIDIA_REQUIRE_CUDA=cuda>={NINES}"), 2, "invalid version: '999"),
        (_gpu_spec("NVIDIA_REQUIRE_CUDA=cuda>=\u0661\u0662.0"), 2, "invalid version: '\u0661\u0662.0'"),
        (
            {**SPEC, "process": {"env": ["CUDA_VERSION=\u00b2.\u00b2"]}},
            2,
            "CUDA_VERSION: invalid version '\u00b2.\u00b2'",
        ),
        (_gpu_spec(f"CUDA_DEVICE_MEMORY_LIMIT={NINES}"), 2, "CUDA_DEVICE_MEMORY_LIMIT='999"),
        (_gpu_spec("CUDA_DEVICE_SM_LIMIT=\u00b2"), 2, "CUDA_DEVICE_SM_LIMIT='\u00b2': not a percentage"),
    ],
)
def test_hostile_spec_through_the_hook(
    hook_env: dict[str, str], tmp_path: Path, doc: dict | bytes, code: int, message: str
) -> None:
    err = assert_one_line(run_hook(hook_env, hostile_bundle(tmp_path, doc)), code, message)
    if NINES in json.dumps(doc if isinstance(doc, dict) else {}):
        assert "more characters)" in err  # cut, with the marker


def test_fifo_as_config_json_does_not_hang_the_hook(hook_env: dict[str, str], tmp_path: Path) -> None:
    state = hostile_bundle(tmp_path, SPEC)
    (tmp_path / "bundle" / "config.json").unlink()
    os.mkfifo(tmp_path / "bundle" / "config.json")
    assert_one_line(run_hook(hook_env, state), InputError.exit_code, "config.json: not a regular file")


def test_env_value_with_escapes_is_escaped_and_cut_in_stderr_and_log(hook_env: dict[str, str], tmp_path: Path) -> None:
    forged = "compute\nlevel=info msg=forged\x1b]0;pwned\x07\x1b[2J" + "z" * 5000
    err = assert_one_line(
        run_hook(hook_env, hostile_bundle(tmp_path, _gpu_spec(f"NVIDIA_DRIVER_CAPABILITIES={forged}"))),
        InputError.exit_code,
        "unknown capability 'compute\\nlevel=info msg=forged\\x1b]0;pwned",
    )
    assert "\x1b" not in err and "\x07" not in err and f"... (+{len(forged) - 200} more characters)" in err
    raw = (tmp_path / "hook.log").read_bytes()
    assert raw.count(b"\n") == 1 and b"\x1b" not in raw and b"\x07" not in raw and len(raw) < 2048
    assert json.loads(raw)["error"] == err.removeprefix("nvc-py-hook: ").rstrip("\n")


@pytest.mark.parametrize("value", ["x" * (1 << 20), "x," * (1 << 19)])
def test_a_megabyte_env_value_adds_little_to_the_log(hook_env: dict[str, str], tmp_path: Path, value: str) -> None:
    result = run_hook(hook_env, hostile_bundle(tmp_path, _gpu_spec(f"NVIDIA_VISIBLE_DEVICES={value}")))
    assert_one_line(result, 6, "device error: x")
    assert (tmp_path / "hook.log").stat().st_size < 8192


def test_bad_ids_are_refused_before_a_sharing_directory_is_made(hook_env: dict[str, str], tmp_path: Path) -> None:
    from nvc.plan import share

    for cid in ("a\nb", "-x", "../x", "a/b"):
        state = json.loads(hostile_bundle(tmp_path, _gpu_spec("CUDA_DEVICE_MEMORY_LIMIT=1g")))
        state["id"] = cid
        assert_one_line(run_hook(hook_env, json.dumps(state).encode()), InputError.exit_code, "invalid container id")
        assert not os.path.lexists(os.path.join(share.STATE_DIR, cid))
        assert run_hook(hook_env, json.dumps(state).encode(), "poststop").returncode == 0  # nothing to remove

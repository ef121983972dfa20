"""Docker: ``nvc-py setup docker`` (daemon.json and the ``--gpus`` hook link) and containers of a
private dockerd (Debian's docker.io, tests/harness/docker.py) on the fake driver.

One dockerd serves the module's container tests: it is started inside the fake driver's mount
namespace (the prestart hooks run in dockerd's), with a daemon.json and a hook link that
``nvc-py setup docker`` wrote, and the hook link's directory on its PATH. The setup tests run the
installed ``nvc-py`` on files in their temporary directory (``--config``, ``--gpus-hook-dir``), never
at the host's paths. Everything on the fake driver is a test double: no GPU result.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.bundle import make_bundle
from harness.docker import Dockerd, base_config
from harness.fakegpus import A100, H100, MIG_2G, MIG_3G, SHOW
from harness.fakegpus import uuids as _uuids
from nvc.errors import InputError

SCRIPTS = Path(sysconfig.get_path("scripts"))
NVC_PY = str(SCRIPTS / "nvc-py")
HOOK_FRONT = "/usr/lib/nvc-py/nvc-py-hook"
RUNTIME = "/usr/lib/nvc-py/nvc-py-runtime"
GPUS_HOOK = "nvidia-container-runtime-hook"


def setup_docker(*args: str, config: Path) -> subprocess.CompletedProcess[str]:
    """``nvc-py setup docker --no-server ARGS`` for hooks reading ``config`` ($NVC_PY_CONFIG; the
    no-server file goes beside it, it need not exist)."""
    return subprocess.run(
        [NVC_PY, "setup", "docker", "--no-server", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "NVC_PY_CONFIG": str(config)},
    )


def listing(path: Path) -> list[str]:
    """Every entry under ``path`` (temporary files included), relative."""
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    """Where the setup tests' hooks would read their configuration (the file is not needed)."""
    return tmp_path / "config.yaml"


# --- daemon.json: merged, byte for byte back, junk refused ------------------------------------------------

STARTING_FILES = {
    "none": None,
    "empty object": "{}\n",
    "other keys, odd layout": (
        '{\t"log-level":"warn" ,\r\n\n  "runtimes" : {\r\n "custom": {"path": "/opt/x", '
        '"runtimeArgs": ["--debug"]}} , "features": {"buildkit": true},'
        '"default-ulimits":{"nofile":{"Name":"nofile","Hard":64000,"Soft":64000}}}   '
    ),
    "indented, default runtime set": '{\n    "default-runtime": "runc",\n    "data-root": "/srv/docker"\n}\n',
}


@pytest.mark.parametrize("set_default", [False, True], ids=["runtime", "set-as-default"])
@pytest.mark.parametrize("name", list(STARTING_FILES))
def test_setup_then_remove_gives_daemon_json_back_byte_for_byte(
    tmp_path: Path, config_file: Path, name: str, set_default: bool
) -> None:
    original = STARTING_FILES[name]
    replaces_default = set_default and '"default-runtime"' in (original or "")  # not only an addition
    daemon_json, hook_dir = tmp_path / "docker" / "daemon.json", tmp_path / "bin"
    hook_dir.mkdir()
    if original is not None:
        daemon_json.parent.mkdir()
        daemon_json.write_text(original, newline="")
        daemon_json.chmod(0o600)
    before = json.loads(original) if original is not None else {}
    args = ["--config", str(daemon_json), "--gpus-hook-dir", str(hook_dir), *(["--set-as-default"] * set_default)]
    first = setup_docker(*args, config=config_file)
    assert first.returncode == 0, first.stderr
    how = (
        "systemctl restart docker, or --restart"
        if os.path.isdir("/run/systemd/system")
        else "--restart reloads a running dockerd's runtimes (SIGHUP); --gpus needs it started again"
    )
    assert f"wrote {daemon_json}\n" in first.stdout and f"restart it ({how})\n" in first.stdout
    assert (
        f"{daemon_json}: default-runtime was 'runc' (--remove takes the key out" in first.stdout
    ) == replaces_default
    written = daemon_json.read_bytes()
    backup = tmp_path / "docker" / "daemon.json.nvc-py.bak"  # the previous file, as it was
    assert (
        (backup.read_bytes(), stat.S_IMODE(backup.stat().st_mode)) == (original.encode(), 0o600)
        if original is not None
        else not backup.exists()
    )
    doc = json.loads(written)
    assert {k: v for k, v in doc.items() if k not in ("runtimes", "default-runtime")} == {
        k: v for k, v in before.items() if k not in ("runtimes", "default-runtime")
    }
    assert doc["runtimes"] == {**before.get("runtimes", {}), "nvc-py": {"path": RUNTIME}}
    assert doc.get("default-runtime") == ("nvc-py" if set_default else before.get("default-runtime"))
    assert stat.S_IMODE(daemon_json.stat().st_mode) == (0o600 if original is not None else 0o644)
    assert os.readlink(hook_dir / GPUS_HOOK) == HOOK_FRONT
    again = setup_docker(*args, config=config_file)  # a second run changes nothing
    assert again.returncode == 0 and daemon_json.read_bytes() == written
    assert f"unchanged {daemon_json}\n" in again.stdout and "restart" not in again.stdout
    removed = setup_docker(
        "--remove", "--config", str(daemon_json), "--gpus-hook-dir", str(hook_dir), config=config_file
    )
    assert removed.returncode == 0, removed.stderr
    if original is None:
        assert not daemon_json.exists() and f"removed {daemon_json}\nremoved {daemon_json.parent}\n" in removed.stdout
    elif replaces_default:
        assert json.loads(daemon_json.read_text()) == {k: v for k, v in before.items() if k != "default-runtime"}
    else:
        assert daemon_json.read_bytes() == original.encode()
    assert not (hook_dir / GPUS_HOOK).is_symlink()
    assert listing(tmp_path) == sorted(
        [
            "bin",
            "no-server",
            *(  # daemon.json restored: no backup left
                ["docker", "docker/daemon.json"] if original is not None else []
            ),
        ]
    )  # setup made docker/: gone with it


def test_text_edits_are_undone_exactly() -> None:
    """Adding as the first member in the object's own layout and removing it again, for layouts the
    CLI test does not cover; a runtimes object setup emptied goes too, an entry of ours it replaced too."""
    from nvc.hook.setup import docker

    entry = {"path": RUNTIME}
    for text in (
        "{}",
        " { }\n",
        '{"a":1,"b":[1,{"c":"}"}]}',
        '{\n\t"runtimes": {\n\t\t"x": {"path": "/x"}\n\t}\n}',
        '{"runtimes":{},"a":"\\"runtimes\\": {"}',
        '{"b": {"runtimes": {"nvc-py": {}}}}',
    ):
        for set_default in (False, True):
            added = docker.with_runtime(text, "daemon.json", "nvc-py", entry, set_default)
            assert json.loads(added)["runtimes"]["nvc-py"] == entry
            assert docker.with_runtime(added, "daemon.json", "nvc-py", entry, set_default) == added
            back = docker.without_runtime(added, "daemon.json", "nvc-py")
            assert back == text or (text.startswith('{"runtimes":{}') and json.loads(back) == {"a": '"runtimes": {'})
    replaced = docker.with_runtime('{"runtimes": {"nvc-py": {"path": "/old"}}, "a": 1}', "f", "nvc-py", entry, False)
    assert replaced == '{"runtimes": {"nvc-py": {"path": "/usr/lib/nvc-py/nvc-py-runtime"}}, "a": 1}'
    assert docker.without_runtime(replaced, "f", "nvc-py") == '{ "a": 1}'


JUNK = {
    "not JSON": ("daemon.json junk\n", "not valid JSON (Expecting value at line 1 column 1)"),
    "empty": ("", "not valid JSON (Expecting value at line 1 column 1)"),
    "trailing data": ('{"debug": true}\n}\n', "not valid JSON (Extra data at line 2 column 1)"),
    "an array": ("[]\n", "not a JSON object"),
    "runtimes not an object": ('{"runtimes": ["nvc-py"]}', "runtimes is not an object of objects"),
    "duplicate key": ('{"runtimes": {}, "runtimes": {}}', "duplicate key 'runtimes'"),
    "NaN": ('{"max-concurrent-uploads": NaN}', "NaN is not JSON"),
    "not UTF-8": ('{"labels": ["\xff"]}', "not UTF-8 text"),
}


@pytest.mark.parametrize("name", list(JUNK))
def test_junk_daemon_json_is_refused_in_one_line_with_nothing_written(
    tmp_path: Path, config_file: Path, name: str
) -> None:
    text, reason = JUNK[name]
    daemon_json, hook_dir = tmp_path / "daemon.json", tmp_path / "bin"
    hook_dir.mkdir()
    daemon_json.write_bytes(text.encode("latin-1") if name == "not UTF-8" else text.encode())
    before = listing(tmp_path)
    for extra in ([], ["--remove"]):
        result = setup_docker(
            *extra, "--config", str(daemon_json), "--gpus-hook-dir", str(hook_dir), config=config_file
        )
        assert (result.returncode, result.stdout) == (InputError.exit_code, "")
        assert result.stderr == f"nvc-py: input error: {daemon_json}: {reason}\n"
        assert daemon_json.read_bytes() == (text.encode("latin-1") if name == "not UTF-8" else text.encode())
        assert listing(tmp_path) == before


def test_daemon_json_read_never_blocks_on_a_fifo(tmp_path: Path, config_file: Path) -> None:
    fifo = tmp_path / "daemon.json"
    os.mkfifo(fifo)
    result = setup_docker("--config", str(fifo), "--gpus-hook-dir", str(tmp_path), config=config_file)
    assert result.stderr == f"nvc-py: input error: {fifo}: is a FIFO, not a regular file\n"
    assert not (tmp_path / GPUS_HOOK).exists()


def test_gpus_hook_of_another_is_never_replaced(tmp_path: Path, config_file: Path) -> None:
    """Where NVIDIA's toolkit put its hook: left alone by default (and said), refused with --gpus-hook
    before anything is written, kept by --remove."""
    hook_dir = tmp_path / "bin"
    hook_dir.mkdir()
    theirs = hook_dir / GPUS_HOOK
    theirs.write_text("#!/bin/sh\n# NVIDIA's\n")
    daemon_json = tmp_path / "daemon.json"
    args = ("--config", str(daemon_json), "--gpus-hook-dir", str(hook_dir))
    refused = setup_docker(*args, "--gpus-hook", config=config_file)
    assert (
        refused.stderr
        == (f"nvc-py: input error: {theirs}: exists and is not nvc-py's link (NVIDIA's toolkit?): not replaced\n")
        and refused.returncode == InputError.exit_code
    )
    assert not daemon_json.exists()
    kept = setup_docker(*args, config=config_file)
    assert kept.returncode == 0 and f"left {theirs} alone (not nvc-py's)" in kept.stdout
    assert theirs.read_text() == "#!/bin/sh\n# NVIDIA's\n" and daemon_json.exists()
    assert setup_docker("--remove", *args, config=config_file).returncode == 0
    assert theirs.read_text() == "#!/bin/sh\n# NVIDIA's\n" and not daemon_json.exists()


def test_no_gpus_hook_and_dry_run(tmp_path: Path, config_file: Path) -> None:
    hook_dir = tmp_path / "bin"
    hook_dir.mkdir()
    daemon_json = tmp_path / "daemon.json"
    args = ("--config", str(daemon_json), "--gpus-hook-dir", str(hook_dir))
    dry = setup_docker(*args, "--dry-run", config=config_file)
    assert dry.returncode == 0 and listing(tmp_path) == ["bin"]
    assert dry.stdout.startswith(f'# {daemon_json}\n{{\n  "runtimes": {{\n    "nvc-py": {{\n')
    assert f"would link {hook_dir / GPUS_HOOK} -> {HOOK_FRONT}\n" in dry.stdout
    assert setup_docker(*args, config=config_file).returncode == 0
    assert (hook_dir / GPUS_HOOK).is_symlink()
    dropped = setup_docker(*args, "--no-gpus-hook", config=config_file)  # nvc-py's link taken away again
    assert dropped.returncode == 0 and f"removed {hook_dir / GPUS_HOOK}\n" in dropped.stdout
    assert not (hook_dir / GPUS_HOOK).is_symlink()
    assert setup_docker("--remove", *args, "--dry-run", config=config_file).stdout == f"would remove {daemon_json}\n"


@pytest.mark.skipif(os.path.isdir("/run/systemd/system"), reason="systemd runs here: --restart would restart docker")
def test_restart_without_systemd_writes_then_reloads_the_running_dockerd(
    tmp_path: Path, config_file: Path, rootfs_cache
) -> None:  # noqa: ANN001
    """Without systemd, --restart writes the registration (exit 0), then tells the running dockerd that
    reads that daemon.json to reload it (SIGHUP: the runtime shows in its `docker info`) and says in a
    line what --gpus needs; where none runs, it says that dockerd reads it as it starts."""
    daemon_json, hook_dir = tmp_path / "daemon.json", tmp_path / "bin"
    hook_dir.mkdir()
    args = ("--restart", "--config", str(daemon_json), "--gpus-hook-dir", str(hook_dir))
    alone = setup_docker(*args, config=config_file)
    assert (alone.returncode, alone.stderr) == (0, ""), alone.stderr
    assert f"wrote {daemon_json}\n" in alone.stdout
    assert alone.stdout.endswith(f"no running dockerd reads {daemon_json}: dockerd reads it as it starts\n")
    assert setup_docker("--remove", *args[1:], config=config_file).returncode == 0
    daemon_json.write_text(json.dumps(base_config(tmp_path), indent=2) + "\n")
    dockerd = Dockerd(tmp_path, rootfs_cache, daemon_json, path=[hook_dir])
    try:
        assert "nvc-py" not in dockerd.info()["Runtimes"]
        result = setup_docker(*args, config=config_file)
        assert (result.returncode, result.stderr) == (0, ""), result.stderr
        pid = dockerd.process.pid
        assert f"dockerd (pid {pid}) reloaded {daemon_json} (SIGHUP): it serves runtime nvc-py\n" in result.stdout, (
            result.stdout
        )
        assert (
            f"dockerd (pid {pid}) looks for {GPUS_HOOK} only as it starts: for `docker run --gpus`, stop it "
            f"(kill {pid}) and start it again as before: /usr/sbin/dockerd --config-file {daemon_json} "
            in result.stdout
        ), result.stdout
        assert dockerd.info()["Runtimes"]["nvc-py"]["path"] == RUNTIME
        # Removed again: the file has no runtimes member left, which dockerd needs to drop one on SIGHUP.
        removed = setup_docker("--remove", *args, config=config_file)
        assert (removed.returncode, removed.stderr) == (0, ""), removed.stderr
        assert f"dockerd (pid {pid}) reloaded {daemon_json} (SIGHUP): it dropped runtime nvc-py\n" in removed.stdout, (
            removed.stdout
        )
        assert (
            f"dockerd (pid {pid}) found {GPUS_HOOK} as it started: `docker run --gpus` fails until it starts "
            "again; stop it" in removed.stdout
        ), removed.stdout
        assert "nvc-py" not in dockerd.info()["Runtimes"]
        assert daemon_json.read_text() == json.dumps(base_config(tmp_path), indent=2) + "\n"
    finally:
        dockerd.stop()


@pytest.mark.parametrize("target", [HOOK_FRONT, "/usr/lib/nvc-py/nvc-py-hook-python"], ids=["front", "python"])
def test_hook_answers_as_nvc_py_hook_under_the_gpus_hook_name(tmp_path: Path, target: str) -> None:
    """Called as nvidia-container-runtime-hook (a link, as setup docker makes it), the front still runs
    nvc-py-hook's program (it goes by the file it runs from), and the program goes by its arguments."""
    link = tmp_path / GPUS_HOOK
    link.symlink_to(target)
    result = subprocess.run([str(link), "--help"], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.startswith("usage: nvc-py-hook prestart|poststart|poststop  (OCI state on stdin)\n")


def test_runtime_adds_no_second_hook_where_gpus_hook_is_nvc_py(
    active_2gpu, fake_2gpu, debian_rootfs: Path, tmp_path: Path
) -> None:
    """`--runtime nvc-py --gpus 1`: dockerd's hook is nvc-py's (through the link), so nvc-py-runtime
    adds none (two prestart hooks would configure the container twice)."""
    from nvc import config as config_load
    from nvc.hook.oci import runtime

    config = tmp_path / "config.yaml"
    config.write_text(f"root: {fake_2gpu.root}\nload-kmods: false\n")
    link = tmp_path / GPUS_HOOK
    link.symlink_to(HOOK_FRONT)
    bundle = make_bundle(
        tmp_path / "b",
        debian_rootfs,
        ["true"],
        env={"NVIDIA_VISIBLE_DEVICES": "0"},
        hooks={"prestart": [{"path": str(link), "args": [GPUS_HOOK, "prestart"]}]},
    )
    spec = json.loads((bundle / "config.json").read_text())
    runtime.rewrite(spec, str(bundle), config_load.load(str(config)))
    assert [h["path"] for h in spec["hooks"]["prestart"]] == [str(link)]


# --- containers of a private dockerd -------------------------------------------------------------------


@pytest.fixture(scope="module")
def dockerd(fake_2gpu, rootfs_cache, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dockerd]:
    """dockerd with what `nvc-py setup docker` wrote (runtime nvc-py, the --gpus hook link) and the
    hook configuration for the fake driver in its environment, inside the fake driver's namespace."""
    from fakedriver.activate import activate

    work = tmp_path_factory.mktemp("docker")
    config = work / "config.yaml"
    config.write_text(f"root: {fake_2gpu.root}\nload-kmods: false\nlog: {{file: {work / 'hook.log'}}}\n")
    daemon_json, hook_dir = work / "daemon.json", work / "bin"
    daemon_json.write_text(json.dumps(base_config(work), indent=2) + "\n")
    hook_dir.mkdir()
    setup = setup_docker("--config", str(daemon_json), "--gpus-hook-dir", str(hook_dir), config=config)
    assert setup.returncode == 0, setup.stderr
    with activate(fake_2gpu):
        daemon = Dockerd(work, rootfs_cache, daemon_json, path=[hook_dir], env={"NVC_PY_CONFIG": str(config)})
        try:
            yield daemon
        finally:
            daemon.stop()


def _nodes(stdout: str) -> list[str]:
    return [w for w in stdout.split() if w.startswith("nvidia") and w[6:].isdigit()]


def _hook_lines(dockerd: Dockerd) -> list[dict]:
    return [json.loads(line) for line in (dockerd.workdir / "hook.log").read_text().splitlines()]


def test_dockerd_reads_what_setup_wrote(dockerd: Dockerd) -> None:
    info = dockerd.info()
    assert info["ServerVersion"].startswith("20.10.")
    assert info["Runtimes"]["nvc-py"]["path"] == RUNTIME


# docker run's GPU options -> UUIDs nvidia-smi -L lists, GPU device nodes
DOCKER_CASES = {
    "--gpus all": (["--gpus", "all"], [H100, A100, MIG_2G, MIG_3G], ["nvidia0", "nvidia1"]),
    "--gpus 1": (["--gpus", "1"], [H100], ["nvidia0"]),
    "--gpus '\"device=1\"'": (["--gpus", '"device=1"'], [A100], ["nvidia1"]),
    "--runtime nvc-py -e NVIDIA_VISIBLE_DEVICES=0": (
        ["--runtime", "nvc-py", "-e", "NVIDIA_VISIBLE_DEVICES=0"],
        [H100],
        ["nvidia0"],
    ),
}


@pytest.mark.parametrize("case", list(DOCKER_CASES))
def test_docker_run_gets_the_gpus_it_asks_for(dockerd: Dockerd, case: str) -> None:
    """`--gpus` through dockerd's prestart hook at the nvidia-container-runtime-hook link to nvc-py-hook;
    `--runtime nvc-py` through nvc-py-runtime's hook."""
    args, uuids, nodes = DOCKER_CASES[case]
    result = dockerd.run(dockerd.image(), SHOW, extra_args=args)
    assert result.returncode == 0, result.stderr
    assert (_uuids(result.stdout), _nodes(result.stdout)) == (uuids, nodes), result.stdout
    last = _hook_lines(dockerd)[-1]
    assert last["outcome"] == "configured" and re.fullmatch(r"[0-9a-f]{64}", last["container"])


def test_docker_run_without_gpus_gets_nothing(dockerd: Dockerd) -> None:
    """No `--gpus`: dockerd adds no hook; `--runtime nvc-py` without NVIDIA_VISIBLE_DEVICES: nvc-py-runtime
    adds none. One `--runtime nvc-py --gpus 1`: one prestart run, not two."""
    logged = len(_hook_lines(dockerd)) if (dockerd.workdir / "hook.log").exists() else 0
    for args in ([], ["--runtime", "nvc-py"]):
        result = dockerd.run(dockerd.image(), SHOW, extra_args=args)
        assert result.returncode == 0, result.stderr
        assert "nvidia-smi: not found" in result.stdout and _nodes(result.stdout) == [], (args, result.stdout)
    both = dockerd.run(dockerd.image(), SHOW, extra_args=["--runtime", "nvc-py", "--gpus", "1"])
    assert both.returncode == 0 and _uuids(both.stdout) == [H100], both.stderr
    prestarts = [line for line in _hook_lines(dockerd)[logged:] if line["stage"] == "prestart"]
    assert [line["outcome"] for line in prestarts] == ["configured"], prestarts


def _doctor(*args: str, dockerd: Dockerd) -> dict:
    """`nvc-py doctor --json ARGS`'s checks by name, for the hook configuration dockerd's hooks read."""
    done = subprocess.run(
        [str(SCRIPTS / "nvc-py"), "doctor", "--json", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NVC_PY_CONFIG": str(dockerd.workdir / "config.yaml"), "NVC_PY_HOOK_SOCKET": "none"},
    )
    assert done.stderr == "", done.stderr
    return {c["name"]: c for c in json.loads(done.stdout)["checks"]}


def test_doctor_reads_what_the_running_dockerd_reads_and_its_run_sees_the_gpu(dockerd: Dockerd) -> None:
    """doctor finds the running dockerd's --config-file and PATH (not /etc/docker/daemon.json), the
    runtime and --gpus hook setup wrote there, and --run starts a container through it asking for GPU 0."""
    checks = _doctor("--run", dockerd=dockerd)
    assert checks["docker"]["status"] == "ok" and str(dockerd.workdir / "daemon.json") in checks["docker"]["detail"]
    assert checks["docker --gpus"] == {
        "name": "docker --gpus",
        "status": "ok",
        "fix": "",
        "detail": f"{dockerd.workdir}/bin/nvidia-container-runtime-hook is nvc-py's hook",
    }
    assert "dockerd" not in checks, checks.get("dockerd")  # started after daemon.json was written
    assert checks["docker run"]["status"] == "ok", checks["docker run"]
    assert checks["docker run"]["detail"].startswith(
        "a container started with `docker run --gpus device=0` sees it: GPU 0: NVIDIA H100"
    )


def test_doctor_finds_a_daemon_json_without_the_runtime(dockerd: Dockerd) -> None:
    """daemon.json without nvc-py's runtime (removed after dockerd started): doctor says so, and that
    the running dockerd read an older file. (Last in the module: the file is put back after.)"""
    daemon_json = dockerd.workdir / "daemon.json"
    before = daemon_json.read_bytes()
    time.sleep(1.5)  # a change later than dockerd's start by more than its clock's slack
    assert (
        setup_docker(
            "--config",
            str(daemon_json),
            "--remove",
            "--gpus-hook-dir",
            str(dockerd.workdir / "none"),
            config=dockerd.workdir / "config.yaml",
        ).returncode
        == 0
    )
    try:
        checks = _doctor(dockerd=dockerd)
    finally:
        daemon_json.write_bytes(before)
    assert checks["docker"] == {
        "name": "docker",
        "status": "fail",
        "fix": "nvc-py setup docker",
        "detail": f"{daemon_json} registers no nvc-py runtime",
    }
    assert checks["dockerd"]["status"] == "fail" and "before " + str(daemon_json) in checks["dockerd"]["detail"]


# In a pid namespace of its own (whose /proc shows its processes alone): a private dockerd, with the
# containerd it starts as its child, and `nvc-py doctor --json` beside them; argv[1] the work directory.
DOCKERD_AND_DOCTOR = """
import json, os, subprocess, sys
from pathlib import Path
sys.path.insert(0, os.getcwd())
from harness.docker import Dockerd, base_config
from harness.rootfs import RootfsCache
work = Path(sys.argv[1])
daemon_json = work / "daemon.json"
daemon_json.write_text(json.dumps(base_config(work)))
env = {**os.environ, "NVC_PY_HOOK_SOCKET": "none"}
def doctor():
    return json.loads(subprocess.run([sys.argv[2], "doctor", "--json"], capture_output=True, text=True, env=env).stdout)
print(json.dumps(doctor()))
daemon = Dockerd(work, RootfsCache(work / "rootfs"), daemon_json)
try:
    print(json.dumps(doctor()))
    print(json.dumps([str(daemon.exec_root)]))
finally:
    daemon.stop()
"""


def test_doctor_fails_only_what_fails_for_the_engines_that_run(tmp_path: Path) -> None:
    """No dockerd runs: doctor fails nothing of Docker's (it says what to do for one started later).
    Where the only containerd is dockerd's own (its child, reading the configuration dockerd wrote
    under its exec root), doctor does not fail containerd for /etc/containerd/config.toml, which that
    one never reads: it says which containerd it found and whose it is."""
    done = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", DOCKERD_AND_DOCTOR, str(tmp_path), NVC_PY],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).parent,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    alone, report, found = done.stdout.strip().split("\n")
    exec_root = json.loads(found)[0]
    checks = {c["name"]: c for c in json.loads(alone)["checks"]}
    assert checks["dockerd"] == {"name": "dockerd", "status": "skip", "detail": "not running", "fix": ""}
    for name in ("docker", "docker --gpus"):
        assert checks[name]["status"] != "fail", checks[name]
    assert checks["docker --gpus"]["detail"].endswith("(nvc-py setup docker, for a dockerd started later)"), checks
    checks = {c["name"]: c for c in json.loads(report)["checks"]}
    check = checks["containerd"]
    assert check["status"] == "skip", check
    assert check["detail"].startswith("no containerd of its own runs (pid "), check
    assert (
        f"is dockerd's own, reading {exec_root}/containerd/containerd.toml); /etc/containerd/config.toml "
        "registers no nvc-py runtime (nvc-py setup containerd, for one started later)" in check["detail"]
    ), check

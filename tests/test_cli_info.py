"""``nvc-py info`` and ``nvc-py list`` end to end on the fake driver: golden outputs, global
options, and one-line errors with stable exit codes.

Goldens under tests/golden/ were generated once (NVC_UPDATE_GOLDEN=1) and checked by hand
against the machine YAMLs; the driver root's temporary path is written as ``<root>``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE = os.environ.get("NVC_UPDATE_GOLDEN") == "1"


def nvc(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the installed CLI in a child (it inherits the active fake's mount namespace)."""
    return subprocess.run([sys.executable, "-m", "nvc", *args], capture_output=True, text=True, timeout=60)


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.write_text(text)
    assert text == path.read_text(), f"{name} differs from its golden file"


GOLDEN_COMMANDS = {
    "info": ["info"],
    "info-csv": ["info", "--csv"],
    "info-json": ["info", "--json"],
    "list": ["list"],
    "list-json": ["list", "--json"],
}


@pytest.mark.parametrize(
    ("fixture", "prefix"), [("active_2gpu", "two-gpu-mig"), ("active_local_nvidia", "local-nvidia")]
)
def test_golden_outputs(fixture: str, prefix: str, request: pytest.FixtureRequest) -> None:
    fake = request.getfixturevalue(fixture)
    for name, args in GOLDEN_COMMANDS.items():
        done = nvc("--root", str(fake.root), *args)
        assert done.returncode == 0 and done.stderr == "", (args, done.stderr)
        check_golden(f"{prefix}-{name}.txt", done.stdout.replace(str(fake.root), "<root>"))


def test_info_matches_the_machine(active_2gpu) -> None:
    """The JSON schema, checked against the YAML rather than against itself."""
    doc = json.loads(nvc("--root", str(active_2gpu.root), "info", "--json").stdout)
    machine = active_2gpu.machine
    assert doc["nvrm_version"] == machine["driver_version"]
    assert doc["cuda_version"] == f"{machine['cuda_version'] // 1000}.{machine['cuda_version'] % 100 // 10}"
    assert [d["uuid"] for d in doc["devices"]] == [g["uuid"] for g in machine["gpus"]]
    assert [d["bus_id"] for d in doc["devices"]] == [g["pci_bus_id"].lower() for g in machine["gpus"]]
    migs = [m["uuid"] for d in doc["devices"] for m in d["mig_devices"]]
    assert migs == [m["uuid"] for g in machine["gpus"] for m in (g.get("mig") or {}).get("devices") or []]
    assert len(migs) == 2


def test_list_default_equals_explicit_flags(active_2gpu) -> None:
    root = str(active_2gpu.root)
    assert (
        nvc("--root", root, "list").stdout
        == nvc("--root", root, "list", "--device=all", "--compat32", "-l", "-b", "-i", "-f").stdout
    )
    # Only --imex-channel keeps the defaults, and adds the channel.
    default = json.loads(nvc("--root", root, "list", "--json").stdout)
    with_channel = json.loads(nvc("--root", root, "list", "--json", "--imex-channel=1").stdout)
    assert with_channel == {**default, "imex_channels": [f"{root}/dev/nvidia-caps-imex-channels/channel1"]}
    assert list(default) == [
        "devices",
        "mig_devices",
        "imex_channels",
        "mig_config",
        "binaries",
        "libraries",
        "libraries32",
        "ipcs",
        "firmwares",
        "loader_files",
    ]


def test_list_sections_and_flags(active_2gpu) -> None:
    root = str(active_2gpu.root)
    out = (
        nvc("--root", root, "list", "-d", "0", "--imex-channel", "1,0", "--mig-config=all", "--mig-monitor=all")
        .stdout.replace(root, "<root>")
        .splitlines()
    )
    assert out == [
        "<root>/dev/nvidiactl",
        "<root>/dev/nvidia-uvm",
        "<root>/dev/nvidia-uvm-tools",
        "<root>/dev/nvidia-modeset",
        "<root>/dev/nvidia0",
        "<root>/dev/nvidia-caps-imex-channels/channel1",
        "<root>/dev/nvidia-caps-imex-channels/channel0",
        "/proc/driver/nvidia/capabilities/mig/config",
        "<root>/dev/nvidia-caps/nvidia-cap1",
        "/proc/driver/nvidia/capabilities/mig/monitor",
        "<root>/dev/nvidia-caps/nvidia-cap2",
    ]
    assert nvc("--root", root, "list", "-f", "--no-gsp-firmware").stdout == ""
    libs = json.loads(nvc("--root", root, "list", "-l", "--json").stdout)["libraries"]
    assert libs and all("/x86_64-linux-gnu/" in p for p in libs)


def test_global_options(active_local_nvidia, tmp_path: Path) -> None:
    root = str(active_local_nvidia.root)
    log = tmp_path / "debug.log"
    log.write_text("earlier\n")
    for user in ("--user", "-u", f"--user={os.geteuid()}:{os.getegid()}", f"-u{os.geteuid()}"):
        done = nvc("--debug", str(log), user, "--root", root, "list", "-d", "0")
        assert done.returncode == 0 and done.stdout.endswith("/dev/nvidia0\n"), (user, done.stderr)
    lines = log.read_text().splitlines()
    assert lines[0] == "earlier" and len(lines) > 4
    assert all(re.match(r"^[DIWE]\d{4} \d\d:\d\d:\d\d\.\d{6} \d+ \w+\.py:\d+\] ", ln) for ln in lines[1:])
    # --ldcache is looked up inside the root.
    done = nvc("--root", root, "--ldcache", "/etc/none.cache", "list", "-l")
    assert (done.returncode, done.stderr) == (
        5,
        f"nvc-py: detection error: {root}/etc/none.cache: No such file or directory\n",
    )


def test_load_kmods_into_an_empty_root(active_2gpu, tmp_path: Path) -> None:
    """The nodes come from /proc alone (the empty root has no NVML to ask). No nvidia_modeset module is
    loaded on this host (/sys/module), so no nvidia-modeset node is made, though its major is there."""
    done = nvc("--root", str(tmp_path), "--load-kmods", "list", "-d", "1,0")
    assert done.returncode == 0, done.stderr
    assert done.stdout.replace(str(tmp_path), "<root>").splitlines() == [
        "<root>/dev/nvidiactl",
        "<root>/dev/nvidia-uvm",
        "<root>/dev/nvidia-uvm-tools",
        "<root>/dev/nvidia0",
        "<root>/dev/nvidia1",
    ]
    assert not (tmp_path / "dev/nvidia-modeset").exists()
    assert (tmp_path / "dev/nvidia-caps/nvidia-cap157").is_char_device()


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["list", "-d", "7"], 6, "device error: 7: unknown device"),
        (["list", "-d", "0:5"], 6, "device error: 0:5: unknown device"),
        (["list", "-d", "bogus"], 6, "device error: bogus: unknown device"),
        (["list", "--imex-channel", "1048576"], 2, "input error: 1048576: unsupported IMEX channel value"),
        (
            ["list", "--imex-channel", "5"],
            6,
            "device error: /dev/nvidia-caps-imex-channels/channel5: "
            "no such device node under <root> (see --load-kmods)",
        ),
        (
            ["list", "-d", "1:0", "--mig-config=all"],
            2,
            "input error: cannot enable mig-config with specific MIG devices selected",
        ),
        (["--user=abc", "list"], 2, "input error: abc: invalid user (expected UID[:GID])"),
    ],
)
def test_errors_are_one_line(active_2gpu, args: list[str], code: int, message: str) -> None:
    root = str(active_2gpu.root)
    head, tail = (args[:1], args[1:]) if args[0].startswith("--user") else ([], args)
    done = nvc(*head, "--root", root, *tail)
    assert (done.returncode, done.stdout) == (code, "")
    assert done.stderr.replace(root, "<root>") == f"nvc-py: {message}\n"


def test_no_driver(tmp_path: Path) -> None:
    """Without the fake active there is no NVIDIA driver on this machine."""
    if Path("/proc/driver/nvidia").exists():
        pytest.skip("a real NVIDIA driver is loaded")
    # a package's user may have no source tree: it says where the fake driver is
    try_it = (
        "; to try nvc-py without a GPU, run `make try` in a copy of nvc-py's source (its fake driver is in the "
        "source, not installed)\n"
    )
    done = nvc("--root", str(tmp_path), "info")
    assert done.returncode == 3 and done.stdout == ""
    assert done.stderr.startswith(
        "nvc-py: initialization error: no NVIDIA driver is loaded on this host (load library "
        "failed: libnvidia-ml.so.1: "
    )
    assert done.stderr.endswith(try_it) and done.stderr.count("\n") == 1
    done = nvc("--root", str(tmp_path), "list")
    assert (done.returncode, done.stderr) == (
        3,
        "nvc-py: initialization error: no NVIDIA driver is loaded on this host (/proc/driver/nvidia/version: not "
        "found: the NVIDIA kernel driver is not loaded)" + try_it,
    )
    done = nvc("--root", "relative", "list")
    assert done.returncode == 2 and "invalid driver root" in done.stderr


def _plain(*words: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """``nvc-py WORDS…`` under ``-X importtime``: the run and the modules it imported."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "nvc", *words], capture_output=True, text=True, timeout=60
    )
    lines = done.stderr.splitlines(keepends=True)
    done.stderr = "".join(line for line in lines if not line.startswith("import time:"))
    return done, {line.rsplit("|", 1)[-1].strip() for line in lines if line.startswith("import time:")}


# The CLI's click path whatever the command line (nvc.commands.cli.main), for comparison.
_CLICK = "import sys; from nvc.commands.cli import main; sys.exit(main(sys.argv[1:]))"


def _plain_forms(root: str) -> list[list[str]]:
    """Command lines nvc.commands.plain runs: ``info`` (in its formats) and ``list``, after the global
    options it reads, in each spelling."""
    return [
        ["info"],
        ["info", "--csv"],
        ["info", "--json"],
        ["list"],
        ["--root", root, "info"],
        [f"--root={root}", "info", "--json"],
        ["-r", root, "list"],
        ["--ldcache", "/etc/ld.so.cache", "-r", root, "info", "--csv"],
        ["-l", "/etc/ld.so.cache", "list"],
        ["--ldcache=/etc/ld.so.cache", "info"],
        ["-u", "info"],
        ["--user=65534:65534", "--root", root, "info"],
        ["-d", "/dev/null", "info"],
        ["--debug=/dev/null", "-r", root, "list"],
        ["-k", "--root", root, "info", "--json"],
        ["--load-kmods", "list"],
    ]


# Command lines left to click: other options, other spellings, an option twice.
_CLICK_FORMS = [
    ["--version"],
    ["info", "--csv", "--json"],
    ["list", "--json"],
    ["-r=/", "info"],
    ["--root", "/", "--root", "/", "info"],
    ["-d", "/dev/null", "--debug=/dev/null", "info"],
    ["-k", "-k", "info"],
    ["--load-kmods=yes", "list"],
    ["--user", "1000", "info"],
    ["--root", "--json", "info"],
]


def _warm_up(root: str) -> None:
    """One ``list`` through click first: the driver's file lists, read from its ELF files (pyelftools,
    which imports typing) where /run/nvc-py keeps none for this driver yet, are kept for the runs after."""
    subprocess.run([sys.executable, "-c", _CLICK, "--root", root, "list"], capture_output=True, timeout=60)


@pytest.mark.parametrize("driver", ["fake", "none"])
def test_info_and_list_answer_as_the_cli_without_click(
    driver: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``nvc-py info`` and ``list``, ``info --csv`` and ``--json``, after ``--root``, ``--ldcache``,
    ``--user``, ``--debug`` and ``--load-kmods`` in their spellings, run without click (nvc.commands.plain) and print what the CLI's click
    path prints for the same words: output, or the error line and status where no driver is loaded. Any
    other command line is click's."""
    if driver == "none" and Path("/proc/driver/nvidia").exists():
        pytest.skip("a real NVIDIA driver is loaded")
    root = str(request.getfixturevalue("active_2gpu").root) if driver == "fake" else str(tmp_path)
    config = tmp_path / "config.yaml"
    config.write_text(f"root: {root}\n")
    monkeypatch.setenv("NVC_PY_CONFIG", str(config))
    _warm_up(root)
    for words in _plain_forms(root) + _CLICK_FORMS:
        plain, imported = _plain(*words)
        parsed = subprocess.run([sys.executable, "-c", _CLICK, *words], capture_output=True, text=True, timeout=60)
        assert (plain.returncode, plain.stdout, plain.stderr) == (parsed.returncode, parsed.stdout, parsed.stderr)
        if words in _CLICK_FORMS:
            assert "click" in imported, words
            continue
        assert plain.returncode == (0 if driver == "fake" else 3), (words, plain.stderr)
        assert "nvc.commands.plain" in imported and not {"click", "nvc.commands.cli", "typing"} & imported, words


def test_a_debug_log_without_click_is_the_clis(active_2gpu, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--debug FILE`` before ``info`` or ``list`` without click logs the messages the CLI's click path
    logs, and a debug log that cannot be opened is the same error, before anything else is done."""
    monkeypatch.setenv("NVC_PY_CONFIG", str(tmp_path / "none.yaml"))
    root = str(active_2gpu.root)
    _warm_up(root)  # else the first run's log has what reading the driver's files found, the second's not
    for command in ("info", "list"):
        logs = {}
        for way, argv in (("plain", ["-m", "nvc"]), ("click", ["-c", _CLICK])):
            log = tmp_path / f"{way}-{command}.log"
            done = subprocess.run(
                [sys.executable, *argv, "--debug", str(log), "-r", root, command],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 0, done.stderr
            logs[way] = [line.split("] ", 1)[1] for line in log.read_text().splitlines()]
        assert logs["plain"] == logs["click"] and logs["plain"], command
    missing = str(tmp_path / "no" / "such.log")
    words = ["-d", missing, "-r", root, "info"]
    plain, imported = _plain(*words)
    parsed = subprocess.run([sys.executable, "-c", _CLICK, *words], capture_output=True, text=True, timeout=60)
    assert (plain.returncode, plain.stdout, plain.stderr) == (parsed.returncode, parsed.stdout, parsed.stderr)
    assert plain.returncode == 2 and missing in plain.stderr and "click" not in imported


def test_list_nvml_flag_asks_nvml_for_the_same_listing(active_local_nvidia, tmp_path: Path) -> None:
    """``list --nvml`` (bench/discovery.py's forced NVML path) answers as the /proc fast path does."""
    root = str(active_local_nvidia.root)
    fast, forced = tmp_path / "fast.log", tmp_path / "forced.log"
    plain = nvc("--root", root, "--debug", str(fast), "list")
    with_nvml = nvc("--root", root, "--debug", str(forced), "list", "--nvml")
    assert plain.returncode == with_nvml.returncode == 0
    assert plain.stdout == with_nvml.stdout
    assert "inventory from /proc" in fast.read_text() and "inventory from NVML" not in fast.read_text()
    assert "inventory from NVML" in forced.read_text()

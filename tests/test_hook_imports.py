"""The direct hook (no server) imports only what its call needs, on the fake driver.

Where no server answers, every container start pays for the hook's interpreter start and
imports; these tests keep out what the direct path once paid for without needing it. The
installed launcher runs under ``-X importtime`` as runc's prestart hook of a real container
(GPU 0, and a container asking for none), so the modules its forked helpers import count too; and
so does nvc-py-runtime's, rewriting a GPU create's spec.

Nor does the direct path import typing (some 2.5 ms of a start on the CPU test host): its records
derive from nvc.records.NamedTuple, and its modules import typing's names for type checkers only
(``TYPE_CHECKING = False``, then ``if TYPE_CHECKING:``; docs/development.md).

The hook's own process, which plans while its helpers start, leaves to them what only they use (their
confinement, python-prctl, socket's wrapper): the modules it holds at its exit are recorded. A hook
server, in turn, has imported everything any process of such a call imports before it forks a worker,
so that no served call's helper imports on the call's path.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from harness.bundle import make_bundle
from harness.hookserver import LIBDIR, hook_server

LAUNCHER = LIBDIR / "nvc-py-hook-python"
# Never on the direct hook's path: the CLI's parser, YAML, ELF parsing, NVML, logging's set-up,
# site's .pth files, and dataclasses (with inspect, ast and dis it imports; the hook's records are
# named tuples: making dozens of dataclasses at import slowed the direct hook down), and the
# Kubernetes device plugin's gRPC, protobuf and modules; nor, in the hook's helpers, pyseccomp (with
# ctypes.util, which runs ``ldconfig -p`` twice): ldconfig's filter comes compiled from root's cache
# once a start has made it; nor the exporter's prometheus_client; nor pathlib, with the urllib.parse and
# ipaddress it imports (discovery joins its /proc and driver paths with os.path), nor fnmatch; nor, for a
# container that asks for no NVIDIA_REQUIRE_*, the requirements' grammar; nor typing.
NEVER = frozenset(
    {
        "typing",
        "nvc.plan.requirements",
        "pathlib",
        "urllib.parse",
        "ipaddress",
        "fnmatch",
        "click",
        "yaml",
        "elftools",
        "pynvml",
        "logging",
        "site",
        "dataclasses",
        "inspect",
        "grpc",
        "google.protobuf",
        "nvc.k8s",
        "nvc.rpc.nvml_events",
        "pyseccomp",
        "ctypes.util",
        "nvc.exporter",
        "prometheus_client",
    }
)
# A container asking for no GPU is answered before any of configure's machinery loads.
NEVER_WITHOUT_GPU = NEVER | {
    "nvc.pipeline.configure",
    "nvc.plan.mountplan",
    "nvc.plan.operations",
    "nvc.rpc.helper",
    "ctypes",
    "socket",
    "subprocess",
    "shutil",
    "tempfile",
}


def _imported(stderr: str) -> set[str]:
    return {m[1] for m in re.finditer(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$", stderr, re.MULTILINE)}


def _direct_hook(fixtures: tuple, tmp_path: Path, env: dict[str, str], outcome: str, flag: str) -> str:
    """The installed launcher as runc's prestart hook of a container with ``env``, under the
    interpreter's ``flag`` (its stderr returned), twice: the first start after a configuration change
    parses its YAML (then cached by text), and the first after a boot compiles ldconfig's filter."""
    driver, runc, rootfs = fixtures
    interpreter, flags = LAUNCHER.read_text().splitlines()[0][2:].split(" ", 1)
    assert flags == "-IS"  # isolated, without site
    config, log, err = tmp_path / "config.yaml", tmp_path / "hook.log", tmp_path / "hook.err"
    config.write_text(f"root: {driver.root}\nlog: {{file: {log}}}\n")  # otherwise the defaults
    wrapper = tmp_path / "hook.sh"  # runc shows a hook's stderr only when it fails
    wrapper.write_text(f'#!/bin/sh\nexec {interpreter} {flags} {flag} {LAUNCHER} "$@" 2>{err}\n')
    wrapper.chmod(0o755)
    hook = {
        "path": str(wrapper),
        "args": ["hook.sh", "prestart"],
        "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin", f"NVC_PY_CONFIG={config}", "NVC_PY_HOOK_SOCKET=none"],
    }
    bundle = make_bundle(tmp_path / "bundle", rootfs, ["true"], env=env, hooks={"prestart": [hook]})
    for _ in range(2):
        result = runc.run(bundle)
        assert result.returncode == 0, (result.stderr, err.read_text())
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(line["outcome"], "via" in line) for line in lines] == [(outcome, False)] * 2
    return err.read_text()


@pytest.mark.parametrize(
    ("env", "outcome", "never"),
    [({"NVIDIA_VISIBLE_DEVICES": "0"}, "configured", NEVER), ({}, "no-gpu", NEVER_WITHOUT_GPU)],
    ids=["gpu", "no-gpu"],
)
def test_direct_hook_imports_only_what_the_call_needs(
    active_2gpu, runc, debian_rootfs: Path, tmp_path: Path, env: dict[str, str], outcome: str, never: frozenset[str]
) -> None:
    imported = _imported(_direct_hook((active_2gpu, runc, debian_rootfs), tmp_path, env, outcome, "-X importtime"))
    assert "nvc.hook.oci.prestart" in imported  # the profile is the hook's
    assert imported & never == set()


# What only the direct hook's helpers need (the container helper's and ldconfig sandbox's confinement,
# with python-prctl and resource), socket's wrapper (the helpers' protocol needs only _socket), and
# importlib's package (with warnings): imported by the hook's own process, they would add to every
# start without a server, where the helpers import theirs while it plans.
HELPERS_OWN = frozenset({"nvc.system.confinement", "prctl", "resource", "socket", "selectors", "importlib", "warnings"})
_RECORD_MODULES = """import os, sys
pid, end = os.getpid(), os._exit
def record(code):
    if os.getpid() == pid:
        with open({out!r}, "w") as file:
            file.write("\\n".join(sorted(sys.modules)))
    end(code)
os._exit = record
sys.argv = sys.argv[1:]
exec(compile(open(sys.argv[0]).read(), sys.argv[0], "exec"), {{"__name__": "__main__"}})
"""


def test_direct_hooks_own_process_leaves_its_helpers_modules_to_them(
    active_2gpu, runc, debian_rootfs: Path, tmp_path: Path
) -> None:
    """The process that plans a GPU container's configuration (the launcher's, run as the hook by runc:
    the modules it holds when it exits) forks the container helper and ldconfig's sandbox but imports
    none of what only they use."""
    out = tmp_path / "modules.txt"
    prelude = tmp_path / "record.py"
    prelude.write_text(_RECORD_MODULES.format(out=str(out)))
    _direct_hook(
        (active_2gpu, runc, debian_rootfs), tmp_path, {"NVIDIA_VISIBLE_DEVICES": "0"}, "configured", str(prelude)
    )
    modules = set(out.read_text().split("\n"))
    assert {"nvc.pipeline.configure", "nvc.rpc.container_service", "nvc.apply.ldconfig"} <= modules
    assert modules & HELPERS_OWN == set()


def test_a_server_has_imported_every_module_a_gpu_call_imports_in_any_of_its_processes(
    active_2gpu, runc, debian_rootfs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a direct GPU call imports, in its own process or in its helpers and ldconfig's sandbox, a
    hook server started by the installed launcher has imported by the time it listens (its program,
    its preload, its warm-up): a served call's worker and the helpers it forks import nothing on the
    call's path. The server's modules are those it holds when SIGTERM ends it."""
    imported = _imported(
        _direct_hook(
            (active_2gpu, runc, debian_rootfs), tmp_path, {"NVIDIA_VISIBLE_DEVICES": "0"}, "configured", "-X importtime"
        )
    )
    out, prelude = tmp_path / "server-modules.txt", tmp_path / "record.py"
    prelude.write_text(_RECORD_MODULES.format(out=str(out)))
    interpreter, flags = LAUNCHER.read_text().splitlines()[0][2:].split(" ", 1)
    monkeypatch.setenv("NVC_PY_CONFIG", str(tmp_path / "config.yaml"))  # _direct_hook's: the fake driver's root
    with hook_server(LAUNCHER, tmp_path / "run" / "hook.sock", wrapper=(interpreter, flags, str(prelude))):
        pass
    served = set(out.read_text().split("\n"))
    assert "nvc.hook.server.loop" in served
    assert imported - served == set()


def test_direct_hook_takes_its_modules_from_the_code_cache(
    active_2gpu, runc, debian_rootfs: Path, tmp_path: Path
) -> None:
    """Every source module a direct GPU hook call imports once the launcher mapped the cache comes
    from it (nvc/system/codecache.py): install wrote it with all a call imports."""
    verbose = _direct_hook(
        (active_2gpu, runc, debian_rootfs), tmp_path, {"NVIDIA_VISIBLE_DEVICES": "0"}, "configured", "-v"
    )
    loaders = dict(re.findall(r"^import '([\w.]+)' # <(\S+)", verbose, re.MULTILINE))
    after = list(loaders)[list(loaders).index("nvc.system.codecache") + 1 :]
    assert "nvc.hook.oci.prestart" in after and "nvc.pipeline.configure" in after
    from_sources = [name for name in after if loaders[name].endswith("SourceFileLoader")]
    assert from_sources == [], from_sources
    assert {loaders[name] for name in after if name.startswith("nvc.")} == {"nvc.system.codecache._CachedLoader"}


def test_runtime_wrappers_gpu_create_imports_only_what_it_needs(active_2gpu, tmp_path: Path) -> None:
    """nvc-py-runtime's program rewriting a GPU create's spec with no server (then executing the runtime)
    keeps out what the direct hook keeps out, typing too, but fnmatch: it finds the runtime with
    shutil.which."""
    launcher = LIBDIR / "nvc-py-runtime-python"
    interpreter, flags = launcher.read_text().splitlines()[0][2:].split(" ", 1)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    spec = {
        "ociVersion": "1.0.2",
        "root": {"path": "rootfs"},
        "process": {"args": ["/bin/true"], "cwd": "/", "env": ["NVIDIA_VISIBLE_DEVICES=0"]},
    }
    (bundle / "config.json").write_text(json.dumps(spec))
    config = tmp_path / "config.yaml"
    config.write_text(f"root: {active_2gpu.root}\nruntimes: [/bin/true]\n")
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "NVC_PY_CONFIG": str(config), "NVC_PY_HOOK_SOCKET": "none"}
    for _ in range(2):  # the first call after a configuration change parses its YAML (then cached by text)
        (bundle / "config.json").write_text(json.dumps(spec))
        result = subprocess.run(
            [interpreter, *flags.split(), "-X", "importtime", str(launcher), "create", "--bundle", str(bundle), "c1"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr[-2000:]
    rewritten = json.loads((bundle / "config.json").read_text())
    assert "/dev/nvidia0" in {d["path"] for d in rewritten["linux"]["devices"]}  # the GPU create's path
    imported = _imported(result.stderr)
    assert "nvc.hook.oci.runtime" in imported
    assert imported & (NEVER - {"fnmatch"}) == set()

"""What the hook server runs: only the hook's commands and read-only ones; and the caller's Python
environment (PYTHONPATH, PYTHONHOME, PYTHONSTARTUP) reaches neither the server, the front, the hook
nor the runtime.

Every server here runs in the test's private mount namespace with its socket in the test's temporary
directory; the on-demand ones are told (NVC_PY_HOST_PID) that this test process stands for the
host, and are killed at the end of their test.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.hookcalls import call_directly
from harness.hookfixtures import served  # noqa: F401  (fixtures)
from harness.hookserver import LIBDIR
from harness.installed import HOOK
from harness.ondemand import (
    log_lines,
    no_gpu_state,  # noqa: F401  (fixture)
    prestart,
)
from nvc.hook.server import handover


@pytest.mark.parametrize(
    "argv",
    [
        ["/x/nvc-py", "setup", "podman", "--hooks-dir", "{tmp}/hooks.d"],
        ["/x/nvc-py", "--root", "/", "config", "show"],
        ["/x/nvc-py", "share", "status"],
        ["/x/nvc-py", "-V"],
        ["/x/nvc-py", "--bogus", "info"],
        ["/x/nvc-py", "--root", "/", "hook", "prestart"],
        ["/x/nvc-py-hook", "bogus"],
        ["/x/nvc-py-runtime", "--root", "{tmp}/state", "delete", "c1"],
    ],
    ids=["setup", "config", "share", "version", "unknown-option", "cli-hook", "hook-usage", "runtime-delete"],
)
def test_the_server_runs_only_the_hook_and_read_only_commands(served: Path, tmp_path: Path, argv: list[str]) -> None:
    """Anything but the hook's stages, configure/info/list and nvc-py-runtime's create is the caller's to
    run, as itself."""
    answers, err = call_directly(served, [word.format(tmp=tmp_path) for word in argv])
    assert (answers, err) == ([b"fall back"], "")
    assert not (tmp_path / "hooks.d").exists()


def test_the_server_runs_list_info_and_the_hook(active_2gpu, served: Path) -> None:
    root = str(active_2gpu.root)
    for argv in (
        ["/x/nvc-py", "-r", root, "list"],
        ["/x/nvc-py", f"--root={root}", "info", "--csv"],
        ["/x/nvc-py-hook", "poststart"],
    ):
        assert call_directly(served, argv) == ([b"ready", b"exit 0"], ""), argv


SHADOWS = ("json", "yaml", "click", "elftools", "nvc")


@pytest.fixture
def hostile_python_env(tmp_path: Path) -> Iterator[tuple[dict[str, str], Path]]:
    """A caller's environment whose PYTHONPATH holds modules named like nvc-py's imports (each leaves
    a marker when imported), with PYTHONHOME and PYTHONSTARTUP that would break or hijack Python."""
    evil, marker = tmp_path / "evil", tmp_path / "imported"
    for name in SHADOWS:
        (evil / name).mkdir(parents=True)
        (evil / name / "__init__.py").write_text(f"open({str(marker)!r}, 'a').write({name!r} + '\\n')\n")
    (tmp_path / "startup.py").write_text(f"open({str(marker)!r}, 'a').write('startup\\n')\n")
    yield (
        {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "PYTHONPATH": str(evil),
            "PYTHONHOME": str(evil),
            "PYTHONSTARTUP": str(tmp_path / "startup.py"),
            "PYTHONUSERBASE": str(evil),
        },
        marker,
    )


@pytest.mark.parametrize("how", ["front-served", "front-direct", "python-program"])
def test_pythonpath_of_the_caller_is_never_imported(active_2gpu, served: Path, hostile_python_env, how: str) -> None:
    env, marker = hostile_python_env
    env = {**env, handover.SOCKET_ENV: str(served) if how == "front-served" else str(served) + ".absent"}
    program = LIBDIR / ("nvc-py-python" if how == "python-program" else "nvc-py")
    result = subprocess.run(
        [str(program), "--root", str(active_2gpu.root), "info", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert (result.returncode, result.stderr) == (0, "")
    assert json.loads(result.stdout)["devices"]
    assert not marker.exists(), marker.read_text()


def test_pythonpath_reaches_neither_the_hook_nor_the_runtime(no_gpu_state, hostile_python_env) -> None:
    (env, bundle), (hostile, marker) = no_gpu_state, hostile_python_env
    hook = prestart({**env, **hostile, "NVC_PY_HOST_PID": "0"}, bundle, "hostile")  # no server: the Python hook
    assert (hook.returncode, hook.stderr) == (0, "") and "via" not in log_lines(env)[-1]
    for program in (LIBDIR / "nvc-py-runtime", HOOK.with_name("nvc-py-runtime")):  # the console script links to it
        runtime = subprocess.run(
            [str(program), "--version"],
            capture_output=True,
            text=True,
            env={**hostile, "NVC_PY_CONFIG": env["NVC_PY_CONFIG"]},
            timeout=60,
        )
        assert runtime.returncode == 0 and "version" in runtime.stdout, runtime.stderr
        assert (LIBDIR / "nvc-py-runtime-python").read_text().splitlines()[0].endswith(" -IS")
    assert not marker.exists(), marker.read_text()

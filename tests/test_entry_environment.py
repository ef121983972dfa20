"""No variable of a caller's that steers the dynamic loader, libc or Python reaches a root entry point of
nvc-py, before or after its restart, nor a program it starts (CVE-2025-23266's class): each installed
program is started as an engine that dropped the hook's explicit ``env`` would start it, with an image's
or an administrator's LD_PRELOAD, LD_LIBRARY_PATH, GCONV_PATH, GLIBC_TUNABLES, PYTHONPATH (with a
sitecustomize), PYTHONHOME, PYTHONSTARTUP and PYTHONUSERBASE (with a usercustomize). The one exception
is the runtime nvc-py-runtime executes: it gets the engine's environment whole, as without the wrapper."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.hookserver import LIBDIR
from harness.installed import SCRIPTS
from harness.markerlib import build_marker_library
from nvc.system.loaderenv import is_unsafe

# A library the interpreter loads once running (behind ctypes); one it links (libz) would end it at its
# start, before any constructor ran (the interpreter binds every symbol at load).
SHADOWED = ("libffi.so.8",)
ENTRY_POINTS = {
    "hook": [LIBDIR / "nvc-py-hook", "prestart"],
    "cdi-hook": [LIBDIR / "nvc-py-hook", "update-ldcache", "--folder", "/nonexistent"],
    "runtime": [LIBDIR / "nvc-py-runtime", "create", "--bundle", "/nonexistent", "c1"],  # no runtime runs
    "cli": [LIBDIR / "nvc-py", "--version"],
    "client": [LIBDIR / "nvc-py-hook-client", LIBDIR / "nvc-py-hook-python", "poststart"],
}
HARMLESS = {
    "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "HOME": "/root",
    "LDX": "kept",
    "XLD_PRELOAD": "kept",
    "MY_PYTHONPATH": "kept",
}


@pytest.fixture
def hostile_env(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """The environment, and the marker file any of its code writes when it runs."""
    marker, evil = tmp_path / "ran", tmp_path / "evil"
    evil.mkdir()
    for soname in ("preload.so", *SHADOWED):
        build_marker_library(evil / soname, marker, soname)
    write = f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\n"
    (evil / "sitecustomize.py").write_text(write)
    (evil / "startup.py").write_text(write)
    user_site = tmp_path / "user" / f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
    user_site.mkdir(parents=True)
    (user_site / "usercustomize.py").write_text(write)
    return {
        **HARMLESS,
        "LD_PRELOAD": str(evil / "preload.so"),
        "LD_LIBRARY_PATH": str(evil),
        "GCONV_PATH": str(evil),
        "GLIBC_TUNABLES": "glibc.malloc.check=0",
        "PYTHONPATH": str(evil),
        "PYTHONHOME": str(evil),
        "PYTHONSTARTUP": str(evil / "startup.py"),
        "PYTHONUSERBASE": str(tmp_path / "user"),
        "NVC_PY_HOOK_SOCKET": "none",
    }, marker


@pytest.mark.parametrize("argv", ENTRY_POINTS.values(), ids=ENTRY_POINTS.keys())
def test_no_caller_code_runs_in_an_entry_point(hostile_env: tuple[dict[str, str], Path], argv: list) -> None:
    env, marker = hostile_env
    result = subprocess.run(
        [str(word) for word in argv], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60
    )
    assert not marker.exists(), marker.read_text()
    assert "Traceback" not in result.stderr and "error while loading" not in result.stderr, result.stderr
    assert result.returncode >= 0 and result.returncode != 127, result.stderr


def _dumper(tmp_path: Path) -> tuple[Path, Path]:
    """A program that writes the environment it got (its names) to a file."""
    program, dump = tmp_path / "dump-env", tmp_path / "env"
    program.write_text(f"#!/bin/sh\nenv -0 > {dump}\n")
    program.chmod(0o755)
    return program, dump


def _names(dump: Path) -> set[str]:
    return {entry.split("=", 1)[0] for entry in dump.read_text().split("\0") if entry}


def test_the_front_drops_what_the_python_programs_drop(
    hostile_env: tuple[dict[str, str], Path], tmp_path: Path
) -> None:
    """The front, compiled with nvc/system/unsafe-environment.list, keeps exactly what nvc.system.loaderenv keeps."""
    env, marker = hostile_env
    env = {**env, "LD_BIND_NOW": "1", "PYTHONINSPECT": "1", "MALLOC_TRACE": str(tmp_path / "trace"), "TZDIR": "/x"}
    program, dump = _dumper(tmp_path)
    result = subprocess.run(
        [str(LIBDIR / "nvc-py-hook-client"), str(program)], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert _names(dump) - {"PWD"} == {name for name in env if not is_unsafe(name)}
    assert set(HARMLESS) <= _names(dump) and not marker.exists()


@pytest.mark.parametrize("args", [["state", "c1"], ["--version"]], ids=["passed through", "the program"])
def test_the_runtime_gets_the_callers_environment_whole(
    hostile_env: tuple[dict[str, str], Path], tmp_path: Path, args: list[str]
) -> None:
    """runc, started by nvc-py-runtime, gets the engine's environment as it would without the wrapper (an
    engine's, not a container's), the variables the front and the Python program ran without included, while
    neither of them loaded the LD_PRELOAD library: only the runtime's own processes did."""
    env, marker = hostile_env
    program, dump = _dumper(tmp_path)
    config = tmp_path / "config.yaml"
    config.write_text(f"runtimes: [{program}]\n")
    env = {**env, "NVC_PY_CONFIG": str(config)}
    for _ in range(2):  # the first call of a pass-through command writes the runtime cache
        dump.unlink(missing_ok=True)
        result = subprocess.run(
            [str(LIBDIR / "nvc-py-runtime"), *args], env=env, capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, result.stderr
        got = dict(entry.split("=", 1) for entry in dump.read_text().split("\0") if entry)
        assert {name: value for name, value in got.items() if name != "PWD"} == env
    runtime_programs = {os.path.realpath("/bin/sh"), os.path.realpath(shutil.which("env") or "env")}
    loaded_in = {line.split()[2] for line in marker.read_text().splitlines()}
    assert loaded_in and loaded_in <= runtime_programs, loaded_in


def test_every_installed_command_is_a_front_of_an_isolated_program() -> None:
    """pip makes no console script (it would run an interpreter the caller steers); the commands in the
    scripts directory link to the fronts, each of which runs an interpreter isolated from the environment."""
    distribution = importlib.metadata.distribution("nvc-py")
    assert [e for e in distribution.entry_points if e.group == "console_scripts"] == []
    for name in ("nvc-py", "nvc-py-hook", "nvc-py-runtime"):
        assert os.readlink(SCRIPTS / name) == str(LIBDIR / name)
        assert (LIBDIR / name).read_bytes()[:4] == b"\x7fELF"
        assert (LIBDIR / f"{name}-python").read_text().splitlines()[0].endswith(" -IS")

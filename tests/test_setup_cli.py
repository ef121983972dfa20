"""What a user touches besides containers: bad paths and configuration files given to setup, cdi
and config (one line, exit code 2, nothing written), ``setup ... --remove``, the configuration's
``root`` for every driver command, and the ``--help``/``--version`` of nvc-py-hook and nvc-py-runtime.

Everything runs the installed programs, in temporary directories (the ``--hooks-dir``,
``--unit-dir``, ``--drop-in`` ... options), never at the host's own paths.
"""

from __future__ import annotations

import os
import subprocess
import sysconfig
from pathlib import Path

import pytest

from nvc import __version__
from nvc.errors import InputError

SCRIPTS = Path(sysconfig.get_path("scripts"))
NVC_PY = str(SCRIPTS / "nvc-py")
HOOK = str(SCRIPTS / "nvc-py-hook")
RUNTIME = str(SCRIPTS / "nvc-py-runtime")
HOOK_FILES = ("oci-nvc-py-hook.json", "oci-nvc-py-poststop.json")
UNITS = ("nvc-py-hook.socket", "nvc-py-hook.service")


def run(*argv: str, env: dict[str, str] | None = None, **kwargs) -> subprocess.CompletedProcess[str]:  # noqa: ANN003
    return subprocess.run(
        [NVC_PY, *argv], capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})}, **kwargs
    )


def assert_refused(result: subprocess.CompletedProcess[str], line: str) -> None:
    """Exit code 2 and exactly ``line`` on stderr, nothing on stdout."""
    assert (result.returncode, result.stderr, result.stdout) == (InputError.exit_code, line + "\n", "")


def tree(path: Path) -> list[str]:
    """Every entry under ``path`` (temporary files included), relative."""
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(f"log: {{file: {tmp_path / 'hook.log'}}}\n")
    return path


# --- bad paths: one line naming the path and the reason, exit 2, nothing written ----------------------


def test_hooks_dir_that_cannot_be_created(config_file: Path) -> None:
    assert_refused(
        run("setup", "podman", "--hooks-dir", "/proc/nope", "--config", str(config_file), "--no-server"),
        "nvc-py: input error: /proc/nope: cannot create directory: No such file or directory",
    )


def test_hooks_dir_that_is_a_file(tmp_path: Path, config_file: Path) -> None:
    a_file = tmp_path / "hooks.d"
    a_file.write_text("mine\n")
    before = tree(tmp_path)
    assert_refused(
        run("setup", "podman", "--hooks-dir", str(a_file), "--config", str(config_file), "--no-server"),
        f"nvc-py: input error: {a_file}: not a directory (cannot write {a_file}/oci-nvc-py-hook.json)",
    )
    assert tree(tmp_path) == before and a_file.read_text() == "mine\n"


def test_second_hooks_file_unwritable_leaves_the_first_unwritten(tmp_path: Path, config_file: Path) -> None:
    """The poststop file's place is a directory: neither file is written, no temporary file stays."""
    hooks = tmp_path / "hooks.d"
    (hooks / HOOK_FILES[1]).mkdir(parents=True)
    result = run("setup", "podman", "--hooks-dir", str(hooks), "--config", str(config_file), "--no-server")
    assert_refused(result, f"nvc-py: input error: {hooks / HOOK_FILES[1]}: cannot write: Is a directory")
    assert tree(hooks) == [HOOK_FILES[1]]


def test_unit_dir_that_cannot_be_created(config_file: Path) -> None:
    assert_refused(
        run("setup", "server", "--unit-dir", "/proc/nope", "--config", str(config_file)),
        "nvc-py: input error: /proc/nope: cannot create directory: No such file or directory",
    )


def test_containerd_drop_in_that_cannot_be_written(tmp_path: Path) -> None:
    main = tmp_path / "config.toml"
    main.write_text("version = 2\n")
    result = run(
        "setup",
        "containerd",
        "--config",
        str(main),
        "--drop-in",
        "/proc/nope/99-nvc-py.toml",
        "--no-server",
        env={"NVC_PY_CONFIG": str(tmp_path / "nvc.yaml")},
    )
    assert_refused(result, "nvc-py: input error: /proc/nope: cannot create directory: No such file or directory")
    assert main.read_text() == "version = 2\n" and tree(tmp_path) == ["config.toml"]


def test_cdi_output_that_cannot_be_written(active_2gpu, tmp_path: Path) -> None:
    assert_refused(
        run("--root", str(active_2gpu.root), "cdi", "generate", "--output", "/proc/nope/x.yaml"),
        "nvc-py: input error: /proc/nope: cannot create directory: No such file or directory",
    )
    (tmp_path / "x.yaml").mkdir()
    assert_refused(
        run("--root", str(active_2gpu.root), "cdi", "generate", "--output", str(tmp_path / "x.yaml")),
        f"nvc-py: input error: {tmp_path / 'x.yaml'}: cannot write: Is a directory",
    )
    assert tree(tmp_path) == ["x.yaml"]


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["-d", "/proc/nope/debug.log", "config", "show"],
            "/proc/nope/debug.log: cannot open debug log: No such file or directory",
        ),
        (["share", "status", "--state-dir", "/etc/hostname"], "/etc/hostname: not a directory"),
        (
            ["setup", "containerd", "--config", "/etc", "--drop-in", "{tmp}/99-nvc-py.toml"],
            "/etc: is a directory, not a regular file",
        ),
        (
            ["setup", "containerd", "--config", "{tmp}/new/config.toml", "--drop-in", "/proc/nope/99-nvc-py.toml"],
            "/proc/nope: cannot create directory: No such file or directory",
        ),
        (["config", "show", "--file", "relative-missing.yaml"], "relative-missing.yaml: no such configuration file"),
        (
            ["config", "show", "--file", "/etc"],
            "/etc: not a regular file (a configuration file must be a regular file of at most 1048576 bytes)",
        ),
        (
            ["--root", "/nonexistent", "info"],
            "/nonexistent: invalid driver root (must be an absolute path to a directory)",
        ),
    ],
    ids=[
        "debug-log",
        "share-state-dir",
        "containerd-config-dir",
        "containerd-drop-in",
        "config-relative",
        "config-dir",
        "root",
    ],
)
def test_other_bad_paths(tmp_path: Path, argv: list[str], line: str) -> None:
    result = run(
        *(word.format(tmp=tmp_path) for word in argv), cwd=tmp_path, env={"NVC_PY_CONFIG": str(tmp_path / "nvc.yaml")}
    )
    assert_refused(result, f"nvc-py: input error: {line.format(tmp=tmp_path)}")
    assert tree(tmp_path) == []


# --- configuration files given by the user ---------------------------------------------------------


def test_config_show_of_a_missing_file_is_an_error(tmp_path: Path) -> None:
    assert_refused(
        run("config", "show", "--file", str(tmp_path / "missing.yaml")),
        f"nvc-py: input error: {tmp_path / 'missing.yaml'}: no such configuration file",
    )
    assert run("config", "show", env={"NVC_PY_CONFIG": str(tmp_path / "missing.yaml")}).stdout.startswith(
        "# effective nvc-py configuration from built-in defaults"
    )  # the default file may be absent


@pytest.mark.parametrize(
    "command",
    [
        ["setup", "podman", "--hooks-dir", "{tmp}/hooks.d", "--no-server"],
        ["setup", "server", "--unit-dir", "{tmp}/units"],
        ["--root", "/", "cdi", "generate", "--output", "{tmp}/cdi.yaml"],
    ],
    ids=["podman", "server", "cdi"],
)
@pytest.mark.parametrize(
    ("given", "reason"),
    [
        ("config.yaml", "--config must be an absolute path (the hooks read it from elsewhere)"),
        ("{tmp}/missing.yaml", "no such configuration file"),
        ("{tmp}/bad.yaml", "bogus: unknown key"),
    ],
    ids=["relative", "missing", "invalid"],
)
def test_setup_config_that_hooks_could_not_read_is_refused(
    tmp_path: Path, command: list[str], given: str, reason: str
) -> None:
    (tmp_path / "bad.yaml").write_text("bogus: 1\n")
    given = given.format(tmp=tmp_path)
    result = run(*(word.format(tmp=tmp_path) for word in command), "--config", given, cwd=tmp_path)
    assert result.returncode == InputError.exit_code and result.stdout == ""
    assert result.stderr.startswith(f"nvc-py: input error: {given}: ") and reason in result.stderr
    assert result.stderr.count("\n") == 1
    assert tree(tmp_path) == ["bad.yaml"]


def test_every_driver_command_reads_the_configured_root(active_2gpu, tmp_path: Path) -> None:
    """info, list, cdi generate and configure --dry-run without --root: the configuration's root,
    the same answers as with --root; --root given wins over the file."""
    root = str(active_2gpu.root)
    config = tmp_path / "config.yaml"
    config.write_text(f"root: {root}\n")
    rootfs = tmp_path / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    env = {"NVC_PY_CONFIG": str(config), "NVC_PY_HOOK_SOCKET": "none"}
    for command in (["info"], ["list"], ["cdi", "generate"], ["configure", "--dry-run", "-c", "-u", str(rootfs)]):
        by_file = run(*command, env=env)
        assert by_file.returncode == 0, by_file.stderr
        assert by_file.stdout == run("--root", root, *command, env=env).stdout, command
    assert "libnvidia-ml.so" in run("list", env=env).stdout
    config.write_text("root: /nonexistent-driver-root\n")
    assert_refused(
        run("info", env=env),
        "nvc-py: input error: /nonexistent-driver-root: invalid driver root (must be an absolute path to a directory)",
    )
    assert run("--root", root, "info", env=env).returncode == 0


# --- setup ... --remove ------------------------------------------------------------------------------


def test_setup_podman_remove(tmp_path: Path, config_file: Path) -> None:
    hooks = tmp_path / "hooks.d"
    hooks.mkdir()
    (hooks / "other.json").write_text("{}\n")
    run("setup", "podman", "--hooks-dir", str(hooks), "--config", str(config_file), "--no-server", check=True)
    assert tree(hooks) == sorted([*HOOK_FILES, "other.json"])
    removed = run("setup", "podman", "--hooks-dir", str(hooks), "--remove", check=True).stdout.splitlines()
    assert removed == [f"removed {hooks / name}" for name in HOOK_FILES]
    assert tree(hooks) == ["other.json"]
    assert run("setup", "podman", "--hooks-dir", str(hooks), "--remove", check=True).stdout == ""  # idempotent


def test_setup_server_remove(tmp_path: Path, config_file: Path) -> None:
    units = tmp_path / "units"
    run(
        "setup",
        "podman",
        "--hooks-dir",
        str(tmp_path / "hooks.d"),
        "--config",
        str(config_file),
        "--no-server",
        check=True,
    )
    run("setup", "server", "--unit-dir", str(units), "--config", str(config_file), check=True)
    assert tree(units) == sorted(UNITS)
    assert "Documentation=" not in (units / UNITS[1]).read_text()  # no man page to point at
    run(
        "setup",
        "podman",
        "--hooks-dir",
        str(tmp_path / "hooks.d"),
        "--config",
        str(config_file),
        "--no-server",
        check=True,
    )
    assert (tmp_path / "no-server").exists()
    removed = run(
        "setup", "server", "--unit-dir", str(units), "--config", str(config_file), "--remove", check=True
    ).stdout.splitlines()
    assert removed == [*(f"removed {units / name}" for name in UNITS), f"removed {tmp_path / 'no-server'}"]
    assert tree(units) == [] and not (tmp_path / "no-server").exists()


def test_setup_server_remove_where_systemd_runs(tmp_path: Path) -> None:
    """As test_hook_served_systemd's enable test: systemd "runs" in a private mount namespace, a
    stand-in systemctl records what it is asked; the socket is stopped and disabled first."""
    record = tmp_path / "systemctl.log"
    systemctl = tmp_path / "systemctl"
    systemctl.write_text(f'#!/bin/sh\necho "$@" >> {record}\n')
    systemctl.chmod(0o755)
    script = (
        "mount -t tmpfs tmpfs /run && mkdir -p /run/systemd/system && mount -t tmpfs tmpfs /etc/systemd/system"
        f" && {NVC_PY} setup server --systemctl {systemctl} && : > {record}"
        f" && {NVC_PY} setup server --systemctl {systemctl} --remove && ls -A /etc/systemd/system"
    )
    result = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout.splitlines()[-3:] == [
        "stopped and disabled nvc-py-hook.socket and nvc-py-hook.service",
        "removed /etc/systemd/system/nvc-py-hook.socket",
        "removed /etc/systemd/system/nvc-py-hook.service",
    ]
    assert record.read_text() == "disable --now nvc-py-hook.socket\nstop nvc-py-hook.service\ndaemon-reload\n"


def _containerd(main: Path, drop_in: Path, tmp_path: Path, *more: str) -> list[str]:
    """``nvc-py setup containerd`` on ``main`` and ``drop_in`` (``more``: ``--remove``); its lines."""
    given = more or ("--no-server",)  # the no-server file goes beside the test's nvc-py configuration
    env = {"NVC_PY_CONFIG": str(tmp_path / "nvc.yaml")}
    done = run("setup", "containerd", "--config", str(main), "--drop-in", str(drop_in), *given, check=True, env=env)
    return done.stdout.splitlines()


def test_setup_containerd_remove(tmp_path: Path) -> None:
    main = tmp_path / "config.toml"
    original = '# site\nversion = 2\nimports = ["/etc/site/other.toml"]\n\n[grpc]\n  address = "/run/s.sock"\n'
    main.write_text(original)
    drop_in = tmp_path / "conf.d" / "99-nvc-py.toml"
    _containerd(main, drop_in, tmp_path)
    assert drop_in.exists() and str(drop_in) in main.read_text()
    removed = _containerd(main, drop_in, tmp_path, "--remove")
    assert removed == [
        f"removed {drop_in} from the imports of {main}",
        f"removed {main}.nvc-py.bak",
        f"removed {drop_in}",
        f"removed {drop_in.parent}",
    ]
    assert main.read_text() == original and not drop_in.parent.exists()  # setup made conf.d: gone with its file
    main.unlink()  # no containerd configuration: setup makes one, --remove removes it again
    _containerd(main, drop_in, tmp_path)
    assert main.exists()
    removed = _containerd(main, drop_in, tmp_path, "--remove")
    assert removed == [f"removed {main}", f"removed {drop_in}", f"removed {drop_in.parent}"] and not main.exists()


def test_setup_remove_leaves_no_directory_it_made(tmp_path: Path, config_file: Path) -> None:
    """Where podman was never installed, setup made /etc/containers/oci/hooks.d: --remove removes
    it with its files, and the parents it leaves empty; a directory holding anything else stays."""
    etc = tmp_path / "etc"
    hooks = etc / "containers/oci/hooks.d"
    (etc / "keep").mkdir(parents=True)
    run("setup", "podman", "--hooks-dir", str(hooks), "--config", str(config_file), "--no-server", check=True)
    removed = run("setup", "podman", "--hooks-dir", str(hooks), "--remove", check=True).stdout.splitlines()
    assert removed[2:] == [f"removed {hooks}", f"removed {hooks.parent}", f"removed {hooks.parent.parent}"]
    assert tree(etc) == ["keep"]


# --- --help and --version ------------------------------------------------------------------------------


@pytest.mark.parametrize("option", ["--help", "--version"])
def test_runtime_describes_itself_then_the_runtime_it_execs(tmp_path: Path, option: str) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("runtimes: [runc]\n")
    result = subprocess.run(
        [RUNTIME, option], capture_output=True, text=True, timeout=60, env={**os.environ, "NVC_PY_CONFIG": str(config)}
    )
    assert result.returncode == 0, result.stderr
    first, _, rest = result.stdout.partition("\n\n")
    assert first.startswith(f"nvc-py-runtime {__version__} (nvc-py): an OCI runtime that is runc or crun")
    assert (
        f"every command is then run by\n{subprocess.check_output(['which', 'runc'], text=True).strip()} "
        f"(configuration: {config}" in first
    )
    runc = subprocess.run(["runc", option], capture_output=True, text=True, check=True).stdout
    assert rest == runc


@pytest.mark.parametrize("argv", [["--help"], ["-h"], ["prestart", "--help"], ["poststop", "-h"]])
def test_hook_help_on_stdout_without_stdin_or_log(tmp_path: Path, argv: list[str]) -> None:
    """stdin stays open and empty (a read would hang until the timeout); the configured log stays unwritten."""
    config = tmp_path / "config.yaml"
    config.write_text(f"log: {{file: {tmp_path / 'hook.log'}}}\n")
    proc = subprocess.Popen(
        [HOOK, *argv],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "NVC_PY_CONFIG": str(config)},
    )
    try:
        proc.wait(timeout=30)  # a hook reading stdin would wait here for ever
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        out, err = proc.stdout.read(), proc.stderr.read()
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            pipe.close()
    assert (proc.returncode, err) == (0, "")
    assert out.startswith("usage: nvc-py-hook prestart|poststart|poststop")
    assert not (tmp_path / "hook.log").exists()

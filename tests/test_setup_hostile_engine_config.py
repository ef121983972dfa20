"""``nvc-py setup docker|podman|containerd|crio`` and their ``--remove`` on hostile engine configuration
files (hook/setup/engineconf.py): a symbolic link to another file, a FIFO, a character device (/dev/zero's
numbers), a directory, a 3 MiB file, garbage, nesting 100000 deep, a hooks_dir of 100000 components.
Each is refused with exit 2 and one line naming the file, no traceback, and nothing written anywhere:
the link's target and everything else in the scratch tree stay as they were, byte for byte.

daemon.json and containerd's config.toml are given by ``--config`` in the scratch tree. podman's
containers.conf (and a drop-in) and CRI-O's crio.conf (and a drop-in) lie where the engines read them,
/etc/containers and /etc/crio, in a private mount namespace whose /etc is an overlay with an upper
directory in the scratch tree: whatever the command wrote in /etc would show there, and the host's
/etc is never written. Their hooks go to ``--hooks-dir`` in the scratch tree.
"""

from __future__ import annotations

import os
import random
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest

from harness.installed import SCRIPTS
from nvc.errors import InputError

NVC_PY = str(SCRIPTS / "nvc-py")
ETC_OVERLAY = 'mount -t overlay overlay -o "lowerdir=/etc,upperdir=$1,workdir=$2" /etc && shift 2 && exec "$@"'


class Engine(NamedTuple):
    """One engine's configuration file as a test lays it out: where it is (in the scratch tree, or
    in /etc as the command sees it), what it holds when valid, how setup is run on it."""

    name: str
    path: str  # {s}: the scratch tree
    base: str  # a valid file
    syntax: str  # "json" or "toml"
    argv: tuple[str, ...]
    in_etc: bool  # in the /etc overlay (its upper directory is {s}/etc)
    table: str = ""  # where hooks_dir sits ("": no hooks_dir)


def _hooks_engine(name: str, path: str, table: str) -> Engine:
    """podman or CRI-O with one file of its chain laid out (in the /etc overlay)."""
    return Engine(
        name,
        path,
        f"[{table}]\n",
        "toml",
        ("setup", name, "--hooks-dir", "{s}/hooks.d", "--config", "{s}/nvc/config.yaml", "--no-server"),
        True,
        table,
    )


ENGINES = {
    "docker": Engine(
        "docker",
        "{s}/conf/daemon.json",
        '{"log-level": "warn"}\n',
        "json",
        ("setup", "docker", "--config", "{file}", "--gpus-hook-dir", "{s}/bin", "--no-server"),
        False,
    ),
    "containerd": Engine(
        "containerd",
        "{s}/conf/config.toml",
        "version = 2\n",
        "toml",
        ("setup", "containerd", "--config", "{file}", "--drop-in", "{s}/conf/conf.d/99-nvc-py.toml", "--no-server"),
        False,
    ),
    "podman": _hooks_engine("podman", "/etc/containers/containers.conf", "engine"),
    "podman drop-in": _hooks_engine("podman", "/etc/containers/containers.conf.d/50-site.conf", "engine"),
    "crio": _hooks_engine("crio", "/etc/crio/crio.conf", "crio.runtime"),
    "crio drop-in": _hooks_engine("crio", "/etc/crio/crio.conf.d/50-site.conf", "crio.runtime"),
}


class Scratch(NamedTuple):
    root: Path  # everything a case lays out and compares
    work: Path  # the overlay's work directory (the kernel's, not compared)
    engine: Engine

    def path(self, template: str) -> str:
        return template.format(s=self.root)

    @property
    def file(self) -> str:
        """The configuration file as the command names it."""
        return self.path(self.engine.path)

    @property
    def placed(self) -> Path:
        """Where the test puts it: in the overlay's upper directory for /etc."""
        return Path(self.root / "etc" / self.file.removeprefix("/etc/") if self.engine.in_etc else self.file)


def _deep(syntax: str) -> str:
    nested = "[" * 100000 + "]" * 100000
    return f'{{"a": {nested}}}\n' if syntax == "json" else f"a = {nested}\n"


def _directory(path: Path, text: str) -> None:
    path.mkdir()
    (path / "inside").write_text(text)


def _garbage() -> bytes:
    rng = random.Random(40)
    return bytes(rng.randrange(256) for _ in range(4096))


# Each case: (lay the file out, what the line says after "FILE: ").
CASES: dict[str, tuple[Callable[[Scratch], None], Callable[[Scratch], str]]] = {
    "symlink": (
        lambda s: s.placed.symlink_to(s.root / "elsewhere" / "target"),
        lambda s: f"is a symbolic link to {s.root / 'elsewhere' / 'target'}, not followed (",
    ),
    "fifo": (lambda s: os.mkfifo(s.placed), lambda s: "is a FIFO, not a regular file"),
    "device": (
        lambda s: os.mknod(s.placed, stat.S_IFCHR | 0o644, os.makedev(1, 5)),
        lambda s: "is a character device, not a regular file",
    ),
    "directory": (lambda s: _directory(s.placed, s.engine.base), lambda s: "is a directory, not a regular file"),
    "3 MiB": (lambda s: s.placed.write_bytes(b" " * (3 << 20)), lambda s: "is 3145728 bytes, over 1048576 (not read)"),
    "garbage bytes": (lambda s: s.placed.write_bytes(_garbage()), lambda s: "not UTF-8 text"),
    "garbage text": (
        lambda s: s.placed.write_text("\x01}{ ][ = ==\n"),
        lambda s: f"not valid {s.engine.syntax.upper()} (",
    ),
    "nested 100000 deep": (
        lambda s: s.placed.write_text(_deep(s.engine.syntax)),
        lambda s: (
            "nested more than 64 levels deep"
            if s.engine.syntax == "json"
            else "not valid TOML (TOML value nested more than 100 levels deep"
        ),
    ),
    "hooks_dir of 100000 components": (
        lambda s: s.placed.write_text(f'[{s.engine.table}]\nhooks_dir = ["{"/a" * 100000}"]\n'),
        lambda s: f"{s.engine.table}.hooks_dir: a path of 200000 bytes, over 4095",
    ),
}


def snapshot(root: Path) -> dict[str, object]:
    """Every entry under ``root`` with what it is: a link's target, a file's bytes, a node's type
    (never opened: a FIFO would block)."""
    found: dict[str, object] = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        found[str(path.relative_to(root))] = (
            os.readlink(path)
            if stat.S_ISLNK(st.st_mode)
            else path.read_bytes()
            if stat.S_ISREG(st.st_mode)
            else (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode))
        )
    return found


def run_setup(scratch: Scratch, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [NVC_PY, *(scratch.path(word.replace("{file}", scratch.file)) for word in scratch.engine.argv), *extra]
    env = {**os.environ, "NVC_PY_CONFIG": scratch.path("{s}/nvc/config.yaml"), "NVC_PY_HOOK_SOCKET": "none"}
    if scratch.engine.in_etc:
        argv = [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            ETC_OVERLAY,
            "sh",
            str(scratch.root / "etc"),
            str(scratch.work),
            *argv,
        ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)


def _scratch(tmp_path: Path, name: str) -> Scratch:
    """A scratch tree for engine ``name``: the link target elsewhere/target (a valid file of the
    engine's), nvc-py's configuration, the engine's file's directory (empty)."""
    engine = ENGINES[name]
    made = Scratch(tmp_path / "s", tmp_path / "overlay-work", engine)
    made.work.mkdir()
    for directory in ("elsewhere", "nvc", "bin"):
        (made.root / directory).mkdir(parents=True)
    (made.root / "elsewhere" / "target").write_text(engine.base)
    (made.root / "nvc" / "config.yaml").write_text("{}\n")
    made.placed.parent.mkdir(parents=True)
    return made


# Every case on every engine's file; a hooks_dir only where the engine reads one (docker's and
# containerd's long paths are options: test_long_paths_given_as_options).
ENGINE_CASES = [
    (engine, case) for engine in ENGINES for case in CASES if ENGINES[engine].table or not case.startswith("hooks_dir")
]


@pytest.mark.parametrize("remove", [False, True], ids=["setup", "remove"])
@pytest.mark.parametrize(("engine", "case"), ENGINE_CASES, ids=[f"{e}-{c}" for e, c in ENGINE_CASES])
def test_hostile_configuration_is_refused_in_one_line_with_nothing_written(
    tmp_path: Path, engine: str, case: str, remove: bool
) -> None:
    lay_out, reason = CASES[case]
    scratch = _scratch(tmp_path, engine)
    lay_out(scratch)
    before = snapshot(scratch.root)
    result = run_setup(scratch, *(["--remove"] if remove else []))
    assert "Traceback" not in result.stderr, result.stderr
    assert (result.returncode, result.stdout, result.stderr.count("\n")) == (InputError.exit_code, "", 1), result
    assert result.stderr.startswith(f"nvc-py: input error: {scratch.file}: {reason(scratch)}"), result.stderr
    assert snapshot(scratch.root) == before


@pytest.mark.parametrize(
    ("engine", "option", "reason"),
    [
        ("docker", "--gpus-hook-dir", "not a directory (cannot link nvidia-container-runtime-hook there)"),
        ("containerd", "--drop-in", "cannot create directory: File name too long"),
        ("podman", "--hooks-dir", "cannot create directory: File name too long"),
        ("crio", "--hooks-dir", "cannot create directory: File name too long"),
    ],
)
def test_long_paths_given_as_options(tmp_path: Path, engine: str, option: str, reason: str) -> None:
    """A path of 60000 components (as many as one argument may hold) where setup writes: one line."""
    made = Scratch(tmp_path / "s", tmp_path / "overlay-work", ENGINES[engine])
    for directory in ("nvc", "conf", "etc", "bin"):
        (made.root / directory).mkdir(parents=True)
    made.work.mkdir()
    (made.root / "nvc" / "config.yaml").write_text("{}\n")
    long = f"{made.root}{'/a' * 60000}"
    argv = list(ENGINES[engine].argv)
    argv[argv.index(option) + 1] = long + ("/99-nvc-py.toml" if option == "--drop-in" else "")
    before = snapshot(made.root)
    result = run_setup(made._replace(engine=made.engine._replace(argv=tuple(argv))))
    assert "Traceback" not in result.stderr, result.stderr
    assert (result.returncode, result.stdout, result.stderr.count("\n")) == (InputError.exit_code, "", 1), result
    assert result.stderr.startswith(f"nvc-py: input error: {made.root}/a/a/") and reason in result.stderr
    assert snapshot(made.root) == before


def test_parse_bounded_refuses_deeper_than_its_limit() -> None:
    """A JSON document that parses (no RecursionError) but nests deeper than MAX_DEPTH is refused as
    well: whatever walks it afterwards (daemon.json's text edit) must not recurse that deep."""
    import json

    from nvc.hook.setup import engineconf

    ok = "[" * engineconf.MAX_DEPTH + "]" * engineconf.MAX_DEPTH
    assert engineconf.parse_bounded(json.loads, ok, "f") is not None
    for depth in (engineconf.MAX_DEPTH + 1, 500, 100000):
        with pytest.raises(InputError, match=f"^input error: f: nested more than {engineconf.MAX_DEPTH} levels deep$"):
            engineconf.parse_bounded(json.loads, "[" * depth + "]" * depth, "f")


@pytest.mark.parametrize(
    ("engine", "text"),
    [
        ("docker", '{\n  "log-level": "warn"\n}\n'),
        ("containerd", 'version = 2\n\n[grpc]\n  address = "/run/site.sock"\n'),
    ],
)
def test_a_rewrite_is_a_rename_keeping_the_previous_file_as_backup(tmp_path: Path, engine: str, text: str) -> None:
    """The previous file, the very inode, becomes FILE.nvc-py.bak (a link planted there is replaced,
    its target untouched), the new text is renamed in, and --remove restores the text byte for byte."""
    from nvc.hook.setup import engineconf

    made = Scratch(tmp_path / "s", tmp_path / "overlay-work", ENGINES[engine])
    for directory in ("nvc", "conf", "bin", "elsewhere"):
        (made.root / directory).mkdir(parents=True)
    (made.root / "nvc" / "config.yaml").write_text("{}\n")
    victim = made.root / "elsewhere" / "victim"
    victim.write_text("not the engine's\n")
    config, backup = Path(made.file), Path(made.file + engineconf.BACKUP_SUFFIX)
    config.write_text(text)
    config.chmod(0o600)
    backup.symlink_to(victim)
    inode = config.stat().st_ino
    done = run_setup(made)
    assert done.returncode == 0, done.stderr
    assert not backup.is_symlink() and (backup.read_text(), backup.stat().st_ino) == (text, inode)
    assert stat.S_IMODE(backup.stat().st_mode) == 0o600 and victim.read_text() == "not the engine's\n"
    written, written_inode = config.read_text(), config.stat().st_ino
    assert config.stat().st_ino != inode and written != text and stat.S_IMODE(config.stat().st_mode) == 0o600
    assert sorted(p.name for p in config.parent.iterdir() if p.name != "conf.d") == [config.name, backup.name]
    again = run_setup(made)  # the same text: the file and its backup stay as they are
    assert again.returncode == 0, again.stderr
    assert (config.stat().st_ino, backup.stat().st_ino, backup.read_text()) == (written_inode, inode, text)
    removed = run_setup(made, "--remove")  # the file restored: setup's backup goes with it
    assert removed.returncode == 0, removed.stderr
    assert config.read_text() == text and not os.path.lexists(backup)
    assert sorted(p.name for p in config.parent.iterdir()) == [config.name]


def test_package_removal_refuses_each_hostile_file_in_one_line(tmp_path: Path) -> None:
    """``python -I -m nvc.hook.setup.maintainer unregister`` (what the package's removal runs) on the host's
    own paths, in a private mount namespace: /etc and /usr overlays with upper directories of the
    test's, /run a tmpfs (no systemd to call). A linked daemon.json, a FIFO for containerd's
    config.toml and a podman drop-in with a hooks_dir of 100000 components: a line each, exit 1 (the
    steps that failed), no traceback, the link's target and /etc untouched."""
    import sys

    upper, work = tmp_path / "etc", tmp_path / "work"
    for directory in (
        upper / "docker",
        upper / "containerd",
        upper / "containers" / "containers.conf.d",
        work / "etc",
        work / "usr",
        tmp_path / "usr",
        tmp_path / "elsewhere",
    ):
        directory.mkdir(parents=True)
    victim = tmp_path / "elsewhere" / "daemon.json"
    victim.write_text('{"log-level": "warn"}\n')
    (upper / "docker" / "daemon.json").symlink_to(victim)
    os.mkfifo(upper / "containerd" / "config.toml")
    (upper / "containers" / "containers.conf.d" / "50-site.conf").write_text(
        f'[engine]\nhooks_dir = ["{"/a" * 100000}"]\n'
    )
    before = snapshot(tmp_path)
    script = (
        'mount -t overlay overlay -o "lowerdir=/etc,upperdir=$1,workdir=$2/etc" /etc'
        ' && mount -t overlay overlay -o "lowerdir=/usr,upperdir=$3,workdir=$2/usr" /usr'
        ' && mount -t tmpfs tmpfs /run && shift 3 && exec "$@"'
    )
    result = subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            "sh",
            str(upper),
            str(work),
            str(tmp_path / "usr"),
            sys.executable,
            "-I",
            "-m",
            "nvc.hook.setup.maintainer",
            "unregister",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 1, result
    assert result.stderr.splitlines() == [
        "nvc-py: input error: /etc/containers/containers.conf.d/50-site.conf: engine.hooks_dir: a path of 200000 "
        "bytes, over 4095",
        "nvc-py: input error: /etc/containerd/config.toml: is a FIFO, not a regular file",
        f"nvc-py: input error: /etc/docker/daemon.json: is a symbolic link to {victim}, not followed "
        f"(--config {victim} changes that file)",
    ]
    assert {k: v for k, v in snapshot(tmp_path).items() if not k.startswith(("work", "usr"))} == {
        k: v for k, v in before.items() if not k.startswith(("work", "usr"))
    }

"""The configuration file: defaults, strict validation naming file/key/reason, ``config show``."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

from nvc import config
from nvc.config import yamlfile as configyaml
from nvc.errors import InputError
from nvc.model.capabilities import CAPABILITIES


def test_missing_file_means_defaults(tmp_path: Path) -> None:
    cfg = config.load(str(tmp_path / "absent.yaml"))
    assert cfg == config.defaults() == config.Config(ldconfig=config.default_ldconfig())
    assert cfg.accept_envvar_when_unprivileged and not cfg.accept_volume_mounts and not cfg.disable_require
    assert cfg.supported_capabilities == CAPABILITIES and cfg.ldconfig.startswith("@")


def test_values_are_read(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "root: /run/nvidia/driver\nload-kmods: false\nuser: '1000:1000'\n"
        "log: {file: /tmp/x.log, level: debug}\nsupported-capabilities: utility,compute\n"
        "sharing: {enabled: true, device-memory-limit: 8g, device-sm-limit: 50}\n"
        "ldconfig: /sbin/ldconfig\nallow-ldconfig-from-container: true\n"
    )
    cfg = config.load(str(path))
    assert (cfg.root, cfg.load_kmods, cfg.user, cfg.log_file, cfg.log_level) == (
        "/run/nvidia/driver",
        False,
        "1000:1000",
        "/tmp/x.log",
        "debug",
    )
    assert cfg.supported_capabilities == ("utility", "compute")
    assert cfg.sharing == config.Sharing(True, "8g", 50)
    assert cfg.ldconfig == "/sbin/ldconfig"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("bogus: 1\n", "bogus: unknown key"),
        ("load-kmods: 'yes'\n", "load-kmods: expected true or false"),
        ("root: relative/dir\n", "root: expected an absolute path"),
        ("log: {level: loud}\n", "log.level: expected one of debug, info, warning, error"),
        ("log: {colour: red}\n", "log.colour: unknown key"),
        ("supported-capabilities: [compute, turbo]\n", "supported-capabilities: unknown capability 'turbo'"),
        ("user: bob\n", "user: expected UID or UID:GID"),
        ("sharing: {device-sm-limit: 150}\n", "sharing.device-sm-limit: expected an integer percent"),
        ("cuda-compat-mode: always\n", "cuda-compat-mode: expected one of disabled, mount, ldconfig"),
        ("ldconfig: /sbin/ldconfig\n", "ldconfig: /sbin/ldconfig is a path in the container image, refused"),
        ("- a list\n", "top level: expected a mapping"),
        ("root: [unclosed\n", "not valid YAML at line"),
    ],
)
def test_bad_values_name_file_key_and_reason(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(InputError, match=f"^input error: {path}: ") as err:
        config.load(str(path))
    assert message in str(err.value)


def test_config_show_prints_effective_values_and_env_override(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("disable-require: true\n")
    out = subprocess.run(
        ["nvc-py", "config", "show"],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": f"{sysconfig.get_path('scripts')}:/usr/bin:/bin", "NVC_PY_CONFIG": str(path)},
    ).stdout
    assert out.startswith(f"# effective nvc-py configuration from {path}\n")
    shown = yaml.safe_load(out)
    assert shown["disable-require"] is True and shown["load-kmods"] is True and shown["log"]["level"] == "info"
    bad = tmp_path / "bad.yaml"
    bad.write_text("disable-require: maybe\n")
    result = subprocess.run(["nvc-py", "config", "show", "--file", str(bad)], capture_output=True, text=True)
    assert result.returncode == InputError.exit_code
    assert result.stderr == f"nvc-py: input error: {bad}: disable-require: expected true or false (got 'maybe')\n"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "run" / "config-cache.json"
    monkeypatch.setattr(configyaml, "CACHE_PATH", str(path))
    return path


def test_second_load_comes_from_the_cache_without_yaml(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("no-cgroups: true\nlog: {level: debug}\nsupported-capabilities: [compute, utility]\n")
    first = config.load(str(path))
    assert cache.stat().st_mode & 0o777 == 0o600 and cache.parent.stat().st_mode & 0o777 == 0o700
    monkeypatch.setitem(sys.modules, "yaml", None)  # any `import yaml` now fails
    assert config.load(str(path)) == first and first.no_cgroups and first.log_level == "debug"
    path.write_text("no-cgroups: false\n")  # an edit is a miss: parsed again
    with pytest.raises(ImportError):
        config.load(str(path))
    monkeypatch.delitem(sys.modules, "yaml")
    assert config.load(str(path)).no_cgroups is False


def test_cached_document_is_still_validated(tmp_path: Path, cache: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("load-kmods: 'yes'\n")
    for _ in range(2):  # parsed, then from the cache: the same refusal
        with pytest.raises(InputError, match="load-kmods: expected true or false"):
            config.load(str(path))
    assert cache.exists()


@pytest.mark.parametrize("tamper", ["group-writable", "other-owner", "symlink", "junk"])
def test_an_untrusted_cache_is_ignored(tmp_path: Path, cache: Path, tamper: str) -> None:
    """A planted document for the very same text must not become the configuration."""
    path = tmp_path / "c.yaml"
    text = "accept-volume-mounts: false\n"
    path.write_text(text)
    config.load(str(path))
    planted = json.dumps({"text": text, "document": {"accept-volume-mounts": True}})
    if tamper == "symlink":
        target = tmp_path / "elsewhere.json"
        target.write_text(planted)
        target.chmod(0o600)
        cache.unlink()
        cache.symlink_to(target)
    else:
        cache.write_text("{not json" if tamper == "junk" else planted)
        if tamper == "group-writable":
            cache.chmod(0o620)
        elif tamper == "other-owner":
            os.chown(cache, 1000, 1000)
    assert config.load(str(path)).accept_volume_mounts is False


def test_a_document_json_cannot_hold_is_not_cached(tmp_path: Path, cache: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("root: /\nuser: 2026-01-01\n")  # a YAML date: refused, and never cached as a string
    with pytest.raises(InputError, match="user: expected UID or UID:GID"):
        config.load(str(path))
    assert not cache.exists()


# --- hostile configuration files and caches -----------------------------------------------------

ALIAS_BOMB = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{','.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)
)
NVC_PY = str(Path(sysconfig.get_path("scripts")) / "nvc-py")
HOOK = str(Path(sysconfig.get_path("scripts")) / "nvc-py-hook")


def test_alias_bomb_is_refused_before_it_expands(tmp_path: Path, cache: Path) -> None:
    """Nine levels of nine aliases (about 450 bytes) would expand to 9^9 nodes for whoever walks the document."""
    assert len(ALIAS_BOMB) < 500
    path = tmp_path / "c.yaml"
    path.write_text(ALIAS_BOMB)
    with pytest.raises(InputError, match=f"^input error: {path}: line 1: YAML anchors and aliases are not accepted$"):
        config.load(str(path))
    path.write_text("root: &r /\nldcache: /etc/ld.so.cache\n")  # even a harmless anchor: a config needs none
    with pytest.raises(InputError, match="line 1: YAML anchors and aliases are not accepted"):
        config.load(str(path))
    assert not cache.exists()
    (tmp_path / "bomb.yaml").write_text(ALIAS_BOMB)
    result = subprocess.run(
        [NVC_PY, "config", "show"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"NVC_PY_CONFIG": str(tmp_path / "bomb.yaml")},
    )
    assert result.returncode == InputError.exit_code
    assert result.stderr == (
        f"nvc-py: input error: {tmp_path / 'bomb.yaml'}: line 1: YAML anchors and aliases are not accepted\n"
    )


def test_deeply_nested_yaml_is_one_error(tmp_path: Path, cache: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("root: " + "[" * 20_000 + "]" * 20_000 + "\n")
    with pytest.raises(InputError, match="not valid YAML: nested too deeply"):
        config.load(str(path))


@pytest.mark.parametrize(
    ("text", "line", "what"),
    [
        ("root: /\nuser: 2001-13-01\n", 2, "'2001-13-01' is not a valid timestamp"),
        ("log: {file: 2001-01-01 10:00:00+99:00}\n", 1, "'2001-01-01 10:00:00+99:00' is not a valid timestamp"),
        ("root: !!int x\n", 1, "'x' is not a valid int"),
        ("root: !!int ''\n", 1, "'' is not a valid int"),
        ("load-kmods: !!bool maybe\n", 1, "'maybe' is not a valid bool"),
        ("k8s:\n  nvml-retry: !!float x\n", 2, "'x' is not a valid float"),
        ("k8s:\n  nvml-retry: !!timestamp x\n", 2, "'x' is not a valid timestamp"),
    ],
)
def test_a_value_its_yaml_type_cannot_hold_is_one_error(
    tmp_path: Path, cache: Path, text: str, line: int, what: str
) -> None:
    """PyYAML's constructors raise ValueError, KeyError, IndexError or AttributeError for these (found by
    tests/fuzz/fuzz_config.py): one line naming the file, the line and the value, through the real program too."""
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(InputError, match=f"^input error: {path}: line {line}: {re.escape(what)}$"):
        config.load(str(path))
    result = subprocess.run(
        [NVC_PY, "config", "show"], capture_output=True, text=True, timeout=60, env={"NVC_PY_CONFIG": str(path)}
    )
    assert (result.returncode, result.stderr) == (
        InputError.exit_code,
        f"nvc-py: input error: {path}: line {line}: {what}\n",
    )


@pytest.mark.parametrize("kind", ["fifo", "device", "directory", "huge", "not-utf8"])
def test_config_file_that_is_not_a_small_text_file(tmp_path: Path, kind: str) -> None:
    """Through the real program, with a timeout only as a safety net: one line, never a hang."""
    path = tmp_path / "c.yaml"
    message = "not a regular file (a configuration file must be a regular file of at most 1048576 bytes)"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path = Path("/dev/zero")  # would be read forever
    elif kind == "directory":
        path.mkdir()
    elif kind == "huge":
        with open(path, "wb") as f:
            f.truncate(config.MAX_SIZE + 1)
        message = "larger than 1048576 bytes (a configuration file must be"
    else:
        path.write_bytes(b"root: /\xff\n")
        message = "not UTF-8 text"
    for argv in ([NVC_PY, "config", "show"], [HOOK, "prestart"]):
        result = subprocess.run(
            argv, capture_output=True, text=True, timeout=60, input="{}", env={"NVC_PY_CONFIG": str(path)}
        )
        assert result.returncode == InputError.exit_code
        prog = os.path.basename(argv[0])
        assert result.stderr.startswith(f"{prog}: input error: {path}: {message}")
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


@pytest.mark.parametrize("plant", ["huge", "nested"])
def test_a_cache_that_is_not_a_small_json_file_is_a_miss(tmp_path: Path, cache: Path, plant: str) -> None:
    """(A FIFO or a device: test_fifo_or_device_as_the_real_cache_..., in processes a timeout can end.)"""
    path = tmp_path / "c.yaml"
    path.write_text("no-cgroups: true\n")
    cache.parent.mkdir(mode=0o700)
    if plant == "huge":
        with open(cache, "wb") as f:
            f.truncate(configyaml.MAX_CACHE_SIZE + 1)
        cache.chmod(0o600)
    else:
        cache.write_text("[" * 100_000 + "]" * 100_000)
        cache.chmod(0o600)
    assert config.load(str(path)).no_cgroups is True
    assert stat.S_ISREG(cache.lstat().st_mode) and json.loads(cache.read_text())["text"] == "no-cgroups: true\n"


@pytest.mark.parametrize("plant", ["mkfifo -m 0600 {}", "mknod -m 0600 {} c 1 5"])
def test_fifo_or_device_as_the_real_cache_does_not_hang_config_show_or_the_hook(tmp_path: Path, plant: str) -> None:
    """The real /run/nvc-py (a private tmpfs over it): a FIFO or /dev/zero's node as config-cache.json
    is a miss, replaced by a good cache."""
    path = tmp_path / "c.yaml"
    path.write_text("no-cgroups: true\n")
    make = plant.replace("{}", configyaml.CACHE_PATH)
    script = (
        f"set -e; mkdir -p -m 0700 /run/nvc-py; mount -t tmpfs -o mode=0700 tmpfs /run/nvc-py; "
        f"{make}; {NVC_PY} config show; rm {configyaml.CACHE_PATH}; {make}; "
        f"echo '{{}}' | {HOOK} prestart || echo hook=$?; test -f {configyaml.CACHE_PATH} && echo replaced"
    )
    result = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={"NVC_PY_CONFIG": str(path), "PATH": "/usr/bin:/bin:/usr/sbin:/sbin"},
    )
    assert result.returncode == 0, result.stderr
    assert "no-cgroups: true" in result.stdout and "hook=2\nreplaced\n" in result.stdout
    assert result.stderr == "nvc-py-hook: input error: OCI state on stdin: no absolute 'bundle' path\n"


@pytest.mark.parametrize("value", ["\u00b2", "1:\u00b2", "9" * 4400])
def test_user_digits_are_ascii(tmp_path: Path, value: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(f"user: '{value}'\n")
    with pytest.raises(InputError, match="user: expected UID or UID:GID"):
        config.load(str(path))

"""The configuration file: defaults, strict validation naming file/key/reason, ``config show``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

from nvc import config
from nvc.capabilities import CAPABILITIES
from nvc.errors import InputError


def test_missing_file_means_defaults(tmp_path: Path) -> None:
    cfg = config.load(str(tmp_path / "absent.yaml"))
    assert cfg == config.Config()
    assert cfg.accept_envvar_when_unprivileged and not cfg.accept_volume_mounts and not cfg.disable_require
    assert cfg.supported_capabilities == CAPABILITIES and cfg.ldconfig.startswith("@")


def test_values_are_read(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("root: /run/nvidia/driver\nload-kmods: false\nuser: '1000:1000'\n"
                    "log: {file: /tmp/x.log, level: debug}\nsupported-capabilities: utility,compute\n"
                    "sharing: {enabled: true, device-memory-limit: 8g, device-sm-limit: 50}\n"
                    "ldconfig: /sbin/ldconfig\nallow-ldconfig-from-container: true\n")
    cfg = config.load(str(path))
    assert (cfg.root, cfg.load_kmods, cfg.user, cfg.log_file, cfg.log_level) == (
        "/run/nvidia/driver", False, "1000:1000", "/tmp/x.log", "debug")
    assert cfg.supported_capabilities == ("utility", "compute")
    assert cfg.sharing == config.Sharing(True, "8g", 50)
    assert cfg.ldconfig == "/sbin/ldconfig"


@pytest.mark.parametrize(("text", "message"), [
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
])
def test_bad_values_name_file_key_and_reason(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(InputError, match=f"^input error: {path}: ") as err:
        config.load(str(path))
    assert message in str(err.value)


def test_config_show_prints_effective_values_and_env_override(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("disable-require: true\n")
    out = subprocess.run(["nvc-py", "config", "show"], capture_output=True, text=True, check=True,
                         env={"PATH": f"{sysconfig.get_path('scripts')}:/usr/bin:/bin",
                              "NVC_PY_CONFIG": str(path)}).stdout
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
    monkeypatch.setattr(config, "CACHE_PATH", str(path))
    return path


def test_second_load_comes_from_the_cache_without_yaml(tmp_path: Path, cache: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
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

"""The configuration file: defaults, strict validation naming file/key/reason, ``config show``."""

from __future__ import annotations

import subprocess
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

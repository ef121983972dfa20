"""Running ``nvc-py doctor`` in tests: its exit status and lines, and podman configured by its own files
($CONTAINERS_CONF, $CONTAINERS_STORAGE_CONF: hooks, CDI and storage of the test's own) as doctor
finds it on a host. Shared by tests/test_doctor.py and tests/test_doctor_security.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from .installed import SCRIPTS

PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def doctor(*args: str, env: dict[str, str] | None = None) -> tuple[int, list[str]]:
    """The exit status and lines of `nvc-py doctor ARGS` (nothing on stderr)."""
    base = {"PATH": PATH, "NVC_PY_HOOK_SOCKET": "none", **(env or {})}
    done = subprocess.run(
        [str(SCRIPTS / "nvc-py"), "doctor", *args], capture_output=True, text=True, timeout=600, env=base
    )
    assert done.stderr == "", done.stderr
    return done.returncode, done.stdout.splitlines()


@pytest.fixture
def podman_conf(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, active_2gpu) -> dict[str, str]:
    """podman configured by its own files for this test (hooks, CDI specs, storage; cgroupfs and runc,
    which this machine needs), and nvc-py's configuration for the fake driver: the environment. The
    runroot is short: podman refuses a --runroot over 50 characters, and one that long given in
    storage.conf makes every attached `podman run` wait 20 s after its container ended."""
    runroot = tmp_path_factory.mktemp("runroot")
    conf = tmp_path / "containers.conf"
    conf.write_text(
        f'[engine]\nhooks_dir = ["{tmp_path / "hooks.d"}"]\ncdi_spec_dirs = ["{tmp_path / "cdi"}"]\n'
        'cgroup_manager = "cgroupfs"\nruntime = "runc"\nevents_logger = "file"\n'
        f'tmp_dir = "{tmp_path / "podman-tmp"}"\n'
        '[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]\n'
    )
    storage = tmp_path / "storage.conf"
    storage.write_text(f'[storage]\ndriver = "vfs"\ngraphroot = "{tmp_path / "storage"}"\nrunroot = "{runroot}"\n')
    config = tmp_path / "config.yaml"
    config.write_text(f"root: {active_2gpu.root}\nload-kmods: false\nlog: {{file: {tmp_path / 'hook.log'}}}\n")
    return {"CONTAINERS_CONF": str(conf), "CONTAINERS_STORAGE_CONF": str(storage), "NVC_PY_CONFIG": str(config)}

"""Where podman and CRI-O read hooks (hook/setup/hooksdirs.py), and `nvc-py setup podman|crio` writing there.

The resolution is checked on configuration chains laid out under a temporary root; the last test is
the README's own path on this machine's podman with its own defaults (no --hooks-dir, no
containers.conf of the test's), in a mount namespace of the test's own where /usr/share/containers
and /etc/containers are copies: the host's stay untouched.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from harness.fakegpus import H100
from harness.fakegpus import uuids as _uuids
from harness.installed import SCRIPTS
from harness.podman import own_engine_config
from nvc.errors import InputError
from nvc.hook.setup import hooksdirs
from nvc.hook.setup.hooksdirs import CRIO, DEFAULT_HOOKS_DIR, PODMAN, Resolved, resolve


def _write(root: Path, path: str, text: str) -> str:
    full = root / path.lstrip("/")
    full.parent.mkdir(parents=True, exist_ok=True)
    full.write_text(text)
    return str(full)


def test_podman_reads_its_default_when_no_file_sets_hooks_dir(tmp_path: Path) -> None:
    assert resolve(PODMAN, {}, str(tmp_path)) == Resolved((DEFAULT_HOOKS_DIR,), "")
    _write(tmp_path, "/usr/share/containers/containers.conf", '[engine]\n#hooks_dir = ["/x"]\nevents_logger = "file"\n')
    assert resolve(PODMAN, {}, str(tmp_path)).dirs == (DEFAULT_HOOKS_DIR,)


def test_each_later_file_of_the_chain_replaces_the_list(tmp_path: Path) -> None:
    """/usr/share's file, then its drop-ins, then /etc's file, then /etc's drop-ins by name; the last
    directory is the most preferred (a file there masks one of the same name elsewhere): ours go there."""
    _write(tmp_path, "/usr/share/containers/containers.conf", '[engine]\nhooks_dir = ["/a"]\n')
    assert resolve(PODMAN, {}, str(tmp_path)).dirs == ("/a",)
    _write(tmp_path, "/usr/share/containers/containers.conf.d/10-x.conf", '[engine]\nhooks_dir = ["/b"]\n')
    assert resolve(PODMAN, {}, str(tmp_path)).dirs == ("/b",)
    etc = _write(tmp_path, "/etc/containers/containers.conf", '[engine]\nhooks_dir = ["/c", "/d/"]\n')
    assert resolve(PODMAN, {}, str(tmp_path)) == Resolved(("/c", "/d"), etc)
    assert resolve(PODMAN, {}, str(tmp_path)).target == "/d"
    _write(tmp_path, "/etc/containers/containers.conf.d/20-b.conf", '[engine]\nhooks_dir = ["/f"]\n')
    _write(tmp_path, "/etc/containers/containers.conf.d/10-a.conf", '[engine]\nhooks_dir = ["/e"]\n')
    _write(tmp_path, "/etc/containers/containers.conf.d/30-c.conf.bak", '[engine]\nhooks_dir = ["/g"]\n')
    assert resolve(PODMAN, {}, str(tmp_path)).dirs == ("/f",)
    empty = _write(tmp_path, "/etc/containers/containers.conf.d/40-d.conf", "[engine]\nhooks_dir = []\n")
    assert resolve(PODMAN, {}, str(tmp_path)) == Resolved((DEFAULT_HOOKS_DIR,), empty)
    assert "podman reads hooks from /usr/share/containers/oci/hooks.d (" in hooksdirs.described(
        PODMAN, resolve(PODMAN, {}, str(tmp_path))
    )


def test_containers_conf_replaces_the_chain_and_the_override_comes_last(tmp_path: Path) -> None:
    _write(tmp_path, "/etc/containers/containers.conf", '[engine]\nhooks_dir = ["/etc-dir"]\n')
    own = _write(tmp_path, "/own.conf", '[engine]\nhooks_dir = ["/own"]\n')
    plain = _write(tmp_path, "/plain.conf", "[engine]\n")
    override = _write(tmp_path, "/override.conf", '[engine]\nhooks_dir = ["/override"]\n')
    assert resolve(PODMAN, {"CONTAINERS_CONF": own}, str(tmp_path)).dirs == ("/own",)
    assert resolve(PODMAN, {"CONTAINERS_CONF": plain}, str(tmp_path)).dirs == (DEFAULT_HOOKS_DIR,)
    assert resolve(PODMAN, {"CONTAINERS_CONF_OVERRIDE": override}, str(tmp_path)).dirs == ("/override",)


def test_the_cgroup_manager_is_systemd_unless_the_last_file_setting_it_says_otherwise(tmp_path: Path) -> None:
    """Which engines' containers have their device rules rewritten by a systemd reload (nvc-py doctor)."""
    assert hooksdirs.cgroup_manager(PODMAN, {}, str(tmp_path)) == "systemd"
    assert hooksdirs.cgroup_manager(CRIO, {}, str(tmp_path)) == "systemd"
    _write(tmp_path, "/usr/share/containers/containers.conf", '[engine]\ncgroup_manager = "cgroupfs"\n')
    _write(tmp_path, "/etc/crio/crio.conf.d/10-x.conf", '[crio.runtime]\ncgroup_manager = "cgroupfs"\n')
    assert hooksdirs.cgroup_manager(PODMAN, {}, str(tmp_path)) == "cgroupfs"
    assert hooksdirs.cgroup_manager(CRIO, {}, str(tmp_path)) == "cgroupfs"
    _write(tmp_path, "/etc/containers/containers.conf.d/20-y.conf", '[engine]\ncgroup_manager = "systemd"\n')
    assert hooksdirs.cgroup_manager(PODMAN, {}, str(tmp_path)) == "systemd"


def test_crio_reads_crio_conf_and_its_drop_ins(tmp_path: Path) -> None:
    assert resolve(CRIO, {}, str(tmp_path)).dirs == (DEFAULT_HOOKS_DIR,)
    _write(tmp_path, "/etc/crio/crio.conf", '[crio.runtime]\nhooks_dir = ["/x"]\n[crio.image]\npause_image = "p"\n')
    assert resolve(CRIO, {}, str(tmp_path)).dirs == ("/x",)
    drop_in = _write(tmp_path, "/etc/crio/crio.conf.d/01-hooks.conf", '[crio.runtime]\nhooks_dir = ["/y"]\n')
    assert resolve(CRIO, {}, str(tmp_path)) == Resolved(("/y",), drop_in)
    # podman's key is not CRI-O's, nor the other way round
    _write(tmp_path, "/etc/containers/containers.conf", '[crio.runtime]\nhooks_dir = ["/z"]\n')
    assert resolve(PODMAN, {}, str(tmp_path)).dirs == (DEFAULT_HOOKS_DIR,)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[engine\n", "not valid TOML"),
        ('[engine]\nhooks_dir = "relative"\n', "engine.hooks_dir: expected a list of absolute directories"),
        ("[engine]\nhooks_dir = [1]\n", "engine.hooks_dir: expected a list of absolute directories"),
        ("\xff", "not UTF-8 text"),
    ],
)
def test_a_file_the_engine_would_refuse_is_named(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.conf"
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(InputError, match=f"{path}: {message}"):
        resolve(PODMAN, {"CONTAINERS_CONF": str(path)})


def test_a_fifo_in_the_chain_is_refused_without_waiting(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.conf"
    import os

    os.mkfifo(fifo)
    with pytest.raises(InputError, match="not a regular file"):
        resolve(PODMAN, {"CONTAINERS_CONF": str(fifo)})


def _nvc(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPTS / "nvc-py"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "NVC_PY_HOOK_SOCKET": "none", **(env or {})},
    )


def test_setup_podman_warns_when_podman_will_not_read_the_hooks_dir(tmp_path: Path) -> None:
    own = tmp_path / "containers.conf"
    own.write_text(f'[engine]\nhooks_dir = ["{tmp_path / "read"}"]\n')
    config = tmp_path / "config.yaml"
    config.write_text("{}\n")
    env = {"CONTAINERS_CONF": str(own)}
    done = _nvc("setup", "podman", "--config", str(config), "--no-server", env=env)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.splitlines()[:2] == [
        f"wrote {tmp_path}/read/oci-nvc-py-hook.json",
        f"wrote {tmp_path}/read/oci-nvc-py-poststop.json",
    ]
    elsewhere = _nvc(
        "setup", "podman", "--hooks-dir", str(tmp_path / "other"), "--config", str(config), "--no-server", env=env
    )
    assert elsewhere.returncode == 0
    assert elsewhere.stderr == (
        f"warning: podman reads hooks from {tmp_path}/read ({own}'s hooks_dir): it will not read {tmp_path}/other\n"
    )
    removed = _nvc("setup", "podman", "--hooks-dir", str(tmp_path / "other"), "--remove", env=env)
    assert sorted(removed.stdout.splitlines()) == sorted(
        [
            *(f"removed {tmp_path}/{d}/oci-nvc-py-{f}.json" for d in ("read", "other") for f in ("hook", "poststop")),
            f"removed {tmp_path}/read",
            f"removed {tmp_path}/other",
        ]
    )  # setup made them: gone with their files
    crio = _nvc("setup", "crio", "--hooks-dir", str(tmp_path / "crio"), "--config", str(config), "--no-server")
    assert crio.returncode == 0 and "warning: CRI-O reads hooks from " in crio.stderr
    hook = json.loads((tmp_path / "crio" / "oci-nvc-py-hook.json").read_text())
    assert hook["stages"] == ["prestart"] and hook["hook"]["args"] == ["nvc-py-hook", "prestart"]


def test_setup_podman_then_podman_with_its_own_defaults_sees_the_gpu(active_2gpu, podman, tmp_path: Path) -> None:
    """The README's path as a user has it: `nvc-py setup podman` (no --hooks-dir), then podman with no
    --hooks-dir and no containers.conf of the test's: the container sees the GPU it asked for. An
    install of an earlier version, in /etc/containers/oci/hooks.d (which Debian 12's podman does not
    read: before, the container started with no GPU and no word), is moved; --remove removes it all."""
    own_engine_config(tmp_path)
    made = [d for d in (DEFAULT_HOOKS_DIR, os.path.dirname(DEFAULT_HOOKS_DIR)) if not os.path.exists(d)]  # by setup
    config = tmp_path / "config.yaml"
    config.write_text(f"root: {active_2gpu.root}\nload-kmods: false\nlog: {{file: {tmp_path / 'hook.log'}}}\n")
    legacy = Path(hooksdirs.LEGACY_HOOKS_DIR)
    assert _nvc("setup", "podman", "--hooks-dir", str(legacy), "--config", str(config), "--no-server").returncode == 0
    image = podman.image()
    unread = podman.run(image, ["nvidia-smi", "-L"], env={"NVIDIA_VISIBLE_DEVICES": "0"}, hooks_dirs=None)
    assert "nvidia-smi" in unread.stderr and not _uuids(unread.stdout)  # the earlier version's place: no GPU

    done = _nvc("setup", "podman", "--config", str(config), "--no-server")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.splitlines()[:4] == [
        f"wrote {DEFAULT_HOOKS_DIR}/oci-nvc-py-hook.json",
        f"wrote {DEFAULT_HOOKS_DIR}/oci-nvc-py-poststop.json",
        f"removed {legacy}/oci-nvc-py-hook.json (moved to {DEFAULT_HOOKS_DIR})",
        f"removed {legacy}/oci-nvc-py-poststop.json (moved to {DEFAULT_HOOKS_DIR})",
    ]
    seen = podman.run(image, ["nvidia-smi", "-L"], env={"NVIDIA_VISIBLE_DEVICES": "0"}, hooks_dirs=None)
    assert seen.returncode == 0, seen.stderr
    assert _uuids(seen.stdout) == [H100]

    removed = _nvc("setup", "podman", "--remove")
    assert removed.stdout.splitlines() == [
        f"removed {DEFAULT_HOOKS_DIR}/oci-nvc-py-hook.json",
        f"removed {DEFAULT_HOOKS_DIR}/oci-nvc-py-poststop.json",
        *(f"removed {d}" for d in made),
    ]  # and the directories setup made
    gone = podman.run(image, ["nvidia-smi", "-L"], env={"NVIDIA_VISIBLE_DEVICES": "0"}, hooks_dirs=None)
    assert "nvidia-smi" in gone.stderr and not _uuids(gone.stdout)

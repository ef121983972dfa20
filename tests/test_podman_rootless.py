"""Rootless podman, run by an ordinary user, with a GPU through CDI on the fake driver (#51).

Root writes the CDI spec (`nvc-py cdi generate --output /etc/cdi/nvidia.yaml`); the user, with a
/etc/subuid and /etc/subgid range of its own, runs `podman run --device nvidia.com/gpu=0`. The user,
its ranges and /etc/cdi exist only in a private mount namespace where /etc is an overlay on a tmpfs:
the host's /etc stays as it is. podman runs in the user's own storage (vfs), XDG_RUNTIME_DIR the
user's 0700 directory, no network (no slirp4netns here), cgroupfs (rootless podman on cgroup v1
manages no cgroup at all: no device rules either, docs/engines.md).
"""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import time
from pathlib import Path

import pytest

from harness.bundle import reachable_from_userns
from harness.fakegpus import H100, uuids
from harness.hookfixtures import setup_dir  # noqa: F401  (fixture)
from harness.installed import SCRIPTS
from harness.podman import CONTAINERS_CONF

USER, UID = "nvc-rootless", 45678
SUBIDS = f"{USER}:300000:65536\n"  # the user's range: uid 1 inside is host 300000
# As root, in a private mount namespace: /etc an overlay where the user, its ranges and the CDI spec
# exist ($1 a scratch directory, $2 the user's home), root's command ($3...), then the user's podman
# commands ($0) through runuser.
AS_USER = """\
set -e
scratch=$1; home=$2; shift 2
mount -t tmpfs tmpfs "$scratch"
mkdir "$scratch/upper" "$scratch/work"
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$scratch/upper,workdir=$scratch/work" /etc
echo "%(user)s:x:%(uid)d:%(uid)d::$home:/bin/sh" >> /etc/passwd
echo "%(user)s:x:%(uid)d:" >> /etc/group
printf '%(subids)s' > /etc/subuid
printf '%(subids)s' > /etc/subgid
mkdir -p /etc/cdi
"$@"
exec runuser -u %(user)s -- sh -c "$0"
"""
# What the container shows: its GPU, its nodes, the ld cache's driver entry, the owner (as the container
# sees it) of what the CDI hooks made (the ld cache, the libcuda.so link), its uid and uid map.
CHECK = (
    "nvidia-smi -L 2>&1; ls /dev | grep '^nvidia'; ldconfig -p | grep -o 'libcuda.so.1 (.*'; "
    "stat -c 'owner %u:%g %n' /etc/ld.so.cache /usr/lib/x86_64-linux-gnu/libcuda.so; id -u; cat /proc/self/uid_map"
)


def _user_script(home: Path, run: Path, image_tar: Path, userns: list[str]) -> str:
    """The user's commands: its own podman configuration and storage, the image imported, the GPU run."""
    env = (
        f"HOME={home} XDG_RUNTIME_DIR={run} CONTAINERS_CONF={home}/containers.conf "
        f"CONTAINERS_STORAGE_CONF={home}/storage.conf CONTAINERS_REGISTRIES_CONF={home}/registries.conf"
    )
    podman = f"env {env} podman"
    return (
        f"{podman} import --quiet {image_tar} localhost/nvc-rootless:debian >/dev/null && "
        f"exec {podman} --hooks-dir {home}/hooks.d run --rm --pull never --network none {' '.join(userns)} "
        f'--device nvidia.com/gpu=0 -v /proc:/proc:rbind localhost/nvc-rootless:debian sh -c "{CHECK}"'
    )


def _stop_pause_process(run: Path) -> None:
    """End the process rootless podman leaves to hold the user's namespace (its pid in the user's
    runtime directory), and wait until it is gone."""
    try:
        pid = int((run / "libpod/tmp/pause.pid").read_text())
    except FileNotFoundError:
        return
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.01)


# podman's --userns modes -> the container's uid (id -u) and its uid_map as the container reads it: without
# a mode the container is in podman's own user namespace (host ids); keep-id and nomap give it one inside
# that namespace, where 0 is the user and 1.. its range (keep-id: the user's uid is the user; nomap: the
# user is not mapped at all).
USERNS_MODES = {
    "default": ([], "0", [["0", str(UID), "1"], ["1", "300000", "65536"]]),
    "keep-id": (
        ["--userns=keep-id"],
        str(UID),
        [["0", "1", str(UID)], [str(UID), "0", "1"], ["45679", "45679", "19858"]],
    ),
    "nomap": (["--userns=nomap"], "0", [["0", "1", "65536"]]),
}


@pytest.mark.parametrize("mode", USERNS_MODES)
def test_rootless_podman_gets_gpu_through_cdi(
    active_2gpu,
    fake_2gpu,
    rootfs_cache,
    setup_dir: Path,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    mode: str,
) -> None:
    """An ordinary user's `podman run --device nvidia.com/gpu=0`, with no --userns and with rootless podman's
    keep-id and nomap (where NVIDIA's stack fails: libnvidia-container #115, toolkit #648): GPU 0 and its
    nodes, libcuda in a working ld cache, the ld cache and the libcuda.so link the container root's, the
    uid and uid map of the mode."""
    try:
        pwd.getpwuid(UID)
        pytest.skip(f"uid {UID} is taken on this host")
    except KeyError:
        pass
    home, scratch = tmp_path / "home", tmp_path / "etc-scratch"
    # The runroot ($XDG_RUNTIME_DIR/containers) short: podman 4.3's exit command (`podman container
    # cleanup`, run by conmon) refuses a --runroot over 50 characters, and `podman run` then waits 20 s
    # for the exit code it would have stored.
    run = tmp_path_factory.mktemp("run")
    assert len(f"{run}/containers") <= 50, run
    for directory in (home, scratch, home / "hooks.d"):
        directory.mkdir()
    run.chmod(0o700)
    (home / "containers.conf").write_text(CONTAINERS_CONF)
    (home / "registries.conf").write_text("")
    (home / "storage.conf").write_text(
        f'[storage]\ndriver = "vfs"\nrunroot = "{run}/containers"\ngraphroot = "{home}/storage"\n'
    )
    image_tar = home / "debian.tar"
    image_tar.write_bytes(rootfs_cache.tarball("debian").read_bytes())
    for path in (home, run, *home.iterdir()):
        os.chown(path, UID, UID)
    reachable_from_userns(home)
    reachable_from_userns(fake_2gpu.root)
    reachable_from_userns(setup_dir / "config.yaml")  # the hooks' configuration, read by the user's hooks
    generate = [
        str(SCRIPTS / "nvc-py"),
        "--root",
        str(fake_2gpu.root),
        "cdi",
        "generate",
        "--output",
        "/etc/cdi/nvidia.yaml",
        "--config",
        str(setup_dir / "config.yaml"),
    ]
    script = AS_USER % {"user": USER, "uid": UID, "subids": SUBIDS}
    userns, uid, uid_map = USERNS_MODES[mode]
    user_script = _user_script(home, run, image_tar, userns)
    try:
        result = subprocess.run(
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                script,
                user_script,
                str(scratch),
                str(home),
                *generate,
            ],
            capture_output=True,
            text=True,
            timeout=300,
            stdin=subprocess.DEVNULL,
        )
    finally:
        _stop_pause_process(run)
    assert result.returncode == 0, result.stderr
    assert uuids(result.stdout) == [H100]
    lines = result.stdout.splitlines()
    assert [line for line in lines if line.startswith("nvidia")] == [
        "nvidia-modeset",
        "nvidia-uvm",
        "nvidia-uvm-tools",
        "nvidia0",
        "nvidiactl",
    ], result.stdout
    assert any(
        line.startswith("libcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1") for line in lines
    ), result.stdout
    assert "owner 0:0 /etc/ld.so.cache" in lines, result.stdout
    assert "owner 0:0 /usr/lib/x86_64-linux-gnu/libcuda.so" in lines, result.stdout
    owners = lines.index("owner 0:0 /usr/lib/x86_64-linux-gnu/libcuda.so")
    assert lines[owners + 1] == uid, result.stdout
    assert [line.split() for line in lines[owners + 2 :]] == uid_map, result.stdout

"""README's commands walked with the package installed, in a throwaway copy of this host's root
(harness.hostroot): a clone's make targets beside the package, and the install and quick start on a
host without systemd (dockerd started by hand, podman), every printed piece of advice run as printed."""

from __future__ import annotations

import shutil
from pathlib import Path

from harness import debroot, progress

# In a throwaway copy of this host's root (harness.hostroot): the package installed as README says
# (the suite's own make install removed first, as a host with the package has none), then the
# make targets of a clone beside it.
BESIDE = r"""set -eu
say() { echo "@@ $*"; }  # not "==": make try and demo print such lines
rm -rf /usr/lib/nvc-py /usr/local/bin/nvc-py /usr/local/bin/nvc-py-hook /usr/local/bin/nvc-py-runtime
cd /mnt && apt-get install -q -y --no-install-recommends ./nvc-py.deb > /dev/null 2>&1
cd /root/nvc-py
say try; make try CMD='nvc-py info'
for target in install uninstall test; do
	say $target; if make $target; then echo "make $target: not refused"; exit 1; fi
done
say demo; make demo
say verify; dpkg --verify nvc-py && echo "package files as installed"
say doctor; nvc-py doctor || true
"""


def test_source_tree_beside_the_package(deb: Path, tmp_path: Path) -> None:
    """With the package installed, ``make try`` and ``make demo`` in a clone use it as installed;
    ``make install``, ``uninstall`` and ``test`` refuse in one line that says what to do instead,
    and the package's files stay as dpkg installed them; doctor's advice (``make try``) works."""
    from harness import hostroot

    clone, work = tmp_path / "clone", tmp_path / "work"
    debroot.copy_tree(clone)
    work.mkdir()
    shutil.copy2(deb, work / "nvc-py.deb")
    (tmp_path / "layers").mkdir()
    with progress.phase("the package installed in a throwaway root, a clone's make targets beside it"):
        result = hostroot.run(BESIDE, tmp_path / "layers", 600, [(work, "/mnt"), (clone, "/root/nvc-py")])
    out = result.stdout
    assert result.returncode == 0, out[-6000:]

    def section(name: str) -> str:
        return out.split(f"@@ {name}\n", 1)[1].split("\n@@ ", 1)[0]

    assert "NVIDIA H100 80GB HBM3" in section("try"), out[-6000:]
    for target in ("install", "uninstall", "test"):
        assert section(target).startswith(
            f"make {target}: /usr/lib/nvc-py is the Debian package nvc-py's: this tree is not installed over it "
            "nor removed from it; apt remove nvc-py first (make try and make demo use the package as installed)\n"
        ), section(target)
    demo = section("demo")
    assert "pip, install: nothing (the Debian package nvc-py in /usr/lib/nvc-py is used as installed)" in demo
    assert "GPU 0: NVIDIA H100 80GB HBM3" in demo, demo[-4000:]
    assert section("verify") == "package files as installed", section("verify")
    assert "run `make try` in a copy of nvc-py's source" in section("doctor"), section("doctor")


# README's install and quick start in order, on a host without systemd with a dockerd started by hand
# (the host), in a throwaway copy of this host's root: the fake driver stands in for the
# NVIDIA one (shown at the real paths, its root in the configuration), a small image made from host
# parts for IMAGE, and containers get no network (podman and docker on this machine: runc, cgroupfs,
# vfs). Each printed command runs as printed; dockerd is started again as setup prints it.
WALK = r"""set -eu
say() { echo "@@ $*"; }
rm -rf /usr/lib/nvc-py /usr/local/bin/nvc-py /usr/local/bin/nvc-py-hook /usr/local/bin/nvc-py-runtime
/usr/bin/python3 - <<'PY'
import sys
sys.path.insert(0, "/root/nvc-py/tests")
from pathlib import Path
from fakedriver.activate import show
from fakedriver.build import build
fake = build(Path("/root/nvc-py/tests/fakedriver/machines/two-gpu-mig.yaml"), Path("/srv/fake"))
Path("/srv/staging").mkdir()
show(fake, Path("/srv/staging"))
PY
mkdir -p /etc/containers
printf '[engine]\ncgroup_manager = "cgroupfs"\nruntime = "runc"\nevents_logger = "file"\n[containers]\n%s\n' \
	'default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]' > /etc/containers/containers.conf
printf '[storage]\ndriver = "vfs"\nrunroot = "/run/containers/storage"\ngraphroot = "/var/lib/containers/storage"\n' \
	> /etc/containers/storage.conf
dockerd --iptables=false --ip-masq=false --bridge=none --storage-driver vfs --exec-opt native.cgroupdriver=cgroupfs \
	--cgroup-parent nvc-walk > /tmp/dockerd.log 2>&1 &
ready() {
	for i in $(seq 300); do docker version > /dev/null 2>&1 && return 0; sleep 0.1; done
	cat /tmp/dockerd.log; exit 1
}
ready
say install; cd /mnt && apt-get install -q -y --no-install-recommends ./nvc-py.deb > /dev/null 2>&1 && echo installed
echo "root: /srv/fake/root" >> /etc/nvc-py/config.yaml
podman import -q /mnt/rootfs.tar localhost/walk > /dev/null && docker import /mnt/rootfs.tar walk > /dev/null
say doctor; nvc-py doctor || true
say setup-podman; nvc-py setup podman
say podman-run; podman run --rm --network none -e NVIDIA_VISIBLE_DEVICES=0 localhost/walk nvidia-smi -L
say cdi; nvc-py cdi generate --output /etc/cdi/nvidia.yaml
say podman-cdi; podman run --rm --network none --device nvidia.com/gpu=0 localhost/walk nvidia-smi -L
say setup-docker; nvc-py setup docker --restart | tee /tmp/setup-docker.out
say docker-runtime; docker run --rm --network none --runtime nvc-py -e NVIDIA_VISIBLE_DEVICES=0 walk nvidia-smi -L
pid=$(sed -n 's/.* stop it (kill \([0-9]*\)) and start it again as before: \(.*\)$/\1/p' /tmp/setup-docker.out)
again=$(sed -n 's/.* stop it (kill \([0-9]*\)) and start it again as before: \(.*\)$/\2/p' /tmp/setup-docker.out)
kill $pid; while kill -0 $pid 2>/dev/null; do sleep 0.1; done
$again > /tmp/dockerd.log 2>&1 &
ready
say docker-gpus; docker run --rm --network none --gpus all walk nvidia-smi -L
say doctor-run; nvc-py doctor --run || true
say refused
if docker run --rm --network none --runtime nvc-py -e NVIDIA_VISIBLE_DEVICES=7 walk true; then exit 1; fi
tail -n 1 /var/log/nvc-py.log
say remove; apt-get remove -q -y nvc-py 2>&1 | grep -v '^(Reading database'
say after; docker info --format '{{json .Runtimes}}'
docker run --rm --network none --runtime nvc-py walk true 2>&1 || true
say done
pid=$(cat /var/run/docker.pid); kill $pid; while kill -0 $pid 2>/dev/null; do sleep 0.1; done
for dir in /sys/fs/cgroup/*/nvc-walk /sys/fs/cgroup/*/libpod_parent; do
	[ -d "$dir" ] && find "$dir" -depth -type d -exec rmdir {} + 2>/dev/null || true
done
"""


def test_readme_walk_without_systemd(deb: Path, tmp_path: Path, rootfs_cache) -> None:  # noqa: ANN001
    """README's install and quick start on a host without systemd (podman, a dockerd started by hand):
    every command works as printed; doctor's advice is what the walk does; `setup docker --restart`
    reloads dockerd's runtimes and says how to start it again for --gpus, which works; a refused
    start is logged; `apt remove` makes the running dockerd drop runtime nvc-py."""
    from harness import hostroot

    clone, work = tmp_path / "clone", tmp_path / "work"
    debroot.copy_tree(clone)
    work.mkdir()
    shutil.copy2(deb, work / "nvc-py.deb")
    shutil.copy2(rootfs_cache.tarball("debian"), work / "rootfs.tar")
    (tmp_path / "layers").mkdir()
    with progress.phase("README's install and quick start in a throwaway root without systemd"):
        result = hostroot.run(WALK, tmp_path / "layers", 600, [(work, "/mnt"), (clone, "/root/nvc-py")])
    out = result.stdout
    (tmp_path / "walk.log").write_text(out)  # the whole transcript, kept with a failed test's files
    assert result.returncode == 0 and out.rstrip().endswith("@@ done"), out[-6000:]

    def section(name: str) -> str:
        return out.split(f"@@ {name}\n", 1)[1].split("\n@@ ", 1)[0]

    walked = {"nvc-py setup podman", "nvc-py setup docker", "nvc-py cdi generate --output /etc/cdi/nvidia.yaml"}
    advice = {line.split("→ ", 1)[1] for line in section("doctor").splitlines() if "→ " in line}
    assert advice <= walked, section("doctor")
    h100 = "GPU 0: NVIDIA H100 80GB HBM3"
    assert section("podman-run").startswith(h100) and section("podman-cdi").startswith(h100), out[-6000:]
    setup = section("setup-docker")
    assert "reloaded /etc/docker/daemon.json (SIGHUP): it serves runtime nvc-py\n" in setup, setup
    assert "start it again as before" in setup, setup
    assert section("docker-runtime").startswith(h100), section("docker-runtime")
    assert "GPU 1: NVIDIA A100-SXM4-40GB" in section("docker-gpus"), section("docker-gpus")
    doctor = section("doctor-run")
    assert "✓ podman run: " in doctor and "✓ docker run: " in doctor and "✗ containerd" not in doctor, doctor
    logged = section("refused").splitlines()[-1]
    assert '"stage":"runtime"' in logged and '"outcome":"error"' in logged, section("refused")
    removal = section("remove")
    assert "reloaded /etc/docker/daemon.json (SIGHUP): it dropped runtime nvc-py\n" in removal, removal
    after = section("after")
    assert "nvc-py" not in after.splitlines()[0] and "Unknown runtime specified nvc-py" in after, after

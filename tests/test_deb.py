"""The Debian package (docs/install.md): ``make deb`` builds it on this machine (Debian 12), twice
(a lower version to upgrade from); in a minimal Debian 12 root made by debootstrap, holding the
distribution packages it depends on so that the install needs no network (harness.debroot),

- ``apt-get install ./….deb`` installs it: ``nvc-py --version``, a fake-driver ``nvc-py info``, bash
  completion and a prestart hook call answer, the call served by the server the hook starts on
  demand (no systemd runs there, and postinst starts nothing);
- an upgrade keeps the admin's configuration and the containers' sharing state, stops the server of
  the replaced code, and (systemd faked: /run/systemd/system and a systemctl that logs) starts the
  socket and restarts the service;
- ``apt-get remove`` undoes what ``nvc-py setup …`` and ``cdi generate`` wrote, stops the units and
  the servers, keeps the configuration;
- ``apt-get purge`` is refused while /run/nvc-py/share holds a container's state, then unmounts
  nvc-py's own scheduler tmpfs and leaves the root as it was before the install but for apt's and
  dpkg's own records;
- with /run/nvc-py, its share and gpu-sched, /etc/nvc-py, the log and /var/log replaced by symlinks
  to someone else's files and mounts (a tmpfs among them), ``dpkg --purge`` follows none, unmounts
  none, succeeds and names what it left.

Two builds, one from the tree a release tarball holds (``git archive``, no .git) and one from the
clone, list the same files, and lintian reports no error and no warning but those
deploy/debian/lintian-overrides explains. The chroot runs in its own mount and pid namespaces: the
package's maintainer scripts look for servers in /proc, and must see the root's alone.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from harness import debroot, progress

REPO = debroot.REPO
PIP_CACHE = debroot.CACHE / "deb-pip"  # the builds' own pip cache (tools/debpkg.py says why), kept between runs
# What the package depends on beyond a minbase root: apt finds it installed and fetches nothing.
INCLUDE = "python3"
MACHINE = Path(__file__).resolve().parent / "fakedriver" / "machines" / "two-gpu-mig.yaml"
# apt's and dpkg's records and caches, the only differences a purge may leave.
APT_RECORDS = ("var/lib/dpkg", "var/lib/apt", "var/cache/apt", "var/log/apt", "var/log/dpkg.log",
               "var/cache/debconf")
# In the root (the test's files at /mnt): install, use, upgrade, set up, remove and purge.
SCRIPT = r"""set -eu
cd /mnt
say() { echo "== $*"; }
alive() { test -e /proc/$1 && ! grep -q '^State:[[:space:]]*Z' /proc/$1/status; }
# The servers (their workers share the command line, but have a server for parent).
servers() {
	for p in /proc/[0-9]*; do
		if [ "$(cut -d' ' -f4 $p/stat 2>/dev/null)" = 1 ] && tr '\0' ' ' < $p/cmdline 2>/dev/null |
			grep -q '^/usr/lib/nvc-py/venv/bin/python -IS /usr/lib/nvc-py/nvc-py-hook-python serve'; then
			if alive ${p#/proc/}; then echo ${p#/proc/}; fi
		fi
	done
}
gone() { for f in "$@"; do if test -e "$f" || test -L "$f"; then echo "left: $f"; exit 1; fi; done; }
apt() {
	if apt-get -q -y -o Dpkg::Use-Pty=0 --no-install-recommends "$@" > /mnt/apt.out 2>&1; then rc=0; else rc=$?; fi
	grep -v '^(Reading database' /mnt/apt.out || true
	return $rc
}
hook() { NVC_PY_CONFIG=/mnt/config.yaml nvc-py-hook prestart < /mnt/state.json; }
printf '{"ociVersion":"1.0.2","id":"deb-test","status":"creating","pid":%d,"bundle":"/mnt/bundle"}' $$ > state.json

say install; apt install ./old.deb
test "$(readlink /usr/bin/nvc-py)" = ../lib/nvc-py/nvc-py
test "$(head -n1 /usr/lib/nvc-py/nvc-py-python)" = "#!/usr/lib/nvc-py/venv/bin/python -IS"
test "$(readlink -f /usr/lib/nvc-py/venv/bin/python)" = "$(readlink -f /usr/bin/python3)"
grep -q '"path": "/usr/lib/nvc-py/nvc-py-hook"' /usr/share/containers/oci/hooks.d/oci-nvc-py-hook.json
test -L /etc/systemd/system/sockets.target.wants/nvc-py-hook.socket
gone /etc/systemd/system/multi-user.target.wants/nvc-py-device-plugin.service \
     /etc/systemd/system/multi-user.target.wants/nvc-py-exporter.service /run/nvc-py/hook.sock
test -f /etc/logrotate.d/nvc-py && test -f /lib/systemd/system/nvc-py-device-plugin.service && \
    test -f /lib/systemd/system/nvc-py-exporter.service
test -n "$(find /usr/lib/nvc-py/venv -name '*.pyc' | head -n 1)"
for module in pytest grpc_tools pygments pip setuptools; do
	if /usr/lib/nvc-py/venv/bin/python -I -c "import $module" 2>/dev/null; then echo "bundled: $module"; exit 1; fi
done
say version; nvc-py --version
say info; NVC_PY_CONFIG=/mnt/config.yaml nvc-py info
say completion; COMP_WORDS="nvc-py se" COMP_CWORD=1 _NVC_PY_COMPLETE=bash_complete nvc-py
say hook; hook; hook
nvc-py-hook prestart < state.json  # the default configuration: its log is /var/log/nvc-py.log
old=$(servers); test -n "$old"; echo "server $old"
mkdir -p /run/nvc-py/share/ctr-1 && echo held > /run/nvc-py/share/ctr-1/limits
echo "# the admin's edit" >> /etc/nvc-py/config.yaml

say upgrade
mkdir -p /run/systemd/system
printf '#!/bin/sh\necho "$*" >> /mnt/systemctl.log\ncase "$*" in *is-enabled*) echo enabled;; esac\n' \
	> /usr/bin/systemctl
chmod 755 /usr/bin/systemctl
apt install ./new.deb
dpkg-query -W -f='${Version}\n' nvc-py
for pid in $old; do if alive $pid; then echo "old server $pid still runs"; exit 1; fi; done
grep -q "the admin's edit" /etc/nvc-py/config.yaml
test -f /run/nvc-py/share/ctr-1/limits
say systemctl; cat systemctl.log
hook; new=$(servers); test -n "$new" && test "$new" != "$old"; echo "server $new"

say setup
nvc-py setup podman --hooks-dir /etc/containers/oci/hooks.d
nvc-py setup containerd
NVC_PY_CONFIG=/mnt/config.yaml nvc-py cdi generate --output /etc/cdi/nvidia.yaml
nvc-py setup podman --no-server
test -f /etc/systemd/system/nvc-py-hook.socket && test -f /etc/containerd/conf.d/99-nvc-py.toml
test -f /etc/cdi/nvidia.yaml && test -f /etc/nvc-py/no-server

say remove; : > systemctl.log; apt remove nvc-py
gone /usr/lib/nvc-py /usr/bin/nvc-py /usr/bin/nvc-py-hook /usr/bin/nvc-py-runtime \
	/usr/share/containers/oci/hooks.d/oci-nvc-py-hook.json /usr/share/containers/oci/hooks.d/oci-nvc-py-poststop.json \
	/etc/containers/oci/hooks.d/oci-nvc-py-hook.json /etc/containers/oci/hooks.d/oci-nvc-py-poststop.json \
	/etc/containerd /etc/cdi /lib/systemd/system/nvc-py-hook.socket /etc/systemd/system/nvc-py-hook.service
test -f /etc/nvc-py/config.yaml && test -f /etc/nvc-py/no-server
test -z "$(servers)"
say systemctl-remove; cat systemctl.log

say purge-refused
if apt purge nvc-py; then echo "purged with sharing state"; exit 1; fi
dpkg-query -W -f='${Status}\n' nvc-py
test -f /run/nvc-py/share/ctr-1/limits && test -f /etc/nvc-py/no-server && ! test -e /etc/nvc-py/config.yaml
rm -r /run/nvc-py/share/ctr-1
mkdir -p /run/nvc-py/gpu-sched && mount -t tmpfs -o mode=0755 tmpfs /run/nvc-py/gpu-sched  # nvc-py's own tmpfs
echo rotated > /var/log/nvc-py.log.1
say purge; apt purge nvc-py
if grep -q ' /run/nvc-py/gpu-sched ' /proc/self/mountinfo; then echo "nvc-py's tmpfs left mounted"; exit 1; fi
rm -r /run/systemd /usr/bin/systemctl

# Links planted where nvc-py's files go, each to someone else's files and mounts: dpkg --purge follows
# none, unmounts none of them, succeeds and names what it left.
theirs() { for f in "$@"; do test "$(cat /srv/theirs/$f)" = theirs || { echo "gone: /srv/theirs/$f"; exit 1; }; done; }
mkdir -p /srv/theirs/etc /srv/theirs/share /srv/theirs/mnt /srv/theirs/run/gpu-sched /srv/theirs/empty
for f in etc/no-server share/ctr-9 log varlog; do echo theirs > /srv/theirs/$f; done
mount -t tmpfs tmpfs /srv/theirs/mnt && echo theirs > /srv/theirs/mnt/data
mount -t tmpfs tmpfs /srv/theirs/empty && mount -t tmpfs tmpfs /srv/theirs/run/gpu-sched
say links-in-run
dpkg -i new.deb > /dev/null
mkdir /run/nvc-py && ln -s /srv/theirs/mnt /run/nvc-py/gpu-sched && ln -s /srv/theirs/share /run/nvc-py/share
mv /etc/nvc-py /srv/etc-nvc-py && ln -s /srv/theirs/etc /etc/nvc-py
ln -s /srv/theirs/log /var/log/nvc-py.log
dpkg --purge nvc-py 2>&1
theirs etc/no-server share/ctr-9 log mnt/data
rm -rf /run/nvc-py /etc/nvc-py /var/log/nvc-py.log /srv/etc-nvc-py
say run-linked
dpkg -i new.deb > /dev/null
ln -s /srv/theirs/run /run/nvc-py
mv /var/log /srv/log && ln -s /srv/log /var/log && cp /srv/theirs/varlog /srv/log/nvc-py.log
dpkg --purge nvc-py 2>&1
theirs varlog && test "$(cat /srv/log/nvc-py.log)" = theirs
mountpoint -q /srv/theirs/run/gpu-sched
rm /var/log /run/nvc-py /srv/log/nvc-py.log && mv /srv/log /var/log
say sched-linked-to-a-mount
dpkg -i new.deb > /dev/null
mkdir /run/nvc-py && ln -s /srv/theirs/empty /run/nvc-py/gpu-sched
dpkg --purge nvc-py 2>&1
mountpoint -q /srv/theirs/empty && mountpoint -q /srv/theirs/mnt
rm -r /run/nvc-py
umount /srv/theirs/mnt /srv/theirs/empty /srv/theirs/run/gpu-sched && rm -r /srv/theirs
say purged
"""


def _version() -> str:
    text = (REPO / "nvc/__init__.py").read_text()
    return text.split('__version__ = "', 1)[1].split('"', 1)[0]


def _build(tree: Path, out: Path, version: str) -> Path:
    with progress.phase(f"make deb: the package at version {version} from {tree}"):
        debroot.run(["make", "-C", str(tree), "--no-print-directory", "deb", f"DEB_DIR={out}",
                     f"DEB_VERSION={version}", f"DEB_PIP_CACHE={PIP_CACHE}"], 600)
    return next(out.glob("nvc-py_*.deb"))


def _git(*args: str, env: dict[str, str] | None = None) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True,
                          env=env).stdout.strip()


def release_tree(dest: Path) -> Path:
    """This tree as a release tarball holds it: ``git archive`` of a commit of the working tree as it
    is (untracked files too, through a temporary index: the repository's index and branches are not
    touched), unpacked into ``dest``; no .git."""
    with tempfile.TemporaryDirectory(prefix="nvc-deb-index-") as tmp:
        env = {**os.environ, "GIT_INDEX_FILE": f"{tmp}/index"}
        _git("read-tree", "HEAD", env=env)
        _git("add", "-A", env=env)
        tree = _git("write-tree", env=env)
    when = _git("log", "-1", "--format=%cI")
    who = {"GIT_AUTHOR_NAME": "test_deb", "GIT_AUTHOR_EMAIL": "test@nvc-py.invalid", "GIT_AUTHOR_DATE": when,
           "GIT_COMMITTER_NAME": "test_deb", "GIT_COMMITTER_EMAIL": "test@nvc-py.invalid", "GIT_COMMITTER_DATE": when}
    commit = _git("commit-tree", tree, "-p", "HEAD", "-m", "test_deb: the working tree", env={**os.environ, **who})
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", commit], capture_output=True,
                             check=True).stdout
    dest.mkdir()
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


@pytest.fixture(scope="module")
def deb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package built from the clone."""
    return _build(REPO, tmp_path_factory.mktemp("deb-new"), _version())


@pytest.fixture(scope="module")
def debs(tmp_path_factory: pytest.TempPathFactory, deb: Path) -> dict[str, Path]:
    """The package built twice: ``old``, at a lower version, from this tree as a release tarball
    holds it (no .git), and ``new`` from the clone."""
    base = tmp_path_factory.mktemp("deb")
    release = release_tree(base / "release")
    assert not (release / ".git").exists() and (release / "Makefile").is_file()
    return {"old": _build(release, base / "old", f"{_version()}~test1"), "new": deb}


def test_python_lock_satisfies_install_requires() -> None:
    """deploy/debian/python-lock.txt (what the package bundles) against setup.cfg's minimums: a raised
    minimum needs `make deb-lock` (the build's `pip check` sees what the locked ones require)."""
    sys.path.insert(0, str(REPO / "tools"))
    import missing_deps

    def key(name: str) -> str:
        return name.lower().replace("_", "-").replace(".", "-")

    lines = (REPO / "deploy/debian/python-lock.txt").read_text().splitlines()
    locked = dict(line.split("==") for line in lines if line and not line.startswith("#"))
    locked = {key(name): version for name, version in locked.items()}
    for text in missing_deps.runtime_requirements():
        requirement = Requirement(text)
        assert key(requirement.name) in locked, f"{requirement.name}: not in the lock"
        assert requirement.specifier.contains(locked[key(requirement.name)], prereleases=True), text


def _listing(deb: Path) -> list[tuple[str, ...]]:
    """``dpkg-deb -c``'s entries: (mode, owner, size, path and link), the size of the changelog (which
    names the version) left out."""
    out = debroot.run(["dpkg-deb", "-c", str(deb)], 60).stdout
    entries = []
    for line in out.splitlines():
        mode, owner, size, _date, _time, path = line.split(None, 5)
        entries.append((mode, owner, "" if path.endswith("/changelog.gz") else size, path))
    return entries


def test_two_builds_list_the_same_files(debs: dict[str, Path]) -> None:
    """One from a release tarball's tree, one from the clone: the same files, modes, owners and sizes."""
    old, new = _listing(debs["old"]), _listing(debs["new"])
    assert old == new
    paths = {entry[3].split(" -> ")[0] for entry in new}
    assert {"./usr/lib/nvc-py/nvc-py-hook", "./etc/nvc-py/config.yaml", "./lib/systemd/system/nvc-py-hook.socket",
            "./usr/share/containers/oci/hooks.d/oci-nvc-py-hook.json"} <= paths
    assert not [p for p in paths if "__pycache__" in p or "/pytest" in p or "/grpc_tools" in p or "/pygments" in p]


def test_control_pins_the_interpreter(debs: dict[str, Path]) -> None:
    control = debroot.run(["dpkg-deb", "-f", str(debs["new"]), "Depends", "Version"], 60).stdout
    minor = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert f"python3 (>= {minor}), python3 (<< {sys.version_info.major}.{sys.version_info.minor + 1})" in control
    assert "libseccomp2" in control and "libcap2" in control
    names = set(re.findall(r"(?:^Depends:|[,|])\s*([a-z0-9][a-z0-9.+-]*)", control, re.M))  # bcrypt's: libgcc-s1
    assert not [name for name in names if name.startswith(("gcc", "python3-dev", "python3-venv")) or "pytest" in name]
    assert f"Version: {_version()}\n" in control


def test_lintian_has_no_error_or_unexplained_warning(debs: dict[str, Path], summary_line) -> None:  # noqa: ANN001
    result = subprocess.run(["lintian", str(debs["new"])], capture_output=True, text=True, timeout=300)
    reported = [line for line in result.stdout.splitlines() if line[:2] in ("E:", "W:")]
    assert result.returncode == 0 and not reported, result.stdout + result.stderr
    summary_line(f"DEB lintian: {len(reported)} errors or warnings (overrides: deploy/debian/lintian-overrides)")


def test_install_upgrade_remove_purge(debs: dict[str, Path], tmp_path: Path, summary_line) -> None:  # noqa: ANN001
    from fakedriver.build import build

    started = time.monotonic()
    root, work = tmp_path / "root", tmp_path / "work"
    hit = debroot.base_root(root, INCLUDE)
    work.mkdir()
    for name, deb in debs.items():
        shutil.copy2(deb, work / f"{name}.deb")
    fake = build(MACHINE, work / "fake")
    (work / "config.yaml").write_text("root: /mnt/fake/root\nlog: {file: /mnt/hook.log}\n")
    (work / "bundle/rootfs").mkdir(parents=True)
    (work / "bundle/config.json").write_text('{"ociVersion": "1.0.2", "process": {"env": ["PATH=/usr/bin"], '
                                             '"args": ["true"], "cwd": "/"}, "root": {"path": "rootfs"}}')
    before = debroot.tree(root, APT_RECORDS)
    binds = [(work, "/mnt"), (fake.proc / "driver", "/proc/driver"), (fake.proc / "devices", "/proc/devices")]
    with progress.phase("the package installed, upgraded, set up, removed and purged in the Debian root"):
        out = debroot.chroot(root, SCRIPT, 600, binds, own_pids=True).stdout

    assert f"== version\nnvc-py {_version()}\n" in out
    info = out.split("== info\n", 1)[1]
    assert "NVIDIA H100 80GB HBM3" in info and "NVIDIA A100-SXM4-40GB" in info
    assert "plain,setup" in out.split("== completion\n", 1)[1]
    log = (work / "hook.log").read_text().splitlines()
    assert len(log) == 3 and all('"outcome":"no-gpu"' in line and '"via":"server"' in line for line in log), log
    upgrade = out.split("== upgrade\n", 1)[1]
    assert f"\n{_version()}\n" in upgrade  # the version dpkg reports after it
    calls = out.split("== systemctl\n", 1)[1].split("\n== ", 1)[0]
    assert "daemon-reload" in calls and "start nvc-py-hook.socket" in calls
    assert "try-restart nvc-py-hook.service" in calls, calls
    calls = out.split("== systemctl-remove\n", 1)[1].split("\n== ", 1)[0].splitlines()
    assert calls[0] == ("stop nvc-py-hook.socket nvc-py-hook.service nvc-py-device-plugin.service "
                        "nvc-py-exporter.service"), calls
    refused = out.split("== purge-refused\n", 1)[1]
    assert "nvc-py: not purged: /run/nvc-py/share holds the GPU-sharing state of containers (ctr-1); run" in refused
    assert "install ok config-files" in refused  # dpkg removed the configuration file, the rest waits
    assert out.rstrip().endswith("== purged"), out
    own = out.split("== purge\n", 1)[1].split("\n== ", 1)[0]
    assert "purge left" not in own, own
    left = "nvc-py: purge left "
    section = out.split("== links-in-run\n", 1)[1].split("\n== ", 1)[0]
    for line in ("/run/nvc-py/gpu-sched: a symlink (to /srv/theirs/mnt), not nvc-py's",
                 "/run/nvc-py/share: a symlink (to /srv/theirs/share), not nvc-py's", "/run/nvc-py: not empty",
                 "/var/log/nvc-py.log: a symlink (to /srv/theirs/log), not nvc-py's",
                 "/etc/nvc-py: a symlink (to /srv/theirs/etc), not nvc-py's"):
        assert left + line in section, section
    section = out.split("== run-linked\n", 1)[1].split("\n== ", 1)[0]
    for line in ("/run/nvc-py: a symlink (to /srv/theirs/run), not nvc-py's", "/var/log: a symlink (to /srv/log)"):
        assert left + line in section, section
    section = out.split("== sched-linked-to-a-mount\n", 1)[1].split("\n== ", 1)[0]
    assert left + "/run/nvc-py/gpu-sched: a symlink (to /srv/theirs/empty), not nvc-py's" in section, section

    after = debroot.tree(root, APT_RECORDS)
    changed = debroot.differences(before, after)
    assert not changed, [(path, before.get(path), after.get(path)) for path in changed]
    line = (f"DEB install, upgrade, remove, purge ok in {time.monotonic() - started:.0f} s, tree as before "
            f"(root cache: {'hit' if hit else 'miss'})")
    print(line)
    summary_line(line)


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
            "nor removed from it; apt remove nvc-py first (make try and make demo use the package as installed)\n"), \
            section(target)
    demo = section("demo")
    assert "pip, install: nothing (the Debian package nvc-py in /usr/lib/nvc-py is used as installed)" in demo
    assert "GPU 0: NVIDIA H100 80GB HBM3" in demo, demo[-4000:]
    assert section("verify") == "package files as installed", section("verify")
    assert "run `make try` in its source tree" in section("doctor"), section("doctor")


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

"""The Debian package (docs/install.md): ``make deb`` builds it on this machine (Debian 12), twice
(a lower version to upgrade from); in a minimal Debian 12 root made by debootstrap, holding the
distribution packages it depends on so that the install needs no network (harness.debroot),

- ``apt-get install ./….deb`` installs it: ``nvc-py --version``, a fake-driver ``nvc-py info`` (its
  configuration's driver root is not /: the native driver helper the front starts is set aside), the
  packaged native driver helper's own answer there (linked against the distribution's libc), bash
  completion and a prestart hook call answer, the call served by the server the hook starts on
  demand (no systemd runs there, and postinst starts nothing);
- an upgrade keeps the admin's configuration and the containers' sharing state, stops the server of
  the replaced code, and (systemd faked: /run/systemd/system and a systemctl that logs) starts the
  socket and restarts the service;
- ``nvc-py setup`` of every engine, ``setup podman --remove`` and ``setup server --remove`` leave the
  package's files as dpkg installed them (``dpkg --verify``), write no unit that would shadow the
  package's, restart no server where nothing changed, and disable the package's socket through systemctl;
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

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from packaging.requirements import Requirement

from harness import debroot, progress
from harness.debbuild import version

REPO = debroot.REPO
# What the package depends on beyond a minbase root: apt finds it installed and fetches nothing.
INCLUDE = "python3"
MACHINE = Path(__file__).resolve().parent / "fakedriver" / "machines" / "two-gpu-mig.yaml"
# apt's and dpkg's records and caches, the only differences a purge may leave.
APT_RECORDS = ("var/lib/dpkg", "var/lib/apt", "var/cache/apt", "var/log/apt", "var/log/dpkg.log", "var/cache/debconf")
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
test -L /etc/systemd/system/multi-user.target.wants/nvc-py-cdi-refresh.path && \
    test -L /etc/systemd/system/timers.target.wants/nvc-py-cdi-refresh.timer && \
    test -f /lib/systemd/system/nvc-py-cdi-refresh.service
test -n "$(find /usr/lib/nvc-py/venv -name '*.pyc' | head -n 1)"
for module in pytest grpc_tools pygments pip setuptools; do
	if /usr/lib/nvc-py/venv/bin/python -I -c "import $module" 2>/dev/null; then echo "bundled: $module"; exit 1; fi
done
say code-cache  # the modules the packaged launchers load from the cache postinst wrote
/usr/lib/nvc-py/venv/bin/python -I -S -v /usr/lib/nvc-py/nvc-py-python --version 2>&1 | grep -c '_CachedLoader object'
say version; nvc-py --version
say info; NVC_PY_CONFIG=/mnt/config.yaml nvc-py info
say native-helper; /usr/lib/nvc-py/nvc-py-driver-snapshot /mnt/fake/root "$(cat /proc/sys/kernel/overflowuid)" \
	"$(cat /proc/sys/kernel/overflowgid)"
say completion; COMP_WORDS="nvc-py se" COMP_CWORD=1 _NVC_PY_COMPLETE=bash_complete nvc-py
say hook; hook; hook
nvc-py-hook prestart < state.json  # the default configuration: its log is /var/log/nvc-py.log
old=$(servers); test -n "$old"; echo "server $old"
stays() { tr '\0' '\n' < /proc/$1/environ | grep -qx NVC_PY_SERVE_STAYS=1; }
say setup-without-systemd; nvc-py setup podman
set -- $(servers)
if [ $# != 1 ] || [ "$1" = "$old" ] || ! stays $1; then echo "servers after setup: $* (before: $old)"; exit 1; fi
old=$1
say init-script  # what the init (not systemd) runs at boot and shutdown: registered by postinst
ls /etc/rc2.d /etc/rc0.d | grep -x '[SK][0-9][0-9]nvc-py-hook'
/etc/init.d/nvc-py-hook status
/etc/init.d/nvc-py-hook stop
if alive $old; then echo "server $old still runs after stop"; exit 1; fi
if /etc/init.d/nvc-py-hook status; then exit 1; else echo "status: $?"; fi
/etc/init.d/nvc-py-hook start
set -- $(servers)
if [ $# != 1 ] || ! stays $1; then echo "servers after the init script's start: $*"; exit 1; fi
/etc/init.d/nvc-py-hook restart
if alive $1; then echo "server $1 still runs after restart"; exit 1; fi
set -- $(servers)
if [ $# != 1 ] || ! stays $1; then echo "servers after the init script's restart: $*"; exit 1; fi
old=$1
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
stays $new || { echo "server $new: not the successor setup's server starts"; exit 1; }

# The package's files as dpkg installed them (the configuration file is the admin's to edit).
verified() {
	changed=$(dpkg --verify nvc-py | grep -v ' c /' || true)
	if [ -n "$changed" ]; then echo "dpkg --verify after $*: $changed"; exit 1; fi
}
say setup; : > systemctl.log
nvc-py setup podman; verified setup podman
nvc-py setup containerd; verified setup containerd
nvc-py setup docker; verified setup docker
nvc-py setup docker --remove; verified setup docker --remove
gone /etc/systemd/system/nvc-py-hook.socket /etc/systemd/system/nvc-py-hook.service
say systemctl-setup; cat systemctl.log
say setup-remove; : > systemctl.log
nvc-py setup podman --remove; verified setup podman --remove
nvc-py setup server --remove; verified setup server --remove
test -f /usr/share/containers/oci/hooks.d/oci-nvc-py-hook.json
say systemctl-setup-remove; cat systemctl.log
say setup-again
nvc-py setup podman --hooks-dir /etc/containers/oci/hooks.d; verified setup podman --hooks-dir
NVC_PY_CONFIG=/mnt/config.yaml nvc-py cdi generate --output /etc/cdi/nvidia.yaml
say cdi-refresh; NVC_PY_CONFIG=/mnt/config.yaml nvc-py cdi refresh
nvc-py setup podman --no-server; verified setup podman --no-server
gone /etc/systemd/system/nvc-py-hook.socket /etc/systemd/system/nvc-py-hook.service
test -f /etc/containerd/conf.d/99-nvc-py.toml && test -f /etc/cdi/nvidia.yaml && test -f /etc/nvc-py/no-server

say remove; : > systemctl.log; apt remove nvc-py
gone /usr/lib/nvc-py /usr/bin/nvc-py /usr/bin/nvc-py-hook /usr/bin/nvc-py-runtime \
	/usr/share/containers/oci/hooks.d/oci-nvc-py-hook.json /usr/share/containers/oci/hooks.d/oci-nvc-py-poststop.json \
	/etc/containers/oci/hooks.d/oci-nvc-py-hook.json /etc/containers/oci/hooks.d/oci-nvc-py-poststop.json \
	/etc/containerd /etc/cdi /lib/systemd/system/nvc-py-hook.socket /etc/systemd/system/nvc-py-hook.service
test -f /etc/nvc-py/config.yaml && test -f /etc/nvc-py/no-server
test -z "$(servers)"
test -z "$(/etc/init.d/nvc-py-hook start)"  # a conffile until the purge: nothing to start
say systemctl-remove; cat systemctl.log

say purge-refused
if apt purge nvc-py; then echo "purged with sharing state"; exit 1; fi
dpkg-query -W -f='${Status}\n' nvc-py
test -f /run/nvc-py/share/ctr-1/limits && test -f /etc/nvc-py/no-server && ! test -e /etc/nvc-py/config.yaml
rm -r /run/nvc-py/share/ctr-1
mkdir -p /run/nvc-py/gpu-sched && mount -t tmpfs -o mode=0755 tmpfs /run/nvc-py/gpu-sched  # nvc-py's own tmpfs
echo rotated > /var/log/nvc-py.log.1
say purge; apt purge nvc-py
gone /etc/init.d/nvc-py-hook /etc/rc2.d/S01nvc-py-hook /etc/rc0.d/K01nvc-py-hook
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
    assert {
        "./usr/lib/nvc-py/nvc-py-hook",
        "./etc/nvc-py/config.yaml",
        "./lib/systemd/system/nvc-py-hook.socket",
        "./lib/systemd/system/nvc-py-cdi-refresh.path",
        "./lib/systemd/system/nvc-py-cdi-refresh.timer",
        "./usr/share/containers/oci/hooks.d/oci-nvc-py-hook.json",
    } <= paths
    assert not [p for p in paths if "__pycache__" in p or "/pytest" in p or "/grpc_tools" in p or "/pygments" in p]


def test_the_description_names_every_engine(debs: dict[str, Path]) -> None:
    description = debroot.run(["dpkg-deb", "-f", str(debs["new"]), "Description"], 60).stdout
    assert all(engine in description for engine in ("Docker", "Podman", "CRI-O", "containerd")), description


def test_control_pins_the_interpreter(debs: dict[str, Path]) -> None:
    control = debroot.run(["dpkg-deb", "-f", str(debs["new"]), "Depends", "Version"], 60).stdout
    minor = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert f"python3 (>= {minor}), python3 (<< {sys.version_info.major}.{sys.version_info.minor + 1})" in control
    assert "libseccomp2" in control and "libcap2" in control
    names = set(re.findall(r"(?:^Depends:|[,|])\s*([a-z0-9][a-z0-9.+-]*)", control, re.M))  # bcrypt's: libgcc-s1
    assert not [name for name in names if name.startswith(("gcc", "python3-dev", "python3-venv")) or "pytest" in name]
    assert f"Version: {version()}\n" in control


def test_lintian_has_no_error_or_unexplained_warning(debs: dict[str, Path], tmp_path: Path, summary_line) -> None:  # noqa: ANN001
    # lintian leaves a database file (mldbm-elf-*) in its temporary directory: the test's, not the host's /tmp
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    result = subprocess.run(["lintian", str(debs["new"])], capture_output=True, text=True, timeout=300, env=env)
    reported = [line for line in result.stdout.splitlines() if line[:2] in ("E:", "W:")]
    assert result.returncode == 0 and not reported, result.stdout + result.stderr
    summary_line(f"DEB lintian: {len(reported)} errors or warnings (overrides: deploy/debian/lintian-overrides)")


def test_install_upgrade_remove_purge(debs: dict[str, Path], tmp_path: Path, summary_line) -> None:  # noqa: ANN001
    from fakedriver.build import build

    started = time.monotonic()
    root, work = tmp_path / "root", tmp_path / "work"
    hit = debroot.base_root(root, INCLUDE)
    work.mkdir()
    for name, package in debs.items():
        shutil.copy2(package, work / f"{name}.deb")
    fake = build(MACHINE, work / "fake")
    (work / "config.yaml").write_text("root: /mnt/fake/root\nlog: {file: /mnt/hook.log}\n")
    (work / "bundle/rootfs").mkdir(parents=True)
    (work / "bundle/config.json").write_text(
        '{"ociVersion": "1.0.2", "process": {"env": ["PATH=/usr/bin"], '
        '"args": ["true"], "cwd": "/"}, "root": {"path": "rootfs"}}'
    )
    before = debroot.tree(root, APT_RECORDS)
    binds = [(work, "/mnt"), (fake.proc / "driver", "/proc/driver"), (fake.proc / "devices", "/proc/devices")]
    with progress.phase("the package installed, upgraded, set up, removed and purged in the Debian root"):
        out = debroot.chroot(root, SCRIPT, 600, binds, own_pids=True).stdout

    assert f"== version\nnvc-py {version()}\n" in out
    assert int(out.split("== code-cache\n", 1)[1].split("\n", 1)[0]) >= 20, out  # nvc-py's start, from the cache
    info = out.split("== info\n", 1)[1].split("\n== ", 1)[0]
    assert "NVIDIA H100 80GB HBM3" in info and "NVIDIA A100-SXM4-40GB" in info
    native = json.loads(out.split("== native-helper\n", 1)[1].split("\n== ", 1)[0])
    assert [gpu["uuid"] for gpu in native["result"]["gpus"]] == re.findall(r"GPU UUID:\s+(\S+)", info)
    assert "plain,setup" in out.split("== completion\n", 1)[1]
    log = (work / "hook.log").read_text().splitlines()
    assert len(log) == 3 and all('"outcome":"no-gpu"' in line and '"via":"server"' in line for line in log), log
    # Without systemd, setup starts a server that stays in place of the one the hooks started; the
    # upgrade's stop-servers has it start its successor of the new code (the script checks both).
    alone = out.split("== setup-without-systemd\n", 1)[1].split("\n== ", 1)[0].splitlines()
    assert "systemd is not running: no units written" in alone, alone
    assert [
        line
        for line in alone
        if re.fullmatch(
            r"started the hook server on /run/nvc-py/hook\.sock \(pid \d+\), to stay \(no idle exit\)", line
        )
    ], alone
    init = out.split("== init-script\n", 1)[1].split("\n== ", 1)[0].splitlines()
    assert init[:2] == ["K01nvc-py-hook", "S01nvc-py-hook"], init  # rc0.d, rc2.d
    assert re.fullmatch(r"nvc-py-hook server \d+ serves /run/nvc-py/hook\.sock", init[2]), init
    assert re.fullmatch(r"stopped nvc-py-hook server \d+", init[3]), init
    assert init[4:6] == ["no nvc-py-hook server serves /run/nvc-py/hook.sock", "status: 3"], init
    start_line = r"nvc-py-hook: started the hook server on /run/nvc-py/hook\.sock \(pid \d+\), to stay.*"
    assert re.fullmatch(start_line, init[6]), init
    assert re.fullmatch(r"stopped nvc-py-hook server \d+", init[7]) and re.fullmatch(start_line, init[8]), init
    upgrade = out.split("== upgrade\n", 1)[1]
    assert f"\n{version()}\n" in upgrade  # the version dpkg reports after it
    calls = out.split("== systemctl\n", 1)[1].split("\n== ", 1)[0]
    assert "daemon-reload" in calls and "start nvc-py-hook.socket" in calls
    assert "try-restart nvc-py-hook.service" in calls, calls
    # On the packaged install setup leaves the package's files alone (dpkg --verify clean after each
    # command: the script says otherwise and stops) and writes no units shadowing the package's.
    hooks = "/usr/share/containers/oci/hooks.d"
    setup = out.split("== setup\n", 1)[1].split("\n== ", 1)[0].splitlines()
    assert f"kept {hooks}/oci-nvc-py-hook.json (the nvc-py package's)" in setup, setup
    assert "enabled and started nvc-py-hook.socket (the nvc-py package's, in /lib/systemd/system)" in setup, setup
    assert not [line for line in setup if "/etc/systemd/system" in line or line.startswith(f"wrote {hooks}")], setup
    calls = out.split("== systemctl-setup\n", 1)[1].split("\n== ", 1)[0].splitlines()
    assert set(calls) == {"enable --now nvc-py-hook.socket"}, calls  # no server restarted needlessly
    removed = out.split("== setup-remove\n", 1)[1].split("\n== ", 1)[0].splitlines()
    assert (
        f"kept {hooks}/oci-nvc-py-hook.json, {hooks}/oci-nvc-py-poststop.json: the nvc-py package's "
        "(apt remove nvc-py removes them)"
    ) in removed, removed
    assert (
        "stopped and disabled nvc-py-hook.socket and nvc-py-hook.service (the nvc-py package's units stay in "
        "/lib/systemd/system: systemctl enable --now nvc-py-hook.socket serves again)"
    ) in removed, removed
    calls = out.split("== systemctl-setup-remove\n", 1)[1].split("\n== ", 1)[0].splitlines()
    assert calls == ["disable --now nvc-py-hook.socket", "stop nvc-py-hook.service"], calls
    calls = out.split("== systemctl-remove\n", 1)[1].split("\n== ", 1)[0].splitlines()
    assert calls[0] == (
        "stop nvc-py-hook.socket nvc-py-hook.service nvc-py-device-plugin.service nvc-py-exporter.service "
        "nvc-py-cdi-refresh.path nvc-py-cdi-refresh.timer nvc-py-cdi-refresh.service"
    ), calls
    assert "/etc/cdi/nvidia.yaml: today's already" in out.split("== cdi-refresh\n", 1)[1], out
    refused = out.split("== purge-refused\n", 1)[1]
    assert "nvc-py: not purged: /run/nvc-py/share holds the GPU-sharing state of containers (ctr-1); run" in refused
    assert "install ok config-files" in refused  # dpkg removed the configuration file, the rest waits
    assert out.rstrip().endswith("== purged"), out
    own = out.split("== purge\n", 1)[1].split("\n== ", 1)[0]
    assert "purge left" not in own, own
    left = "nvc-py: purge left "
    section = out.split("== links-in-run\n", 1)[1].split("\n== ", 1)[0]
    for line in (
        "/run/nvc-py/gpu-sched: a symlink (to /srv/theirs/mnt), not nvc-py's",
        "/run/nvc-py/share: a symlink (to /srv/theirs/share), not nvc-py's",
        "/run/nvc-py: not empty",
        "/var/log/nvc-py.log: a symlink (to /srv/theirs/log), not nvc-py's",
        "/etc/nvc-py: a symlink (to /srv/theirs/etc), not nvc-py's",
    ):
        assert left + line in section, section
    section = out.split("== run-linked\n", 1)[1].split("\n== ", 1)[0]
    for line in ("/run/nvc-py: a symlink (to /srv/theirs/run), not nvc-py's", "/var/log: a symlink (to /srv/log)"):
        assert left + line in section, section
    section = out.split("== sched-linked-to-a-mount\n", 1)[1].split("\n== ", 1)[0]
    assert left + "/run/nvc-py/gpu-sched: a symlink (to /srv/theirs/empty), not nvc-py's" in section, section

    after = debroot.tree(root, APT_RECORDS)
    changed = debroot.differences(before, after)
    assert not changed, [(path, before.get(path), after.get(path)) for path in changed]
    line = (
        f"DEB install, upgrade, remove, purge ok in {time.monotonic() - started:.0f} s, tree as before "
        f"(root cache: {'hit' if hit else 'miss'})"
    )
    print(line)
    summary_line(line)

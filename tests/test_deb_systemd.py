"""The Debian package on a Debian root booted with systemd as PID 1 (harness.booted: systemd-nspawn):
installed, every engine set up and removed, a refused GPU start through the socket-activated server,
removed and purged; ``dpkg --verify`` after each step, the unit files systemd loads, and the journal
and ``ps`` free of left-over processes and zombies."""

from __future__ import annotations

import itertools
import re
import shutil
import time
from pathlib import Path

from harness import debroot, progress

# The systemd root: what the package depends on, and systemd as its PID 1 (apt fetches nothing).
SYSTEMD_INCLUDE = "python3,systemd,systemd-sysv,dbus,procps"
# In the booted root (the test's files at /mnt): the package installed, every engine set up and
# removed, doctor, a refused GPU start through the socket-activated server, the server restarted,
# apt remove and purge; dpkg --verify after each change, the units systemd loads, zombies, the journal.
SYSTEMD_SCRIPT = r"""set -eu
cd /mnt
say() { echo "== $*"; }
apt() {
	if apt-get -q -y -o Dpkg::Use-Pty=0 --no-install-recommends "$@" > /mnt/apt.out 2>&1; then rc=0; else rc=$?; fi
	grep -v '^(Reading database' /mnt/apt.out || true
	return $rc
}
verified() {
	changed=$(dpkg --verify nvc-py | grep -v ' c /' || true)
	if [ -n "$changed" ]; then echo "dpkg --verify after $*: $changed"; exit 1; fi
}
loaded() { systemctl show -p FragmentPath --value nvc-py-hook.socket nvc-py-hook.service | grep .; }
refused() {
	printf '{"ociVersion":"1.0.2","id":"gpu-refused","status":"creating","pid":%d,"bundle":"/mnt/bundle"}' $$ > state.json
	if nvc-py-hook prestart < state.json 2> refused.err; then echo "a GPU start without a driver was not refused"; exit 1; fi
	echo "refused: $(cat refused.err)"
}
# Zombies left for 5 s (one whose parent died is reaped by systemd, in its own time), with their parents.
zombies() {
	for i in 1 2 3 4 5; do
		sleep 1
		found=$(ps -eo stat=,ppid=,user=,args= | awk '$1 ~ /^Z/')
		[ -n "$found" ] || return 0
	done
	echo "$found"
	ps -o pid=,args= -p "$(echo "$found" | awk '{print $2}' | sort -u | paste -sd, -)" || true
}

say install; apt install ./nvc-py.deb; verified install
say loaded; loaded
# The package's init script is for inits other than systemd: here it hands the command to systemctl.
say init-script; /etc/init.d/nvc-py-hook start; systemctl is-active nvc-py-hook.service
/usr/lib/nvc-py/venv/bin/python -I -m nvc.hook.setup.maintainer server-status || echo "status $?"
say refresh-units; systemctl is-active nvc-py-cdi-refresh.path nvc-py-cdi-refresh.timer || true
systemctl start nvc-py-cdi-refresh.service; systemctl show -p ConditionResult --value nvc-py-cdi-refresh.service
for engine in podman crio containerd docker; do
	say "setup $engine"; nvc-py setup $engine; verified setup $engine
done
say loaded-after-setup; loaded
say doctor; nvc-py doctor || true
say refused; refused
say zombies; zombies
# docs/install.md's "Driver upgrades": the server and its workers gone while the socket is stopped, then the socket back.
say driver-upgrade; pgrep -c -f '[n]vc-py-hook-python' >/dev/null && echo serving
systemctl stop nvc-py-hook.socket nvc-py-hook.service; systemctl is-active nvc-py-hook.socket nvc-py-hook.service || true
pgrep -c -f '[n]vc-py-hook-python' || true  # [n]: not this script's own command line
systemctl start nvc-py-hook.socket; systemctl is-active nvc-py-hook.socket
for engine in podman crio containerd docker server; do
	say "remove $engine"; nvc-py setup $engine --remove; verified setup $engine --remove
done
say server-removed; systemctl is-enabled nvc-py-hook.socket || true; systemctl is-active nvc-py-hook.socket || true
say setup-again; nvc-py setup podman; verified setup podman again; refused
systemctl restart nvc-py-hook.service; refused
say apt-remove; apt remove nvc-py
say apt-purge; apt purge nvc-py
say zombies-at-end; zombies
say journal; journalctl -b --no-pager -o cat | grep -iE 'nvc|left-over|remains running|defunct|killing process' || true
say done
"""


def test_a_host_with_systemd(debs: dict[str, Path], tmp_path: Path, summary_line) -> None:  # noqa: ANN001
    """The package on a Debian root booted with systemd as PID 1 (harness.booted): its units are the
    ones systemd loads before and after every engine's setup, dpkg --verify is clean after every setup
    and remove, `setup server --remove` disables the package's socket, a GPU start without a driver is
    refused through the socket-activated server, the commands docs/install.md gives for a driver upgrade
    stop every server process and start the socket again, and neither ps nor the journal shows a zombie, a
    left-over process or a process killed at a stop, across setup, restart, apt remove and purge."""
    from harness.booted import booted

    started = time.monotonic()
    root, work = tmp_path / "root", tmp_path / "work"
    hit = debroot.base_root(root, SYSTEMD_INCLUDE)
    work.mkdir()
    shutil.copy2(debs["new"], work / "nvc-py.deb")
    (work / "bundle/rootfs").mkdir(parents=True)
    (work / "bundle/config.json").write_text(
        '{"ociVersion": "1.0.2", "process": {"env": ["PATH=/usr/bin", '
        '"NVIDIA_VISIBLE_DEVICES=all"], "args": ["true"], "cwd": "/"}, '
        '"root": {"path": "rootfs"}}'
    )
    with progress.phase("the package installed, set up, removed and purged in a Debian root booted with systemd"):
        with booted(root, [(work, "/mnt")], tmp_path / "console.log") as machine:
            out = machine.run(SYSTEMD_SCRIPT, 600).stdout

    def section(name: str) -> list[str]:
        """The lines after ``== NAME`` up to the next such header (none for an empty section)."""
        lines = out.splitlines()
        start = lines.index(f"== {name}") + 1
        return list(itertools.takewhile(lambda line: not line.startswith("== "), lines[start:]))

    assert out.rstrip().endswith("== done"), out[-6000:]
    units = ["/lib/systemd/system/nvc-py-hook.socket", "/lib/systemd/system/nvc-py-hook.service"]
    assert section("loaded") == units and section("loaded-after-setup") == units, out
    assert section("init-script")[-3:] == [  # systemd's server is systemd's: no other stays
        "active",
        "no nvc-py-hook server serves /run/nvc-py/hook.sock",
        "status 3",
    ], out
    assert not [line for line in out.splitlines() if "/etc/systemd/system/nvc-py-hook" in line], out
    # the CDI refresh's path and timer run from the install on; without a driver its service is skipped
    assert section("refresh-units") == ["active", "active", "no"], out
    assert section("server-removed") == ["disabled", "inactive"], out
    refusal = "refused: nvc-py-hook: initialization error: /proc/driver/nvidia/version: not found"
    assert [line for line in out.splitlines() if line.startswith("refused: ")] == [
        line for line in out.splitlines() if line.startswith(refusal)
    ] and out.count(refusal) == 3, out
    assert section("zombies") == [] and section("zombies-at-end") == [], out
    assert section("driver-upgrade") == ["serving", "inactive", "inactive", "0", "active"], out
    journal = section("journal")
    faults = [line for line in journal if re.search(r"left-over|remains running|defunct|killing process", line, re.I)]
    assert not faults, faults
    listening = [line for line in journal if "nvc-py-hook serve: listening on" in line]
    said = [line for line in journal if "idle workers keep no driver helper" in line]
    assert len(listening) >= 2 and 1 <= len(said) <= len(listening), journal
    line = (
        f"DEB on systemd: setup, remove, restart, purge clean in {time.monotonic() - started:.0f} s "
        f"(root cache: {'hit' if hit else 'miss'})"
    )
    print(line)
    summary_line(line)

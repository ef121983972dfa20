"""GPU device access across ``systemctl daemon-reload`` where systemd manages the containers'
cgroups, for each way nvc-py is registered (issue 45, item 3; docs/engines.md, "systemd reloads").

The reference stack's best-known failure: a hook adds device-cgroup rules behind the runtime's back,
systemd rewrites the unit's device policy from its own ``DeviceAllow=`` list on a reload, and the
GPU is gone ("Failed to initialize NVML: Unknown Error"). Here a Debian root boots with systemd as
PID 1 on cgroup v2 alone (harness.booted, ``unified``: this machine mounts v1 and v2 side by side and
gives a booted container its v1 controllers read-only, so systemd could manage no device cgroup
there); runc runs three containers in it with ``--systemd-cgroup`` (each in a scope under
system.slice), one per registration:

- hook: the node bound in and the rules added by a prestart hook running nvc-py's own code
  (``ContainerHandle.device_cgroup`` and ``allow_devices``, as nvc-py-hook's apply step does);
- wrapper: the nodes and rules put in the spec by nvc-py-runtime's code (``devnodes.add_to_spec``);
- cdi: the nodes of nvc-py's CDI spec (``devnodes.spec_device``) put in the spec as a CDI-aware
  engine does (``linux.devices`` and a rule with CDI's default permissions).

Each container opens two fake GPU nodes: /dev/nvidia0 (195:0) and /dev/nvidia1 (195:1), for which
/dev/char/195:1 is made by nvc-py-runtime's code (``devnodes.char_links``: udev makes none for
NVIDIA's nodes, and runc 1.1 tells systemd only of nodes whose /dev/char link exists). Opening a node with no driver behind it fails with ENXIO where the device
cgroup allows it and EPERM where it does not, so each open says which. Each is opened after the
start, after ``systemctl daemon-reload``, after the hook's rules are added again, and after
``systemctl set-property`` on the scope.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from harness import debroot, progress

SYSTEMD_INCLUDE = "python3,systemd,systemd-sysv,dbus,procps"  # test_deb_systemd.py's root (one cache)
MODES = ("hook", "wrapper", "cdi")
NODES = {"/dev/nvidia0": (195, 0), "/dev/nvidia1": (195, 1)}
ALLOWED = "No such device or address"  # the cgroup let the open through to a node with no driver
DENIED = "Operation not permitted"
NVC = "/usr/lib/nvc-py"  # the installed nvc-py, bound into the booted root where it lies here
RUNC = "/usr/local/sbin/runc"
# The hook's cgroup step as nvc-py-hook's apply does it (nvc/pipeline/apply.py), on the OCI state's pid.
HOOK = (
    "import json, sys\n"
    "from nvc.apply.cgroups import allow_devices\n"
    "from nvc.apply.container import ContainerHandle\n"
    "from nvc.plan.devfilter import DeviceRule\n"
    "handle = ContainerHandle.open(json.load(sys.stdin)['pid'])\n"
    "allow_devices(handle.device_cgroup(), [DeviceRule('c', 195, m, 'rw') for m in (0, 1)])\n"
)
# nvidia1's /dev/char link made as nvc-py-runtime makes it (nvidia0 is left without one).
LINKS = (
    "from nvc.cdi.devnodes import char_links\n"
    "from nvc.discover.nodes import DeviceNode\n"
    "assert char_links([DeviceNode('/dev/nvidia1', 195, 1)]) == []\n"
)
# What setup and doctor say about the hook where systemd runs: podman's default cgroup manager, then
# a containers.conf that names cgroupfs (whose containers' rules no reload rewrites).
SAYS = (
    "from nvc.doctor import ok\n"
    "from nvc.doctor.engines import systemd_reload\n"
    "from nvc.hook.setup import engines, hooksdirs\n"
    "podman = ok('podman', 'hook')\n"
    "open('/tmp/cgroupfs.conf', 'w').write('[engine]\\ncgroup_manager = \"cgroupfs\"\\n')\n"
    "for manager, env in (('systemd', {}), ('cgroupfs', {'CONTAINERS_CONF': '/tmp/cgroupfs.conf'})):\n"
    "    print(f'doctor {manager}:', systemd_reload([(podman, 'podman')], env).status)\n"
    "    _, warnings = engines.install_hooks(hooksdirs.PODMAN, '/tmp/hooks', None, env)\n"
    "    print(f'setup {manager}:', any('daemon-reload' in w for w in warnings))\n"
)
SCRIPT = r"""set -u
runc() { RUNC --root /run/nvc-test-runc "$@"; }
for node in 0 1; do mknod -m 666 /dev/nvidia$node c 195 $node; done
NVCPY -I -c "$LINKS"
probe() {
	for mode in MODES; do for node in 0 1; do
		echo "$1 $mode nvidia$node: $(runc exec nvc-$mode /bin/busybox cat /dev/nvidia$node 2>&1)"
	done; done
}
for mode in MODES; do
	runc --systemd-cgroup run -d --bundle /mnt/$mode nvc-$mode < /dev/null > /mnt/$mode.log 2>&1 \
		|| echo "start $mode failed: $(cat /mnt/$mode.log)"
done
echo "cgroups: $(systemctl is-active nvc-hook.scope nvc-wrapper.scope nvc-cdi.scope | tr '\n' ' ')"
probe started
systemctl daemon-reload
probe reloaded
runc state nvc-hook | tr -d ' \n' | sed 's/.*"pid":\([0-9]*\).*/{"pid": \1}/' | NVCPY -I -c "$HOOK"
probe readded
for mode in MODES; do systemctl set-property --runtime nvc-$mode.scope CPUWeight=50; done
probe set-property
for mode in MODES; do runc delete -f nvc-$mode; done
NVCPY -I -c "$SAYS"
echo "== done"
"""


def _bundle(bundle: Path, mode: str) -> None:
    """An OCI bundle (runc's default spec, busybox sleeping) with the GPU nodes as ``mode`` gives them."""
    from nvc.cdi import devnodes
    from nvc.discover.nodes import DeviceNode

    (bundle / "rootfs/bin").mkdir(parents=True)
    shutil.copy2("/bin/busybox", bundle / "rootfs/bin/busybox")
    subprocess.run(["runc", "spec", "--bundle", str(bundle)], check=True)
    spec: dict[str, Any] = json.loads((bundle / "config.json").read_text())
    spec["root"] = {"path": "rootfs", "readonly": False}
    spec["process"].update(terminal=False, args=["/bin/busybox", "sleep", "600"])
    spec["linux"]["cgroupsPath"] = f"system.slice:nvc:{mode}"
    found = [DeviceNode(path, major, minor) for path, (major, minor) in NODES.items()]
    if mode == "hook":
        spec["mounts"] += [
            {"destination": n.path, "source": n.path, "type": "bind", "options": ["bind"]} for n in found
        ]
        python = f"{NVC}/venv/bin/python"
        spec["hooks"] = {"prestart": [{"path": python, "args": [python, "-I", "-c", HOOK]}]}
    elif mode == "wrapper":
        assert devnodes.add_to_spec(spec, "/", found)
    else:
        for node in found:
            entry = devnodes.spec_device("/", node)
            del entry["hostPath"]
            spec["linux"].setdefault("devices", []).append(entry)
            spec["linux"]["resources"]["devices"].append(
                {"allow": True, "type": "c", "major": node.major, "minor": node.minor, "access": "rwm"}
            )
    (bundle / "config.json").write_text(json.dumps(spec))


@pytest.fixture(scope="module")
def booted_out(tmp_path_factory: pytest.TempPathFactory) -> str:
    """What the script said in one boot."""
    from harness.booted import booted

    tmp = tmp_path_factory.mktemp("reload")
    root, work = tmp / "root", tmp / "work"
    debroot.base_root(root, SYSTEMD_INCLUDE)
    runc = shutil.which("runc")
    assert runc is not None, "runc is missing: make deps installs it"
    for mode in MODES:
        _bundle(work / mode, mode)
    script = SCRIPT.replace("RUNC", RUNC).replace("MODES", " ".join(MODES)).replace("NVCPY", f"{NVC}/venv/bin/python")
    script = f"HOOK={shlex.quote(HOOK)}\nLINKS={shlex.quote(LINKS)}\nSAYS={shlex.quote(SAYS)}\n{script}"
    binds = [(work, "/mnt"), (Path(NVC), NVC), (Path(runc), RUNC)]
    with progress.phase("GPU nodes through daemon-reload in a root booted with systemd on cgroup v2"):
        with booted(root, binds, tmp / "console.log", unified=True) as machine:
            out = machine.run(script, 300).stdout
    assert out.rstrip().endswith("== done") and "failed" not in out, out
    assert "cgroups: active active active" in out, out
    return out


@pytest.fixture(scope="module")
def opens(booted_out: str) -> dict[tuple[str, str, str], str]:
    """Each open's result by (moment, mode, node): ``ALLOWED``, ``DENIED`` or the error."""
    out = booted_out
    results = {}
    for line in out.splitlines():
        match = re.fullmatch(r"(started|reloaded|readded|set-property) (\w+) (nvidia\d): (.*)", line)
        if match:
            moment, mode, node, said = match.groups()
            results[moment, mode, node] = next((w for w in (ALLOWED, DENIED) if w in said), said)
    assert len(results) == 4 * len(MODES) * len(NODES), out
    return results


@pytest.mark.parametrize("node", ["nvidia0", "nvidia1"])
@pytest.mark.parametrize("mode", MODES)
def test_every_registration_opens_the_gpu_after_the_start(
    opens: dict[tuple[str, str, str], str], mode: str, node: str
) -> None:
    assert opens["started", mode, node] == ALLOWED


@pytest.mark.parametrize("node", ["nvidia0", "nvidia1"])
def test_the_hooks_rules_are_lost_when_systemd_rewrites_the_scope(
    opens: dict[tuple[str, str, str], str], node: str
) -> None:
    """Rules added behind runc's back are not in the scope's DeviceAllow=: the reload drops them,
    /dev/char link or not (the reference stack's failure, reproduced); added again by the hook's
    code, a set-property on the scope drops them again."""
    assert opens["reloaded", "hook", node] == DENIED
    assert opens["readded", "hook", node] == ALLOWED
    assert opens["set-property", "hook", node] == DENIED


@pytest.mark.parametrize("moment", ["reloaded", "readded", "set-property"])
@pytest.mark.parametrize("mode", ["wrapper", "cdi"])
def test_rules_in_the_spec_survive_where_the_dev_char_link_exists(
    opens: dict[tuple[str, str, str], str], moment: str, mode: str
) -> None:
    """Rules in the spec reach systemd as DeviceAllow=/dev/char/195:N, which runc 1.1 passes on only
    for nodes whose /dev/char link exists: nvidia1's survives, nvidia0's is dropped as the hook's."""
    assert opens[moment, mode, "nvidia1"] == ALLOWED
    assert opens[moment, mode, "nvidia0"] == DENIED


def test_setup_and_doctor_say_the_hook_loses_the_gpus_where_systemd_manages_cgroups(booted_out: str) -> None:
    """With systemd as PID 1: `setup podman` warns and doctor's daemon-reload line fails under podman's
    default cgroup manager (systemd); neither where containers.conf names cgroupfs."""
    said = [line for line in booted_out.splitlines() if line.startswith(("doctor ", "setup "))]
    assert said == ["doctor systemd: fail", "setup systemd: True", "doctor cgroupfs: ok", "setup cgroupfs: False"]

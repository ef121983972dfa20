"""The hook, CDI spec and runtime wrapper in real containers (podman, runc, containerd) on the fake driver.

The fake driver (a test double) is activated in this process's private mount namespace;
podman, runc and containerd started from here inherit it, so the hook they run sees the
fake GPUs at the real /proc and /dev paths. The fake nvidia-smi inside a container lists
exactly the GPUs whose device nodes it finds there.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from harness.bundle import make_bundle
from harness.containerd import Containerd
from harness.fakegpus import A100, H100, MIG_2G, MIG_3G, SHOW
from harness.fakegpus import uuids as _uuids
from harness.hookfixtures import setup_dir  # noqa: F401  (fixture)
from harness.installed import SCRIPTS
from harness.markerlib import assert_image_libraries_never_load


def _log_lines(setup_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (setup_dir / "hook.log").read_text().splitlines()]


@pytest.mark.parametrize(
    ("name", "stage"), [("oci-nvc-py-hook.json", "prestart"), ("oci-nvc-py-poststop.json", "poststop")]
)
def test_hooks_d_files(setup_dir: Path, name: str, stage: str) -> None:
    doc = json.loads((setup_dir / "hooks.d" / name).read_text())
    assert doc["version"] == "1.0.0" and doc["stages"] == [stage] and doc["when"] == {"always": True}
    # make install's native front, where pip never writes: it hands the hook to a server (or runs it)
    assert doc["hook"]["path"] == "/usr/lib/nvc-py/nvc-py-hook"
    assert doc["hook"]["args"] == ["nvc-py-hook", stage]
    assert doc["hook"]["env"] == [
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        f"NVC_PY_CONFIG={setup_dir / 'config.yaml'}",
    ]


# NVIDIA_VISIBLE_DEVICES (None: unset) -> UUIDs nvidia-smi -L lists, GPU nodes; None: no driver at all.
PODMAN_CASES = [
    ("1", [A100], ["nvidia1"]),
    (None, None, []),
    ("void", None, []),
    ("", None, []),
    ("none", [], []),
    ("all", [H100, A100, MIG_2G, MIG_3G], ["nvidia0", "nvidia1"]),
    (MIG_3G, [A100, MIG_3G], ["nvidia1"]),
]


def test_podman_env_requests(active_2gpu, podman, setup_dir: Path) -> None:
    """Each NVIDIA_VISIBLE_DEVICES form through `podman run --hooks-dir`; the cases share one image."""
    image = podman.image()
    for value, uuids, nodes in PODMAN_CASES:
        env = {} if value is None else {"NVIDIA_VISIBLE_DEVICES": value}
        result = podman.run(image, SHOW, env=env, hooks_dirs=[setup_dir / "hooks.d"])
        assert result.returncode == 0, (value, result.stderr)
        if uuids is None:
            assert "nvidia-smi: not found" in result.stdout, value
        else:
            assert _uuids(result.stdout) == uuids, (value, result.stdout)
        listed = [w for w in result.stdout.split() if w.startswith("nvidia") and w[6:].isdigit()]
        assert listed == nodes, (value, result.stdout)
    outcomes = [(line["outcome"], line.get("devices")) for line in _log_lines(setup_dir)[-len(PODMAN_CASES) :]]
    assert outcomes == [
        ("configured", ["1"]),
        ("no-gpu", None),
        ("no-gpu", None),
        ("no-gpu", None),
        ("configured", "none"),
        ("configured", ["all"]),
        ("configured", [MIG_3G]),
    ]


def test_podman_unsatisfied_requirement_fails_the_start(active_2gpu, podman, setup_dir: Path) -> None:
    env = {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_REQUIRE_CUDA": "cuda>=14.0"}
    result = podman.run(podman.image(), ["true"], env=env, hooks_dirs=[setup_dir / "hooks.d"])
    assert result.returncode != 0
    assert (
        "nvc-py-hook: requirement error: unsatisfied condition: cuda>=14.0, please update your driver "
        "to a newer version, or use an earlier cuda container"
    ) in result.stderr
    last = _log_lines(setup_dir)[-1]
    assert last["outcome"] == "error" and last["error"].startswith("requirement error: unsatisfied condition")


def test_podman_sharing_directory_removed_at_poststop(active_2gpu, podman, setup_dir: Path) -> None:
    from nvc.containerenv import sharing
    from nvc.plan import share

    env = {"NVIDIA_VISIBLE_DEVICES": "0", "NVC_SHARE_MEMORY_LIMIT": "1Gi"}
    result = podman.run(
        podman.image(), ["cat", f"{sharing.CONTAINER_DIR}/limits"], env=env, hooks_dirs=[setup_dir / "hooks.d"]
    )
    assert result.returncode == 0, result.stderr
    assert "memory_limit=1073741824" in result.stdout.replace(" ", "") or "1Gi" in result.stdout, result.stdout
    last = _log_lines(setup_dir)[-1]
    assert last["outcome"] == "configured" and "share" in last
    assert not share.container_dir(last["container"]).exists()


def test_runc_hook_log_line_and_legacy_bundle_path(
    active_2gpu, runc, debian_rootfs: Path, setup_dir: Path, tmp_path: Path
) -> None:
    """runc with the hook in config.json; one structured line per invocation (also for poststop)."""
    hook = {
        "path": str(SCRIPTS / "nvc-py-hook"),
        "args": ["nvc-py-hook", "prestart"],
        "env": [f"NVC_PY_CONFIG={setup_dir / 'config.yaml'}"],
    }
    post = {**hook, "args": ["nvc-py-hook", "poststop"]}
    bundle = make_bundle(
        tmp_path / "bundle",
        debian_rootfs,
        SHOW,
        env={"NVIDIA_VISIBLE_DEVICES": "0"},
        hooks={"prestart": [hook], "poststop": [post]},
    )
    result = runc.create_start(bundle, container_id="nvc-hook-log")
    assert result.returncode == 0, result.stderr
    assert _uuids(result.stdout) == [H100]
    last = _log_lines(setup_dir)[-1]
    assert last["container"] == "nvc-hook-log" and last["devices"] == ["0"]
    assert last["capabilities"] == ["compute", "utility"] and last["outcome"] == "configured"
    assert 0 < last["duration_ms"] < 10_000
    # The legacy state member and a bad request, straight through the console script.
    state = json.dumps({"ociVersion": "1.0.2", "id": "x", "pid": 1, "bundlePath": str(bundle)})
    bad = json.loads((bundle / "config.json").read_text())
    bad["process"]["env"].append("NVIDIA_DRIVER_CAPABILITIES=turbo")
    (bundle / "config.json").write_text(json.dumps(bad))
    run = subprocess.run(
        [str(SCRIPTS / "nvc-py-hook"), "prestart"],
        input=state,
        capture_output=True,
        text=True,
        env={"NVC_PY_CONFIG": str(setup_dir / "config.yaml")},
    )
    assert run.returncode == 2
    assert (
        run.stderr == "nvc-py-hook: input error: NVIDIA_DRIVER_CAPABILITIES: unknown capability 'turbo' "
        "(known: utility, compute, video, graphics, display, ngx, compat32)\n"
    )


def test_runc_hostile_env_gives_one_escaped_bounded_line(
    active_2gpu, runc, debian_rootfs: Path, setup_dir: Path, tmp_path: Path
) -> None:
    """An image env value with a newline, terminal escapes and a megabyte of padding, through a real
    runc start: the start fails with the hook's one escaped, cut line; the log grows by one short line."""
    hook = {
        "path": str(SCRIPTS / "nvc-py-hook"),
        "args": ["nvc-py-hook", "prestart"],
        "env": [f"NVC_PY_CONFIG={setup_dir / 'config.yaml'}"],
    }
    forged = 'compute\nlevel=info msg="forged"\x1b]0;pwned\x07\x1b[2J' + "z" * (1 << 20)
    bundle = make_bundle(
        tmp_path / "bundle",
        debian_rootfs,
        SHOW,
        hooks={"prestart": [hook]},
        env={"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_DRIVER_CAPABILITIES": forged},
    )
    log = setup_dir / "hook.log"
    before = log.stat().st_size if log.exists() else 0
    result = runc.create_start(bundle, container_id="nvc-hostile-env")
    assert result.returncode != 0 and "/dev/nvidia" not in result.stdout
    hook_lines = [line for line in result.stderr.splitlines() if "nvc-py-hook: input error" in line]
    assert len(hook_lines) == 1, result.stderr[:3000]
    # runc quotes the hook's stderr once more (Go's %q): backslashes doubled
    assert 'unknown capability \'compute\\\\nlevel=info msg=\\"forged\\"\\\\x1b]0;pwned\\\\x07' in hook_lines[0]
    assert "\x1b" not in result.stderr and "\x07" not in result.stderr and len(result.stderr) < 8192
    assert not any(line.startswith('level=info msg="forged"') for line in result.stderr.splitlines())
    added = log.read_bytes()[before:]
    assert added.count(b"\n") == 1 and b"\x1b" not in added and len(added) < 4096
    line = json.loads(added)
    assert (line["container"], line["outcome"]) == ("nvc-hostile-env", "error")
    assert line["error"].startswith(
        "input error: NVIDIA_DRIVER_CAPABILITIES: unknown capability "
        '\'compute\\nlevel=info msg="forged"\\x1b]0;pwned\\x07\\x1b[2jzzz'
    )  # lowercased
    assert "more characters)" in line["error"]


def test_hook_given_ld_library_path_loads_nothing_from_the_image(
    active_2gpu, runc, debian_rootfs: Path, setup_dir: Path, tmp_path: Path
) -> None:
    """A hook handed LD_LIBRARY_PATH pointing into the image (CVE-2025-23266's shape) restarts
    without it before loading any library: the image's libffi/libseccomp/NVML never run as root."""

    def hook(evil: Path) -> dict:
        return {
            "path": str(SCRIPTS / "nvc-py-hook"),
            "args": ["nvc-py-hook", "prestart"],
            "env": [f"NVC_PY_CONFIG={setup_dir / 'config.yaml'}", f"LD_LIBRARY_PATH={evil}"],
        }

    assert_image_libraries_never_load(
        runc, debian_rootfs, tmp_path, hook, ("libffi.so.8", "libseccomp.so.2", "libnvidia-ml.so.1")
    )


def test_podman_cdi_device(active_2gpu, fake_2gpu, podman, setup_dir: Path, tmp_path: Path) -> None:
    """`nvc-py cdi generate`, then `podman run --device nvidia.com/gpu=0` (podman applies the spec itself)."""
    spec_dir = tmp_path / "cdi"
    spec_dir.mkdir()
    subprocess.run(
        [
            str(SCRIPTS / "nvc-py"),
            "--root",
            str(fake_2gpu.root),
            "cdi",
            "generate",
            "--output",
            str(spec_dir / "nvidia.yaml"),
            "--config",
            str(setup_dir / "config.yaml"),
        ],
        check=True,
        capture_output=True,
    )
    import yaml

    spec = yaml.safe_load((spec_dir / "nvidia.yaml").read_text())
    assert spec["kind"] == "nvidia.com/gpu"
    assert [d["name"] for d in spec["devices"]] == ["0", "1", "1:0", "1:1", "all"]
    assert all(
        m["options"] == ["ro", "nosuid", "nodev", "rbind", "rprivate"]
        for m in spec["containerEdits"]["mounts"]
        if "/lib" in m["containerPath"]
    )
    assert all(
        h["hookName"] == "createContainer" and h["env"][0].startswith("PATH=") for h in spec["containerEdits"]["hooks"]
    )
    by_uuid = subprocess.run(
        [
            str(SCRIPTS / "nvc-py"),
            "--root",
            str(fake_2gpu.root),
            "cdi",
            "generate",
            "--format",
            "json",
            "--device-name-strategy",
            "uuid",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    assert [d["name"] for d in json.loads(by_uuid.stdout)["devices"]] == [H100, A100, MIG_2G, MIG_3G, "all"]
    check = ["sh", "-c", "nvidia-smi -L; readlink /usr/lib/x86_64-linux-gnu/libcuda.so"]
    result = podman.run(podman.image(), check, extra_args=["--device", "nvidia.com/gpu=0"], cdi_spec_dir=spec_dir)
    assert result.returncode == 0, result.stderr
    assert _uuids(result.stdout) == [H100]
    assert result.stdout.split()[-1] == "libcuda.so.1"


def test_containerd_runtime_wrapper(active_2gpu, rootfs_cache, setup_dir: Path, tmp_path: Path) -> None:
    """A private containerd (started inside the fake driver's namespace) runs `ctr run` through nvc-py-runtime."""
    wrapper = tmp_path / "runtime.sh"  # containerd hands shims no environment of our choosing
    config = setup_dir / "config.yaml"
    wrapper.write_text(f'#!/bin/sh\nNVC_PY_CONFIG={config} exec {SCRIPTS / "nvc-py-runtime"} "$@"\n')
    wrapper.chmod(0o755)
    daemon = Containerd(tmp_path / "containerd", rootfs_cache)
    try:
        image = daemon.image()
        result = daemon.run(image, "nvc-ctr-gpu", SHOW, env={"NVIDIA_VISIBLE_DEVICES": "1"}, runc_binary=str(wrapper))
        assert result.returncode == 0, result.stderr
        assert _uuids(result.stdout) == [A100]
        plain = daemon.run(image, "nvc-ctr-plain", SHOW, runc_binary=str(wrapper))
        assert plain.returncode == 0 and "nvidia-smi: not found" in plain.stdout
        bad = daemon.run(image, "nvc-ctr-bad", ["true"], runc_binary=str(wrapper), env={"NVIDIA_VISIBLE_DEVICES": "7"})
        assert bad.returncode != 0 and "nvc-py-runtime: device error: 7: unknown device" in bad.stderr, bad.stderr
    finally:
        daemon.stop()
    *_, configured, refused = _log_lines(setup_dir)  # the GPU container's start, then the runtime's refusal
    assert (configured["container"], configured["outcome"]) == ("nvc-ctr-gpu", "configured")
    assert (refused["stage"], refused["container"], refused["outcome"]) == ("runtime", "nvc-ctr-bad", "error")


def test_runtime_rewrites_only_gpu_specs(active_2gpu, debian_rootfs: Path, setup_dir: Path, tmp_path: Path) -> None:
    """On create: hook (once; the poststop one only where the container shares its GPU), device nodes
    and cgroup rules in the spec; other specs untouched."""
    from nvc import config as config_file
    from nvc.hook.oci import runtime

    config = config_file.load(str(setup_dir / "config.yaml"))
    assert runtime.find_create(
        ["--root", "/r", "--log", "l", "--systemd-cgroup", "create", "--bundle", "/b", "id"]
    ) == (5, "/b")
    assert runtime.find_create(["--root", "/r", "start", "id"]) is None
    assert runtime.global_options(["--log=/l", "--log-format", "json", "--debug", "kill", "id"]) == (
        {"--log": "/l", "--log-format": "json", "--debug": ""},
        4,
    )
    bundle = make_bundle(tmp_path / "b", debian_rootfs, ["true"], env={"NVIDIA_VISIBLE_DEVICES": "1"})
    spec = json.loads((bundle / "config.json").read_text())
    assert runtime.rewrite(spec, str(bundle), config)
    assert [(h["path"], h["args"]) for h in spec["hooks"]["prestart"]] == [
        ("/usr/lib/nvc-py/nvc-py-hook", ["nvc-py-hook", "prestart"])
    ]
    assert "poststop" not in spec["hooks"]
    shared = make_bundle(
        tmp_path / "s", debian_rootfs, ["true"], env={"NVIDIA_VISIBLE_DEVICES": "1", "NVC_SHARE_MEMORY_LIMIT": "1g"}
    )
    shared_spec = json.loads((shared / "config.json").read_text())
    assert runtime.rewrite(shared_spec, str(shared), config)
    for stage in ("prestart", "poststop"):
        assert [(h["path"], h["args"]) for h in shared_spec["hooks"][stage]] == [
            ("/usr/lib/nvc-py/nvc-py-hook", ["nvc-py-hook", stage])
        ]
    assert not runtime.rewrite(shared_spec, str(shared), config)
    paths = [d["path"] for d in spec["linux"]["devices"]]
    assert paths == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia1"]
    assert {"allow": True, "type": "c", "major": 195, "minor": 1, "access": "rw"} in spec["linux"]["resources"][
        "devices"
    ]
    assert not runtime.rewrite(spec, str(bundle), config)  # idempotent: nothing added twice
    # With the driver's nodes in /dev (the fake's, over this namespace's /dev), their /dev/char links
    # too: runc tells systemd of a node only through its link (tests/test_systemd_reload.py).
    assert not os.path.lexists("/dev/char/195:1")
    fresh = json.loads((bundle / "config.json").read_text())
    assert runtime.rewrite(fresh, str(bundle), config._replace(root="/"))
    assert os.readlink("/dev/char/195:1") == "/dev/nvidia1" and os.readlink("/dev/char/195:255") == "/dev/nvidiactl"
    plain = json.loads(make_bundle(tmp_path / "p", debian_rootfs, ["true"]).joinpath("config.json").read_text())
    assert not runtime.rewrite(plain, str(tmp_path / "p"), config) and "hooks" not in plain


def test_cdi_spec_nodes_get_their_dev_char_links(tmp_path: Path) -> None:
    """`cdi generate` and `cdi refresh` link each /dev node of a spec (docs/engines.md, "systemd reloads");
    a node outside /dev, an entry that is no node, and a place that cannot hold links are not."""
    from nvc.cdi import devnodes
    from nvc.discover.nodes import DeviceNode

    ctl = {"path": "/dev/nvidiactl", "hostPath": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255}
    gpu0 = {"path": "/dev/nvidia0", "major": 195, "minor": 0}
    doc = {"containerEdits": {"deviceNodes": [ctl]}, "devices": [{"containerEdits": {"deviceNodes": [gpu0, "x"]}}, 7]}
    found = devnodes.spec_nodes(doc)
    assert found == [DeviceNode("/dev/nvidiactl", 195, 255), DeviceNode("/dev/nvidia0", 195, 0)]
    char = tmp_path / "char"
    assert devnodes.char_links([*found, DeviceNode("/srv/driver/dev/nvidia1", 195, 1)], str(char)) == []
    assert {n: os.readlink(char / n) for n in os.listdir(char)} == {
        "195:255": "/dev/nvidiactl",
        "195:0": "/dev/nvidia0",
    }
    assert devnodes.char_links(found, str(char)) == []  # links already there are kept
    (tmp_path / "file").write_text("")
    assert devnodes.char_links(found, str(tmp_path / "file")) == [f"cannot make {tmp_path / 'file'}: File exists"]


def test_setup_containerd_keeps_unrelated_settings(tmp_path: Path) -> None:
    main = tmp_path / "config.toml"
    original = (
        '# site settings\nversion = 2\nroot = "/var/lib/site-containerd"\noom_score = -999\n\n'
        '[grpc]\n  address = "/run/site/containerd.sock"\n\n'
        '[plugins."io.containerd.grpc.v1.cri"]\n  sandbox_image = "registry.k8s.io/pause:3.9"\n'
        '  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]\n'
        "    SystemdCgroup = true\n"
    )
    main.write_text(original)
    drop_in = tmp_path / "conf.d" / "99-nvc-py.toml"
    for _ in range(2):  # a second run changes nothing more
        subprocess.run(
            [str(SCRIPTS / "nvc-py"), "setup", "containerd", "--config", str(main), "--drop-in", str(drop_in)],
            check=True,
            capture_output=True,
        )
    text = main.read_text()
    assert text.replace(f'imports = ["{drop_in}"]\n', "") == original
    dump = subprocess.run(
        ["containerd", "--config", str(main), "config", "dump"], check=True, capture_output=True, text=True
    ).stdout
    for line in (
        'root = "/var/lib/site-containerd"',
        "oom_score = -999",
        'address = "/run/site/containerd.sock"',
        'sandbox_image = "registry.k8s.io/pause:3.9"',
        "SystemdCgroup = true",
        '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvc-py]',
        'runtime_type = "io.containerd.runc.v2"',
        'BinaryName = "/usr/lib/nvc-py/nvc-py-runtime"',
    ):
        assert line in dump, line
    legacy = tmp_path / "v1.toml"  # no version key: containerd reads it as version 1
    legacy.write_text('root = "/var/lib/old"\n')
    refused = subprocess.run(
        [str(SCRIPTS / "nvc-py"), "setup", "containerd", "--config", str(legacy), "--drop-in", str(drop_in)],
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 2 and "containerd config version 1: only version 2" in refused.stderr
    assert legacy.read_text() == 'root = "/var/lib/old"\n'

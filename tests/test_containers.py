"""Smoke tests of the container harness: each engine really runs the test rootfs.

Later tests build on these paths (runc bundles with hooks, podman hooks dirs
and CDI specs, ctr with a runc wrapper); when one of those fails, these say
whether the harness or the code under test is at fault.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from harness.bundle import make_bundle
from harness.runtime import new_container_id

HOST_DYNAMIC_BINARY = Path("/usr/bin/getconf")  # needs libc.so.6 only
WRAPPER = """#!/bin/sh
printf '%s\\n' "$*" >> {log}
exec runc "$@"
"""


def _write_script(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


@pytest.mark.parametrize(
    "variant, is_debian, libc_path",
    [("debian", True, "/lib/x86_64-linux-gnu/libc.so.6"), ("lib64", False, "/usr/lib64/libc.so.6")],
)
def test_runc_runs_rootfs_with_working_glibc(make_rootfs, runc, tmp_path, variant, is_debian, libc_path):
    rootfs = make_rootfs(variant)
    # A host-built dynamic binary only runs if the loader and the container's
    # ld.so.cache are right (the lib64 layout is reached through the cache alone).
    shutil.copy2(HOST_DYNAMIC_BINARY, rootfs / "usr/local/bin/getconf")
    script = "test -e /etc/debian_version && echo debian=yes || echo debian=no; ldconfig -p; getconf GNU_LIBC_VERSION"
    bundle = make_bundle(tmp_path, rootfs, ["sh", "-c", script])

    result = runc.run(bundle)

    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"debian={'yes' if is_debian else 'no'}"
    assert f"libc.so.6 (libc6,x86-64) => {libc_path}" in result.stdout
    assert lines[-1] == os.confstr("CS_GNU_LIBC_VERSION")


@pytest.mark.parametrize("method", ["run", "create_start"])
def test_runc_reports_exit_status_and_output(debian_rootfs, runc, tmp_path, method):
    bundle = make_bundle(tmp_path, debian_rootfs, ["sh", "-c", "echo out-$$; echo err >&2; exit 7"])

    result = getattr(runc, method)(bundle)

    assert (result.returncode, result.stdout, result.stderr) == (7, "out-1\n", "err\n")


def test_prestart_hook_gets_oci_state_before_process_starts(debian_rootfs, runc, tmp_path):
    state_file = tmp_path / "state.json"
    hook = _write_script(
        tmp_path / "hook.sh",
        f"""#!/bin/sh
cat > {state_file}
echo hooked > {debian_rootfs}/hook-marker
""",
    )
    bundle = make_bundle(
        tmp_path / "bundle",
        debian_rootfs,
        ["cat", "/hook-marker"],
        hooks={"prestart": [{"path": str(hook), "args": ["hook.sh", "prestart"], "env": ["PATH=/usr/bin:/bin"]}]},
    )
    cid = new_container_id()

    result = runc.create_start(bundle, cid)

    assert (result.returncode, result.stdout) == (0, "hooked\n"), result.stderr
    state = json.loads(state_file.read_text())
    assert state["id"] == cid
    assert state["bundle"] == str(bundle)
    assert isinstance(state["pid"], int) and state["pid"] > 1


def test_podman_runs_imported_image_with_private_hooks_dir(podman, tmp_path):
    hooks_dir = tmp_path / "hooks.d"
    hooks_dir.mkdir()
    state_file = tmp_path / "state.json"
    hook = _write_script(tmp_path / "hook.sh", f"#!/bin/sh\ncat > {state_file}\n")
    (hooks_dir / "nvc-test.json").write_text(
        json.dumps(
            {
                "version": "1.0.0",
                "hook": {"path": str(hook), "args": ["hook.sh", "prestart"]},
                "when": {"always": True},
                "stages": ["prestart"],
            }
        )
    )

    result = podman.run(
        podman.image("debian"),
        ["sh", "-c", "cat /etc/debian_version; echo $NVC_TEST"],
        env={"NVC_TEST": "from-env"},
        hooks_dirs=[hooks_dir],
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [Path("/etc/debian_version").read_text().strip(), "from-env"]
    assert json.loads(state_file.read_text())["pid"] > 1


def test_podman_reads_cdi_spec_from_private_dir(podman, tmp_path):
    spec_dir = tmp_path / "cdi"
    spec_dir.mkdir()
    (spec_dir / "nvc-test.json").write_text(
        json.dumps(
            {
                "cdiVersion": "0.5.0",
                "kind": "nvc.test/dev",
                "devices": [{"name": "one", "containerEdits": {"env": ["NVC_CDI=one"]}}],
            }
        )
    )

    result = podman.run(
        podman.image("lib64"),
        ["sh", "-c", "echo $NVC_CDI; test -e /etc/debian_version || echo no-debian"],
        extra_args=["--device", "nvc.test/dev=one"],
        cdi_spec_dir=spec_dir,
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["one", "no-debian"]
    assert not (Path("/etc/cdi") / "nvc-test.json").exists()


def test_ctr_runs_imported_image_through_runc_wrapper(containerd, tmp_path):
    log = tmp_path / "runc-calls.log"
    wrapper = _write_script(tmp_path / "runc-wrapper", WRAPPER.format(log=log))
    cid = new_container_id()

    result = containerd.run(
        containerd.image("debian"), cid, ["sh", "-c", "cat /etc/debian_version; echo pid=$$"], runc_binary=str(wrapper)
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [Path("/etc/debian_version").read_text().strip(), "pid=1"]
    calls = log.read_text().splitlines()
    assert any(" create " in f" {call} " and call.endswith(cid) for call in calls), calls

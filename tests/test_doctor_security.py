"""`nvc-py doctor --security`: the hostile-image cases through podman, configured by its own files as on a
host (tests/harness/doctor.py), on the fake driver (a test double: nothing here is a GPU result).

Against the installed hook every case passes and the run leaves nothing: no container in podman's
store, no run directory, no mount. Against a hook that writes through the image by path and runs a
program with the image's environment (the reference's update-ldcache before CVE-2025-23267's fix and
its hooks before CVE-2025-23266's), registered in the installed hook's place, exactly those classes
fail, saying what reached the host, and the exit status is 1.
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from harness.doctor import (
    PATH,
    doctor,
    podman_conf,  # noqa: F401 - fixture
)
from harness.installed import HOOK, SCRIPTS
from nvc.doctor.hostile import CASES

LINE = re.compile(
    r"^(?P<mark>[✓✗-]) podman run (?P<case>[a-z0-9-]+)(?: \((?P<cves>[A-Z0-9, -]+)\))?: "
    r"(?P<word>passed|failed|not applicable): (?P<detail>.*)$"
)
# A hook that writes the image's ld cache by path (through its links) and runs a program with the
# container's environment and the rootfs as its working directory, before the installed hook.
VULNERABLE_HOOK = """#!/usr/bin/python3
import json, os, subprocess, sys
state = sys.stdin.read()
bundle = json.loads(state)["bundle"]
with open(os.path.join(bundle, "config.json")) as f:
    spec = json.load(f)
root = os.path.join(bundle, spec["root"]["path"])
with open(os.path.join(root, "etc/ld.so.cache"), "a") as f:
    f.write("written by path\\n")
image_env = dict(e.split("=", 1) for e in spec["process"]["env"])
subprocess.run(["/usr/bin/python3", "-c", "pass"], env=image_env, cwd=root)
sys.exit(subprocess.run([{hook!r}, "prestart"], input=state.encode()).returncode)
"""


def _setup_podman(env: dict[str, str]) -> None:
    subprocess.run(
        [str(SCRIPTS / "nvc-py"), "setup", "podman", "--config", env["NVC_PY_CONFIG"], "--no-server"],
        check=True,
        env={**os.environ, **env},
        capture_output=True,
    )


def _cases(lines: list[str]) -> dict[str, re.Match]:
    """The case lines by case name; every line before the summary is one."""
    found = {}
    for line in lines[:-1]:
        if line.startswith("    → "):
            continue
        match = LINE.match(line)
        assert match, line
        found[match["case"]] = match
    return found


def _left_behind(env: dict[str, str]) -> list[str]:
    """What a run could leave: containers in podman's store, run directories, mounts of them."""
    ps = subprocess.run(
        ["podman", "ps", "--all", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        check=True,
    )
    dirs = glob.glob(os.path.join(tempfile.gettempdir(), "nvc-doctor-security-*"))
    mounts = [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if "nvc-doctor-security-" in line]
    return ps.stdout.split() + dirs + mounts


def test_every_case_passes_against_the_installed_hook_and_nothing_is_left(podman_conf: dict[str, str]) -> None:
    _setup_podman(podman_conf)

    status, lines = doctor("--security", env=podman_conf)

    cases = _cases(lines)
    assert set(cases) == {case.name for case in CASES}
    failed = [m.string for m in cases.values() if m["word"] != "passed"]
    assert not failed, "\n".join(failed)
    assert status == 0 and lines[-1] == f"{len(CASES)} passed, 0 failed, 0 not applicable"
    for case in CASES:
        assert (cases[case.name]["cves"] or "") == ", ".join(case.cves)
    assert "started, sees GPU 0; nothing reached the host" in cases["libdir-link-to-host-dir"]["detail"]
    assert "refused" in cases["mount-target-link-into-proc"]["detail"]
    assert not _left_behind(podman_conf)


def test_a_hook_that_follows_the_images_links_and_passes_its_env_fails(
    podman_conf: dict[str, str], tmp_path: Path
) -> None:
    script = tmp_path / "vulnerable-hook"
    script.write_text(VULNERABLE_HOOK.format(hook=str(HOOK)))
    script.chmod(0o755)
    hooks = tmp_path / "hooks.d"
    hooks.mkdir()
    (hooks / "oci-nvc-py-hook.json").write_text(
        json.dumps(
            {
                "version": "1.0.0",
                "hook": {"path": str(script), "env": [f"PATH={PATH}", f"NVC_PY_CONFIG={podman_conf['NVC_PY_CONFIG']}"]},
                "when": {"always": True},
                "stages": ["prestart"],
            }
        )
    )

    status, lines = doctor("--security", env=podman_conf)

    cases = _cases(lines)
    failed = {name for name, m in cases.items() if m["word"] == "failed"}
    assert failed == {
        "ld-so-cache-link-to-host-file",
        "ld-so-cache-link-climbing",
        "ld-preload-in-image-env",
        "python-path-in-image-env",
    }, "\n".join(lines)
    assert all(m["word"] == "passed" for name, m in cases.items() if name not in failed), "\n".join(lines)
    assert "the canary changed: ld.so.cache" in cases["ld-so-cache-link-to-host-file"]["detail"]
    assert "the image's code ran on the host: /usr/bin/python3" in cases["ld-preload-in-image-env"]["detail"]
    assert "the image's code ran on the host: python " in cases["python-path-in-image-env"]["detail"]
    assert status == 1 and lines[-1] == f"{len(CASES) - 4} passed, 4 failed, 0 not applicable"
    assert not _left_behind(podman_conf)


def test_sigterm_during_a_case_leaves_nothing(podman_conf: dict[str, str]) -> None:
    """Ended while a container starts: its run directory and its container are removed on the way out."""
    _setup_podman(podman_conf)
    doctor_run = subprocess.Popen(
        [str(SCRIPTS / "nvc-py"), "doctor", "--security"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={"PATH": PATH, "NVC_PY_HOOK_SOCKET": "none", **podman_conf},
    )
    try:
        deadline = time.monotonic() + 120
        while not glob.glob(os.path.join(tempfile.gettempdir(), "nvc-doctor-security-*", "libdir-*")):
            assert time.monotonic() < deadline and doctor_run.poll() is None
            time.sleep(0.05)
        time.sleep(0.3)
        doctor_run.send_signal(signal.SIGTERM)
        assert doctor_run.wait(timeout=120) != 0
    finally:
        doctor_run.kill()
        doctor_run.wait()
    assert not _left_behind(podman_conf)

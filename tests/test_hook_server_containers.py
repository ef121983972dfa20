"""Container starts through ``nvc-py-hook serve``: runc and podman run the registered client (or
nvc-py-hook itself, or a hook script running nvc-py configure), a worker of the server configures
the container, and the hook's log line says so; without a server the client runs the hook itself.

The server is started inside the test's private mount namespace where the fake driver (a test
double) is active, so its workers see the fake GPUs, as runc's hooks do.
"""

from __future__ import annotations

from pathlib import Path

from harness.bundle import make_bundle
from harness.fakegpus import A100, H100, SHOW
from harness.fakegpus import uuids as _uuids
from harness.hookfixtures import default_run_dir, last_log_line, served, setup_dir  # noqa: F401  (fixtures)
from harness.hookserver import BUILT_CLIENT as CLIENT
from harness.hookserver import client_hook, hook_server
from harness.installed import HOOK
from harness.markerlib import assert_image_libraries_never_load
from nvc.hook.server import handover


def hook_entry(setup_dir: Path, sock: Path, stage: str = "prestart", *env: str) -> dict:
    return client_hook(HOOK, sock, [f"NVC_PY_CONFIG={setup_dir / 'config.yaml'}", *env], stage)


def test_container_gets_its_gpu_through_the_server(
    served: Path, runc, debian_rootfs: Path, setup_dir: Path, tmp_path: Path
) -> None:
    bundle = make_bundle(
        tmp_path / "bundle",
        debian_rootfs,
        SHOW,
        env={"NVIDIA_VISIBLE_DEVICES": "1"},
        hooks={"prestart": [hook_entry(setup_dir, served)]},
    )
    result = runc.create_start(bundle, container_id="nvc-served")
    assert result.returncode == 0, result.stderr
    assert _uuids(result.stdout) == [A100]
    last = last_log_line(setup_dir)
    assert (last["container"], last["devices"], last["outcome"], last["via"]) == (
        "nvc-served",
        ["1"],
        "configured",
        "server",
    )


def test_podman_with_setup_podman_hooks_reaches_the_server_at_its_default_socket(
    default_run_dir: Path, podman, setup_dir: Path
) -> None:
    """The recommended set-up end to end: `nvc-py setup podman`'s hooks.d file (no socket named) and
    a server on the default socket."""
    with hook_server(HOOK, Path(handover.DEFAULT_SOCKET)):
        result = podman.run(
            podman.image(), SHOW, env={"NVIDIA_VISIBLE_DEVICES": "0"}, hooks_dirs=[setup_dir / "hooks.d"]
        )
    assert result.returncode == 0, result.stderr
    assert _uuids(result.stdout) == [H100]
    last = last_log_line(setup_dir)
    assert (last["outcome"], last["devices"], last["via"]) == ("configured", ["0"], "server")


def test_refusal_reaches_the_runtime_through_the_client(
    served: Path, runc, debian_rootfs: Path, setup_dir: Path, tmp_path: Path
) -> None:
    bundle = make_bundle(
        tmp_path / "bundle",
        debian_rootfs,
        SHOW,
        env={"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_REQUIRE_CUDA": "cuda>=99.0"},
        hooks={"prestart": [hook_entry(setup_dir, served)]},
    )
    result = runc.create_start(bundle, container_id="nvc-served-refused")
    assert result.returncode != 0
    assert "requirement error: unsatisfied condition: cuda>=99.0" in result.stderr
    last = last_log_line(setup_dir)
    assert (last["outcome"], last["via"]) == ("error", "server")


def test_loader_variables_of_the_hook_env_load_nothing(
    served: Path, runc, debian_rootfs: Path, setup_dir: Path, tmp_path: Path
) -> None:
    """The client is static (no loader); the worker drops LD_* before anything it starts sees them."""

    def hook(evil: Path) -> dict:
        return hook_entry(setup_dir, served, "prestart", f"LD_LIBRARY_PATH={evil}", f"LD_PRELOAD={evil}/libffi.so.8")

    assert_image_libraries_never_load(
        runc, debian_rootfs, tmp_path, hook, ("libc.so.6", "libffi.so.8", "libseccomp.so.2", "libnvidia-ml.so.1")
    )


def test_without_a_server_the_client_runs_the_hook_itself(
    active_2gpu, runc, debian_rootfs: Path, setup_dir: Path, tmp_path: Path
) -> None:
    bundle = make_bundle(
        tmp_path / "bundle",
        debian_rootfs,
        SHOW,
        env={"NVIDIA_VISIBLE_DEVICES": "0"},
        hooks={"prestart": [hook_entry(setup_dir, tmp_path / "absent.sock")]},
    )
    result = runc.create_start(bundle, container_id="nvc-unserved")
    assert result.returncode == 0, result.stderr
    assert _uuids(result.stdout) == [H100]
    last = last_log_line(setup_dir)
    assert last["container"] == "nvc-unserved" and "via" not in last


def test_nvc_py_configure_through_the_server_in_a_prestart_hook(
    active_2gpu, served: Path, runc, debian_rootfs: Path, tmp_path: Path
) -> None:
    """A hook script may hand ``nvc-py configure`` to the server too. The server runs its own nvc-py
    whatever path the call names: a fallback would have to exec /nonexistent/nvc-py and fail."""
    from harness.configurehook import HOOK
    from harness.configurehook import run as _run
    from harness.fakegpus import H100 as GPU0

    script = tmp_path / "hook.sh"
    script.write_text(
        HOOK.format(
            prefix=f"NVC_PY_HOOK_SOCKET={served} {CLIENT}",
            nvc="/nonexistent/nvc-py",
            root=active_2gpu.root,
            args="--device=0 --compute --utility",
            rootfs=debian_rootfs,
            log=tmp_path / "hook.log",
        )
    )
    script.chmod(0o755)
    hook = {"path": str(script), "args": ["hook.sh"], "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"]}
    out = _run(runc, tmp_path, debian_rootfs, hook, "nvidia-smi -L").stdout
    assert out.splitlines() == [f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {GPU0})"]


def test_nvc_py_hook_registered_directly_hands_a_container_start_to_the_server(
    served: Path, runc, debian_rootfs: Path, setup_dir: Path, tmp_path: Path
) -> None:
    """nvc-py-hook registered directly (a CDI hook, an older hooks.d file) is served too, whatever
    the hook's args[0] (the front knows its name from its file)."""
    assert HOOK.read_bytes()[:4] == b"\x7fELF"
    hook = {
        "path": str(HOOK),
        "args": ["oci-hook", "prestart"],
        "env": [f"NVC_PY_CONFIG={setup_dir / 'config.yaml'}", f"{handover.SOCKET_ENV}={served}"],
    }
    bundle = make_bundle(
        tmp_path / "bundle", debian_rootfs, SHOW, env={"NVIDIA_VISIBLE_DEVICES": "0"}, hooks={"prestart": [hook]}
    )
    result = runc.create_start(bundle, container_id="nvc-python-served")
    assert result.returncode == 0, result.stderr
    assert _uuids(result.stdout) == [H100]
    last = last_log_line(setup_dir)
    assert (last["container"], last["outcome"], last["via"]) == ("nvc-python-served", "configured", "server")

"""The installed device plugin (``nvc-py k8s device-plugin``) run against the kubelet stand-in
(tests/harness/kubelet.py) for tests/test_k8s_*.py: a plugin run and its log, its configuration, the
stand-in in a child process."""

from __future__ import annotations

import os
import pickle
import re
import shutil
import signal
import subprocess
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from harness.installed import SCRIPTS

GIB = 1 << 30
GPUS3 = tuple(f"GPU-11111111-2222-4333-8444-5555555555{i:02d}" for i in range(3))  # machines/three-gpu.yaml
XID_FILE = "var/lib/fake-nvml/xid-events"  # in the driver root (tests/fakedriver/src/libnvidia-ml/events.c)


class PluginRun:
    """A running ``nvc-py k8s device-plugin`` and its log."""

    def __init__(self, config: Path, directory: Path, log: Path, wrap: Callable[[list[str]], list[str]] = list) -> None:
        """``wrap``: the command line as run (the test cluster runs it in its node's namespaces)."""
        self.log = log
        self.health_file = log.with_suffix(".health.json")  # not the host's /run/nvc-py/device-plugin.json
        env = {**os.environ, "NVC_PY_HOOK_SOCKET": "none"}
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                wrap(
                    [
                        str(SCRIPTS / "nvc-py"),
                        "k8s",
                        "device-plugin",
                        "--config",
                        str(config),
                        "--device-plugin-dir",
                        str(directory),
                        "--health-file",
                        str(self.health_file),
                    ]
                ),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
            )

    def text(self) -> str:
        return self.log.read_text()

    def wait_log(self, pattern: str, timeout: float = 20) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(pattern, self.text())
            if found:
                return found.group(0)
            assert self.process.poll() is None, f"the plugin exited ({self.process.returncode}):\n{self.text()}"
            time.sleep(0.05)
        raise AssertionError(f"no {pattern!r} in the plugin's log:\n{self.text()}")

    def stop(self) -> int:
        """SIGTERM once it logged its first line (its handler is set by then); its exit status."""
        if self.process.poll() is None:
            self.wait_log("device-plugin: ")
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise


def _config(tmp_path: Path, root: Path, k8s: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(f"root: {root}\nload-kmods: false\nlog: {{file: {tmp_path / 'hook.log'}}}\nk8s: {k8s}\n")
    return path


def in_child(body: Callable[..., Any], *args: Any) -> Any:
    """``body(*args)`` in a forked child, its result back (pickled), or the test failed with its traceback.

    gRPC's threads must never live in the pytest process: they outlive every test, and a process with
    threads cannot setns back out of a fake driver's namespace (tests/fakedriver/activate.py). So the
    stand-in, and every gRPC call, runs in a child; the plugin and containerd run from the parent.
    """
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            out = ("ok", body(*args))
        except BaseException:  # noqa: BLE001 - everything goes back to the parent
            out = ("error", traceback.format_exc())
        with os.fdopen(write, "wb") as f:
            pickle.dump(out, f)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    status, value = pickle.loads(data) if data else ("error", "the child died without an answer")
    if status != "ok":
        pytest.fail(f"in the kubelet stand-in's process:\n{value}", pytrace=False)
    return value


@contextmanager
def kubelet(directory: Path) -> Iterator[Any]:
    """The stand-in serving on ``directory`` (in a child of :func:`in_child` only)."""
    from harness.kubelet import Kubelet

    node = Kubelet(directory)
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    """A short device plugin directory (a socket's path has at most 107 bytes; pytest's are long)."""
    directory = Path(tempfile.mkdtemp(prefix="nvc-k8s-"))
    yield directory
    shutil.rmtree(directory)


@pytest.fixture
def run_plugin(plugin_dir: Path, tmp_path: Path) -> Iterator[Callable[..., PluginRun]]:
    runs: list[PluginRun] = []

    def start(root: Path, k8s: str = "{}") -> PluginRun:
        run = PluginRun(_config(tmp_path, root, k8s), plugin_dir, tmp_path / f"plugin{len(runs)}.log")
        runs.append(run)
        return run

    yield start
    for run in runs:
        assert run.stop() == 0, run.text()

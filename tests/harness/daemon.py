"""Stopping a daemon the harness started (containerd, dockerd): it must not outlive the session."""

from __future__ import annotations

import signal
import subprocess


def stop_daemon(process: subprocess.Popen, timeout: float) -> None:
    """SIGTERM (the daemon's own shutdown), wait up to ``timeout`` seconds, then SIGKILL."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

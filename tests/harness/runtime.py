"""Running OCI bundles with runc, with a private state dir and sure cleanup."""

from __future__ import annotations

import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

REAP_SCRIPT = Path(__file__).with_name("reap.py")


def new_container_id(prefix: str = "nvc-test") -> str:
    """A unique container id (also the cgroup name, so it must not collide)."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@dataclass(frozen=True)
class Runc:
    """runc with its own `--root`, so tests never see or touch host containers."""

    state_root: Path
    binary: str = "runc"

    def _base(self) -> list[str]:
        return [self.binary, "--root", str(self.state_root)]

    def run(
        self, bundle: Path, container_id: str | None = None, timeout: float = 30
    ) -> subprocess.CompletedProcess[str]:
        """`runc run` (no terminal): the container's exit status and output."""
        cid = container_id or new_container_id()
        try:
            return subprocess.run(
                [*self._base(), "run", "--bundle", str(bundle), cid],
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
        finally:
            self.delete(cid)

    def create_start(
        self, bundle: Path, container_id: str | None = None, timeout: float = 30
    ) -> subprocess.CompletedProcess[str]:
        """`runc create` then `runc start`, as engines do; returns when the process ends.

        Use this where the create/start split matters (hook stages, state
        between the two); see reap.py for how the exit status is obtained.
        """
        cid = container_id or new_container_id()
        try:
            return subprocess.run(
                [sys.executable, str(REAP_SCRIPT), self.binary, str(self.state_root), str(bundle), cid],
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
        finally:
            self.delete(cid)

    def delete(self, container_id: str) -> None:
        """Force-delete (kills it if running); a container already gone is fine."""
        subprocess.run([*self._base(), "delete", "-f", container_id], capture_output=True, timeout=30)

"""nvc.hook.setup.processes, the scan that setup's dockerd reload and doctor's engine checks read:
a process under another root directory (a chroot, a container) is not one of this host's, since it
reads that root's files; found through the real /proc, with busybox as the process."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from nvc.hook.setup.processes import processes


def _runs(pid: int, token: str) -> bool:
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[-2:-1] == [token.encode()]


def test_a_process_under_another_root_is_not_found(tmp_path: Path) -> None:
    token = f"{os.getpid()}.{time.monotonic_ns() % 1000}"
    root = tmp_path / "root"
    root.mkdir()
    shutil.copy2("/bin/busybox", root / "busybox")
    ours = subprocess.Popen(["/bin/busybox", "sleep", token])
    chrooted = subprocess.Popen(["/busybox", "sleep", token], preexec_fn=lambda: os.chroot(root))
    try:
        deadline = time.monotonic() + 5
        while not all(_runs(p.pid, token) for p in (ours, chrooted)) and time.monotonic() < deadline:
            time.sleep(0.01)  # both exec'd busybox (the chroot came first)
        assert os.readlink(f"/proc/{chrooted.pid}/root") == str(root)
        found = [p.pid for p in processes(lambda argv: argv[-1:] == (token,))]
        assert found == [ours.pid]
    finally:
        for proc in (ours, chrooted):
            proc.kill()
            proc.wait()

"""`runc create` + `runc start`, then wait for the container's exit status.

Run as a script by runtime.Runc.create_start. `runc create` leaves the
container's init orphaned, so nothing could collect its exit status; this
process makes itself a child subreaper first, so the orphan is reparented here
and waitpid() gives the real status. It lives in its own process so that the
pytest process never becomes a subreaper for unrelated orphans.

Exit status: the container's (128+signal when killed), or runc's when create
or start fails (with a line on stderr naming the failed step).
Usage: reap.py RUNC STATE_ROOT BUNDLE CONTAINER_ID
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys

PR_SET_CHILD_SUBREAPER = 36


def main(runc: str, state_root: str, bundle: str, container_id: str) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    base = [runc, "--root", state_root]
    created = subprocess.run([*base, "create", "--bundle", bundle, container_id])
    if created.returncode != 0:
        print(f"nvc-harness: runc create failed (rc {created.returncode})", file=sys.stderr)
        return created.returncode
    state = subprocess.run([*base, "state", container_id], check=True, stdout=subprocess.PIPE)
    pid = json.loads(state.stdout)["pid"]
    started = subprocess.run([*base, "start", container_id])
    if started.returncode != 0:
        print(f"nvc-harness: runc start failed (rc {started.returncode})", file=sys.stderr)
        return started.returncode
    while True:
        reaped, status = os.waitpid(-1, 0)
        if reaped == pid:
            return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))

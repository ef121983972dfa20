"""When a workload of bench/share.py (torch_load.py, torch_decode.py) begins its timed part, after its warm-up.

START_AT is a time.time() value, several runs given the same one to begin together; a run whose warm-up ended
after it prints "late S" and begins at once, alone for those S seconds. Or START_AT is a file's path: the run
prints "ready" once warmed up and waits for that file, which sharegpu.go_together writes with the start time
once every run of the group said "ready", so that none begins alone however long another's warm-up took (a
first run's files not yet in the page cache; a capped one's, slowed by its cap).
"""

import os
import time


def wait_for_start(start_at: str) -> None:
    """Return when the timed part begins (see the module's docstring); at once for START_AT 0."""
    try:
        at = float(start_at)
    except ValueError:
        print("ready", flush=True)
        while not os.path.exists(start_at):
            time.sleep(0.005)
        with open(start_at) as f:
            at = float(f.read())
    if at and at < time.time():
        print(f"late {time.time() - at:.2f}", flush=True)
    if at > time.time():
        time.sleep(at - time.time())

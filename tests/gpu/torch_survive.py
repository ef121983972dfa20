"""A PyTorch client that keeps the GPU busy and says what it sees if its MPS server goes away.

    torch_survive.py SECONDS MARKER

A bf16 matmul, the GPU synchronised after each; "alive T N" every 0.25 s (T: time.time(), N:
iterations so far). It touches MARKER once it has run on the GPU (a test then knows it is a client).
On the first error "error T MESSAGE" (the message's first line), then one more try on a new tensor:
"retry ok" or "retry MESSAGE". "done T" at the end. A call that has not returned for HANG_S seconds
prints "hung T" and ends the process with status 3: a hang is a result, not a stuck test.
"""

import os
import sys
import threading
import time

import torch

HANG_S = 10.0
last = time.monotonic()


def watchdog() -> None:
    while True:
        time.sleep(0.5)
        if time.monotonic() - last > HANG_S:
            print(f"hung {time.time():.3f}", flush=True)
            os._exit(3)


def first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def main() -> None:
    global last
    seconds, marker = float(sys.argv[1]), sys.argv[2]
    threading.Thread(target=watchdog, daemon=True).start()
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    open(marker, "w").close()
    end, n, said = time.monotonic() + seconds, 0, 0.0
    try:
        while time.monotonic() < end:
            torch.matmul(a, a)
            torch.cuda.synchronize()
            n += 1
            last = time.monotonic()
            if last - said >= 0.25:
                print(f"alive {time.time():.3f} {n}", flush=True)
                said = last
    except Exception as err:  # what CUDA says, whatever torch wraps it in
        print(f"error {time.time():.3f} {first_line(err)}", flush=True)
        last = time.monotonic()
        try:
            torch.matmul(torch.ones(64, 64, device="cuda"), torch.ones(64, 64, device="cuda")).sum().item()
            print("retry ok", flush=True)
        except Exception as again:
            print(f"retry {first_line(again)}", flush=True)
    print(f"done {time.time():.3f}", flush=True)


if __name__ == "__main__":
    main()

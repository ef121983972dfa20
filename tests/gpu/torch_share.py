"""PyTorch under libnvc-share: prints what the tests check, one "key value" line each.

mem_get_info's total, then a 3 GiB tensor and a 2 GiB tensor kept together (under a 4 GiB budget
the second must raise torch.cuda.OutOfMemoryError). Run with and without
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (cuMemCreate instead of cudaMalloc).
"""

import torch

GIB = 1 << 30


def main() -> None:
    free, total = torch.cuda.mem_get_info()
    print(f"mem_get_info {free} {total}", flush=True)
    kept = []
    for gib in (3, 2):
        try:
            kept.append(torch.empty(gib * GIB, dtype=torch.uint8, device="cuda"))
            torch.cuda.synchronize()
            print(f"alloc{gib} ok", flush=True)
        except torch.cuda.OutOfMemoryError:
            print(f"alloc{gib} OutOfMemoryError", flush=True)
    print(f"reserved {torch.cuda.memory_reserved()}", flush=True)


if __name__ == "__main__":
    main()

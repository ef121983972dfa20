"""A PyTorch GPU workload for bench/share.py: iterations per second, second by second.

    torch_load.py WORKLOAD SECONDS [START_AT]

WORKLOAD: matmul (bf16 8192x8192 @ 8192x8192, ~1.6 ms kernels on an H100), conv (bf16 3x3
convolution, 64x256x56x56, cuDNN), train (an MLP's forward, backward and AdamW step under bf16
autocast: dozens of kernels from microseconds to about a millisecond), and the real workloads of
bench/share.py (torch_models.py): transformer (a decoder-only transformer's training step), resnet-train
(a ResNet-50 training step), resnet-infer (ResNet-50 inference). After a warm-up it waits
until START_AT (torch_start.py: a time.time() value, or a file that gives it once every run of a group is
warmed up), then prints "sec I N" for each
second (N iterations completed in second I, the GPU synchronised at each boundary),
"rate R" (iterations per second over the whole run) and "cpu_us C" (the process's CPU time per
iteration: near 1e6 / R, the loop is bound by its host side, not by the GPU). With TORCH_LOAD_STEPS=1
in its environment it also synchronises the GPU after every iteration and prints "step T", T the
time.time() it ended (how fast it follows a change: tests/test_share_set_gpu.py).
"""

import os
import sys
import time

import torch
import torch_start


def workload(name: str):
    dev = "cuda"
    if name == "matmul":
        a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        return lambda: torch.matmul(a, b)
    if name == "conv":
        torch.backends.cudnn.benchmark = True
        x = torch.randn(64, 256, 56, 56, device=dev, dtype=torch.bfloat16)
        w = torch.randn(256, 256, 3, 3, device=dev, dtype=torch.bfloat16)
        return lambda: torch.nn.functional.conv2d(x, w, padding=1)
    if name == "train":
        model = torch.nn.Sequential(
            torch.nn.Linear(2048, 4096),
            torch.nn.GELU(),
            torch.nn.Linear(4096, 4096),
            torch.nn.GELU(),
            torch.nn.Linear(4096, 1000),
        ).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x = torch.randn(512, 2048, device=dev)
        y = torch.randint(0, 1000, (512,), device=dev)

        def step() -> None:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return step
    import torch_models

    if name in torch_models.WORKLOADS:
        return torch_models.WORKLOADS[name]()
    raise SystemExit(f"unknown workload {name}")


def main() -> None:
    name, seconds = sys.argv[1], float(sys.argv[2])
    run = workload(name)
    for _ in range(20):
        run()
    torch.cuda.synchronize()
    torch_start.wait_for_start(sys.argv[3] if len(sys.argv) > 3 else "0")
    steps = os.environ.get("TORCH_LOAD_STEPS") == "1"
    start, cpu = time.monotonic(), time.process_time()
    total, second = 0, 1
    while second <= seconds:
        n = 0
        while time.monotonic() - start < second:
            run()
            n += 1
            if steps:
                torch.cuda.synchronize()
                print(f"step {time.time():.4f}", flush=True)
        torch.cuda.synchronize()
        print(f"sec {second} {n}", flush=True)
        total += n
        second += 1
    print(f"rate {total / (time.monotonic() - start):.2f}", flush=True)
    print(f"cpu_us {(time.process_time() - cpu) * 1e6 / max(total, 1):.1f}", flush=True)


if __name__ == "__main__":
    main()

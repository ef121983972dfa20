"""A launch-bound inference service for bench/share.py: batch-1 token-by-token generation, requests arriving
at a fixed rate.

    torch_decode.py SECONDS RATE [START_AT]

Each request generates 64 tokens, one at a time: the token's embedding through 8 small layers (Linear
1024x1024 and GELU, bf16), a head over a 4096-token vocabulary and its argmax, read back on the host to
choose the next token (as a sampling loop does). Hundreds of kernels of a few microseconds each: the GPU
idles between launches, the host is the bottleneck. Requests arrive every 1 / RATE seconds from START_AT
(torch_start.py; RATE 0: back to back, to measure the service's own capacity); each is served when the one before it is
done, and its latency runs from its arrival, not from when it was served. Prints "req ARRIVAL DONE" (seconds
from the first arrival) for each request arrived within SECONDS, then "cpu_us C" (the process's CPU time per
request). sharegpu.serve_latencies reads these lines.
"""

import sys
import time

import torch
import torch_start

TOKENS, LAYERS, WIDTH, VOCAB = 64, 8, 1024, 4096


def decoder():
    """One request's generation: 64 tokens through the layers, each read back on the host."""
    dev, dtype = "cuda", torch.bfloat16
    embed = torch.nn.Embedding(VOCAB, WIDTH).to(dev, dtype)
    layers = torch.nn.Sequential(*[m for _ in range(LAYERS) for m in (torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU())])
    layers = layers.to(dev, dtype)
    head = torch.nn.Linear(WIDTH, VOCAB).to(dev, dtype)

    @torch.inference_mode()
    def request() -> None:
        token = 1
        for _ in range(TOKENS):
            x = embed(torch.tensor([token], device=dev))
            token = int(head(layers(x)).argmax())

    return request


def main() -> None:
    seconds, rate = float(sys.argv[1]), float(sys.argv[2])
    request = decoder()
    for _ in range(5):
        request()
    torch.cuda.synchronize()
    torch_start.wait_for_start(sys.argv[3] if len(sys.argv) > 3 else "0")
    start, cpu, served = time.monotonic(), time.process_time(), 0
    while True:
        arrival = served / rate if rate else time.monotonic() - start
        if arrival >= seconds:
            break
        early = arrival - (time.monotonic() - start)
        if early > 0:
            time.sleep(early)
        request()
        print(f"req {arrival:.6f} {time.monotonic() - start:.6f}", flush=True)
        served += 1
    print(f"cpu_us {(time.process_time() - cpu) * 1e6 / max(served, 1):.1f}", flush=True)


if __name__ == "__main__":
    main()

"""Runs on the target host (shipped inside the probe script): NCCL all-reduce bus bandwidth.

Needs a python with a CUDA torch (the engine virtualenv); one process drives every GPU
through torch.cuda.nccl. Prints JSON; changes no setting.
"""
import json
import time

import torch
from torch.cuda import nccl

SIZE = 256 << 20  # bytes per GPU, large enough to be bandwidth-bound
ITERS = 20


def sync(n):
    for i in range(n):
        torch.cuda.synchronize(i)


def main():
    n = torch.cuda.device_count()
    if n < 2:
        print(json.dumps({"error": f"{n} CUDA device(s) visible to torch"}))
        return
    bufs = [torch.ones(SIZE // 4, dtype=torch.float32, device=f"cuda:{i}") for i in range(n)]
    nccl.all_reduce(bufs)
    sync(n)
    if bufs[0][0].item() != n:
        print(json.dumps({"error": f"all-reduce of ones gave {bufs[0][0].item()}, not {n}"}))
        return
    start = time.perf_counter()
    for _ in range(ITERS):
        nccl.all_reduce(bufs)
    sync(n)
    per = (time.perf_counter() - start) / ITERS
    busbw = SIZE / per * 2 * (n - 1) / n / 1e9
    print(json.dumps({"num_gpus": n, "bytes": SIZE, "busbw_gbps": round(busbw, 1)}))


main()

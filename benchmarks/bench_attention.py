"""Explicit attention (attnlib.attention) against torch's fused scaled_dot_product_attention.

Reports the median wall time per call and the ratio explicit/fused for a few sizes, in float32
and float64. The explicit layer is written for reading, not speed: the ratio says what clarity
costs. Usage: ``python benchmarks/bench_attention.py [--device cuda] [--repeats 20]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from attnlib import attention as at
from attnlib import resolve_device


def _time(fn, repeats: int, device: torch.device) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    device = resolve_device(args.device)
    print(f"device: {device}, torch {torch.__version__}, threads {torch.get_num_threads()}")
    print(f"{'dtype':>8} {'B':>4} {'H':>3} {'T':>5} {'d':>4} {'explicit ms':>12} {'sdpa ms':>9} {'ratio':>6}")
    gen = torch.Generator(device=device).manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        for B, H, T, d in [(8, 4, 64, 32), (8, 4, 256, 64), (4, 8, 1024, 64)]:
            q, k, v = (torch.randn(B, H, T, d, generator=gen, device=device, dtype=dtype)
                       for _ in range(3))
            t_ours = _time(lambda q=q, k=k, v=v: at.attention(q, k, v), args.repeats, device)
            t_sdpa = _time(lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v),
                           args.repeats, device)
            print(f"{str(dtype).split('.')[-1]:>8} {B:>4} {H:>3} {T:>5} {d:>4} "
                  f"{1e3 * t_ours:12.3f} {1e3 * t_sdpa:9.3f} {t_ours / t_sdpa:6.2f}")


if __name__ == "__main__":
    main()

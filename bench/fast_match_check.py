"""Does the judge's one-pass comparison (compare.fast_match) work on this machine, and does it pass
act_mish_1ms's outputs? Prints why when it declines (CPU side: nothing to check).

    PYTHONPATH=. python3 bench/fast_match_check.py [--elements N]
"""
from __future__ import annotations

import argparse
import time
import traceback

import torch

from core.evaluation import compare as C


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--elements", type=int, default=1 << 24)
    args = ap.parse_args()
    try:
        C._fast_kernel(torch.float32)
        print("fast_match kernel: built")
    except Exception:
        print("fast_match kernel: NOT built\n" + traceback.format_exc())
        return 1
    g = torch.Generator(device="cuda").manual_seed(0)
    for scale in (1.0, 4.0, -4.0, 0.1):
        x = torch.randn(args.elements, device="cuda", generator=g) * scale
        ref = torch.nn.functional.mish(x.double())
        out = torch.nn.functional.mish(x)
        t0 = time.perf_counter()
        fast = C.fast_match(out, ref, 1e-4, 1e-4)
        t1 = time.perf_counter()
        slow = C.compare(out, ref, 1e-4, 1e-4)
        t2 = time.perf_counter()
        print(f"mish, inputs x{scale:g}, {args.elements} elements: fast_match {fast} ({(t1 - t0) * 1e3:.1f} ms), "
              f"compare {slow!r} ({(t2 - t1) * 1e3:.1f} ms); peak memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

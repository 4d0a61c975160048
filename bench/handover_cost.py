"""GPU time of handing one output from the runner's process to the judge's by CUDA IPC, part by
part: the runner's export (a fresh device block, a copy, the handle), the judge's import (map the
block, copy it out, unmap) and, for comparison, the map and unmap alone; then the runner's release
(freeing the block). Median of REPS, each part between synchronisations, in two real processes.

    PYTHONPATH=. python3 bench/handover_cost.py [--gib 1.75] [--reps 5]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.multiprocessing as mp


def _runner(conn, nbytes: int, reps: int) -> None:
    from core.evaluation.channel import IpcExporter

    out = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").normal_()
    exporter = IpcExporter()
    export_ms, release_ms = [], []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        ref = exporter.export(out)
        export_ms.append((time.perf_counter() - t0) * 1e3)
        conn.send(ref)
        conn.recv()                         # the judge has imported it
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        exporter.release()
        torch.cuda.synchronize()
        release_ms.append((time.perf_counter() - t0) * 1e3)
    conn.send((export_ms, release_ms))


def main(argv: list[str] | None = None) -> int:
    import cupy

    from core.evaluation.channel import import_gpu_tensor

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.75)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    torch.zeros(1, device="cuda")
    nbytes = int(args.gib * 2**30) // 4 * 4
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    child = ctx.Process(target=_runner, args=(there, nbytes, args.reps))
    child.start()
    import_ms, map_ms = [], []
    for _ in range(args.reps):
        ref = here.recv()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        ptr = cupy.cuda.runtime.ipcOpenMemHandle(ref.handle, 1)
        cupy.cuda.runtime.ipcCloseMemHandle(ptr)
        map_ms.append((time.perf_counter() - t0) * 1e3)
        t0 = time.perf_counter()
        got = import_gpu_tensor(ref, torch.device("cuda"))
        import_ms.append((time.perf_counter() - t0) * 1e3)
        del got
        here.send("done")
    export_ms, release_ms = here.recv()
    child.join()
    med = statistics.median
    print(f"| hand-over of {nbytes / 2**30:.2f} GiB (ms, median of {args.reps}) | |\n|---|---|")
    print(f"| runner: export (block, copy, handle) | {med(export_ms):.2f} |")
    print(f"| judge: import (map, copy out, unmap) | {med(import_ms):.2f} |")
    print(f"| judge: map and unmap alone | {med(map_ms):.2f} |")
    print(f"| runner: release (free the block) | {med(release_ms):.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

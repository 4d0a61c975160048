"""GPU time of each pass the evaluation protocol makes over a task's inputs and outputs, one at a
time (synchronised before and after, median of REPS), to find what a large task's evaluation
spends beside the kernel. Also times the float64 reference through torch.compile against eager
float64, and reports how far apart the two are.

    PYTHONPATH=. python3 bench/protocol_costs.py [TASK.py ...] [--reps 5] [--json FILE]

Default task: bench/tasks/act_mish_1ms.py. Prints one Markdown table per task.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from core.evaluation.compare import close_mask, count_poisoned, fast_match, fingerprint, poison_, poisoned_mask
from core.tasks import load_task


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, reps: int) -> tuple[float, object]:
    """Median milliseconds of `fn()` between two device synchronisations, and its last result."""
    times, result = [], None
    for _ in range(reps):
        _sync()
        t0 = time.perf_counter()
        result = fn()
        _sync()
        times.append((time.perf_counter() - t0) * 1e3)
        if _ < reps - 1:
            del result
            result = None
    return statistics.median(times), result


def costs(path: Path, reps: int) -> list[tuple[str, float, str]]:
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")    # cpu: a smoke test only
    task = load_task(path)
    rows: list[tuple[str, float, str]] = []

    def row(name, fn, note=""):
        ms, result = timed(fn, reps)
        rows.append((name, ms, note))
        return result

    model = row("make_model", lambda: task.make_model(1, dev))
    inputs = row("make_inputs (draw)", lambda: task.make_inputs(2, dev))
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    values = list(inputs) + list(model.state_dict().values())
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    row("fingerprint (as shipped)", lambda: fingerprint(values))
    floats = [t.reshape(-1) for t in tensors if t.is_floating_point()]
    row("  its float64 sums alone", lambda: [float(torch.sum(f, dtype=torch.float64)) for f in floats])
    row("  float32 sums instead", lambda: [float(torch.sum(f)) for f in floats])
    snapshot = row("snapshot (clone inputs)", lambda: [t.clone() for t in tensors])
    row("mutation check (torch.equal)", lambda: [torch.equal(a, b) for a, b in zip(tensors, snapshot)])
    snapshot = None     # free it (the lambdas above ran already)

    with torch.no_grad():
        outs = row("eager forward (task dtype)", lambda: _as_list(model(*inputs)))
        obytes = sum(o.numel() * o.element_size() for o in outs)
        row("poison outputs", lambda: [poison_(o) for o in outs])
        row("unwritten check (poisoned_mask.sum)", lambda: [int(poisoned_mask(o).sum()) for o in outs])
        row("unwritten check (count_poisoned, as shipped)", lambda: [count_poisoned(o) for o in outs])
        firsts = [o.clone() for o in outs]
        row("repetition compare (torch.equal)", lambda: [torch.equal(a, b) for a, b in zip(outs, firsts)])
        firsts = None

        m64 = row("model.double()", lambda: task.make_model(1, dev).double())
        x64 = row("inputs .double()", lambda: [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point()
                                               else x for x in inputs])
        ref = row("reference: eager float64 forward", lambda: _as_list(m64(*x64)))
        floating = [(o, r) for o, r in zip(outs, ref) if o.is_floating_point()]
        row("judge: fast_match", lambda: [fast_match(o, r, 1e-4, 1e-4) for o, r in floating])
        row("judge: close_mask (the slow compare's core)", lambda: [int(close_mask(o, r, 1e-4, 1e-4).sum())
                                                                   for o, r in floating])
        try:
            compiled = torch.compile(m64)
            t0 = time.perf_counter()
            compiled(*x64)
            _sync()
            build_s = time.perf_counter() - t0
            ref_c = row("reference: torch.compile float64 forward", lambda: _as_list(compiled(*x64)),
                        f"built in {build_s:.1f} s")
            diffs = [float(((a - b).abs().max() / b.abs().max().clamp_min(1e-300))) for a, b in zip(ref_c, ref)]
            rows.append(("  compiled vs eager float64: max |diff| / max |ref|", float("nan"),
                         ", ".join(f"{d:.2e}" for d in diffs)))
            del ref_c
        except Exception as exc:  # a model torch.compile cannot build
            rows.append(("reference: torch.compile float64 forward", float("nan"), f"failed: {exc!r:.120}"))
    rows.insert(0, (f"inputs {nbytes / 2**30:.2f} GiB, outputs {obytes / 2**30:.2f} GiB", float("nan"), ""))
    return rows


def _as_list(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tasks", nargs="*", default=["bench/tasks/act_mish_1ms.py"])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none (CPU)"
    print(f"GPU: {gpu}, torch {torch.__version__}")
    report = {}
    for t in args.tasks:
        rows = costs(Path(t), args.reps)
        report[t] = rows
        print(f"\n### {Path(t).stem}\n\n| step | ms (median of {args.reps}) | note |\n|---|---|---|")
        for name, ms, note in rows:
            print(f"| {name} | {'' if ms != ms else f'{ms:.2f}'} | {note} |")
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

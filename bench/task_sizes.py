"""Check every example task on a GPU: eager time of one call, and how eager compares with the
float64 reference the judge computes (does the task need a widened tolerance?).

    PYTHONPATH=. python bench/task_sizes.py [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import triton.testing  # noqa: E402

from core.tasks import scan_suite  # noqa: E402


def eager_error(task, model, inputs) -> tuple[str, float | None]:
    """Largest |eager - ref| / (1 + |ref|) against a float64 reference, or why there is none."""
    if not all(s.dtype in ("float16", "bfloat16", "float32", "float64") for s in task.output_specs):
        return "task dtype (integer output)", None
    eager = model(*inputs)
    eager = list(eager) if isinstance(eager, (tuple, list)) else [eager]
    try:
        m64 = task.make_model(1, "cuda").double()
        x64 = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
        ref = m64(*x64)
        ref = list(ref) if isinstance(ref, (tuple, list)) else [ref]
    except Exception as exc:
        return f"float64 failed: {type(exc).__name__}", None
    worst = 0.0
    for e, r in zip(eager, ref):
        e, r = e.double(), r.double()
        ok = torch.isfinite(r) & torch.isfinite(e)
        if ok.any():
            worst = max(worst, float(((e - r).abs() / (1 + r.abs()))[ok].max()))
    return "float64", worst


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    suite = scan_suite(ROOT / "resources" / "tasks")
    rows = []
    for task in suite.tasks:
        t0 = time.perf_counter()
        with torch.no_grad():
            model = task.make_model(1, "cuda")
            inputs = task.make_inputs(2, "cuda")
            ms = triton.testing.do_bench(lambda: model(*inputs), warmup=25, rep=100, return_mode="median")
            kind, err = eager_error(task, model, inputs)
        rtol = task.tolerance()[1]
        rows.append({"task": task.name, "eager_us": ms * 1e3, "reference": kind, "eager_error": err, "rtol": rtol,
                     "widened": err is not None and err > rtol, "seconds": time.perf_counter() - t0})
        print(json.dumps(rows[-1]), flush=True)
        del model, inputs
        torch.cuda.empty_cache()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "task_sizes.json").write_text(json.dumps(rows, indent=1))
    print("\n| task | eager us | reference | eager error vs float64 | tolerance |")
    print("|---|---|---|---|---|")
    for r in rows:
        err = "-" if r["eager_error"] is None else f"{r['eager_error']:.2e}"
        flag = " (widened)" if r["widened"] else ""
        print(f"| {r['task']} | {r['eager_us']:.1f} | {r['reference']} | {err} | {r['rtol']:g}{flag} |")
    short = [r["task"] for r in rows if r["eager_us"] < 50]
    print(f"\n{len(rows)} tasks; under 50 us: {short or 'none'}; errors: {list(suite.errors) or 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

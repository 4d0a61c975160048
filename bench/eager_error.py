"""Eager PyTorch's own error against float64 for every example task under a size, on the inputs as
drawn and scaled by +4 and -4 (the judge's calibration, core/evaluation/judge.py), on the CPU: which
tasks' tolerance the scaled draws widen. One row a task: unscaled, x4, x-4, and WIDENS where only the
scaled draws miss the task's tolerance.

    PYTHONPATH=. python3 bench/eager_error.py MAX_MB
"""
import sys, time, torch
from pathlib import Path
from core.tasks import load_task
from core.evaluation.judge import _eager_error
torch.set_grad_enabled(False)
rows = []
for p in sorted(Path("resources/tasks").glob("*.py")):
    head = p.read_text().splitlines()[0]
    try:
        mb = int(head.split("minimum bytes:")[1].split()[0].replace("_", "")) / 2**20
    except Exception:
        continue
    if mb > float(sys.argv[1]):
        continue
    t = load_task(p)
    tol = t.tolerance()[0]
    out = []
    t0 = time.time()
    for scale in (None, 4.0, -4.0):
        m = t.make_model(1, "cpu"); x = t.make_inputs(1, "cpu")
        if scale:
            x = [a * scale if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in x]
        e = m(*x); e = list(e) if isinstance(e, (tuple, list)) else [e]
        if not all(o.is_floating_point() for o in e):
            out.append(None); continue
        try:
            r = m.double()(*[a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in x])
        except Exception:                    # no float64 kernel for an op
            out.append(None); continue
        r = list(r) if isinstance(r, (tuple, list)) else [r]
        out.append(_eager_error(e, r))
    flag = "WIDENS" if any(v is not None and v > tol for v in out[1:]) and not (out[0] is not None and out[0] > tol) else ""
    print(f"{p.stem:34s} {mb:8.0f} MB tol {tol:g}  " + "  ".join("-" if v is None else f"{v:.2e}" for v in out), flag, f"{time.time()-t0:.0f}s", flush=True)

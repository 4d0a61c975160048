"""Where a loop run's time went, candidate by candidate (issue 4's throughput figure).

    PYTHONPATH=. python3 bench/eval_breakdown.py PROJECT.cuagent [...]

For each project: the wall time between verdicts split into the evaluator's own phases (check,
judge, time, and the waits for the judge's bundles: the supervisor's clocks), the re-verification
of times under the roofline floor (its own check, judge and time), the rest of the evaluation
(messages, set-up) and the loop's time outside the evaluation (proposing, compile waits, the project
write); and the same sums for the candidates whose kernel ran under and over twice the run's fastest
time, since random search's slow schedules make the protocol's repetitions longer. Then the median of
each phase a candidate, and how many evaluations and re-verifications ran with the runner lean, were
served again after running out of memory, or had the judge compute references it had not kept
(details["memory"]). Prints Markdown.
"""
from __future__ import annotations

import statistics
import sys
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.project import Project  # noqa: E402

# The supervisor's phases (details["seconds"]); "wait" and "bundle" since the twenty-eighth session.
PHASES = ("check", "wait", "judge", "time", "bundle")


def rows(path: Path) -> list[dict]:
    with Project.open(path, readonly=True) as project:
        recs = [r for r in project.candidates() if r.evaluated_at and r.extra.get("counted", True)]
    recs.sort(key=lambda r: r.id)
    out, last = [], None
    for r in recs:
        done = datetime.fromisoformat(r.evaluated_at)
        gap = (done - last).total_seconds() if last else None
        last = done
        details = r.extra.get("details") or {}
        sec = details.get("seconds") or {}
        again = details.get("reverify_seconds") or {}
        out.append({"gap": gap, "eval": r.extra.get("eval_seconds"), "ms": r.median_ms if r.status == "measured" else None,
                    "status": r.status, **{k: sec.get(k, 0.0) for k in PHASES},
                    "reverify": sum(again.values()), "reverified": bool(again),
                    "memory": details.get("memory") or {}, "reverify_memory": details.get("reverify_memory") or {}})
    return out


def table(name: str, rs: list[dict]) -> list[str]:
    timed = [r for r in rs[1:] if r["gap"] is not None and r["eval"] is not None]
    fastest = min((r["ms"] for r in timed if r["ms"]), default=None)
    lines = [f"### {name}", "",
             "| candidates | n | wall s | check | wait | judge | time | bundle | re-verification (n) | rest of evaluation "
             "| outside evaluation | mean gap s | median kernel ms |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    groups = [("all", timed)]
    if fastest:
        groups += [(f"kernel <= {2 * fastest:.2f} ms", [r for r in timed if r["ms"] and r["ms"] <= 2 * fastest]),
                   (f"kernel > {2 * fastest:.2f} ms", [r for r in timed if r["ms"] and r["ms"] > 2 * fastest]),
                   ("not measured", [r for r in timed if not r["ms"]]),
                   ("re-verified (under the floor)", [r for r in timed if r["reverified"]])]
    for label, g in groups:
        if not g:
            continue
        s = {k: sum(r[k] for r in g) for k in ("gap", "eval", "reverify", *PHASES)}
        n_again = sum(r["reverified"] for r in g)
        kernel = [r["ms"] for r in g if r["ms"]]
        rest = s["eval"] - s["reverify"] - sum(s[k] for k in PHASES)
        lines.append(f"| {label} | {len(g)} | {s['gap']:.1f} | " + " | ".join(f"{s[k]:.1f}" for k in PHASES) + " | "
                     f"{s['reverify']:.1f} ({n_again}) | {rest:.1f} | {s['gap'] - s['eval']:.1f} | "
                     f"{s['gap'] / len(g):.3f} | {statistics.median(kernel) if kernel else float('nan'):.2f} |")
    if timed:
        lines += ["", "Median ms a candidate: " + ", ".join(
            f"{k} {1e3 * statistics.median(r[k] for r in timed):.0f}" for k in PHASES)]
    # What the GPU's memory made evaluations do (recorded since the thirty-fifth session).
    flags = ("lean", "served_again", "references_computed_again")
    counts = [f"{f} {sum(bool(r['memory'].get(f)) for r in timed)}/{sum(bool(r['reverify_memory'].get(f)) for r in timed)}"
              for f in flags]
    lines += ["", "Memory (evaluations / re-verifications): " + ", ".join(counts)]
    return lines + [""]


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    for p in argv:
        print("\n".join(table(Path(p).name, rows(Path(p)))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

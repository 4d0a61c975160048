"""What is in a project file, as data (for --json and the GUI) and as text (`cuda-agent inspect`)."""
from __future__ import annotations

import json
from typing import Any

from .records import CandidateRecord
from .store import Project, run_may_be_live


def _baseline_times(text: str) -> dict[str, Any]:
    """Eager and torch.compile medians from stored Baselines JSON (read as data: no evaluator import)."""
    try:
        data = json.loads(text)
    except ValueError:
        return {"error": "unreadable baselines"}
    out: dict[str, Any] = {}
    for name in ("eager", "compile"):
        timing = data.get(name) or {}
        out[f"{name}_ms"] = timing.get("median_ms")
        if data.get(f"{name}_error"):
            out[f"{name}_error"] = data[f"{name}_error"]
    out["measured_at"] = data.get("measured_at", "")
    return out


def _best_row(rec: CandidateRecord, branch_names: dict[int, str]) -> dict[str, Any]:
    m = rec.measurement or {}
    return {
        "id": rec.id,
        "branch": branch_names.get(rec.branch_id, str(rec.branch_id)),
        "kind": rec.kind,
        "origin": rec.origin,
        "median_ms": rec.median_ms,
        "speedup_eager": m.get("speedup_eager"),
        "speedup_compile": m.get("speedup_compile"),
        "roofline_fraction": m.get("roofline_fraction"),
        "below_floor": bool(m.get("below_floor")),
        "reward": rec.reward,
        "evaluated_at": rec.evaluated_at,
    }


def summarize(project: Project, best: int = 5) -> dict[str, Any]:
    """Everything `inspect` shows, as JSON-ready data. Reads indexes only: instant on big files."""
    branches = project.branches()
    names = {b.id: b.name for b in branches}
    by_branch = project.counts_by_branch()
    branch_rows = []
    for b in branches:
        counts = by_branch.get(b.id, {})
        top = project.best(1, branch_id=b.id)
        branch_rows.append({"id": b.id, "name": b.name, "parent_candidate_id": b.parent_candidate_id,
                            "created_at": b.created_at, "candidates": sum(counts.values()), "counts": counts,
                            "best_ms": top[0].median_ms if top else None,
                            "best_id": top[0].id if top else None})
    counts = project.counts_by_status()
    return {
        "file": str(project.path),
        "size_bytes": project.path.stat().st_size,
        "schema_version": project.schema_version,
        "migrated_from": project.migrated_from,
        "created_at": project.created_at,
        "task": {"name": project.task_name, "hash": project.task_hash},
        "hardware": project.hardware,
        "baselines": {key: _baseline_times(project.baselines_json(key) or "{}") for key in project.baseline_keys()},
        "total": sum(counts.values()),
        "counts": counts,
        "branches": branch_rows,
        "best": [_best_row(r, names) for r in project.best(best)],
        "runs": len(project.runs()),
        "unfinished_runs": [{"id": r.id, "started_at": r.started_at, "pid": r.pid, "host": r.host,
                             "may_be_live": run_may_be_live(r)} for r in project.unfinished_runs()],
        "checkpoints": project.checkpoint_counts(),
    }


# ---- text -----------------------------------------------------------------------------------------


def _ms(ms: float | None) -> str:
    if ms is None:
        return "-"
    return f"{ms * 1e3:.1f} us" if ms < 1 else f"{ms:.3f} ms"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.0f} %"


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{status} {n}" for status, n in counts.items()) or "none"


def _gpu(hardware: dict[str, Any] | None) -> str:
    if not hardware:
        return "not recorded yet (set by the first run on a GPU)"
    parts = [str(hardware.get("name", "unknown GPU"))]
    details = [str(hardware[k]) for k in ("arch",) if hardware.get(k)]
    if hardware.get("sms"):
        details.append(f"{hardware['sms']} SMs")
    if hardware.get("memory_bytes"):
        details.append(f"{hardware['memory_bytes'] / 2**30:.0f} GiB")
    if hardware.get("torch"):
        details.append(f"torch {hardware['torch']}")
    return parts[0] + (f" ({', '.join(details)})" if details else "")


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    return ["  " + "  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in [header, *rows]]


def format_summary(s: dict[str, Any]) -> str:
    lines = [
        f"Project    {s['file']}  (schema {s['schema_version']}, {_size(s['size_bytes'])}, created {s['created_at']})",
        f"Task       {s['task']['name']}  sha256 {s['task']['hash'][:16]}",
        f"GPU        {_gpu(s['hardware'])}",
    ]
    if s.get("migrated_from"):
        lines.append(f"Note       read from schema {s['migrated_from']} (upgraded when opened for writing)")
    for key, b in s["baselines"].items():
        lines.append(f"Baselines  {key}: eager {_ms(b.get('eager_ms'))}, torch.compile {_ms(b.get('compile_ms'))}")
    lines.append(f"Candidates {s['total']}: {_counts(s['counts'])}")
    lines += ["", "Branches"]
    rows = []
    for b in s["branches"]:
        origin = f"from #{b['parent_candidate_id']}" if b["parent_candidate_id"] is not None else ""
        best = f"{_ms(b['best_ms'])} (#{b['best_id']})" if b["best_id"] is not None else "-"
        rows.append([b["name"], f"#{b['id']}", origin, str(b["candidates"]), best, _counts(b["counts"])])
    lines += _table(["name", "id", "forked", "candidates", "best", "by status"], rows)
    lines += ["", "Best candidates"]
    if s["best"]:
        rows = [[f"#{r['id']}", r["branch"], _ms(r["median_ms"]), _x(r["speedup_eager"]), _x(r["speedup_compile"]),
                 _pct(r["roofline_fraction"]) + (" (below floor!)" if r["below_floor"] else ""),
                 "-" if r["reward"] is None else f"{r['reward']:.3f}", r["origin"]] for r in s["best"]]
        lines += _table(["id", "branch", "median", "vs eager", "vs compile", "of roofline", "reward", "origin"], rows)
    else:
        lines.append("  none measured yet")
    if s["unfinished_runs"]:
        lines += ["", "Unfinished runs (resume them from the app or the CLI)"]
        for r in s["unfinished_runs"]:
            state = "may still be running" if r["may_be_live"] else "was stopped without finishing (killed or crashed)"
            lines.append(f"  run {r['id']} started {r['started_at']} by pid {r['pid']} on {r['host']}: {state}")
    lines += ["", f"Runs       {s['runs']}"]
    if s["checkpoints"]:
        lines.append("Policy checkpoints  " + ", ".join(f"{p} {n}" for p, n in s["checkpoints"].items()))
    return "\n".join(lines)

"""The run report: REPORT.md with SVG plots (reward per branch, best speedup, roofline position).

Inputs are plain dicts so any source works (the project store, a JSON dump, a test):

summary: task / task_name, task_hash, gpu, policy, started_at, finished_at, flops, min_bytes,
    eager_ms / compile_ms (or baselines = {"eager": {"median_ms": ...}, "compile": {...}}),
    branches (a list of {"id", "name"} or a {id: name} mapping), notes (list of lines),
    title. Every key is optional.
candidates: in evaluation order, each with id, branch (name) or branch_id, status, reward, origin,
    measurement = {"timing": {"median_ms"}, "speedup_eager", "speedup_compile",
    "roofline_fraction", "gbps", "tflops", "flops", "min_bytes", "below_floor"}
    (dataclasses.asdict of a CandidateRecord fits).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.project.svg import HLine, Series, chart

from .atomic import write_text_atomic

REPORT_NAME = "REPORT.md"
PLOTS = {"reward": "reward.svg", "speedup": "speedup.svg", "roofline": "roofline.svg"}
PENDING = ("queued", "compiled")
TOP_N = 10


@dataclass
class _Row:
    index: int  # 1-based evaluation index
    id: Any
    branch: str
    status: str
    reward: float | None
    origin: str
    median_ms: float | None
    speedup_eager: float | None
    speedup_compile: float | None
    roofline_fraction: float | None
    gbps: float | None
    below_floor: bool


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _branch_names(summary: Mapping[str, Any]) -> dict[Any, str]:
    raw = summary.get("branches") or {}
    if isinstance(raw, Mapping):
        return {k: str(v) for k, v in raw.items()}
    names = {}
    for b in raw:
        if isinstance(b, Mapping) and "id" in b:
            names[b["id"]] = str(b.get("name", b["id"]))
    return names


def _baseline(summary: Mapping[str, Any], key: str) -> float | None:
    direct = _number(summary.get(f"{key}_ms"))
    if direct is not None:
        return direct
    timing = (summary.get("baselines") or {}).get(key) or {}
    return _number(timing.get("median_ms")) if isinstance(timing, Mapping) else None


def _rows(summary: Mapping[str, Any], candidates: Sequence[Mapping[str, Any]]) -> list[_Row]:
    branches = _branch_names(summary)
    eager_ms, compile_ms = _baseline(summary, "eager"), _baseline(summary, "compile")
    rows = []
    for c in candidates:
        status = str(c.get("status", ""))
        if status in PENDING:
            continue
        branch = c.get("branch")
        if branch is None:
            branch_id = c.get("branch_id")
            branch = branches.get(branch_id, branches.get(str(branch_id), branch_id))
        m = c.get("measurement") or {}
        timing = m.get("timing") or {}
        median = _number(timing.get("median_ms", m.get("median_ms")))
        s_eager, s_compile = _number(m.get("speedup_eager")), _number(m.get("speedup_compile"))
        if s_eager is None and median and eager_ms:
            s_eager = eager_ms / median
        if s_compile is None and median and compile_ms:
            s_compile = compile_ms / median
        measured = status == "measured" and median is not None
        rows.append(_Row(
            index=len(rows) + 1, id=c.get("id"), branch=str(branch if branch is not None else "main"), status=status,
            reward=_number(c.get("reward")), origin=str(c.get("origin") or ""),
            median_ms=median if measured else None,
            speedup_eager=s_eager if measured else None, speedup_compile=s_compile if measured else None,
            roofline_fraction=_number(m.get("roofline_fraction")) if measured else None,
            gbps=_number(m.get("gbps")) if measured else None, below_floor=bool(m.get("below_floor")) and measured,
        ))
    return rows


def _by_branch(rows: list[_Row]) -> dict[str, list[_Row]]:
    out: dict[str, list[_Row]] = {}
    for r in rows:
        out.setdefault(r.branch, []).append(r)
    return out


# ---------------------------------------------------------------- plots


def reward_svg(rows: list[_Row]) -> str:
    series = [Series(branch, [(r.index, r.reward) for r in rs if r.reward is not None], "line+markers")
              for branch, rs in _by_branch(rows).items()]
    return chart(series, title="Reward per evaluation, by branch", x_label="evaluation", y_label="reward",
                 hlines=[HLine(0.0, "reward 0")], x_integer=True)


def speedup_svg(rows: list[_Row]) -> str:
    series = []
    for label, attribute in (("best speedup vs eager", "speedup_eager"), ("best speedup vs torch.compile", "speedup_compile")):
        best, points = -math.inf, []
        for r in rows:
            value = getattr(r, attribute)
            if value is not None and value > best:
                best = value
                points.append((r.index, best))
        if points and rows:
            points.append((rows[-1].index, best))  # carry the record to the last evaluation
        series.append(Series(label, points, "line+markers", step=True))
    return chart(series, title="Best speedup so far", x_label="evaluation", y_label="speedup (baseline time / kernel time)",
                 hlines=[HLine(1.0, "as fast as the baseline")], x_integer=True)


def roofline_svg(rows: list[_Row]) -> str:
    series = []
    for branch, rs in _by_branch(rows).items():
        series.append(Series(branch, [(r.index, r.roofline_fraction) for r in rs
                                      if r.roofline_fraction is not None and not r.below_floor], "markers"))
    flagged = [(r.index, r.roofline_fraction) for r in rows if r.below_floor and r.roofline_fraction is not None]
    if flagged:
        series.append(Series("below the floor (flagged)", flagged, "markers", color="#d62728"))
    return chart(series, title="Roofline position of measured candidates", x_label="evaluation",
                 y_label="fraction of the roofline (floor time / time)", hlines=[HLine(1.0, "roofline floor")],
                 y_min=0.0, x_integer=True)


# ---------------------------------------------------------------- markdown


def _f(value: float | None, spec: str, suffix: str = "") -> str:
    return "–" if value is None else format(value, spec) + suffix


def _cell(value: Any) -> str:
    """Text for a table cell: pipes escaped, '<' and '>' as entities (else read as HTML tags)."""
    text = " ".join(str(value).split())
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def render_markdown(summary: Mapping[str, Any], rows: list[_Row]) -> str:
    task = summary.get("task") or summary.get("task_name") or "(unknown task)"
    title = summary.get("title") or f"CUDA Agent run report: {task}"
    eager_ms, compile_ms = _baseline(summary, "eager"), _baseline(summary, "compile")
    measured = [r for r in rows if r.median_ms is not None]
    best = sorted(measured, key=lambda r: r.median_ms)[:TOP_N]
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.status] = counts.get(r.status, 0) + 1

    lines = [f"# {title}", ""]
    facts = [("Task", f"`{task}`" + (f" (sha256 `{summary['task_hash'][:16]}…`)" if summary.get("task_hash") else ""))]
    for key, label in (("gpu", "GPU"), ("policy", "Policy"), ("started_at", "Started"), ("finished_at", "Finished")):
        if summary.get(key):
            facts.append((label, _cell(summary[key])))
    facts.append(("Baselines", f"eager PyTorch {_f(eager_ms, '.4f', ' ms')}, torch.compile {_f(compile_ms, '.4f', ' ms')}"))
    facts.append(("Evaluations", f"{len(rows)} in {len(_by_branch(rows))} branch(es): "
                  + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) if rows else "none yet"))
    if best:
        b = best[0]
        facts.append(("Best", f"candidate {b.id} (branch {b.branch}): {b.median_ms:.4f} ms, "
                      f"{_f(b.speedup_eager, '.2f', 'x')} vs eager, {_f(b.speedup_compile, '.2f', 'x')} vs torch.compile"))
    lines += ["| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in facts] + [""]
    for note in summary.get("notes") or []:
        lines.append(f"> {_cell(note)}")
    if summary.get("notes"):
        lines.append("")

    lines += ["## Best candidates", ""]
    if best:
        lines += ["| rank | candidate | branch | median time | vs eager | vs torch.compile | roofline | GB/s | reward | origin |",
                  "|---:|---:|---|---:|---:|---:|---:|---:|---:|---|"]
        for rank, r in enumerate(best, 1):
            flag = " ⚠ below floor" if r.below_floor else ""
            lines.append(
                f"| {rank} | {_cell(r.id)} | {_cell(r.branch)} | {r.median_ms:.4f} ms | {_f(r.speedup_eager, '.2f', 'x')} | "
                f"{_f(r.speedup_compile, '.2f', 'x')} | {_f(None if r.roofline_fraction is None else 100 * r.roofline_fraction, '.1f', '%')}{flag} | "
                f"{_f(r.gbps, '.1f')} | {_f(r.reward, '.3f')} | {_cell(r.origin) or '–'} |")
    else:
        lines.append("No candidate has been measured yet.")
    lines.append("")

    lines += [
        "## Reward per branch", "",
        f"![Reward per evaluation, by branch]({PLOTS['reward']})", "",
        "Each point is one evaluated candidate, in the order the optimiser evaluated them (x), with the reward "
        "it earned (y); one line per branch. Failed candidates (compile errors, wrong results, crashes, "
        "timeouts, rejections) get the fixed failure penalty.", "",
        "## Best speedup", "",
        f"![Best speedup so far]({PLOTS['speedup']})", "",
        "The fastest correct candidate so far, as a speedup over eager PyTorch and over `torch.compile` "
        "(baseline median time / candidate median time, both measured the same way on the same GPU). "
        "Above the dashed line at 1 the kernel beats that baseline.", "",
        "## Roofline position", "",
        f"![Roofline position of measured candidates]({PLOTS['roofline']})", "",
        "Every measured candidate's *fraction of the roofline*: the roofline floor time divided by its "
        "measured median time. The floor is the larger of the minimum bytes (each input and weight read "
        "once, each output written once) over the GPU's measured copy bandwidth and the counted FLOPs "
        "over its measured peak rate for the task's dtype, so 1.0 (the dashed line) is the fastest any "
        "kernel could be and 0.5 means twice that time. All candidates of one task share one arithmetic "
        "intensity, so the x axis is the evaluation order rather than the intensity. A candidate faster "
        "than the floor is not a record but a suspicion: it is re-verified and drawn in red as flagged.",
    ]
    flops, min_bytes = _number(summary.get("flops")), _number(summary.get("min_bytes"))
    if flops and min_bytes:
        lines += ["", f"Arithmetic intensity of this task: {flops:.4g} FLOP / {min_bytes:.4g} bytes = "
                  f"{flops / min_bytes:.3g} FLOP/byte."]
    lines.append("")
    return "\n".join(lines)




def render_report(summary: Mapping[str, Any], candidates: Sequence[Mapping[str, Any]], out_dir: str | Path) -> Path:
    """Write REPORT.md and its three SVG plots into out_dir (replacing earlier ones); returns REPORT.md."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = _rows(summary, candidates)
    write_text_atomic(out / PLOTS["reward"], reward_svg(rows))
    write_text_atomic(out / PLOTS["speedup"], speedup_svg(rows))
    write_text_atomic(out / PLOTS["roofline"], roofline_svg(rows))
    report = out / REPORT_NAME
    write_text_atomic(report, render_markdown(summary, rows))
    return report


__all__ = ["PLOTS", "REPORT_NAME", "render_markdown", "render_report"]

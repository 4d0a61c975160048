"""Nsight Compute counters of a generated program's kernels, one row per kernel: where a kernel
that is slower than its floor spends its time (memory, issue slots, a slow pipe, stalls).

    PYTHONPATH=. python bench/ncu_table.py softmax_dim1_fp16 'loss_kl_div:G0_BLOCK=1024' ...

Each argument is a bench/kernel_times.py spec (TASK or TASK:KNOB=V,...). For each, ncu
(`--clock-control none`: the card's clocks stay as they are) profiles the first launch of each
of the program's kernels while kernel_times.py builds, checks and runs it once. The raw CSV goes
to $OUT (or ./ncu-out) as ncu-<n>.csv; the table goes to stdout.
"""
from __future__ import annotations

import csv
import io
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# (column, metric, scale): the metrics read, as the table shows them.
METRICS = [
    ("us", "gpu__time_duration.sum", 1e-3),
    ("dram %", "dram__throughput.avg.pct_of_peak_sustained_elapsed", 1),
    ("read MB", "dram__bytes_read.sum", 1e-6),
    ("write MB", "dram__bytes_write.sum", 1e-6),
    ("issue %", "smsp__issue_active.avg.pct_of_peak_sustained_active", 1),
    ("warps %", "sm__warps_active.avg.pct_of_peak_sustained_active", 1),
    ("fma %", "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active", 1),
    ("xu %", "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active", 1),
    ("fp64 %", "sm__pipe_fp64_cycles_active.avg.pct_of_peak_sustained_active", 1),
    ("lsu %", "sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active", 1),
    ("regs", "launch__registers_per_thread", 1),
    ("L2 hit %", "lts__t_sector_hit_rate.pct", 1),
    ("st long", "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio", 1),
    ("st barrier", "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio", 1),
    ("st math", "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio", 1),
    ("st short", "smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio", 1),
    ("st lg", "smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio", 1),
    ("st mio", "smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio", 1),
    ("st wait", "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio", 1),
    ("tensor %", "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", 1),
    ("smem conflicts", "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum", 1),
]


def profile(spec: str, out: Path, n: int, extra: list[str]) -> list[dict[str, str]]:
    task = spec.partition(":")[0]
    csv_path = out / f"ncu-{n}.csv"
    cmd = ["ncu", "--clock-control", "none", "--csv", "--page", "raw", "-k", f"regex:^{task}_",
           "--metrics", ",".join(m for _, m, _ in METRICS),
           sys.executable, str(ROOT / "bench" / "kernel_times.py"), spec, "--reps", "1", *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    csv_path.write_text(done.stdout)
    firsts = first_launches(done.stdout)
    if done.returncode != 0 or not firsts:
        print(f"## {spec}: ncu failed (exit {done.returncode}): {done.stderr[-800:]}")
    return firsts


def first_launches(output: str) -> list[dict[str, str]]:
    """The rows of ncu's raw CSV page (mixed with the profiled program's own output) for the first
    launch of each kernel, in launch order; the units row after the header is skipped."""
    lines = [line for line in output.splitlines() if line.startswith('"')]
    table = list(csv.DictReader(io.StringIO("\n".join(lines))))
    seen, firsts = set(), []
    for row in table:
        name = row.get("Kernel Name", "")
        if row.get("ID", "").strip() and name and name not in seen:
            seen.add(name)
            firsts.append(row)
    return firsts


def number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except (AttributeError, ValueError):
        return None


def main() -> int:
    args = sys.argv[1:]
    extra = []
    if "--" in args:   # what follows goes to kernel_times.py (e.g. --options -use_fast_math)
        extra = args[args.index("--") + 1:]
        args = args[:args.index("--")]
    if not args:
        print(__doc__)
        return 2
    out = Path(os.environ.get("OUT", "ncu-out"))
    out.mkdir(parents=True, exist_ok=True)
    print("| spec | kernel | " + " | ".join(c for c, _, _ in METRICS) + " |")
    print("|---|---|" + "---|" * len(METRICS))
    for n, spec in enumerate(args):
        for row in profile(spec, out, n, extra):
            cells = []
            for _, metric, scale in METRICS:
                v = number(row.get(metric, ""))
                cells.append("" if v is None else f"{v * scale:.3g}" if v * scale < 100 else f"{v * scale:.0f}")
            print(f"| {spec} | {row.get('Kernel Name', '')[:40]} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

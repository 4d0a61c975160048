"""Headless entry point: `cuda-agent evaluate | baseline | run | bench | bench-search | train | inspect | export |
doctor`.

Exit codes: 0 success, 1 the candidate was not accepted, 2 bad input (file, format), 3 this
machine cannot do it (no GPU, no NVRTC).
"""
from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

from rich.console import Console
from rich.table import Table

console = Console(highlight=False)
err = Console(stderr=True, highlight=False, soft_wrap=True)  # messages stay whole lines

EXIT_OK, EXIT_REJECTED, EXIT_BAD_INPUT, EXIT_UNAVAILABLE = 0, 1, 2, 3


def _fmt_ms(ms: float | None) -> str:
    if ms is None:
        return "-"
    return f"{ms * 1e3:.1f} us" if ms < 1 else f"{ms:.3f} ms"


def _fmt(x: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if x is None else f"{x:{spec}}{suffix}"


def _load_task(path: str):
    from core.tasks import TaskError, load_task

    try:
        return load_task(path)
    except TaskError as exc:
        err.print(f"[red]task error:[/red] {exc}")
        raise SystemExit(EXIT_BAD_INPUT)


def _load_candidate(path: str):
    from core.program import ProgramError, load_solution

    try:
        return load_solution(path)
    except ProgramError as exc:
        err.print(f"[red]program error:[/red] {exc}")
        raise SystemExit(EXIT_BAD_INPUT)
    except OSError as exc:
        err.print(f"[red]cannot read {path}:[/red] {exc.strerror or exc}")
        raise SystemExit(EXIT_BAD_INPUT)


def _settings(args) -> Any:
    from core.evaluation import SupervisorSettings

    s = SupervisorSettings()
    if getattr(args, "timeout", None):
        s.check_timeout_s = s.time_timeout_s = float(args.timeout)
    return s


def _gpu_or_exit(device: int):
    from core.evaluation.probe import probe_gpus

    with console.status("looking for GPUs..."):
        probe = probe_gpus()
    if not probe.can_run:
        return probe.reason
    if device >= len(probe.gpus):
        err.print(f"[red]there is no GPU {device}[/red]: this machine has {len(probe.gpus)}")
        raise SystemExit(EXIT_BAD_INPUT)
    return None


# ---- evaluate -------------------------------------------------------------------------------------


def cmd_evaluate(args) -> int:
    from core.evaluation import Evaluator
    from core.program import KernelProgram

    task = _load_task(args.task)
    candidate = _load_candidate(args.program)
    no_gpu = _gpu_or_exit(args.device)
    if no_gpu:
        if isinstance(candidate, KernelProgram):
            return _compile_only(candidate, no_gpu, args)
        err.print(f"[yellow]cannot evaluate here:[/yellow] {no_gpu}")
        return EXIT_UNAVAILABLE
    with Evaluator(task, args.device, settings=_settings(args)) as ev:
        with console.status(f"starting evaluator processes on GPU {args.device}..."):
            ev.start()
        baselines = None
        if not args.no_baselines:
            with console.status("measuring baselines (eager, torch.compile; cached after the first time)..."):
                baselines = ev.baselines(with_compile=not args.no_compile)
        with console.status(f"evaluating {Path(args.program).name}..."):
            result = ev.evaluate(candidate, with_baselines=baselines is not None)
        if args.json:
            print(json.dumps(result.to_dict(), indent=1, default=str))
        else:
            _print_result(task, result, ev.gpu, ev.tolerance)
    return EXIT_OK if result.ok else EXIT_REJECTED


def _compile_only(program, reason: str, args) -> int:
    from core.toolchain import compile_cuda, parse_ptxas_verbose

    console.print(f"[yellow]no GPU run:[/yellow] {reason}")
    res = compile_cuda(program.source, arch=args.arch, options=list(program.compile_options()) + ["--ptxas-options=-v"])
    if res.ok:
        console.print(f"compiled for {args.arch} with NVRTC in {res.seconds:.2f} s ({len(res.cubin)} bytes of cubin); "
                      "it was not run")
        t = Table(title="resources (ptxas)", header_style="bold")
        for col in ("kernel", "registers", "static shared", "stack", "spills (st/ld)"):
            t.add_column(col)
        for name, k in parse_ptxas_verbose(res.log).items():
            t.add_row(name, str(k.registers), f"{k.shared_bytes} B", f"{k.stack_bytes} B",
                      f"{k.spill_stores}/{k.spill_loads} B")
        console.print(t)
        return EXIT_UNAVAILABLE
    console.print(f"[red]compile error[/red]\n{res.error_summary()}")
    return EXIT_REJECTED


def _print_result(task, result, gpu: dict[str, Any], tolerance) -> None:
    colour = "green" if result.ok else "red"
    console.print(f"[bold]{task.name}[/bold] on {gpu.get('name')}  verdict: [{colour}]{result.status.value}[/{colour}]")
    if result.reason:
        console.print(f"reason: {result.reason}")
    console.print(f"compile {result.compile_seconds:.2f} s{' (cached)' if result.compile_cached else ''}, "
                  f"evaluation {result.eval_seconds:.2f} s, tolerance atol={tolerance[0]:g} rtol={tolerance[1]:g}")
    m = result.measurement
    if m is None:
        return
    t = Table(show_header=True, header_style="bold")
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_row("median time", _fmt_ms(m.timing.median_ms))
    t.add_row("spread (IQR / median)", f"{m.timing.spread * 100:.1f} % over {m.timing.reps} reps")
    t.add_row("eager PyTorch", _fmt_ms(m.eager_ms))
    t.add_row("torch.compile", _fmt_ms(m.compile_ms))
    t.add_row("speedup over eager", _fmt(m.speedup_eager, ".2f", "x"))
    t.add_row("speedup over torch.compile", _fmt(m.speedup_compile, ".2f", "x"))
    t.add_row("bandwidth (minimum bytes)", _fmt(m.gbps, ".0f", " GB/s"))
    t.add_row("arithmetic", _fmt(m.tflops, ".2f", " TFLOP/s"))
    t.add_row("roofline floor", _fmt_ms(m.floor_ms))
    t.add_row("fraction of floor", _fmt(None if m.roofline_fraction is None else m.roofline_fraction * 100, ".1f", " %"))
    console.print(t)
    if m.kernels:
        k = Table(show_header=True, header_style="bold")
        for col in ("kernel", "threads", "registers", "shared (static+dyn)", "local", "spills (st/ld)", "occupancy"):
            k.add_column(col)
        for ks in m.kernels:
            spills = "-" if ks.spill_stores is None else f"{ks.spill_stores}/{ks.spill_loads} B"
            k.add_row(ks.name, str(ks.block_threads), str(ks.registers),
                      f"{ks.static_shared_bytes}+{ks.dynamic_shared_bytes} B", f"{ks.local_bytes} B", spills,
                      _fmt(None if ks.occupancy is None else ks.occupancy * 100, ".0f", " %"))
        console.print(k)
    for note in m.notes:
        console.print(f"note: {note}")


# ---- baseline -------------------------------------------------------------------------------------


def cmd_baseline(args) -> int:
    from core.evaluation import Evaluator

    task = _load_task(args.task)
    no_gpu = _gpu_or_exit(args.device)
    if no_gpu:
        err.print(f"[yellow]cannot measure baselines here:[/yellow] {no_gpu}")
        return EXIT_UNAVAILABLE
    with Evaluator(task, args.device, settings=_settings(args)) as ev:
        with console.status("measuring eager PyTorch and torch.compile..."):
            b = ev.baselines(refresh=args.refresh, with_compile=not args.no_compile)
        if args.json:
            print(b.to_json())
            return EXIT_OK
        t = Table(title=f"{task.name} on {b.gpu} (measured {b.measured_at})", header_style="bold")
        for col in ("baseline", "median", "min", "max", "spread", "reps", "note"):
            t.add_column(col)
        for name, timing, error in (("eager", b.eager, b.eager_error), ("torch.compile", b.compile, b.compile_error)):
            if timing is None:
                t.add_row(name, "-", "-", "-", "-", "-", error or "not measured")
            else:
                t.add_row(name, _fmt_ms(timing.median_ms), _fmt_ms(timing.min_ms), _fmt_ms(timing.max_ms),
                          f"{timing.spread * 100:.1f} %", str(timing.reps), "")
        console.print(t)
        for note in b.notes:
            console.print(f"note: {note}")
    return EXIT_OK if b.eager is not None else EXIT_REJECTED


# ---- doctor ---------------------------------------------------------------------------------------


def cmd_doctor(args) -> int:
    from core.evaluation.probe import probe_gpus
    from core.toolchain import compile_cuda, nvrtc_info

    rows: list[tuple[str, str, str]] = []

    def row(what: str, ok: bool | None, detail: str) -> None:
        mark = {True: "[green]ok[/green]", False: "[red]no[/red]", None: "[yellow]--[/yellow]"}[ok]
        rows.append((what, mark, detail))

    row("python", True, f"{platform.python_version()} ({sys.executable})")
    try:
        import torch

        row("torch", True, f"{torch.__version__}, built for CUDA {torch.version.cuda or 'none (CPU build)'}")
    except ImportError as exc:
        row("torch", False, str(exc))
    with console.status("asking a child process about GPUs..."):
        probe = probe_gpus()
    if probe.gpus:
        for g in probe.gpus:
            row(f"GPU {g['index']}", True, f"{g['name']}, sm_{g['capability'].replace('.', '')}, "
                                          f"{g['sms']} SMs, {g['memory_bytes'] / 2**30:.0f} GiB")
        if probe.driver:
            row("CUDA driver", True, str(probe.driver))
    else:
        row("GPU", False, probe.error or "none visible")
    row("CuPy", probe.cupy is not None, probe.cupy or str(probe.cupy_error))
    available, version, detail = nvrtc_info()
    row("NVRTC", available, f"{version or ''} {detail}".strip())
    compiles = False
    if available:
        res = compile_cuda('extern "C" __global__ void k(float* x) { x[threadIdx.x] *= 2.f; }', arch="sm_90")
        compiles = res.ok
        row("compile check (sm_90)", res.ok, f"{res.seconds:.2f} s" if res.ok else res.error_summary())
    nvcc = shutil.which("nvcc")
    if nvcc:
        try:
            v = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[-1]
        except (OSError, subprocess.TimeoutExpired, IndexError) as exc:
            v = f"failed: {exc}"
        row("nvcc", True, f"{nvcc}: {v}")
    else:
        row("nvcc", None, "not found: resource reports from ptxas -v still come from NVRTC")
    from importlib import metadata

    try:  # read the version without importing Qt: core/ never loads it
        row("PySide6 (desktop app)", True, metadata.version("PySide6-Essentials"))
    except metadata.PackageNotFoundError:
        row("PySide6 (desktop app)", False, "not installed: the CLI works, the app does not")
    from core.evaluation.roofline import cache_root

    row("cache", True, str(cache_root()))
    t = Table(title="cuda-agent doctor", header_style="bold")
    t.add_column("component")
    t.add_column("")
    t.add_column("detail", overflow="fold")
    for r in rows:
        t.add_row(*r)
    console.print(t)
    console.print("[bold]What works here[/bold]")
    console.print(f"  run and time candidates on a local GPU: {'yes' if probe.can_run else 'no - ' + probe.reason}")
    console.print(f"  compile checks (NVRTC, no GPU needed): {'yes' if compiles else 'no - install cuda-agent[cuda12] or [cuda13]'}")
    console.print("  load tasks, browse projects, export: yes")
    return EXIT_OK


# ---- inspect --------------------------------------------------------------------------------------


def cmd_inspect(args) -> int:
    from core.project import Project, ProjectError
    from core.project.inspect import format_summary, summarize

    try:
        with Project.open(args.file, readonly=True) as project:
            summary = summarize(project)
    except ProjectError as exc:
        from rich.markup import escape

        err.print(f"[red]project error:[/red] {escape(str(exc))}")
        return EXIT_BAD_INPUT
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        console.print(format_summary(summary), markup=False, soft_wrap=True)
    return EXIT_OK


# ---- export ---------------------------------------------------------------------------------------


def cmd_export(args) -> int:
    from rich.markup import escape

    from core.project import ProjectError
    from core.project.export import ExportError
    from core.project.ship import NoSuchCandidate, NothingToExport, export_from_project

    try:
        shipped = export_from_project(args.file, args.out, args.candidate, overwrite=args.force)
    except NothingToExport:
        err.print(f"[red]nothing to export:[/red] {escape(args.file)} has no measured candidate yet")
        return EXIT_REJECTED
    except NoSuchCandidate:
        err.print(f"[red]no candidate {args.candidate}[/red] in {escape(args.file)}")
        return EXIT_BAD_INPUT
    except (ProjectError, ExportError) as exc:
        err.print(f"[red]export error:[/red] {escape(str(exc))}")
        return EXIT_BAD_INPUT
    console.print(f"exported candidate {shipped.candidate_id} ({shipped.status}) of {shipped.task_name} to {args.out}:")
    for path in shipped.files:
        console.print(f"  {path}")
    if args.check:
        from core.project.export import build_check

        cu = next(p for p in shipped.files if str(p).endswith(".cu"))
        with console.status(f"building {cu} with nvcc ..."):
            check = build_check(cu, arch=args.arch)
        (console if check.built else err).print(escape(check.summary()))
        if check.built is False:
            return EXIT_REJECTED
    return EXIT_OK


# ---- main -----------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cuda-agent", description="Turn a PyTorch reference op into a fast, verified CUDA kernel.")
    sub = p.add_subparsers(dest="command", required=True)

    e = sub.add_parser("evaluate", help="check and time one candidate (a program .json or a ModelNew .py) against a task")
    e.add_argument("task", help="KernelBench-format task file (.py)")
    e.add_argument("program", help="program file (.json) or KernelBench solution defining ModelNew (.py)")
    e.add_argument("--device", type=int, default=0, help="GPU index (default 0)")
    e.add_argument("--no-baselines", action="store_true", help="skip eager/torch.compile baselines")
    e.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    e.add_argument("--timeout", type=float, help="seconds a check or timing phase may take before the process is killed")
    e.add_argument("--arch", default="sm_90", help="target for a compile-only check on a machine with no GPU")
    e.add_argument("--json", action="store_true", help="print the result as JSON")
    e.set_defaults(func=cmd_evaluate)

    b = sub.add_parser("baseline", help="measure eager PyTorch and torch.compile for a task (cached per GPU)")
    b.add_argument("task")
    b.add_argument("--device", type=int, default=0)
    b.add_argument("--refresh", action="store_true", help="measure again instead of using the cache")
    b.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    b.add_argument("--timeout", type=float)
    b.add_argument("--json", action="store_true")
    b.set_defaults(func=cmd_baseline)

    x = sub.add_parser("export", help="write a project's candidate as NAME.cu (kernels, launcher, PyTorch binding), "
                                      "a loader snippet, a ModelNew file and a Markdown report")
    x.add_argument("file", help="project file (.cuagent)")
    x.add_argument("--candidate", type=int, help="candidate id (default: the fastest measured one)")
    x.add_argument("--out", required=True, help="folder to write into")
    x.add_argument("--force", action="store_true", help="replace files that already exist there")
    x.add_argument("--check", action="store_true", help="build the .cu with nvcc afterwards (no GPU needed; "
                                                          "PyTorch's C++ headers and Python.h must be there)")
    x.add_argument("--arch", default="sm_90", help="target of the --check build (default sm_90)")
    x.set_defaults(func=cmd_export)

    from core.search.cli import add_bench_parser, add_bench_search_parser, add_run_parser, add_train_parser

    add_run_parser(sub)
    add_bench_parser(sub)
    add_bench_search_parser(sub)
    add_train_parser(sub)

    d = sub.add_parser("doctor", help="say what this machine has and what will work")
    d.set_defaults(func=cmd_doctor)

    i = sub.add_parser("inspect", help="summarise a project file: task, GPU, branches, best candidates, counts")
    i.add_argument("file", help="project file (.cuagent)")
    i.add_argument("--json", action="store_true", help="print the summary as JSON")
    i.set_defaults(func=cmd_inspect)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130
    except BrokenPipeError:  # output piped into `head` and the like: stop quietly
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())

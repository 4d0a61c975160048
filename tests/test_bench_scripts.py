"""The GPU session scripts' CPU-side logic: bench/heldout_live.py's comparison of live runs,
bench/throughput.py's reading of compile times and pauses, bench/eval_breakdown.py's sums and memory
counts, and bench/sweep.py's choice of schedules and its whole-space recording (made-up projects,
no GPU)."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from core.evaluation.results import Measurement, Timing
from core.project import CandidateRecord, Project
from core.search.space import ScheduleSpace
from core.tasks import load_task
from tests.support.replay_run import TASK_PATH, search_program

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(path: Path, times_ms: list[float | None], seconds_apart: int) -> None:
    """A made-up live run: candidates in order, None = a failed one, seconds_apart between verdicts."""
    program = search_program()
    schedules = list(ScheduleSpace.from_program(program, load_task(TASK_PATH)).enumerate())
    records = []
    for k, ms in enumerate(times_ms):
        rec = CandidateRecord.from_program(program.with_schedule(schedules[k]), origin="test (made up)")
        rec.created_at = f"2026-11-30T10:00:{k * seconds_apart:02d}+00:00"
        rec.evaluated_at = f"2026-11-30T10:00:{k * seconds_apart + 1:02d}+00:00"
        if ms is None:
            rec.status, rec.reason = "compile_error", "made up"
        else:
            t = Timing(ms, ms, ms, ms, ms, 20)
            rec.status, rec.measurement = "measured", dataclasses.asdict(Measurement(t))
        records.append(rec)
    with Project.create(path, load_task(TASK_PATH)) as project:
        project.add_candidates(records)


def test_heldout_live_counts_evaluations_to_the_best_known(tmp_path, capsys, monkeypatch):
    runs = tmp_path / "lane0"
    (runs / "ppo").mkdir(parents=True)
    (runs / "random").mkdir()
    _run(runs / "ppo" / "act_gelu.cuagent", [2.0, 1.5, 1.02, 1.0], seconds_apart=2)
    _run(runs / "random" / "act_gelu.cuagent", [2.0, None, 1.9, 1.8, 1.6], seconds_apart=3)
    record = tmp_path / "record"
    record.mkdir()
    _run(record / "act_gelu.cuagent", [1.0], seconds_apart=1)
    module = _script("heldout_live")
    monkeypatch.setattr(sys, "argv", ["heldout_live.py", str(runs), "--record", str(record)])
    assert module.main() == 0
    out = capsys.readouterr().out
    # Best known 1.0 ms: ppo reaches 97 % of it at its 3rd candidate (1.02 ms); random never does
    # (5 candidates: counted as 6). Rates: 4 verdicts in 7 s, 5 in 13 s.
    assert "| act_gelu | 1000.0 | 3 | 1000.0 | 34 | 6 | 1600.0 | 23 |" in out
    assert "ppo: median evaluations to 97% of the best known 3 over 1 runs" in out
    assert "ppo / random: 50%" in out


def test_heldout_live_takes_one_folder_per_seed(tmp_path, capsys, monkeypatch):
    for seed, ppo, untrained in ((1, [1.2, 1.0], [1.5, 1.4, 1.3, 1.0]), (2, [1.0], [1.1, 1.05, 1.01]),
                                 (3, [2.0, 1.5, 1.01], [2.0, 1.9])):
        for policy, times in (("ppo", ppo), ("ppo-untrained", untrained)):
            (tmp_path / f"seed{seed}" / policy).mkdir(parents=True)
            _run(tmp_path / f"seed{seed}" / policy / "act_gelu.cuagent", times, seconds_apart=1)
    module = _script("heldout_live")
    monkeypatch.setattr(sys, "argv", ["heldout_live.py", *(str(tmp_path / f"seed{s}") for s in (1, 2, 3))])
    assert module.main() == 0
    out = capsys.readouterr().out
    # Best known 1.0 ms over all runs; per seed ppo needs 2, 1, 3 and the untrained policy 4, 3, 3 (never: 2 + 1).
    assert "| act_gelu | 1000.0 | 2 (2, 1, 3) | 1000.0 |" in out
    assert "| 3 (4, 3, 3) | 1000.0 |" in out
    assert "ppo: median evaluations to 97% of the best known 2 over 3 runs" in out
    assert "ppo-untrained / ppo: 1.50x" in out


def test_sweep_picks_the_default_first_then_distinct_legal_schedules():
    sweep = _script("sweep")
    space = ScheduleSpace.from_program(search_program(), load_task(TASK_PATH))
    picked, n_legal = sweep.pick_schedules(space, 8, "act_gelu")
    assert n_legal == 20 and picked[0] == space.default() and len(picked) == 8
    assert len({tuple(sorted(s.items())) for s in picked}) == 8 and all(space.legal(s) for s in picked)
    whole, _ = sweep.pick_schedules(space, 100, "act_gelu")           # more than the space: all of it
    assert len(whole) == 20
    assert sweep.pick_schedules(space, 8, "act_gelu")[0] == picked      # the same draw for the same task
    # a known schedule (missing knobs keep their default) comes right after the default
    again, _ = sweep.pick_schedules(space, 2, "act_gelu", known={"UNROLL": 4, "NOT_A_KNOB": 1})
    assert again == [space.default(), {**space.default(), "UNROLL": 4}]
    illegal, _ = sweep.pick_schedules(space, 2, "act_gelu", known={"BLOCK": 2048})     # over 1024 threads
    assert illegal[0] == space.default() and illegal[1] != {**space.default(), "BLOCK": 2048}
    # several known points in order (duplicates and illegal ones dropped), then the first one's
    # one-knob neighbours before any random draw
    points = [{"UNROLL": 4}, {"BLOCK": 2048}, {"UNROLL": 4}, {"BLOCK": 128, "UNROLL": 2}]
    first = sweep.first_schedules(space, points, neighbours=True)
    centre = {**space.default(), "UNROLL": 4}
    assert first[:3] == [space.default(), centre, {**space.default(), "BLOCK": 128, "UNROLL": 2}]
    near = first[3:]
    assert near and all(space.legal(s) and sum(s[k] != centre[k] for k in centre) == 1 for s in near)
    assert len({tuple(sorted(s.items())) for s in first}) == len(first)
    picked, _ = sweep.pick_schedules(space, len(first) + 2, "act_gelu", points, neighbours=True)
    assert picked[:len(first)] == first and len(picked) == len(first) + 2
    assert sweep._known_points({"schedule": {"UNROLL": 4}, "also": [{"VEC": 1}]}) == [{"UNROLL": 4}, {"VEC": 1}]


def test_sweep_record_all_skips_spaces_larger_than_asked(tmp_path, monkeypatch):
    sweep = _script("sweep")
    monkeypatch.setattr(sys, "argv", ["sweep.py", "--record-all", "100", "--tasks", "act_mish", "--out",
                                      str(tmp_path)])
    assert sweep.main() == 0                        # act_mish has 169 legal schedules: listed, not evaluated
    result = json.loads((tmp_path / "sweep.json").read_text())
    assert result["too_large"] == ["act_mish"] and result["tasks"] == []
    with pytest.raises(SystemExit):
        monkeypatch.setattr(sys, "argv", ["sweep.py", "--evals", "201"])
        sweep.main()


def test_sweep_record_all_shards_balance_cost_and_cover_every_task_once():
    sweep = _script("sweep")

    class T:
        def __init__(self, name):
            self.name = name

    todo = [(T(f"t{n}"), None, n) for n in (12, 90, 100, 300, 400, 700, 880, 150)]
    shards = [sweep._shard(todo, i, 2) for i in range(2)]
    names = sorted(t.name for s in shards for t, _, _ in s)
    assert names == sorted(t.name for t, _, _ in todo)                   # each task in exactly one shard
    cost = [sum(60 + n for _, _, n in s) for s in shards]
    assert abs(cost[0] - cost[1]) <= 880                                 # no worse than the largest task
    assert all([n for _, _, n in s] == sorted(n for _, _, n in s) for s in shards)   # smallest first


def test_kernel_times_reads_task_and_knob_changes():
    kt = _script("kernel_times")
    assert kt.parse("loss_cross_entropy") == ("loss_cross_entropy", {})
    assert kt.parse("softmax_dim1_fp16:BLOCK=128, CACHE=2") == ("softmax_dim1_fp16", {"BLOCK": 128, "CACHE": 2})
    with pytest.raises(ValueError):
        kt.parse("act_gelu:BLOCK=big")


def test_kernel_times_edits_the_source_or_says_what_is_wrong():
    kt = _script("kernel_times")
    assert kt.edited("a += (double)x; b", ["(double)x=>x"]) == "a += x; b"
    with pytest.raises(ValueError, match="not in the source"):
        kt.edited("a += x;", ["(double)x=>x"])
    with pytest.raises(ValueError, match="no =>"):
        kt.edited("a += x;", ["(double)x"])


def test_ncu_table_keeps_the_first_launch_of_each_kernel():
    output = "\n".join([
        "GPU NVIDIA H200, copy 4111 GB/s",                      # the profiled program's own lines
        '"ID","Kernel Name","gpu__time_duration.sum"',
        '"","","nsecond"',                                      # units
        '"0","t_rownorm0","215000"', '"1","t_reduce1","4400"', '"2","t_rownorm0","214000"',
        "whole program 233.6 us",
    ])
    rows = _script("ncu_table").first_launches(output)
    assert [(r["Kernel Name"], r["gpu__time_duration.sum"]) for r in rows] == [("t_rownorm0", "215000"),
                                                                                ("t_reduce1", "4400")]


def test_sass_mix_counts_mnemonics_per_kernel():
    sass = """
\tcode for sm_90
\t\tFunction : k_one
\t.headerflags\t@"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                        /* 0x00000a00ff017b82 */
        /*0010*/              @!P0 LDG.E.64.CONSTANT R2, desc[UR4][R4.64] ;      /* 0x0000000404029981 */
        /*0020*/                   FADD R3, R2, R3 ;                             /* 0x0000000302037221 */
        /*0030*/               @P1 FADD R3, R3, R3 ;                             /* 0x0000000303037221 */
        /*0040*/                   EXIT ;                                        /* 0x000000000000794d */
\t\tFunction : k_two
        /*0000*/                   MUFU.RCP R0, R1 ;                             /* 0x0000000100007308 */
        /*0010*/                   BRA 0x10;                                     /* 0xfffffff000007947 */
"""
    kernels = _script("sass_mix").mix(sass)
    assert list(kernels) == ["k_one", "k_two"]
    assert kernels["k_one"] == {"LDC": 1, "LDG": 1, "FADD": 2, "EXIT": 1}
    assert kernels["k_two"] == {"MUFU": 1, "BRA": 1}


def test_sass_mix_waves_of_a_split_grid():
    """red_mean_dim0's default: 1024 blocks of 256 threads; at 44 registers an H200 SM holds 5 of
    them (1.55 waves), at 32 it holds 8 (0.97: one wave)."""
    from bench.kernel_times import scheduled
    program = scheduled("red_mean_dim0")[2]
    def ptxas(registers: int) -> str:
        return ("ptxas info    : Compiling entry function 'red_mean_dim0_reduce' for 'sm_90'\n"
                "ptxas info    : Function properties for red_mean_dim0_reduce\n"
                "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
                f"ptxas info    : Used {registers} registers, used 1 barriers, 8200 bytes smem\n")
    waves = _script("sass_mix").wave_lines
    assert waves("red_mean_dim0", program, ptxas(44)) == [
        "red_mean_dim0_reduce: grid 1024 x 256 threads, 44 registers, 8200 B smem: 5 blocks/SM, 1.55 waves"]
    assert waves("red_mean_dim0", program, ptxas(32))[0].endswith("8 blocks/SM, 0.97 waves")


def test_throughput_reads_every_compile_time_and_the_pauses(tmp_path):
    from core.toolchain.cache import CompileCache
    from core.toolchain.diagnostics import CompileResult

    module = _script("throughput")
    cache = CompileCache(tmp_path / "compile")
    for i, seconds in enumerate([0.4, 1.5, 2.5]):
        assert cache.put(CompileResult(True, "ok", b"cubin", "", seconds=seconds, key=f"{i:02d}" + "a" * 62, arch="sm_90"))
    (tmp_path / "compile" / "zz").mkdir()
    (tmp_path / "compile" / "zz" / "broken.json").write_text("{not json")
    assert sorted(module.nvrtc_times(tmp_path / "compile")) == [0.4, 1.5, 2.5]
    assert module._nvrtc([0.4, 1.5, 2.5]) == "3: 1.50 / 1.50"
    assert module._nvrtc([]) == "-"
    # Verdicts 1 s apart: both gaps between the three are pauses over 0.4 s.
    _run(tmp_path / "run.cuagent", [0.2, 0.2, 0.2], seconds_apart=1)
    summary = module.summarise(tmp_path / "run.cuagent")
    assert summary["candidates"] == 3 and len(summary["slow_gaps"]) == 2


def test_throughput_runs_start_with_both_compile_caches_empty(tmp_path, monkeypatch):
    """--fresh-compile-cache empties cuda-agent's compile cache and gives the run an empty CUDA driver
    cache (where NVRTC 12.9+ keeps its output); without it the environment is left alone."""
    module = _script("throughput")
    monkeypatch.setenv("CUDA_AGENT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("CUDA_CACHE_PATH", raising=False)
    ours = tmp_path / "cache" / "compile" / "ab"
    ours.mkdir(parents=True)
    (ours / "entry.json").write_text("{}")
    stale = tmp_path / "out" / ".driver-cache" / "0"
    stale.mkdir(parents=True)
    env = module.run_environment(tmp_path / "out", fresh=True)
    assert env["CUDA_CACHE_PATH"] == str(tmp_path / "out" / ".driver-cache")
    assert not (tmp_path / "out" / ".driver-cache").exists() and not ours.exists()
    assert "CUDA_CACHE_PATH" not in module.run_environment(tmp_path / "out", fresh=False)


def test_eval_breakdown_sums_the_phases_and_counts_what_memory_made_evaluations_do(tmp_path):
    module = _script("eval_breakdown")
    path = tmp_path / "run.cuagent"
    _run(path, [1.0, 1.0, 1.0, 1.0], seconds_apart=1)
    phases = {"check": 0.1, "wait": 0.0, "judge": 0.02, "time": 0.2, "bundle": 0.01}
    memory = [{}, {"lean": True, "served_again": True}, {"lean": True}, {"lean": True}]
    with Project.open(path) as project:
        for rec, mem in zip(project.candidates(), memory):
            details = {"seconds": dict(phases), **({"memory": mem} if mem else {})}
            if mem and not mem.get("served_again"):
                details["reverify_seconds"] = {"check": 0.5}
                details["reverify_memory"] = {"references_computed_again": True}
            project.update_candidate(rec.id, extra={**rec.extra, "details": details, "eval_seconds": 1.0})
    text = "\n".join(module.table("run", module.rows(path)))
    # The first verdict has no gap before it: three candidates counted.
    assert "| all | 3 | 3.0 | 0.3 | 0.0 | 0.1 | 0.6 | 0.0 | 1.0 (2) | 1.0 | 0.0 |" in text, text
    assert "Median ms a candidate: check 100, wait 0, judge 20, time 200, bundle 10" in text
    assert "Memory (evaluations / re-verifications): lean 3/0, served_again 1/0, references_computed_again 0/2" in text

"""The evaluator API: compile a candidate, check it, time it, and turn the timing into metrics.

    with Evaluator(task) as ev:
        base = ev.baselines()            # eager and torch.compile, cached per task and GPU
        result = ev.evaluate(program)    # EvalResult: status, reason, measurement

Everything that touches the GPU happens in the supervisor's processes; this object only
compiles (in a CPU process pool) and does arithmetic, so it is safe in a GUI process.
"""
from __future__ import annotations

import json
import os
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from . import protocol as P
from .gpuinfo import gpu_key
from .results import EvalResult, KernelStats, Measurement, Status, Timing
from .pool import LocalPool, visible_devices
from .roofline import Ceilings, below_floor, cache_root, compute_dtype, floor_ms, minimum_bytes, save_json_atomic
from .supervisor import GpuSupervisor, Outcome, SupervisorSettings

BASELINES_VERSION = 1


@dataclass
class Baselines:
    eager: Timing | None = None
    compile: Timing | None = None
    eager_error: str = ""
    compile_error: str = ""
    task_hash: str = ""
    gpu: str = ""
    measured_at: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def best_ms(self) -> float | None:
        times = [t.median_ms for t in (self.eager, self.compile) if t is not None]
        return min(times) if times else None

    def to_json(self) -> str:
        return json.dumps({"version": BASELINES_VERSION, **asdict(self)}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> "Baselines":
        d = json.loads(text)
        if d.pop("version", None) != BASELINES_VERSION:
            raise ValueError("old baselines format")
        for k in ("eager", "compile"):
            if d.get(k) is not None:
                d[k] = Timing(**d[k])
        return cls(**d)


def baselines_path(task_hash: str, key: str) -> Path:
    return cache_root() / "baselines" / f"{key}-{task_hash[:20]}.json"


def replay_reason(seen_ms: float, unseen_samples_ms: list[float], ratio: float) -> str:
    """Why a candidate's time looks remembered, or "": its median over single calls on inputs it
    had never met is more than `ratio` x its time on inputs it had met (the timing sets). An honest
    kernel takes as long on new inputs of the same distribution; one that recognises inputs it has
    seen and replays stored answers does not."""
    if not unseen_samples_ms or seen_ms <= 0:
        return ""
    unseen_ms = statistics.median(unseen_samples_ms)
    if unseen_ms <= ratio * seen_ms:
        return ""
    return (f"{seen_ms * 1e3:.1f} us on the timing inputs, {unseen_ms * 1e3:.1f} us on {len(unseen_samples_ms)} "
            f"inputs it had never seen ({unseen_ms / seen_ms:.1f}x): answers remembered and replayed?")


def default_compile_workers(compile_ahead: int = 6) -> int:
    """NVRTC processes for a loop that compiles predicted candidates while the GPU measures (up to
    4 x `compile_ahead` of them when compiles are slow; optimizer.AHEAD_MAX_FACTOR), plus the loop's
    own compile. All cores but six on hosts of 12 or more: the GPU runner, the judge, the
    supervisor, the loop and its measuring thread keep one each, and the rest compile (a 16-core
    host gets 10). Half the cores less two on smaller hosts (a quarter on small ones); never
    fewer than two."""
    cpus = os.cpu_count() or 2
    spare = cpus - 6 if cpus >= 12 else max(cpus // 4, cpus // 2 - 2)
    return max(2, min(4 * compile_ahead + 1, spare))


class Evaluator:
    """Evaluates candidates for one task on one or more local GPUs (thread-safe)."""

    def __init__(self, task: Any, devices: int | Sequence[int] | None = 0, *,
                 settings: SupervisorSettings | None = None, compile_pool: Any = None, use_cache: bool = True,
                 compile_workers: int | None = None):
        self.task = task
        self.compile_workers = compile_workers
        self.devices = [devices] if isinstance(devices, int) else (None if devices is None else list(devices))
        self.settings = settings or SupervisorSettings()
        self.use_cache = use_cache
        self._pool = compile_pool
        self._own_pool = compile_pool is None
        self._gpus: LocalPool | None = None
        self._lock = threading.RLock()
        self._baselines: dict[str, Baselines] = {}   # per GPU model (gpu_key)
        self._ceilings: dict[str, Ceilings] = {}

    # ---- lifecycle -----------------------------------------------------------------------------

    def start(self) -> "Evaluator":
        with self._lock:
            if self._gpus is None:
                devices = self.devices if self.devices is not None else visible_devices()
                self._gpus = LocalPool(self.task.name, self.task.source, devices, self.settings)
        return self

    def close(self) -> None:
        with self._lock:
            if self._gpus is not None:
                self._gpus.close()
                self._gpus = None
            if self._own_pool and self._pool is not None:
                self._pool.close()
                self._pool = None

    def __enter__(self) -> "Evaluator":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def gpus(self) -> LocalPool:
        return self.start()._gpus  # type: ignore[return-value]

    @property
    def supervisor(self) -> GpuSupervisor:
        """The first GPU's supervisor (the only one on a one-GPU machine)."""
        return self.gpus.first

    @property
    def gpu(self) -> dict[str, Any]:
        return self.supervisor.gpu

    @property
    def tolerance(self) -> tuple[float, float]:
        return self.supervisor.tolerance

    @property
    def pool(self):
        with self._lock:
            if self._pool is None:
                from core.toolchain import CompilePool

                self._pool = CompilePool(workers=self.compile_workers or default_compile_workers())
            return self._pool

    # ---- baselines and ceilings ----------------------------------------------------------------

    def ceilings(self, sup: GpuSupervisor | None = None) -> Ceilings:
        sup = sup or self.supervisor
        key = gpu_key(sup.gpu)
        if key not in self._ceilings:
            self._ceilings[key] = sup.ceilings()
        return self._ceilings[key]

    def warm_ceilings(self) -> None:
        """Read or measure every GPU model's roofline ceilings now. A search does this at its start,
        beside the baselines, so that no candidate's evaluation carries their measurement: a GPU's
        first CEILING_SAMPLES evaluator starts measure them (an H100's first candidate took 3.2-4.3 s,
        2.7-3.9 s of it outside its phases and compile, the next ones 0.3 s). A failure is left to the
        first measured candidate, whose measurement notes it."""
        for sup in self.gpus.supervisors:
            try:
                self.ceilings(sup)
            except RuntimeError:
                pass

    def baselines(self, refresh: bool = False, with_compile: bool = True,
                  sup: GpuSupervisor | None = None) -> Baselines:
        """Eager and torch.compile times for this task on this GPU model: memory, disk cache, or measured."""
        sup = sup or self.supervisor
        key = gpu_key(sup.gpu)
        if key in self._baselines and not refresh:
            return self._baselines[key]
        path = baselines_path(self.task.hash, key)
        if self.use_cache and not refresh:
            try:
                self._baselines[key] = Baselines.from_json(path.read_text())
                return self._baselines[key]
            except (OSError, ValueError, TypeError, KeyError):
                pass
        b = Baselines(task_hash=self.task.hash, gpu=sup.gpu["name"], measured_at=time.strftime("%Y-%m-%d %H:%M:%S"))
        eager = sup.baseline("eager")
        if eager.status is Status.MEASURED:
            b.eager = Timing.from_samples(eager.samples_ms)
        else:
            b.eager_error = eager.reason
        if with_compile:
            comp = sup.baseline("compile")
            if comp.status is Status.MEASURED:
                b.compile = Timing.from_samples(comp.samples_ms)
                b.notes += comp.notes
            else:
                b.compile_error = comp.reason
        if self.use_cache and b.eager is not None:
            save_json_atomic(path, b.to_json())
        self._baselines[key] = b
        return b

    # ---- candidates ----------------------------------------------------------------------------

    def withdraw(self, candidate: Any) -> bool:
        """Cancel a speculative compile of `candidate` still queued (compile-ahead's prediction that
        went stale). True when one was cancelled; a later prepare or evaluate compiles it anew."""
        from core.program import KernelProgram

        if not isinstance(candidate, KernelProgram) or self._pool is None:
            return False
        options = list(candidate.compile_options()) + ["--ptxas-options=-v"]
        return self._pool.withdraw(candidate.source, arch=self.gpu.get("arch", "sm_90"), options=options)

    def prepare(self, candidate: Any, speculative: bool = False
                ) -> tuple[P.Artifact | None, EvalResult | None, dict[str, Any]]:
        """Validate and compile; returns (artifact, None, info) or (None, failed result, info).
        `speculative`: compiled ahead for a candidate that may never be evaluated, so it waits
        behind every compile someone is waiting for."""
        from core.program import KernelProgram, ProgramError

        info: dict[str, Any] = {}
        if isinstance(candidate, KernelProgram):
            h = candidate.content_hash()
            try:
                candidate.validate()
            except ProgramError as exc:
                return None, EvalResult(Status.REJECTED, f"invalid program: {exc}", candidate_hash=h), info
            arch = self.gpu.get("arch", "sm_90")
            options = list(candidate.compile_options()) + ["--ptxas-options=-v"]
            res = self.pool.compile(candidate.source, arch=arch, options=options, speculative=speculative)
            info.update(compile_log=res.log, compile_seconds=res.seconds, compile_cached=res.cached)
            if not res.ok:
                status = Status.TIMEOUT if res.status == "timeout" else Status.COMPILE_ERROR
                return None, EvalResult(status, res.error_summary(), compile_log=res.log, compile_seconds=res.seconds,
                                        compile_cached=res.cached, candidate_hash=h), info
            from core.toolchain import parse_ptxas_verbose

            info["resources"] = parse_ptxas_verbose(res.log)    # NVRTC ran ptxas -v
            return P.ProgramArtifact(candidate.to_dict(), res.cubin, h), None, info
        from core.program.solution import ModelNewSolution

        if isinstance(candidate, ModelNewSolution):
            return P.ModelNewArtifact(candidate.source, candidate.name, candidate.content_hash()), None, info
        raise TypeError(f"cannot evaluate a {type(candidate).__name__}: expected a KernelProgram or ModelNewSolution")

    def evaluate(self, candidate: Any, *, with_baselines: bool = True) -> EvalResult:
        """Compile, check and time one candidate on a free GPU. Safe to call from several threads."""
        t0 = time.perf_counter()
        artifact, failed, info = self.prepare(candidate)
        if failed is not None:
            failed.eval_seconds = time.perf_counter() - t0
            return failed
        with self.gpus.acquire() as sup:
            baselines = self.baselines(sup=sup) if with_baselines else None
            outcome = sup.evaluate(artifact)
            result = self._result(sup, artifact, outcome, info, baselines)
            if result.ok and result.measurement.below_floor:
                result = self._reverify(sup, artifact, result, info, baselines)
        result.details["device"] = sup.device_index
        result.eval_seconds = time.perf_counter() - t0
        return result

    def remeasure(self, candidate: Any, rounds: int = 30) -> tuple[Timing, Timing] | EvalResult:
        """Time the candidate and eager alternately (for accepting a new best)."""
        artifact, failed, _ = self.prepare(candidate)
        if failed is not None:
            return failed
        with self.gpus.acquire() as sup:
            outcome = sup.evaluate(artifact, interleave_rounds=rounds)
        if outcome.status is not Status.MEASURED:
            return EvalResult(outcome.status, outcome.reason, candidate_hash=artifact.content_hash)
        return Timing.from_samples(outcome.samples_ms), Timing.from_samples(outcome.baseline_samples_ms)

    def _reverify(self, sup: GpuSupervisor, artifact, result: EvalResult, info, baselines) -> EvalResult:
        """Faster than the roofline floor: check on more inputs, re-measure against eager, flag it."""
        s = self.settings
        outcome = sup.evaluate(
            artifact, interleave_rounds=20,
            prepare=P.Prepare(2 * s.check_sets, 2 * s.scaled_variants + 1, s.timing_sets, s.unseen_sets))
        if outcome.status is not Status.MEASURED:
            outcome.reason = "faster than the roofline floor, and failed re-verification: " + outcome.reason
            return self._result(sup, artifact, outcome, info, baselines)
        result.details["reverify_seconds"] = outcome.seconds
        if outcome.details.get("memory"):
            result.details["reverify_memory"] = outcome.details["memory"]
        m = result.measurement
        cand = Timing.from_samples(outcome.samples_ms)
        eager = Timing.from_samples(outcome.baseline_samples_ms)
        replay = replay_reason(max(m.median_ms, cand.median_ms), outcome.unseen_samples_ms, s.replay_ratio)
        if replay:
            failed = Outcome(Status.REJECTED, f"faster than the roofline floor only on inputs it had seen: {replay}",
                             kernels=outcome.kernels, seconds=outcome.seconds)
            return self._result(sup, artifact, failed, info, baselines)
        unseen = (f"; {len(outcome.unseen_samples_ms)} inputs it had never seen took "
                  f"{statistics.median(outcome.unseen_samples_ms):.4g} ms" if outcome.unseen_samples_ms else "")
        m.notes.append(
            f"faster than the roofline floor ({m.median_ms:.4g} ms < {m.floor_ms:.4g} ms): re-verified on "
            f"{2 * s.check_sets + 2 * s.scaled_variants + 1} more input sets; interleaved re-measure gave "
            f"{cand.median_ms:.4g} ms against eager {eager.median_ms:.4g} ms{unseen}")
        return result

    def _result(self, sup: GpuSupervisor, artifact, outcome: Outcome, info: dict[str, Any],
                baselines: Baselines | None) -> EvalResult:
        r = EvalResult(outcome.status, outcome.reason, compile_log=info.get("compile_log", ""),
                       compile_seconds=info.get("compile_seconds", 0.0),
                       compile_cached=info.get("compile_cached", False), candidate_hash=artifact.content_hash,
                       details={"seconds": outcome.seconds, **outcome.details})
        if outcome.status is not Status.MEASURED:
            return r
        timing = Timing.from_samples(outcome.samples_ms)
        m = Measurement(timing=timing, notes=list(outcome.notes))
        if baselines is not None:
            if baselines.eager is not None:
                m.eager_ms = baselines.eager.median_ms
                m.speedup_eager = m.eager_ms / timing.median_ms
            if baselines.compile is not None:
                m.compile_ms = baselines.compile.median_ms
                m.speedup_compile = m.compile_ms / timing.median_ms
        m.min_bytes = minimum_bytes(self.task)
        m.flops = sup.task_info.flops
        seconds = timing.median_ms / 1e3
        m.gbps = m.min_bytes / seconds / 1e9
        m.tflops = m.flops / seconds / 1e12 if m.flops else None
        try:
            ceilings = self.ceilings(sup)
            m.floor_ms = floor_ms(m.min_bytes, m.flops, compute_dtype(self.task), ceilings)
            m.roofline_fraction = m.floor_ms / timing.median_ms
            m.below_floor = below_floor(timing.median_ms, m.floor_ms)
        except RuntimeError as exc:
            m.notes.append(str(exc))
        resources = info.get("resources", {})
        for k in outcome.kernels:
            ptxas = resources.get(k["name"])
            m.kernels.append(KernelStats(
                name=k["name"], registers=k["registers"], static_shared_bytes=k["static_shared_bytes"],
                dynamic_shared_bytes=k["dynamic_shared_bytes"], local_bytes=k["local_bytes"],
                spill_stores=ptxas.spill_stores if ptxas else None, spill_loads=ptxas.spill_loads if ptxas else None,
                block_threads=k["block_threads"], occupancy=k.get("occupancy")))
        r.measurement = m
        return r

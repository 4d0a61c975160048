"""The candidate process: compiles nothing, holds no reference, only launches and times.

One warm runner per GPU runs KernelPrograms (their only untrusted part is CUDA code). A
KernelBench `ModelNew` brings Python code, so it runs in a fresh runner that is retired
afterwards. Any CUDA error ends the process (os._exit): the context may be poisoned. Running out
of GPU memory does not poison it: the request is served once more with the runner lean (see
`Runner.go_lean`), and only then does a failure count against the candidate.
"""
from __future__ import annotations

import os
import time
import traceback
import types
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable

from . import protocol as P
from .profiling import RequestProfiler
from .results import Status

FATAL_EXIT = 70
# Hand-over blocks kept for reuse between requests (channel.IpcExporter): at most this share of
# the GPU's memory.
EXPORT_POOL_FRACTION = 0.125


class CandidateFailure(Exception):
    """A verdict reached inside the runner (rejected, crashed...), with its reason."""

    def __init__(self, status: Status, reason: str, fatal: bool = False):
        super().__init__(reason)
        self.status, self.reason, self.fatal = status, reason, fatal


class CandidateOutOfMemory(CandidateFailure):
    """Memory the candidate itself asked for (its plan's buffers, or PyTorch allocations in its
    ModelNew) did not fit. Whether that is its fault is decided after a lean retry (serve)."""

    def __init__(self, reason: str):
        super().__init__(Status.REJECTED, "oversized allocation: " + reason)


def is_cuda_error(exc: BaseException) -> bool:
    name = type(exc).__name__
    text = str(exc)
    return ("CUDA" in name or "Accelerator" in name or "CUDA error" in text
            or "CUDA_ERROR" in text or "cudaError" in text or "OutOfMemory" in name)


def _cuda_reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text if text.startswith("CUDA error") else f"CUDA error: {text}"


def _gate_notes(run) -> list[str]:
    """Say so when the host's launch outlasted the gate often enough to move the median."""
    if run.samples_ms and run.uncovered_reps * 10 > len(run.samples_ms):
        return [f"launch time leaked into {run.uncovered_reps} of {len(run.samples_ms)} repetitions "
                f"(the call took longer to launch than the {run.gate_us:.0f} us gate)"]
    return []


class Runner:
    def __init__(self, device_index: int, role: str, scratch: Path):
        import torch

        from .channel import IpcExporter
        from .gpuinfo import describe_gpu, init_evaluator_process
        from .timer import Timer

        self.torch = torch
        self.role = role
        self.scratch = scratch                 # folder for outputs handed over as files
        self.device = init_evaluator_process(device_index)
        self.gpu = describe_gpu(self.device)
        self.timer = Timer(self.device, self.gpu["l2_bytes"])
        self.timer.build_gate()       # the NVRTC compile happens now, not when a spare takes over
        self.task = None
        self.programs: OrderedDict[str, Any] = OrderedDict()   # loaded cubins, most recent last
        self.modelnew_cls = None
        self.modelnew_hash = ""
        self.calibrated = False
        # Hand-over blocks kept for reuse between requests (channel.IpcExporter): at most this share
        # of the GPU, about five 1.75 GiB outputs on an 80 GB card.
        self.pool_bytes = int(self.gpu.get("memory_bytes", 0) * EXPORT_POOL_FRACTION)
        self.exporter = IpcExporter(self.pool_bytes)
        self.lean = False          # short of GPU memory for this task: see go_lean

    # ---- setup ---------------------------------------------------------------------------------

    def activate(self) -> None:
        if not self.calibrated:
            self.timer.calibrate()
            self.calibrated = True

    def set_task(self, msg: P.SetTask) -> P.TaskReady:
        from core.tasks import load_task_from_source

        self.task = load_task_from_source(msg.source, msg.name)
        self.timer.settings.min_total_ms = msg.timed_ms
        self.lean = False
        self.exporter.files_only = False
        self.exporter.trim()                       # sized for the last task's outputs
        self.exporter.pool_bytes = self.pool_bytes
        return P.TaskReady(tolerance=self.task.tolerance())

    def go_lean(self) -> None:
        """Give the GPU back to the other evaluator processes, for the rest of this task: outputs go
        to the judge through files instead of device copies held until it reads them, and the
        allocator's cache is emptied after each request (the judge, a separate process, cannot use
        memory this one keeps cached). Costs a copy through host memory per output, so it is only
        done once a request has run out of memory."""
        import gc

        self.lean = True
        self.exporter.files_only = True
        self.exporter.release()
        self.exporter.trim()
        gc.collect()
        self.torch.cuda.empty_cache()

    def memory_note(self) -> str:
        """Where this GPU's memory was when an allocation failed, for the failure's reason."""
        torch = self.torch
        try:
            free, total = torch.cuda.mem_get_info(self.device)
            held = torch.cuda.memory_allocated(self.device)
        except Exception:
            return ""
        blocks = sum(n for _, n in self.exporter.blocks) + self.exporter.pooled_bytes
        handover = f", and {_human(blocks)} in blocks that hand outputs to the judge" if blocks else ""
        return (f" (this process held {_human(held)}: the task's inputs, the evaluator's copies and the "
                f"candidate's own allocations{handover}; {_human(free)} of the GPU's {_human(total)} was free)")

    def materialize(self, s: P.InputSet):
        """Weights and inputs for an input set, drawn on this GPU exactly as the judge draws them."""
        torch = self.torch
        model = self.task.make_model(s.model_seed, self.device)
        inputs = self.task.make_inputs(s.input_seed, self.device)
        if s.scale is not None:
            inputs = [x * s.scale if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                      for x in inputs]
        return model, inputs

    def fingerprint(self, model, inputs) -> tuple[float, ...]:
        from .compare import fingerprint

        return fingerprint(list(inputs) + list(model.state_dict().values()))

    def ceilings(self, msg: P.MeasureCeilings) -> dict[str, Any]:
        from dataclasses import asdict

        from .gpuinfo import gpu_key
        from .roofline import get_ceilings

        return asdict(get_ceilings(self.device, self.gpu["name"], gpu_key(self.gpu)))

    # ---- candidates ----------------------------------------------------------------------------

    def program_for(self, artifact: P.ProgramArtifact):
        prog = self.programs.get(artifact.content_hash)
        if prog is None:
            prog = LoadedProgram(artifact, self)
            self.programs[artifact.content_hash] = prog
            while len(self.programs) > 64:
                self.programs.popitem(last=False)
        else:
            self.programs.move_to_end(artifact.content_hash)
        return prog

    def modelnew_for(self, artifact: P.ModelNewArtifact):
        if self.modelnew_cls is None:
            module = types.ModuleType(f"cuda_agent_candidate_{artifact.content_hash[:12]}")
            module.__file__ = f"<candidate {artifact.name}>"
            try:
                code = compile(artifact.source, module.__file__, "exec")
                exec(code, module.__dict__)
                cls = module.__dict__["ModelNew"]
            except Exception as exc:
                if is_cuda_error(exc):
                    raise
                raise CandidateFailure(Status.CRASHED, "the ModelNew file failed to import: "
                                       + _short_exc(exc)) from exc
            self.modelnew_cls = cls
            self.modelnew_hash = artifact.content_hash
            # From here on this process runs someone else's Python: outputs go through files.
            self.exporter.broken = "a ModelNew process hands its outputs over as files"
        elif self.modelnew_hash != artifact.content_hash:
            raise CandidateFailure(Status.CRASHED, "internal: a ModelNew process got a second candidate")
        return ModelNewInstance(self.modelnew_cls, self)

    def candidate(self, artifact: P.Artifact):
        if isinstance(artifact, P.ProgramArtifact):
            return self.program_for(artifact)
        return self.modelnew_for(artifact)

    # ---- phases --------------------------------------------------------------------------------

    def check(self, msg: P.Check) -> P.CheckDone:
        from .channel import write_output
        from .compare import close_mask, poisoned_mask

        torch = self.torch
        t0 = time.perf_counter()
        cand = self.candidate(msg.artifact)
        atol, rtol = msg.tolerance
        outputs, fingerprints = [], {}
        for i, s in enumerate(msg.bundle.check_sets):
            model, inputs = self.materialize(s)
            fingerprints[s.label] = self.fingerprint(model, inputs)
            bound = cand.bind(model, inputs)
            snapshot = [x.clone() for x in inputs if isinstance(x, torch.Tensor)]
            outs = bound.run(poison_variant=0)
            torch.cuda.synchronize()
            self.validate_outputs(outs, inputs, model)
            self.check_mutation(inputs, snapshot)
            if bound.fixed_outputs:
                self.check_unwritten(outs, poisoned_mask, variant=0, only_floats=True)
            if i == 0:
                first = [o.clone() for o in outs]
                outs = bound.run(poison_variant=1)
                torch.cuda.synchronize()
                self.validate_outputs(outs, inputs, model)
                self.check_mutation(inputs, snapshot)
                if bound.fixed_outputs:
                    self.check_unwritten(outs, poisoned_mask, variant=1, only_floats=True,
                                         also=[None if f.is_floating_point() else poisoned_mask(f, 0)
                                               for f in first])
                for j, (a, b) in enumerate(zip(first, outs)):
                    if torch.equal(a, b):
                        continue    # one read of each; close_mask makes float64 copies (~50 passes)
                    n_diff = int((~close_mask(a, b, atol, rtol)).sum())
                    if n_diff:
                        raise CandidateFailure(
                            Status.WRONG, f"nondeterministic: two runs on the same inputs differ in "
                            f"{n_diff} of {a.numel()} elements of output {j} (a race, e.g. a missing "
                            "__syncthreads?)")
                del first
            outputs.append(tuple(write_output(self.scratch, self.exporter, o, f"c{i}o{j}") for j, o in enumerate(outs)))
            bound.release(outs)
            del outs, snapshot, bound, model, inputs
        kernels = cand.kernel_stats() if hasattr(cand, "kernel_stats") else []
        return P.CheckDone(tuple(outputs), fingerprints, kernels, time.perf_counter() - t0)

    def validate_outputs(self, outs, inputs, model) -> None:
        torch = self.torch
        specs = self.task.output_specs
        if len(outs) != len(specs):
            raise CandidateFailure(Status.REJECTED, f"returned {len(outs)} outputs, the reference returns {len(specs)}")
        protected = [x for x in inputs if isinstance(x, torch.Tensor)] + list(model.state_dict().values())
        for j, (o, spec) in enumerate(zip(outs, specs)):
            if type(o) is not torch.Tensor:
                raise CandidateFailure(Status.REJECTED, f"output {j} is a {type(o).__module__}.{type(o).__name__}, "
                                       "not a plain torch.Tensor")
            if o.device != self.device:
                raise CandidateFailure(Status.REJECTED, f"output {j} is on {o.device}, expected {self.device}")
            if str(o.dtype).removeprefix("torch.") != spec.dtype or tuple(o.shape) != tuple(spec.shape):
                raise CandidateFailure(Status.REJECTED, f"output {j} is {str(o.dtype).removeprefix('torch.')} "
                                       f"{tuple(o.shape)}, expected {spec.dtype} {tuple(spec.shape)}")
            if o.layout != torch.strided:
                raise CandidateFailure(Status.REJECTED, f"output {j} has layout {o.layout}, expected strided")
            for p in protected:
                if _overlaps(o, p):
                    raise CandidateFailure(Status.REJECTED, f"output {j} aliases an input or weight "
                                           "(its memory overlaps a tensor the candidate was given)")
            for k in range(j):
                if _overlaps(o, outs[k]):
                    raise CandidateFailure(Status.REJECTED, f"outputs {k} and {j} share memory")

    def check_mutation(self, inputs, snapshot) -> None:
        torch = self.torch
        tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
        for k, (x, before) in enumerate(zip(tensors, snapshot)):
            same = torch.equal(x, before) or (x.is_floating_point() and bool(
                ((x == before) | (torch.isnan(x) & torch.isnan(before))).all()))
            if not same:
                name = self.task.input_names[k] if k < len(self.task.input_names) else f"#{k}"
                raise CandidateFailure(Status.REJECTED, f"mutates its input '{name}': inputs must be "
                                       "left as they were given")

    def check_unwritten(self, outs, poisoned_mask, variant, only_floats, also=None) -> None:
        from .compare import count_poisoned

        for j, o in enumerate(outs):
            if only_floats and not o.is_floating_point():
                if also is None:
                    continue
                n = int((poisoned_mask(o, variant) & also[j]).sum())    # held each run's pattern: never written
            else:
                n = count_poisoned(o, variant)
            if n:
                if n == o.numel():
                    raise CandidateFailure(Status.REJECTED, f"never wrote output {j}: all {n} elements "
                                           "still hold the poison written before the run")
                raise CandidateFailure(Status.REJECTED, f"partial write: {n} of {o.numel()} elements of "
                                       f"output {j} were never written")

    def _timing_setup(self, bundle: P.Bundle):
        torch = self.torch
        sets = bundle.timing_sets
        model, inputs_a = self.materialize(sets[0])
        sources = [[x for x in inputs_a if isinstance(x, torch.Tensor)]]
        for s in sets[1:]:
            _, more = self.materialize(s)
            sources.append([x for x in more if isinstance(x, torch.Tensor)])
        live = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs_a]   # scalars pass as they are
        live_tensors = [x for x in live if isinstance(x, torch.Tensor)]
        return model, live, live_tensors, sources

    def time(self, msg: P.Time | P.Interleave) -> P.TimeDone:
        from .channel import write_output

        t0 = time.perf_counter()
        self.activate()
        cand = self.candidate(msg.artifact)
        model, live, live_tensors, sources = self._timing_setup(msg.bundle)
        bound = cand.bind(model, live)
        run = self.timer.run(bound.call, live_tensors, sources,
                             poison_outputs=bound.poison if bound.fixed_outputs else None,
                             release_outputs=not bound.fixed_outputs, tolerance=msg.tolerance)
        bound.raise_violations()
        baseline: list[float] = []
        samples, mismatched = run.samples_ms, run.mismatched_reps
        if isinstance(msg, P.Interleave):
            eager = EagerCall(model, live)
            # The interleaved rounds' stray time is never read (the first timing above judged it).
            eager_gate = self.timer.run(eager.call, live_tensors, sources, release_outputs=True,
                                        tolerance=msg.tolerance, reps=2, measure_stray=False).gate_us
            samples, baseline = [], []
            for _ in range(msg.rounds):
                c = self.timer.run(bound.call, live_tensors, sources, release_outputs=not bound.fixed_outputs,
                                   poison_outputs=bound.poison if bound.fixed_outputs else None,
                                   tolerance=msg.tolerance, reps=2, warmup=False, gate_us=run.gate_us,
                                   measure_stray=False)
                e = self.timer.run(eager.call, live_tensors, sources, release_outputs=True,
                                   tolerance=msg.tolerance, reps=2, warmup=False, gate_us=eager_gate,
                                   measure_stray=False)
                samples += c.samples_ms
                baseline += e.samples_ms
                mismatched += c.mismatched_reps
            bound.raise_violations()
        def hand_over(outs, k: int) -> tuple:
            return tuple(write_output(self.scratch, self.exporter, o, f"t{k}o{j}") for j, o in enumerate(outs))

        outputs = [hand_over(outs, k) for k, outs in enumerate(run.first_outputs)]
        del run.first_outputs[:]
        unseen_samples = self._time_unseen(msg.bundle, bound, live_tensors, run.gate_us, msg.tolerance,
                                           lambda outs: outputs.append(hand_over(outs, len(outputs))))
        outputs = tuple(outputs)
        return P.TimeDone(samples, run.stray_ms, outputs, mismatched, time.perf_counter() - t0,
                          baseline_samples_ms=baseline, notes=_gate_notes(run), unseen_samples_ms=unseen_samples)

    def _time_unseen(self, bundle: P.Bundle, bound, live_tensors, gate_us: float, tolerance, hand_over) -> list[float]:
        """One timed call on each of the bundle's unseen input sets, drawn only now, one at a time;
        each call's outputs go to `hand_over` at once (a large task's would not all fit). The
        candidate has met none of these inputs before, so it cannot answer from memory."""
        torch = self.torch
        samples = []
        for s in bundle.unseen_sets:
            inputs = self.task.make_inputs(s.input_seed, self.device)    # weights: the timing sets' model seed
            source = [x for x in inputs if isinstance(x, torch.Tensor)]
            u = self.timer.run(bound.call, live_tensors, [source], poison_outputs=bound.poison if bound.fixed_outputs
                               else None, release_outputs=not bound.fixed_outputs, tolerance=tolerance, reps=1,
                               warmup=False, gate_us=gate_us, measure_stray=False)
            samples += u.samples_ms
            hand_over(u.first_outputs[0])
            del inputs, source, u
        bound.raise_violations()
        return samples

    def time_baseline(self, msg: P.TimeBaseline) -> P.TimeDone:
        t0 = time.perf_counter()
        self.activate()
        model, live, live_tensors, sources = self._timing_setup(msg.bundle)
        notes = []
        if msg.kind == "eager":
            call = EagerCall(model, live).call
        elif msg.kind == "compile":
            torch = self.torch
            try:
                compiled = torch.compile(model)
                tc = time.perf_counter()
                compiled(*live)
                torch.cuda.synchronize()
                notes.append(f"torch.compile took {time.perf_counter() - tc:.1f} s")
            except Exception as exc:
                if is_cuda_error(exc):
                    raise
                raise CandidateFailure(Status.CRASHED, "torch.compile failed: " + _short_exc(exc)) from exc
            call = EagerCall(compiled, live).call
        else:
            raise ValueError(f"unknown baseline {msg.kind!r}")
        run = self.timer.run(call, live_tensors, sources, release_outputs=True, tolerance=msg.tolerance)
        return P.TimeDone(run.samples_ms, run.stray_ms, (), run.mismatched_reps, time.perf_counter() - t0,
                          notes + _gate_notes(run))


def _overlaps(a, b) -> bool:
    if a.numel() == 0 or b.numel() == 0:
        return False
    sa, sb = a.untyped_storage(), b.untyped_storage()
    a0, b0 = sa.data_ptr(), sb.data_ptr()
    return a0 < b0 + sb.nbytes() and b0 < a0 + sa.nbytes()


def _short_exc(exc: BaseException) -> str:
    tb = traceback.extract_tb(exc.__traceback__)
    where = ""
    for frame in reversed(tb):
        if frame.filename.startswith("<candidate"):
            where = f" (line {frame.lineno}: {frame.line})" if frame.line else f" (line {frame.lineno})"
            break
    return f"{type(exc).__name__}: {exc}{where}"


# ---- the two kinds of candidate ----------------------------------------------------------------


class LoadedProgram:
    """A KernelProgram's cubin loaded into this process, ready to bind to tensors."""

    def __init__(self, artifact: P.ProgramArtifact, runner: Runner):
        import cupy

        from core.program import KernelProgram

        self.runner = runner
        self.program = KernelProgram.from_json(artifact.program)
        self.module = cupy.cuda.function.Module()
        self.module.load(artifact.cubin)
        self.functions: dict[str, Any] = {}
        for name in dict.fromkeys(launch.kernel for launch in self.program.launches):
            try:
                self.functions[name] = self.module.get_function(name)
            except Exception as exc:
                if "NOT_FOUND" in str(exc):
                    raise CandidateFailure(Status.REJECTED, f"kernel '{name}' is not in the compiled module "
                                           "(declare it extern \"C\" __global__)") from exc
                raise
        self.last_plan = None

    def bind(self, model, inputs) -> "BoundProgram":
        return BoundProgram(self, model, inputs)

    def kernel_stats(self) -> list[dict[str, Any]]:
        stats = []
        plan = self.last_plan
        for launch in plan.launches if plan else []:
            f = self.functions[launch.kernel]
            threads = launch.block[0] * launch.block[1] * launch.block[2]
            entry = {"name": launch.kernel, "registers": _func_attr(f, _ATTR_NUM_REGS),
                     "static_shared_bytes": _func_attr(f, _ATTR_SHARED_SIZE_BYTES),
                     "dynamic_shared_bytes": int(launch.shared_bytes),
                     "local_bytes": _func_attr(f, _ATTR_LOCAL_SIZE_BYTES), "block_threads": threads}
            try:
                from core.toolchain import theoretical_occupancy

                entry["occupancy"] = theoretical_occupancy(
                    entry["registers"], entry["static_shared_bytes"] + entry["dynamic_shared_bytes"],
                    threads, arch=self.runner.gpu["arch"])
            except Exception:
                entry["occupancy"] = None
            if entry not in stats:
                stats.append(entry)
        return stats


# CUfunction_attribute values (cuda.h)
_ATTR_SHARED_SIZE_BYTES, _ATTR_LOCAL_SIZE_BYTES, _ATTR_NUM_REGS = 1, 3, 4
_ATTR_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8


def _func_attr(f, attribute: int) -> int:
    import cupy

    return int(cupy.cuda.driver.funcGetAttribute(attribute, f.ptr))


def opt_in_shared(f, dynamic: int, static: int | None = None) -> None:
    """Let kernel `f` launch with `dynamic` bytes of dynamic shared memory. Past 48 KiB together with its
    static shared memory (`static`, read from the function when not given) CUDA needs an opt-in; without
    one the launch fails with "invalid argument" (48 KiB of dynamic memory beside a 16-byte static
    array did, on an H100)."""
    if not dynamic:
        return
    if static is None:
        static = _func_attr(f, _ATTR_SHARED_SIZE_BYTES)
    if dynamic + static > 48 * 1024:
        import cupy

        cupy.cuda.driver.funcSetAttribute(f.ptr, _ATTR_MAX_DYNAMIC_SHARED_SIZE_BYTES, dynamic)


class BoundProgram:
    """A program bound to one set of tensors: buffers allocated once, launches prepared."""

    fixed_outputs = True

    def __init__(self, prog: LoadedProgram, model, inputs):
        import numpy as np
        import torch

        from core.program import LaunchLimits, ProgramError, ScalarArg, TensorArg, TensorInfo

        runner = prog.runner
        task = runner.task
        tensors: dict[str, Any] = {}
        env: dict[str, Any] = {}
        for name, value in zip(task.input_names, inputs):
            if isinstance(value, torch.Tensor):
                # Kernels see every tensor as a contiguous row-major array.
                value = value if value.is_contiguous() else value.contiguous()
                tensors[name] = value
                env[name] = TensorInfo(tuple(value.shape), str(value.dtype).removeprefix("torch."))
            else:
                env[name] = value
        for name, value in model.state_dict().items():
            value = value if value.is_contiguous() else value.contiguous()
            tensors[name] = value
            env[name] = TensorInfo(tuple(value.shape), str(value.dtype).removeprefix("torch."))
        free, total = torch.cuda.mem_get_info(runner.device)
        # Memory this process holds cached but unused is free to it as well.
        free += torch.cuda.memory_reserved(runner.device) - torch.cuda.memory_allocated(runner.device)
        gpu = runner.gpu
        limits = LaunchLimits(max_shared_bytes=gpu["shared_per_block_optin"], max_buffer_bytes=total)
        try:
            plan = prog.program.resolve(env, limits)
        except ProgramError as exc:
            raise CandidateFailure(Status.REJECTED, f"launch plan: {exc}") from exc
        need = sum(_nbytes(b.shape, b.dtype) for b in plan.buffers)
        if need > free:
            raise CandidateOutOfMemory(f"the plan's buffers need {_human(need)} but the GPU has {_human(free)} free")
        self.buffers = {}
        for b in plan.buffers:
            try:
                # A zeroed buffer is zeroed once: the program leaves it zeroed (checked after each checked run).
                make = torch.zeros if b.zeroed else torch.empty
                self.buffers[b.name] = make(b.shape, dtype=getattr(torch, b.dtype), device=runner.device)
            except torch.OutOfMemoryError as exc:
                raise CandidateOutOfMemory(f"buffer '{b.name}' ({_human(_nbytes(b.shape, b.dtype))}) "
                                           "does not fit") from exc
        tensors.update(self.buffers)
        self.outputs = [self.buffers[name] for name in plan.outputs]
        self.zeroed = [(b.name, self.buffers[b.name]) for b in plan.buffers if b.zeroed]
        self.inputs = [tensors[n] for n in task.input_names if n in tensors]
        self.tensors = tensors
        prog.last_plan = plan
        self.stream = None
        self.launches: list[tuple] = []
        np_types = {"int32": np.int32, "int64": np.int64, "uint32": np.uint32, "uint64": np.uint64,
                    "float32": np.float32, "float64": np.float64}
        for launch in plan.launches:
            f = prog.functions[launch.kernel]
            static = _func_attr(f, _ATTR_SHARED_SIZE_BYTES) if launch.shared_bytes else 0
            if launch.shared_bytes + static > limits.max_shared_bytes:
                raise CandidateFailure(Status.REJECTED, f"launch plan: kernel '{launch.kernel}' asks for "
                                       f"{launch.shared_bytes} bytes of dynamic shared memory beside its {static} "
                                       f"static bytes; a block of this GPU may have {limits.max_shared_bytes}")
            opt_in_shared(f, launch.shared_bytes, static)
            args = []
            for a in launch.args:
                if isinstance(a, TensorArg):
                    args.append(np.uint64(tensors[a.name].data_ptr()))
                elif isinstance(a, ScalarArg):
                    args.append(np_types[a.ctype](a.value))
                else:
                    raise CandidateFailure(Status.REJECTED, f"unsupported argument {a!r}")
            self.launches.append((f, launch.grid, launch.block, tuple(args), launch.shared_bytes))
        self.violation: str | None = None

    def launch_all(self):
        import cupy
        import torch

        stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
        for f, grid, block, args, shared in self.launches:
            f(grid, block, args, shared_mem=shared, stream=stream)
        return self.outputs

    def call(self):
        from .guard import NoFallbackGuard

        guard = NoFallbackGuard()
        try:
            with guard:
                outs = self.launch_all()
        finally:
            if guard.reason and not self.violation:
                self.violation = guard.reason
        return outs

    def run(self, poison_variant: int):
        from .compare import poison_

        for o in self.outputs:
            poison_(o, poison_variant)
        outs = self.call()
        self.raise_violations()
        self.check_zeroed()
        return outs

    def check_zeroed(self) -> None:
        """A zeroed buffer must be all zeros again after a run (docs/program-format.md)."""
        import torch

        for name, buf in self.zeroed:
            left = int(torch.count_nonzero(buf))
            if left:
                raise CandidateFailure(Status.REJECTED, f"left zeroed buffer '{name}' with {left} nonzero "
                                       f"element{'s' if left != 1 else ''} after a run; a zeroed buffer must be "
                                       "all zeros when the program's last launch ends")

    def poison(self) -> None:
        from .compare import poison_

        for o in self.outputs:
            poison_(o)

    def raise_violations(self) -> None:
        if self.violation:
            raise CandidateFailure(Status.REJECTED, self.violation)

    def release(self, outs) -> None:
        pass


class ModelNewInstance:
    """Builds ModelNew for each input set, with the reference's weights loaded into it."""

    def __init__(self, cls, runner: Runner):
        self.cls, self.runner = cls, runner

    def bind(self, model, inputs) -> "BoundModelNew":
        return BoundModelNew(self, model, inputs)


class BoundModelNew:
    fixed_outputs = False

    def __init__(self, inst: ModelNewInstance, model, inputs):
        import torch

        runner = inst.runner
        task = runner.task
        torch.manual_seed(0)
        try:
            with torch.device(runner.device):
                m = inst.cls(*task.init_inputs)
            m = m.to(runner.device)
            ref_state = model.state_dict()
            own = m.state_dict()
            shared = {k: v for k, v in ref_state.items() if k in own and own[k].shape == v.shape}
            m.load_state_dict(shared, strict=False)
        except CandidateFailure:
            raise
        except torch.OutOfMemoryError as exc:
            raise CandidateOutOfMemory("ModelNew(...) " + _short_exc(exc)) from exc
        except Exception as exc:
            if is_cuda_error(exc):
                raise
            raise CandidateFailure(Status.CRASHED, "ModelNew(...) failed to build: " + _short_exc(exc)) from exc
        self.module = m
        self.inputs = inputs
        self.runner = runner
        self.violation: str | None = None

    def call(self):
        from .guard import CallsPyTorch, NoFallbackGuard

        guard = NoFallbackGuard()
        try:
            with guard:
                out = self.module(*self.inputs)
        except CallsPyTorch:
            out = ()
        except self.runner.torch.OutOfMemoryError as exc:
            raise CandidateOutOfMemory("ModelNew.forward: " + _short_exc(exc)) from exc
        except Exception as exc:
            if is_cuda_error(exc):
                raise
            raise CandidateFailure(Status.CRASHED, "ModelNew.forward raised " + _short_exc(exc)) from exc
        finally:
            if guard.reason and not self.violation:
                self.violation = guard.reason
        self.raise_violations()
        return list(out) if isinstance(out, (tuple, list)) else [out]

    def run(self, poison_variant: int):
        return self.call()

    def raise_violations(self) -> None:
        if self.violation:
            raise CandidateFailure(Status.REJECTED, self.violation)

    def release(self, outs) -> None:
        from .compare import poison_

        # Memory the allocator hands out next must not still hold this answer.
        for o in outs:
            if type(o) is self.runner.torch.Tensor and o.numel():
                poison_(o)


class EagerCall:
    """The reference module (or its torch.compile) called on the live inputs."""

    def __init__(self, module, live):
        self.module, self.live = module, live

    def call(self):
        out = self.module(*self.live)
        return list(out) if isinstance(out, (tuple, list)) else [out]


def _nbytes(shape, dtype: str) -> int:
    from .roofline import spec_bytes

    return spec_bytes(tuple(shape), dtype)


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n} B"


# ---- process entry -------------------------------------------------------------------------------


def runner_main(conn, device_index: int, role: str, scratch: str) -> None:
    """Entry point of a runner process (spawned). Serves requests until Shutdown or a CUDA error."""
    t0 = time.perf_counter()
    try:
        runner = Runner(device_index, role, Path(scratch))
        conn.send(P.Ready(role, os.getpid(), runner.gpu, time.perf_counter() - t0))
    except BaseException as exc:  # startup failed: say why, then go
        conn.send(P.Failure(Status.CRASHED.value, f"runner failed to start: {_short_exc(exc)}", fatal=True))
        os._exit(FATAL_EXIT)
    handlers: dict[type, Callable] = {
        P.SetTask: runner.set_task, P.Check: runner.check, P.Time: runner.time,
        P.Interleave: runner.time, P.TimeBaseline: runner.time_baseline,
        P.MeasureCeilings: runner.ceilings,
    }
    profiler = RequestProfiler(f"runner-{role}")
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            profiler.dump()
            os._exit(0)
        if isinstance(msg, P.Shutdown):
            profiler.dump()
            os._exit(0)
        if isinstance(msg, P.Activate):
            try:
                runner.activate()
                conn.send(P.Verdict(True))
            except BaseException as exc:
                conn.send(P.Failure(Status.CRASHED.value, _cuda_reason(exc), fatal=True))
                os._exit(FATAL_EXIT)
            continue
        try:
            reply = serve(runner, profiler, handlers[type(msg)], msg)
            conn.send(reply)
        except CandidateOutOfMemory as exc:
            # Lean and still short: the candidate's own allocation did not fit.
            fatal = not _context_healthy(runner)
            conn.send(P.Failure(exc.status.value, exc.reason + runner.memory_note(), fatal=fatal))
            if fatal:
                os._exit(FATAL_EXIT)
        except runner.torch.OutOfMemoryError as exc:
            # Lean and still short, outside the candidate's code: the evaluator's own copies of a task
            # too large for this GPU. Not the candidate's doing, and the context is still sound.
            fatal = not _context_healthy(runner)
            conn.send(P.Failure(Status.CRASHED.value, "evaluator error: out of GPU memory outside the candidate's "
                                f"code{runner.memory_note()}: {_cuda_reason(exc)}", fatal=fatal))
            if fatal:
                os._exit(FATAL_EXIT)
        except CandidateFailure as exc:
            fatal = exc.fatal
            if not fatal:
                fatal = not _context_healthy(runner)
            conn.send(P.Failure(exc.status.value, exc.reason, fatal=fatal))
            if fatal:
                os._exit(FATAL_EXIT)
        except BaseException as exc:
            if is_cuda_error(exc):
                status = Status.REJECTED if "out of memory" in str(exc).lower() else Status.CRASHED
                reason = _cuda_reason(exc)
                if status is Status.REJECTED:
                    reason = "oversized allocation: " + reason
                conn.send(P.Failure(status.value, reason, fatal=True))
                os._exit(FATAL_EXIT)
            fatal = not _context_healthy(runner)
            conn.send(P.Failure(Status.CRASHED.value, f"evaluator error: {_short_exc(exc)}", fatal=fatal,
                                details={"traceback": traceback.format_exc()}))
            if fatal:
                os._exit(FATAL_EXIT)


def serve(runner: Runner, profiler, handler: Callable, msg):
    """The handler's reply to `msg`. A request that runs out of GPU memory, in the candidate's code
    or the evaluator's, is served again once the runner has freed the hand-over blocks it keeps for
    reuse (if it kept any; none are kept for the rest of the task), then once more with the runner
    lean (go_lean), which then stays lean for the task; a shortage when lean is raised to the caller.
    A request marked lean (the judge ran short beside this process) makes the runner lean first."""
    torch = runner.torch
    if getattr(msg, "lean", False) and not runner.lean:
        runner.go_lean()
    while True:
        try:
            with profiler:
                runner.exporter.release()      # the judge has read the previous request's outputs
                reply = handler(msg)
                torch.cuda.synchronize()
            if runner.lean:
                torch.cuda.empty_cache()
            return reply
        except (CandidateOutOfMemory, torch.OutOfMemoryError):
            if runner.lean:
                raise
        # Out of the except block: the failed attempt's tensors are no longer held by its traceback.
        # Hand-over blocks kept for reuse go first (and are not kept again for this task); then lean.
        if runner.exporter.trim():
            runner.exporter.pool_bytes = 0
            continue
        runner.go_lean()


def _context_healthy(runner: Runner) -> bool:
    try:
        runner.torch.cuda.synchronize()
        x = runner.torch.ones(4, device=runner.device)
        return float((x + x).sum()) == 8.0
    except BaseException:
        return False

"""The reference process: owns the task, draws secret input sets, computes and keeps references,
and compares candidates' outputs. No candidate code ever runs here, and nothing here is shared
with a candidate's process except seeds and verdicts.
"""
from __future__ import annotations

import math
import os
import secrets
import time
import traceback
from typing import Any

from . import protocol as P
from .profiling import RequestProfiler
from .results import Status


# A bundle keeps its references on the device up to this share of the GPU's memory.
REFERENCE_MEMORY_FRACTION = 0.2
# The check sets' scaled variants multiply floating inputs by +-0.1 to +-LARGEST_SCALE.
LARGEST_SCALE = 4.0
# Eager's own error is also measured on fresh draws scaled by these: one draw's varies (a bf16 SwiGLU,
# 256 x 512 -> 256 on the CPU: 0.53-0.65 % unscaled, 1.00-1.16 % at +-4, eight draws each).
CALIBRATION_SCALES = (LARGEST_SCALE, -LARGEST_SCALE, LARGEST_SCALE)


def _unlink_files(outputs) -> None:
    """Remove the output files a runner wrote for the judge (device handles need nothing)."""
    from .protocol import TensorFile

    for files in outputs:
        for f in files:
            if isinstance(f, TensorFile):
                try:
                    os.unlink(f.path)
                except OSError:
                    pass


class Judge:
    FUSE_ON = ("cuda",)     # device types whose slow float64 references may be fused (fused_reference.py)

    def __init__(self, device_index: int):
        import torch

        from .gpuinfo import describe_gpu, init_evaluator_process

        self.torch = torch
        self.device = init_evaluator_process(device_index)
        self.gpu = describe_gpu(self.device)
        self.task = None
        self.tolerance = (1e-4, 1e-4)
        self.reference_dtype = "float64"
        self.bundles: dict[int, dict[str, Any]] = {}
        self.computed_again = False     # the last judge() computed references it had not kept
        self.reference_fraction = REFERENCE_MEMORY_FRACTION     # halved at each time the GPU ran out
        self.next_id = 1
        self.mappings = None            # the runner's device blocks mapped during a judge() call
        self.fused = None               # a FusedReference once set_task found one right and faster
        self.fused_failure = ""         # why a FusedReference was dropped after set_task took it

    # ---- task ----------------------------------------------------------------------------------

    def set_task(self, msg: P.SetTask) -> P.TaskReady:
        from torch.utils.flop_counter import FlopCounterMode

        from core.tasks import load_task_from_source

        from .fused_reference import OpCounter

        torch = self.torch
        self.task = load_task_from_source(msg.source, msg.name)
        self.bundles.clear()
        self.fused, self.fused_failure = None, ""
        atol, rtol = self.task.tolerance()
        notes: list[str] = []
        seed = secrets.randbits(62)
        model = self.task.make_model(seed, self.device)
        inputs = self.task.make_inputs(seed, self.device)
        counter, ops = FlopCounterMode(display=False), OpCounter()
        with counter, ops:
            eager = _as_list(model(*inputs))
        flops = int(counter.get_total_flops())
        del model, inputs
        floating = all(sp.dtype in ("float16", "bfloat16", "float32", "float64") for sp in self.task.output_specs)
        self.reference_dtype = "float64" if floating else self.task.output_specs[0].dtype
        self.fallback_note = ""
        ref, _ = self.reference_for(P.InputSet("calibration", seed, seed))
        if self.fallback_note:
            notes.append(self.fallback_note)
        if torch.device(self.device).type == "cuda" and self.reference_dtype == "float64":
            from .compare import fast_match_unavailable

            for dtype in sorted({e.dtype for e in eager if e.is_floating_point()}, key=str):
                problem = fast_match_unavailable(dtype)
                if problem:
                    notes.append(f"the judge's one-pass comparison is unavailable for {dtype} outputs "
                                 f"({problem}): every output is compared in about thirty passes instead")
        # If eager PyTorch itself misses the float64 reference by more than the dtype's tolerance
        # (long reductions, ill-conditioned ops, several roundings to bf16), the bar becomes twice
        # eager's own error. Measured on the inputs as drawn and on draws scaled by the largest factor
        # the check sets use: where outputs are small, atol hides a relative error that scaled inputs
        # show (eager's bf16 SwiGLU passed 1e-2 unscaled and missed it at 4x).
        needed = _eager_error(eager, ref)
        del eager, ref
        eager_ms = 0.0
        for scale in CALIBRATION_SCALES if self.reference_dtype == "float64" else ():
            calibration = P.InputSet("calibration", secrets.randbits(62), secrets.randbits(62), scale)
            t0 = self._clock()
            ref, _ = self.reference_for(calibration)
            eager_ms = (self._clock() - t0) * 1e3      # the last one: kernels loaded, clocks up
            model, inputs = self.materialize(calibration)
            needed = max(needed, _eager_error(_as_list(model(*inputs)), ref))
            del model, inputs, ref
        if self.reference_dtype == "float64" and torch.device(self.device).type in self.FUSE_ON:
            note = self._fuse_references(eager_ms, ops.count)
            if note:
                notes.append(note)
        if needed > rtol:
            widened = min(2 * needed, 0.1)
            notes.append(f"tolerance widened from {rtol:g} to {widened:.3g}: eager PyTorch itself differs "
                         f"from the {self.reference_dtype} reference by {needed:.3g}")
            atol = rtol = widened
        self.tolerance = (atol, rtol)
        return P.TaskReady(self.tolerance, notes, flops, self.reference_dtype)

    def _clock(self) -> float:
        """Seconds, after the GPU's queued work is done."""
        if self.torch.device(self.device).type == "cuda":
            self.torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _fuse_references(self, eager_ms: float, ops: int = 0) -> str:
        """Use a FusedReference from now on if the eager float64 reference took at least FUSE_AFTER_MS a
        set and the fused one gives its values, faster, on a set drawn with another model seed than the
        one it was compiled on. `ops`: operations in one forward of the model. Returns a note for the
        task's notes ("" when not tried)."""
        from core.tasks.task import exception_text

        from .fused_reference import FUSE_AFTER_MS, FUSE_MAX_OPS, FusedReference, disagreement

        torch = self.torch
        if eager_ms < FUSE_AFTER_MS:
            return ""
        if ops > FUSE_MAX_OPS:
            return (f"float64 references stay op by op: the model runs {ops} operations, and compiling them "
                    f"could outlast the evaluator's start")
        t0 = self._clock()
        try:
            fused = FusedReference([getattr(torch, sp.dtype) for sp in self.task.output_specs])
            model, inputs = self.materialize(P.InputSet("fuse", secrets.randbits(62), secrets.randbits(62)))
            fused(model, inputs)                # compiles
            del model, inputs
            compile_s = self._clock() - t0
            check = P.InputSet("fuse-check", secrets.randbits(62), secrets.randbits(62))
            eager, _ = self.reference_for(check)
            self.fused = fused
            t1 = self._clock()
            got, _ = self.reference_for(check)
            fused_ms = (self._clock() - t1) * 1e3
            problem = "" if self.fused is fused else self.fused_failure
            problem = problem or disagreement(got, eager)
            del eager, got
        except Exception as exc:    # out of memory included: the task keeps eager references
            self.fused = None
            return f"float64 references stay op by op: torch.compile of the reference failed ({exception_text(exc, 300)})"
        if problem:
            self.fused = None
            return f"float64 references stay op by op: the compiled reference {problem}"
        if fused_ms >= eager_ms:
            self.fused = None
            return (f"float64 references stay op by op: the compiled reference was not faster "
                    f"({fused_ms:.1f} against {eager_ms:.1f} ms a set)")
        return (f"float64 references computed in one fused pass (torch.compile, {compile_s:.1f} s): "
                f"{eager_ms:.1f} -> {fused_ms:.1f} ms a set")

    def reference_for(self, s: P.InputSet) -> tuple[list, tuple[float, ...]]:
        """Reference outputs for an input set, and the fingerprint of what was drawn.

        Computed in float64 where the op allows and the outputs are floating, else in the task's
        dtype (integer outputs such as argmax must match the task's own arithmetic); in one fused
        pass where set_task found that right and faster (fused_reference.py).
        """
        from core.tasks.task import exception_text

        from .compare import fingerprint, keep_reference

        torch = self.torch
        model, inputs = self.materialize(s)
        prints = fingerprint(list(inputs) + list(model.state_dict().values()))
        if self.reference_dtype == "float64" and self.fused is not None:
            try:
                return self.fused(model, inputs), prints
            except torch.OutOfMemoryError:
                raise
            except Exception as exc:    # not seen in set_task's check: op by op from now on
                self.fused = None
                self.fused_failure = f"failed on a later set ({exception_text(exc, 300)})"
                model, inputs = self.materialize(s)
        if self.reference_dtype == "float64":
            try:
                m64 = model.double()
                x64 = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
                outs = [o.detach() for o in _as_list(m64(*x64))]
                specs = self.task.output_specs
                # Kept in float32 for float32 and narrower outputs (compare.kept_reference_dtype).
                return [keep_reference(o, getattr(torch, specs[i].dtype)) if i < len(specs) else o
                        for i, o in enumerate(outs)], prints
            except Exception as exc:  # an op without float64 support: fall back for this task
                self.reference_dtype = self.task.output_specs[0].dtype
                self.fallback_note = f"reference computed in {self.reference_dtype}: float64 failed ({exc})"
                model, inputs = self.materialize(s)
        return [o.detach() for o in _as_list(model(*inputs))], prints

    def task_dtype_outputs(self, s: P.InputSet) -> list:
        """Eager PyTorch's outputs for an input set in the task's own dtypes: what a candidate may
        match where the float64 reference differs from them by more than the tolerance."""
        model, inputs = self.materialize(s)
        return [o.detach() for o in _as_list(model(*inputs))]

    def materialize(self, s: P.InputSet):
        torch = self.torch
        model = self.task.make_model(s.model_seed, self.device)
        inputs = self.task.make_inputs(s.input_seed, self.device)
        if s.scale is not None:
            inputs = [x * s.scale if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
        return model, inputs

    # ---- bundles -------------------------------------------------------------------------------

    def prepare(self, msg: P.Prepare) -> P.Bundle:
        rng = secrets.SystemRandom()
        # The timing sets are the first fresh check sets, drawn with one model seed (the timer binds
        # one model): the time phase's outputs are judged against the check's references, so a
        # candidate costs two float64 references fewer (a fused float64 mish of 1.75 GiB takes
        # about 11 ms on an H100, and an H200 is no faster at float64). Timing only inputs the
        # candidate has met is no weaker: it meets the timing sets in its warm-up anyway.
        model_seed = secrets.randbits(62)
        shared = msg.timing_sets if msg.timing_sets <= msg.check_sets else 0
        fresh = [P.InputSet(f"set{i}", model_seed if i < shared else secrets.randbits(62), secrets.randbits(62))
                 for i in range(msg.check_sets)]
        scaled = []
        for i in range(msg.scaled_variants):
            base = fresh[i % len(fresh)]
            magnitude = 10 ** rng.uniform(-1.0, math.log10(LARGEST_SCALE))      # 0.1 .. 4
            scale = round(magnitude * rng.choice((-1.0, 1.0)), 4) or 0.5
            scaled.append(P.InputSet(f"{base.label}x{scale:g}", base.model_seed, base.input_seed, scale))
        timing = fresh[:shared] if shared else [P.InputSet(f"time{i}", model_seed, secrets.randbits(62))
                                                 for i in range(msg.timing_sets)]
        unseen = [P.InputSet(f"unseen{i}", model_seed, secrets.randbits(62)) for i in range(msg.unseen_sets)]
        # References are kept only within a memory budget; the rest are computed again when judged
        # (a large task's re-verification draws 19 sets, which would not fit otherwise).
        refs: dict[str, list | None] = {}
        prints: dict[str, tuple[float, ...]] = {}
        kept, keeping = 0, True
        for s in {s.label: s for s in fresh + scaled + timing + unseen}.values():    # a timing set once
            if keeping and kept + self.reference_bytes() <= self.reference_budget():
                try:
                    refs[s.label], prints[s.label] = self.reference_for(s)
                    kept += self.reference_bytes()
                    continue
                except self.torch.OutOfMemoryError:
                    pass
                # Out of GPU memory (shared with the candidate's process): give back the other
                # bundles' references, keep none more in this one, and less from now on.
                self._drop_references()
                keeping = False
            refs[s.label], prints[s.label] = None, self.fingerprint_for(s)
        # Two bundles at once (the next one is drawn during the check) may take twice the budget,
        # 40 % of the GPU, while neither had to drop references.
        room = all(r is not None for r in refs.values())
        bundle = P.Bundle(self.next_id, tuple(fresh + scaled), tuple(timing), prints, tuple(unseen), room)
        self.bundles[bundle.id] = {"bundle": bundle, "refs": refs}
        self.next_id += 1
        return bundle

    def reference_bytes(self) -> int:
        """Device bytes one input set's references take (float64 ones kept as keep_reference does)."""
        from .compare import kept_reference_dtype

        def kept(dtype: str) -> int:
            if self.reference_dtype != "float64":
                return _itemsize(dtype)
            return kept_reference_dtype(getattr(self.torch, dtype)).itemsize
        return sum(_numel(sp.shape) * kept(sp.dtype) for sp in self.task.output_specs)

    def reference_budget(self) -> int:
        """Device bytes a bundle's kept references may take: a fifth of the GPU's memory, less after
        the GPU ran out of memory (_drop_references)."""
        return int(self.gpu.get("memory_bytes", 0) * self.reference_fraction)

    def fingerprint_for(self, s: P.InputSet) -> tuple[float, ...]:
        from .compare import fingerprint

        model, inputs = self.materialize(s)
        return fingerprint(list(inputs) + list(model.state_dict().values()))

    def reference(self, refs: dict[str, list | None], s: P.InputSet) -> list:
        """The set's kept references, or ones computed now (and not kept)."""
        kept = refs[s.label]
        if kept is not None:
            return kept
        self.computed_again = True
        return self.reference_for(s)[0]

    def judge(self, msg: P.Judge) -> P.Verdict:
        torch = self.torch
        entry = self.bundles.get(msg.bundle_id)
        if entry is None:
            return P.Verdict(False, Status.CRASHED.value, f"internal: unknown bundle {msg.bundle_id}")
        bundle: P.Bundle = entry["bundle"]
        refs = entry["refs"]
        sets = bundle.check_sets if msg.phase == "check" else bundle.timing_sets + bundle.unseen_sets
        if len(msg.outputs) != len(sets):
            return P.Verdict(False, Status.CRASHED.value, f"internal: {len(msg.outputs)} output sets for {len(sets)} input sets")
        specs = self.task.output_specs
        for files in msg.outputs:
            problem = self._check_files(files, specs, msg.allow_ipc)
            if problem:
                _unlink_files(msg.outputs)
                return P.Verdict(False, Status.REJECTED.value, problem)
        self.computed_again = False
        from .channel import IpcMappings

        self.mappings = IpcMappings()
        try:
            for attempt in range(2):
                try:
                    verdict = self._verdict(sets, msg.outputs, refs)
                    if self.computed_again:      # recorded, so a slow evaluation shows why
                        verdict.details["references_computed_again"] = True
                    return verdict
                except torch.OutOfMemoryError:
                    if attempt:
                        raise
                # Out of GPU memory, which the candidate's process shares (the failed attempt's
                # tensors are freed by now): give back every kept reference (computed again when
                # needed) and the allocator's cache, keep half as much from now on, judge again.
                self._drop_references()
        finally:
            self.mappings.close()
            _unlink_files(msg.outputs)
            if self.computed_again:
                # Large references were computed and dropped: hand their memory back, since the
                # candidate's process allocates from the same GPU.
                torch.cuda.empty_cache()

    def _drop_references(self) -> None:
        import gc

        for entry in self.bundles.values():
            for label in entry["refs"]:
                entry["refs"][label] = None
        self.reference_fraction /= 2
        gc.collect()
        self.torch.cuda.empty_cache()

    def _verdict(self, sets, outputs, refs) -> P.Verdict:
        """Every set's outputs against its reference; the first mismatch decides."""
        from .compare import compare, fast_match

        torch = self.torch
        atol, rtol = self.tolerance
        specs = self.task.output_specs
        # One set's outputs on the device at a time (a large task's outputs would not all fit), but
        # the first two fresh sets' are kept together for the constant-output check, which comes first.
        fresh_idx = [i for i, s in enumerate(sets) if s.scale is None][:2]
        held = {i: self._read(outputs[i]) for i in fresh_idx}
        if len(fresh_idx) == 2:
            (i, k), (a, b) = fresh_idx, (held[fresh_idx[0]], held[fresh_idx[1]])
            for j in range(len(specs)):
                if a[j].numel() > 1 and torch.equal(a[j], b[j]) and not bool(torch.isnan(a[j]).any()) \
                        and not torch.equal(self.reference(refs, sets[i])[j], self.reference(refs, sets[k])[j]):
                    return P.Verdict(False, Status.REJECTED.value,
                                     f"constant output: output {j} is identical for different inputs "
                                     f"({sets[i].label}, {sets[k].label}) while the reference changes")
        for n, (s, files) in enumerate(zip(sets, outputs)):
            outs = held.pop(n) if n in held else self._read(files)
            ref = self.reference(refs, s)
            eager = None
            for j, out in enumerate(outs):
                if fast_match(out, ref[j], atol, rtol):
                    continue            # one fused pass says compare() would pass it
                reason = compare(out, ref[j], atol, rtol)
                if reason and self.reference_dtype == "float64":
                    # PyTorch's own answer in the task's dtype is correct too, where it leaves the
                    # float64 one (1e38 * x overflows in float32 only): computed here, out of the
                    # candidate's reach, for the sets that need it.
                    eager = eager if eager is not None else self.task_dtype_outputs(s)
                    if eager[j].is_floating_point() and compare(out, eager[j], atol, rtol) is None:
                        reason = None
                if reason:
                    label = s.label if s.scale is None else f"{s.label} (inputs scaled by {s.scale:g})"
                    return P.Verdict(False, Status.WRONG.value, f"wrong on input set {label}, output {j}: {reason}",
                                     {"set": s.label, "output": j})
            del outs, ref
        return P.Verdict(True)

    def _check_files(self, files, specs, allow_ipc: bool) -> str:
        """Why a set's output descriptions cannot be the reference's outputs ("" when they can)."""
        from .protocol import TensorFile

        if len(files) != len(specs):
            return f"returned {len(files)} outputs, expected {len(specs)}"
        for j, (f, spec) in enumerate(zip(files, specs)):
            if tuple(f.shape) != tuple(spec.shape) or f.dtype != spec.dtype:
                return f"output {j} is {f.dtype} {tuple(f.shape)}, expected {spec.dtype} {tuple(spec.shape)}"
            if not isinstance(f, TensorFile) and not allow_ipc:
                return "the candidate's process sent a device handle where a file was expected"
            if isinstance(f, TensorFile) and f.numel != _numel(spec.shape):
                return f"output {j} has the wrong size"
            if not isinstance(f, TensorFile) and f.nbytes != _numel(spec.shape) * _itemsize(spec.dtype):
                return f"output {j} has the wrong size"
        return ""

    def _read(self, files) -> list:
        from .channel import read_output

        # Files stay until judge() returns: a judgement run again after running out of memory reads them again.
        # Device blocks are read in place; judge() closes them once its verdict is made.
        return [read_output(f, self.device, remove=False, mappings=self.mappings) for f in files]

    def release(self, msg: P.Release) -> P.Verdict:
        self.bundles.pop(msg.bundle_id, None)
        return P.Verdict(True)


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _itemsize(dtype: str) -> int:
    from .roofline import spec_bytes

    return spec_bytes((1,), dtype)


def _as_list(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _eager_error(eager: list, ref: list) -> float:
    """The smallest atol = rtol that eager's outputs meet against the reference, and their relative
    error norm: what eager PyTorch itself needs to pass."""
    import torch

    needed = 0.0
    for e, r in zip(eager, ref):
        if e.is_floating_point() and e.numel():
            ed, rd = e.double(), r.double()
            finite = torch.isfinite(rd) & torch.isfinite(ed)
            ratio = ((ed - rd).abs() / (1 + rd.abs()))[finite]
            if ratio.numel():
                needed = max(needed, float(ratio.max()))
            rn = float(torch.linalg.vector_norm(rd[finite]))
            if rn > 0:
                needed = max(needed, float(torch.linalg.vector_norm((ed - rd)[finite])) / rn)
    return needed


def judge_main(conn, device_index: int, scratch: str) -> None:
    t0 = time.perf_counter()
    try:
        judge = Judge(device_index)
        conn.send(P.Ready("judge", os.getpid(), judge.gpu, time.perf_counter() - t0))
    except BaseException as exc:
        conn.send(P.Failure(Status.CRASHED.value, f"judge failed to start: {type(exc).__name__}: {exc}", fatal=True))
        os._exit(70)
    handlers = {P.SetTask: judge.set_task, P.Prepare: judge.prepare, P.Judge: judge.judge, P.Release: judge.release}
    profiler = RequestProfiler("judge")
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            profiler.dump()
            os._exit(0)
        if isinstance(msg, P.Shutdown):
            profiler.dump()
            os._exit(0)
        try:
            with profiler:
                reply = handlers[type(msg)](msg)
                judge.torch.cuda.synchronize()
            conn.send(reply)
        except BaseException as exc:
            # out_of_memory: the supervisor makes the runners lean and evaluates the candidate again.
            conn.send(P.Failure(Status.CRASHED.value, f"judge error: {type(exc).__name__}: {exc}", fatal=False,
                                details={"traceback": traceback.format_exc(),
                                         "out_of_memory": isinstance(exc, judge.torch.OutOfMemoryError)}))

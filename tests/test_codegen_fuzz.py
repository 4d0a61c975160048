"""Fuzzing the code generators on random small tasks.

A seeded generator writes KernelBench-format task sources (class Model, get_inputs,
get_init_inputs) in each family: pointwise chains with broadcasting over inputs of different ranks,
reductions over any dims (keepdim both ways), softmax / log-softmax over any dim, the norms, the
losses (K-dim cross-entropy included), scans and pooling, chains of data moves (cat, slices, pads,
transposes, flips, chunk, roll, select, index_select, gather, advanced indexing, unfold, diagonal) with an op after them, few long reductions / scans / rows (the
split paths), reductions whose results are used on the elements again ("compose"), and matrix
products (torch.matmul with transposed operands, batches and a batch times one matrix, F.linear,
addmm with alpha and beta) and convolutions (1-D to 3-D, groups, strides, padding, dilation) with
an op after them half the time; shapes
with odd sizes (1, 3, 7, 33, 129...), 1-4 dims, float32 / float16 / bfloat16 where the op allows. For every task, generate() must lower it (every op drawn is in the
scope of the generators: a CodegenError is a finding); the generated CUDA then runs on the CPU (the
thread-per-CUDA-thread emulation of test_codegen_scan.py, 2-D and 3-D blocks included, with
AddressSanitizer) at the default schedule and a few random legal ones, and its outputs are compared with the task's Model on the CPU.

The CI test draws CA_FUZZ_CASES cases (default 60, six per family) from CA_FUZZ_SEED (default 0); a bigger sweep by hand:

    CA_FUZZ_CASES=500 CA_FUZZ_SEED=7 python -m pytest -q tests/test_codegen_fuzz.py

CA_FUZZ_FAMILIES=reduce,pool limits the families; CA_FUZZ_KEEP=/some/dir keeps the harness
sources there, each case's task.py and inputs in case<n>/, and failures.txt (each failing task's
source and what failed at which schedule).
"""
from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
import tempfile
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from core.codegen import CodegenError, generate
from core.tasks import load_task_from_source
from tests.test_codegen_rownorm import DYNAMIC_SMEM_BYTES, EMULATED_SMEM
from tests.test_codegen_scan import EMULATION, SANITIZE, emulated_launch

GXX = shutil.which("g++")
CASES = int(os.environ.get("CA_FUZZ_CASES", "60"))
SEED = int(os.environ.get("CA_FUZZ_SEED", "0"))
SCHEDULES = int(os.environ.get("CA_FUZZ_SCHEDULES", "3"))       # random legal schedules beyond the default
FAMILIES = ["pointwise", "reduce", "softmax", "norm", "loss", "scan", "pool", "long", "compose", "move", "matmul",
            "conv", "select", "scatter"]
ONLY = [f for f in os.environ.get("CA_FUZZ_FAMILIES", "").split(",") if f]
KEEP = os.environ.get("CA_FUZZ_KEEP")
MAX_THREADS_PER_EXE = 2_000_000            # emulated threads (blocks x block size) per executable run

HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"
F32, F16, BF16 = "torch.float32", "torch.float16", "torch.bfloat16"
SIZES = [1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 31, 33, 64, 65, 100, 129]


# ---- the task generator --------------------------------------------------------------------------

@dataclass
class FuzzCase:
    name: str
    family: str
    source: str
    note: str = ""           # what was drawn, for the failure message


def _shape(rng: random.Random, rank: int, limit: int = 6000) -> list[int]:
    while True:
        shape = [rng.choice(SIZES) for _ in range(rank)]
        if _numel(shape) <= limit:
            return shape


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _dtype(rng: random.Random, half: bool = True) -> str:
    if not half:
        return F32
    return rng.choices([F32, F16, BF16], weights=[3, 1, 1])[0]


def _broadcast_of(rng: random.Random, shape: list[int]) -> list[int]:
    """A shape that broadcasts to `shape`: a suffix of it with some dims set to 1."""
    k = rng.randint(0, len(shape))
    sub = shape[len(shape) - k:]
    return [1 if (d != 1 and rng.random() < 0.35) else d for d in sub]


def _source(forward_args: str, body: list[str], inputs: list[str], init: list[str] | None = None,
            init_inputs: str = "[]") -> str:
    lines = [HEADER, "class Model(nn.Module):", "    def __init__(self):", "        super().__init__()"]
    lines += ["        " + s for s in (init or [])]
    lines += [f"    def forward(self, {forward_args}):"] + ["        " + s for s in body]
    lines += ["", "", "def get_inputs():", f"    return [{', '.join(inputs)}]", "", "",
              "def get_init_inputs():", f"    return {init_inputs}", ""]
    return "\n".join(lines)


def _randn(shape, dtype: str, scale: float = 1.0, shift: float = 0.0) -> str:
    expr = f"torch.randn({tuple(shape)!r})"
    if scale != 1.0:
        expr = f"{expr} * {scale}"
    if shift:
        expr = f"({expr} + {shift})"
    return f"({expr}).to({dtype})" if dtype != F32 else expr


UNARY = [
    "torch.relu({x})", "F.leaky_relu({x}, {a})", "F.elu({x}, alpha={p})", "F.selu({x})", "F.gelu({x})",
    "F.gelu({x}, approximate='tanh')", "F.silu({x})", "F.mish({x})", "F.softplus({x})",
    "F.softplus({x}, beta={p}, threshold=5.0)", "F.softsign({x})", "F.hardtanh({x}, -{p}, {p})",
    "F.hardsigmoid({x})", "F.hardswish({x})", "torch.sigmoid({x})", "torch.tanh({x})",
    "torch.clamp({x}, min=-{p}, max={p})", "torch.clamp({x}, min={a})", "({x} * {p})", "({x} + {a})",
    "torch.abs({x})", "(-{x})", "torch.exp({x} * 0.5)", "F.relu6({x})",
    "torch.where(torch.isnan({x}), torch.zeros_like({x}), {x})", "(torch.ones_like({x}) - {x})",
    "torch.atan({x})", "torch.asinh({x})", "torch.sinh({x} * 0.5)",
]
BINARY = [
    "({x} + {y})", "({x} - {y})", "({x} * {y})", "({x} / ({y}.abs() + 0.5))", "torch.maximum({x}, {y})",
    "torch.minimum({x}, {y})", "torch.where({x} > {y}, {x}, {y} * {p})",
    "torch.where({x} < 0, {y}, {x})", "({x} >= {y}).to({x}.dtype)", "({x} * ({y} != 0.5).to({x}.dtype))",
    "torch.atan2({x}, {y})", "torch.hypot({x}, {y})", "torch.copysign({x}, {y})", "torch.clamp({x}, min={y})",
    "torch.pow({x}.abs() + 0.5, {y} * 0.5)", "torch.fmax({x}, {y})", "torch.fmin({x}, {y})",
]
# Modulo jumps by a whole divisor where its operand crosses a multiple of it, so a last-bit
# difference in a computed operand (an fp16 gelu rounded the other way) changes the result by the
# divisor: it is applied to the task's inputs, which both sides read exactly.
MODULO = ["torch.fmod({x}, -{p})", "torch.remainder({x}, {p})", "torch.remainder({x}, {y}.abs() + 0.5)"]


def _unary(rng: random.Random, x: str) -> str:
    return rng.choice(UNARY).format(x=x, a=rng.choice(["0.1", "0.01", "-0.25", "0.5"]),
                                    p=rng.choice(["0.5", "1.5", "2.0", "3.0"]))


def _binary(rng: random.Random, x: str, y: str) -> str:
    return rng.choice(BINARY).format(x=x, y=y, p=rng.choice(["0.5", "1.5", "-2.0"]))


def gen_pointwise(rng: random.Random, name: str) -> FuzzCase:
    dtype = _dtype(rng)
    out = _shape(rng, rng.randint(1, 4))
    count = rng.randint(1, 3)
    shapes = [out] + [_broadcast_of(rng, out) for _ in range(count - 1)]
    rng.shuffle(shapes)
    args = [f"x{i}" for i in range(count)]
    values = list(args)
    body = []
    if rng.random() < 0.25:
        body.append("m = " + rng.choice(MODULO).format(x=rng.choice(args), y=rng.choice(args),
                                                       p=rng.choice(["0.5", "1.5", "2.0"])))
        values.append("m")
    for k in range(rng.randint(1, 5)):
        if len(values) > 1 and rng.random() < 0.5:
            a, b = rng.sample(values, 2)
            expr = _binary(rng, a, b)
        else:
            expr = _unary(rng, rng.choice(values))
        body.append(f"t{k} = {expr}")
        values.append(f"t{k}")
    # Every input used: fold the unused ones in.
    used = " ".join(body)
    last = values[-1]
    for a in args:
        if not re.search(rf"\b{a}\b", used):
            body.append(f"t{len(body)} = {last} + {a}")
            last = f"t{len(body) - 1}"
    extra_args, extra_inputs = [], []
    if rng.random() < 0.2:                        # a python number given to forward
        body.append(f"t{len(body)} = {last} * s + 0.25")
        last = f"t{len(body) - 1}"
        extra_args, extra_inputs = ["s"], [rng.choice(["0.75", "-1.5", "3"])]
    if rng.random() < 0.15:                       # an integer tensor promoted to the float dtype
        body.append(f"t{len(body)} = {last} + k")
        last = f"t{len(body) - 1}"
        extra_args.append("k")
        extra_inputs.append(f"torch.randint(-3, 4, {tuple(_broadcast_of(rng, out))!r}, dtype=torch.int32)")
    outs = last
    if rng.random() < 0.25 and len(values) > count + 1:
        outs = f"{last}, {values[count]}"
    body.append(f"return {outs}")
    inputs = [_randn(s, dtype, scale=2.0) for s in shapes] + extra_inputs
    return FuzzCase(name, "pointwise", _source(", ".join(args + extra_args), body, inputs), f"{dtype} {shapes}")


def _dims(rng: random.Random, rank: int) -> list[int]:
    k = rng.randint(1, rank)
    dims = sorted(rng.sample(range(rank), k))
    return [d - rank if rng.random() < 0.3 else d for d in dims]


def gen_reduce(rng: random.Random, name: str) -> FuzzCase:
    rank = rng.randint(1, 4)
    shape = _shape(rng, rank)
    dims = _dims(rng, rank)
    d1 = rng.randrange(-rank, rank)
    keep = rng.random() < 0.5
    kd = f", keepdim={keep}"
    dt = f"dim={tuple(dims)!r}"
    op = rng.choice(["sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "prod", "var", "std",
                     "norm", "sum_all", "mean_all", "max_all", "logsumexp", "count", "any"])
    dtype = _dtype(rng, half=op not in ("prod", "var", "std"))
    scale, shift = 1.0, 0.0
    if op == "sum":
        red = f"torch.sum(x, {dt}{kd})"
    elif op == "mean":
        red = f"x.mean({dt}{kd})"
    elif op in ("amax", "amin"):
        red = f"torch.{op}(x, {dt}{kd})"
    elif op in ("max", "min"):
        which = rng.choice(["values", "indices", "both"])
        red = f"torch.{op}(x, dim={d1}{kd})"
        red = red + (".values" if which == "values" else ".indices" if which == "indices" else "")
    elif op in ("argmax", "argmin"):
        red = f"torch.{op}(x, dim={d1}{kd})" if rng.random() < 0.85 else f"torch.{op}(x)"
    elif op == "prod":
        red = f"torch.prod(x, dim={d1}{kd})"
        scale, shift = 0.2, 1.0
    elif op in ("var", "std"):
        corr = rng.choice(["", ", unbiased=False", ", correction=0", ", correction=1"])
        red = f"torch.{op}(x, {dt}{corr}{kd})"
    elif op == "norm":
        p = rng.choice(["1", "2", "3", "float('inf')"])
        red = f"torch.linalg.vector_norm(x, ord={p}, {dt}{kd})" if rng.random() < 0.5 else \
            f"torch.norm(x, p={p}, {dt}{kd})"
    elif op == "count":
        red = f"(x > 0.3).sum({dt}{kd})" if rng.random() < 0.5 else f"(x > 0.3).float().mean({dt}{kd})"
    elif op == "any":
        red = f"(x > 1.5).any(dim={d1}{kd})" if rng.random() < 0.5 else f"(x > -1.5).all(dim={d1}{kd})"
    elif op == "logsumexp":
        red = f"torch.logsumexp(x, {dt}{kd})"
    else:
        red = {"sum_all": "x.sum()", "mean_all": "torch.mean(x)", "max_all": "torch.max(x)"}[op]
    body = []
    if rng.random() < 0.4 and op not in ("prod",):
        body.append(f"x = {_unary(rng, 'x')}")
    body.append(f"y = {red}")
    if op in ("max", "min") and which == "both":
        body.append("return y.values * 2.0, y.indices")
    elif rng.random() < 0.3 and "arg" not in op and "indices" not in red and op not in ("count", "any"):
        body.append(f"return {_unary(rng, 'y')}")
    else:
        body.append("return y")
    return FuzzCase(name, "reduce", _source("x", body, [_randn(shape, dtype, scale, shift)]),
                    f"{dtype} {shape} {op}")


def gen_softmax(rng: random.Random, name: str) -> FuzzCase:
    rank = rng.randint(1, 4)
    shape = _shape(rng, rank)
    dim = rng.randrange(-rank, rank)
    dtype = _dtype(rng)
    fn = rng.choice(["torch.softmax", "F.log_softmax", "F.softmax", "torch.log_softmax"])
    body = []
    if rng.random() < 0.4:
        body.append(f"x = x * {rng.choice(['0.5', '2.0', '-1.0'])}")
    body.append(f"y = {fn}(x, dim={dim})")
    body.append(f"return {_unary(rng, 'y')}" if rng.random() < 0.2 else "return y")
    return FuzzCase(name, "softmax", _source("x", body, [_randn(shape, dtype, scale=3.0)]),
                    f"{dtype} {shape} {fn} dim={dim}")


def gen_norm(rng: random.Random, name: str) -> FuzzCase:
    kind = rng.choice(["layer", "rms", "rms_hand", "batch_eval", "batch_train", "group", "instance"])
    dtype = _dtype(rng) if kind in ("layer", "rms_hand") else F32
    init: list[str] = []
    note = kind
    if kind in ("layer", "rms", "rms_hand"):
        rank = rng.randint(1, 4)
        shape = _shape(rng, rank)
        k = rng.randint(1, rank)
        normalized = shape[rank - k:]
        if kind == "layer":
            affine = rng.random() < 0.7
            bias = rng.random() < 0.7
            init.append(f"self.norm = nn.LayerNorm({normalized!r}, eps={rng.choice(['1e-5', '1e-6'])}, "
                        f"elementwise_affine={affine}, bias={bias}).to({dtype})")
            if affine:
                init.append("with torch.no_grad():")
                init.append("    self.norm.weight.normal_()")
                if bias:
                    init.append("    self.norm.bias.normal_()")
            body = ["return self.norm(x)"]
        elif kind == "rms":
            init.append(f"self.norm = nn.RMSNorm({normalized!r}, eps=1e-5)")
            init.append("with torch.no_grad():")
            init.append("    self.norm.weight.normal_()")
            body = ["return self.norm(x)"]
        else:
            dims = tuple(range(-k, 0))
            body = [f"r = torch.rsqrt(x.float().pow(2).mean(dim={dims!r}, keepdim=True) + 1e-6)",
                    "return (x.float() * r).to(x.dtype) * self.w"]
            init.append(f"self.w = nn.Parameter(torch.randn({normalized!r}).to({dtype}))")
        note += f" {normalized}"
    else:
        rank = rng.randint(2, 5) if kind.startswith("batch") else rng.randint(3, 5)
        c = rng.choice([1, 3, 4, 6, 8, 16])
        shape = [rng.choice([1, 2, 3, 5])] + [c] + _shape(rng, rank - 2, limit=max(1, 6000 // (4 * c)))
        if kind.startswith("batch"):
            cls = {2: "BatchNorm1d", 3: "BatchNorm1d", 4: "BatchNorm2d", 5: "BatchNorm3d"}[rank]
            affine = rng.random() < 0.8
            init.append(f"self.norm = nn.{cls}({c}, affine={affine}, momentum=0.1)")
            init.append("with torch.no_grad():")
            init.append("    self.norm.running_mean.normal_()")
            init.append("    self.norm.running_var.uniform_(0.5, 2.0)")
            if affine:
                init.append("    self.norm.weight.normal_()")
                init.append("    self.norm.bias.normal_()")
            if kind == "batch_eval":
                init.append("self.norm.eval()")
            if kind == "batch_train" and _numel(shape) // c < 2:
                shape[0] = 2
        elif kind == "group":
            groups = rng.choice([g for g in (1, 2, 3, 4, 8) if c % g == 0])
            init.append(f"self.norm = nn.GroupNorm({groups}, {c}, affine={rng.random() < 0.8})")
            note += f" groups={groups}"
        else:
            cls = {3: "InstanceNorm1d", 4: "InstanceNorm2d", 5: "InstanceNorm3d"}[rank]
            init.append(f"self.norm = nn.{cls}({c}, affine={rng.random() < 0.5})")
            if _numel(shape[2:]) < 2:
                shape[-1] = 3
        body = ["return self.norm(x)"]
    if rng.random() < 0.25:
        body[-1] = body[-1].replace("return ", "y = ")
        body.append(f"return {_unary(rng, 'y')}")
    return FuzzCase(name, "norm", _source("x", body, [_randn(shape, dtype, scale=2.0, shift=0.5)], init),
                    f"{dtype} {shape} {note}")


def gen_loss(rng: random.Random, name: str) -> FuzzCase:
    kind = rng.choice(["ce", "nll", "mse", "l1", "smooth_l1", "huber", "kl", "hinge", "cosine", "cos_sim",
                       "triplet"])
    reduction = rng.choice(["none", "sum", "mean"])
    dtype = _dtype(rng) if kind in ("mse", "l1", "smooth_l1", "huber", "ce", "cos_sim") else F32
    if kind in ("ce", "nll"):
        n, c = rng.choice(SIZES), rng.choice([2, 3, 5, 10, 33, 100, 129])
        extra = [rng.choice([2, 3, 5])] if rng.random() < 0.2 else []     # K-dim: [N, C, d] logits
        logits = [n, c] + extra
        targets = f"torch.randint(0, {c}, {tuple([n] + extra)!r})"
        if kind == "ce":
            ls = f", label_smoothing={rng.choice(['0.0', '0.1'])}" if rng.random() < 0.2 else ""
            body = [f"return F.cross_entropy(x, t, reduction='{reduction}'{ls})"]
        else:
            body = [f"return F.nll_loss(F.log_softmax(x, dim=1), t, reduction='{reduction}')"]
        return FuzzCase(name, "loss", _source("x, t", body, [_randn(logits, dtype, 2.0), targets]),
                        f"{dtype} {logits} {kind} {reduction}")
    rank = rng.randint(1, 4)
    shape = _shape(rng, rank)
    if kind in ("mse", "l1", "smooth_l1", "huber"):
        fn = {"mse": "F.mse_loss(x, y", "l1": "F.l1_loss(x, y",
              "smooth_l1": f"F.smooth_l1_loss(x, y, beta={rng.choice(['1.0', '0.5'])}",
              "huber": f"F.huber_loss(x, y, delta={rng.choice(['1.0', '2.0'])}"}[kind]
        body = [f"return {fn}, reduction='{reduction}')"]
        return FuzzCase(name, "loss", _source("x, y", body, [_randn(shape, dtype, 2.0), _randn(shape, dtype)]),
                        f"{dtype} {shape} {kind} {reduction}")
    if kind == "kl":
        shape = _shape(rng, rng.randint(2, 3))
        red = rng.choice(["batchmean", "sum", "mean", "none"])
        body = [f"return F.kl_div(torch.log_softmax(x, dim=-1), torch.softmax(y, dim=-1), reduction='{red}')"]
        return FuzzCase(name, "loss", _source("x, y", body, [_randn(shape, dtype), _randn(shape, dtype)]),
                        f"{dtype} {shape} kl {red}")
    if kind == "hinge":
        body = ["return torch.mean(torch.clamp(1 - x * y, min=0))"]
        return FuzzCase(name, "loss", _source("x, y", body, [_randn(shape, dtype),
                                                            f"torch.randint(0, 2, {tuple(shape)!r}).float() * 2 - 1"]),
                        f"{dtype} {shape} hinge")
    if kind in ("cosine", "cos_sim"):
        rank = max(rank, 2)
        shape = _shape(rng, rank)
        dim = rng.randrange(-rank, rank)
        if kind == "cosine":
            body = [f"c = F.cosine_similarity(x, y, dim={dim})", "return torch.mean(1 - c)"]
        else:
            body = [f"return F.cosine_similarity(x, y, dim={dim}, eps=1e-8)"]
        return FuzzCase(name, "loss", _source("x, y", body, [_randn(shape, dtype), _randn(shape, dtype)]),
                        f"{dtype} {shape} {kind} dim={dim}")
    shape = _shape(rng, 2)
    margin = rng.choice(["1.0", "0.5", "2.0"])
    body = [f"return F.triplet_margin_loss(a, p, n, margin={margin}, reduction='{reduction}')"]
    return FuzzCase(name, "loss", _source("a, p, n", body, [_randn(shape, F32) for _ in range(3)]),
                    f"{shape} triplet {reduction}")


def gen_scan(rng: random.Random, name: str) -> FuzzCase:
    rank = rng.randint(1, 4)
    shape = _shape(rng, rank)
    dim = rng.randrange(-rank, rank)
    kind = rng.choice(["cumsum", "cumprod", "reverse", "exclusive", "masked", "cumsum_epi", "running"])
    dtype = _dtype(rng, half=kind in ("cumsum", "cumsum_epi", "running"))
    inputs = [_randn(shape, dtype, 0.2, 1.0) if kind == "cumprod" else _randn(shape, dtype)]
    args = "x"
    if kind == "cumsum":
        body = [f"return torch.cumsum(x, dim={dim})"]
    elif kind == "cumprod":
        body = [f"return torch.cumprod(x, dim={dim})"]
    elif kind == "reverse":
        op = rng.choice(["cumsum", "cumprod"])
        if op == "cumprod":
            inputs = [_randn(shape, dtype, 0.2, 1.0)]
        body = [f"return torch.{op}(x.flip({dim}), dim={dim}).flip({dim})"]
    elif kind == "exclusive":
        body = [f"return torch.cumsum(x, dim={dim}) - x"]
    elif kind == "masked":
        args = "x, mask"
        inputs.append(f"torch.rand({tuple(shape)!r}) > 0.5")
        body = [f"return torch.cumsum(x * mask, dim={dim})"]
    elif kind == "running":         # cummax / cummin: values and indices, maybe reversed
        op = rng.choice(["cummax", "cummin"])
        operand = rng.choice([_unary(rng, "x"), "x", "x > 0.5"])
        mask = operand == "x > 0.5"                                     # a bool: a running any / all
        if rng.random() < 0.3:
            kind += " reversed"
            body = [f"v, i = torch.{op}(({operand}).flip({dim}), dim={dim})", f"return v.flip({dim}), i.flip({dim})"]
        else:
            values = "v" if mask else _unary(rng, "v")                    # no float math on a bool
            body = [f"v, i = torch.{op}({operand}, dim={dim})", f"return {values}, i"]
        kind += f" {op}"
    else:
        body = [f"y = torch.cumsum({_unary(rng, 'x')}, dim={dim})", f"return {_unary(rng, 'y')}"]
    return FuzzCase(name, "scan", _source(args, body, inputs), f"{dtype} {shape} {kind} dim={dim}")


def gen_pool(rng: random.Random, name: str) -> FuzzCase:
    nd = rng.randint(1, 3)
    kind = rng.choice(["max", "avg"])
    dtype = _dtype(rng)
    lead = [rng.choice([1, 2, 3]), rng.choice([1, 3, 4])]
    batchless = rng.random() < 0.15
    for _ in range(100):
        k = [rng.choice([1, 2, 3, 4]) for _ in range(nd)]
        s = [rng.choice([1, 2, 3]) for _ in range(nd)] if rng.random() < 0.7 else None
        p = [rng.randint(0, kk // 2) for kk in k]
        dil = [rng.choice([1, 2]) for _ in range(nd)] if kind == "max" else [1] * nd
        ceil = rng.random() < 0.4
        spatial = [rng.choice([1, 3, 5, 7, 8, 9, 16, 17, 33]) for _ in range(nd)]
        stride = s or k
        ok = all(dd * (kk - 1) + 1 <= sp + 2 * pp for dd, kk, sp, pp in zip(dil, k, spatial, p))
        if ok and _numel(lead + spatial) <= 8000:
            break
    shape = (lead[1:] if batchless else lead) + spatial
    if kind == "max":
        call = (f"F.max_pool{nd}d(x, kernel_size={tuple(k)!r}, stride={tuple(stride)!r}, padding={tuple(p)!r}, "
                f"dilation={tuple(dil)!r}, ceil_mode={ceil})")
    else:
        cip = rng.random() < 0.5
        div = f", divisor_override={rng.choice([2, 5])}" if nd > 1 and rng.random() < 0.15 else ""
        call = (f"F.avg_pool{nd}d(x, kernel_size={tuple(k)!r}, stride={tuple(stride)!r}, padding={tuple(p)!r}, "
                f"ceil_mode={ceil}, count_include_pad={cip}{div})")
    body = [f"y = {call}"]
    body.append(f"return {_unary(rng, 'y')}" if rng.random() < 0.3 else "return y")
    return FuzzCase(name, "pool", _source("x", body, [_randn(shape, dtype, 2.0)]), f"{dtype} {shape} {call}")


def gen_compose(rng: random.Random, name: str) -> FuzzCase:
    """Reductions whose results are used on the elements again (the row groups, the split path
    when they do not fit, fusion of prologues with broadcast inputs and epilogues), and several
    outputs: x op y -> statistics over random dims (keepdim) -> elementwise with the statistics."""
    dtype = _dtype(rng)
    rank = rng.randint(1, 4)
    shape = _shape(rng, rank)
    dims = tuple(_dims(rng, rank))
    yshape = _broadcast_of(rng, shape)
    body = [f"t = {_binary(rng, _unary(rng, 'x'), 'y')}" if rng.random() < 0.7 else f"t = {_unary(rng, 'x')} + y"]
    pattern = rng.choice(["center", "standardize", "softmax", "gate", "rms", "lse", "two"])
    d = f"dim={dims!r}, keepdim=True"
    if pattern == "center":
        body += [f"r = t.mean({d})", "o = t - r"]
    elif pattern == "standardize":
        body += [f"m = t.mean({d})", f"v = ((t - m) ** 2).mean({d})", "o = (t - m) * torch.rsqrt(v + 1e-5)", "r = v"]
    elif pattern == "softmax":
        body += [f"r = torch.amax(t, {d})", "e = torch.exp(t - r)", f"o = e / e.sum({d})"]
    elif pattern == "gate":
        body += [f"r = torch.sigmoid(torch.amin(t, {d}))", "o = t * r"]
    elif pattern == "rms":
        body += [f"r = torch.sqrt((t * t).mean({d}) + 1e-6)", "o = t / r"]
    elif pattern == "lse":
        body += [f"r = torch.logsumexp(t, dim={dims!r}, keepdim=True)", "o = t - r"]
    else:
        other = tuple(_dims(rng, rank))
        body += [f"r = t.sum({d})", f"o = t * torch.amax(t, dim={other!r}, keepdim=True) - r"]
    if rng.random() < 0.3:
        body.append(f"o = {_unary(rng, 'o')}")
    body.append("return o, r" if rng.random() < 0.35 else "return o")
    return FuzzCase(name, "compose", _source("x, y", body, [_randn(shape, dtype, 2.0), _randn(yshape, dtype)]),
                    f"{dtype} {shape} y{yshape} {pattern} dims={dims}")


def gen_long(rng: random.Random, name: str) -> FuzzCase:
    """Few long reductions, scans or rows: the split paths (a reduction or scan cut into parts that
    several blocks run, then combined) and rows too long for one block's cache."""
    kind = rng.choice(["reduce", "reduce", "scan", "rows"])
    dtype = _dtype(rng)
    if kind == "reduce":
        outer = rng.choice([1, 2, 3, 5])
        inner = rng.choice([1, 1, 3, 7])
        n = rng.choice([4099, 8192, 20000, 33333, 65537]) // (outer * inner) + 1
        shape = [outer, n, inner] if rng.random() < 0.5 else [n, outer * inner]
        dim = 1 if len(shape) == 3 else 0
        op = rng.choice(["x.sum(dim={d})", "x.mean(dim={d}, keepdim=True)", "torch.amax(x, dim={d})",
                         "torch.argmax(x, dim={d})", "torch.var(x, dim={d})", "torch.linalg.vector_norm(x, dim={d})",
                         "x.sum()", "torch.amin(x)", "x.abs().mean()"])
        if "var" in op or "norm" in op:
            dtype = F32
        body = [f"return {op.format(d=dim)}"]
        return FuzzCase(name, "long", _source("x", body, [_randn(shape, dtype, 1.0, 0.5)]), f"{dtype} {shape} {op}")
    if kind == "scan":
        rows = rng.choice([1, 2, 3])
        n = rng.choice([3000, 8191, 20000])
        dtype = F32
        dim = rng.choice([-1, 0])
        shape = [rows, n] if dim == -1 else [n, rows]
        body = [f"return torch.cumsum(x, dim={dim})" if rng.random() < 0.7 else
                f"return torch.cumsum(x.flip({dim}), dim={dim}).flip({dim})"]
        return FuzzCase(name, "long", _source("x", body, [_randn(shape, dtype)]), f"{dtype} {shape} scan")
    rows = rng.choice([1, 2, 3])
    n = rng.choice([5000, 12289, 40000])
    op = rng.choice(["torch.softmax(x, dim=-1)", "F.log_softmax(x, dim=-1)", "F.layer_norm(x, (x.shape[-1],))",
                     "torch.logsumexp(x, dim=-1)"])
    return FuzzCase(name, "long", _source("x", [f"return {op}"], [_randn([rows, n], dtype, 2.0)]),
                    f"{dtype} {[rows, n]} {op}")


def gen_move(rng: random.Random, name: str) -> FuzzCase:
    """A chain of one to three data moves (slices, pads that may crop, cat with another input, a
    transpose, a flip, chunk, roll, select, index_select, gather, x[:, i, j], sliding windows, a
    diagonal), then maybe an elementwise op, a sum, a cumsum, tril or triu on the result."""
    rank = rng.randint(1, 4)
    shape = _shape(rng, rank, limit=3000)
    dtype = rng.choices([F32, F16, BF16, "torch.int64"], weights=[4, 1, 1, 1])[0]
    inputs = [_randn(shape, dtype) if dtype != "torch.int64" else f"torch.randint(-50, 50, {tuple(shape)!r})"]
    args, body, notes = ["x"], [], []
    v, cur = "x", list(shape)
    for step in range(rng.randint(1, 3)):
        r = len(cur)
        d = rng.randrange(r)
        kinds = ["slice", "pad", "cat", "flip", "roll", "index_select"] + (["transpose"] if r >= 2 else []) + \
            (["chunk"] if cur[d] >= 2 else []) + (["select"] if r >= 2 else []) + \
            (["pad_mode"] if r >= 2 and dtype != "torch.int64" else []) + (["upsample"] if 3 <= r <= 5 else []) + \
            ["gather"] + (["unfold"] if r <= 4 else []) + (["diagonal"] if r >= 2 else []) + \
            (["take"] if r >= 2 else [])
        kind = rng.choice(kinds)
        nv = f"v{step}"
        if kind == "slice":
            a = rng.randrange(cur[d])
            b = rng.randint(a + 1, cur[d])
            st = rng.choice([1, 1, 2, 3])
            body.append(f"{nv} = {v}[{':, ' * d}{a}:{b}:{st}]")
            cur[d] = len(range(a, b, st))
        elif kind == "pad":
            k = rng.randint(1, min(r, 3))
            pads = []
            for i in range(k):
                size = cur[r - 1 - i]
                lo = rng.randint(-(size - 1), 3) if size > 1 else rng.randint(0, 3)
                hi = rng.randint(-(size + lo - 1), 3) if size + lo > 1 else rng.randint(0, 3)
                pads += [lo, hi]
                cur[r - 1 - i] = size + lo + hi
            value = rng.choice([0, 0.5, -2])
            body.append(f"{nv} = F.pad({v}, {tuple(pads)!r}, value={value})")
        elif kind == "cat":
            other = list(cur)
            other[d] = rng.choice([1, 2, 5])
            args.append(f"y{step}")
            inputs.append(_randn(other, dtype) if dtype != "torch.int64" else f"torch.randint(-50, 50, {tuple(other)!r})")
            order = [v, f"y{step}"] if rng.random() < 0.5 else [f"y{step}", v]
            body.append(f"{nv} = torch.cat([{', '.join(order)}], dim={d - r if rng.random() < 0.3 else d})")
            cur[d] += other[d]
        elif kind == "pad_mode":                # reflect / replicate: index tables of arange, abs, clamp
            k = rng.randint(1, min(2, r - 1))
            mode = rng.choice(["reflect", "replicate"])
            pads = []
            for i in range(k):
                size = cur[r - 1 - i]
                most = size - 1 if mode == "reflect" else 4
                lo, hi = rng.randint(0, min(most, 4)), rng.randint(0, min(most, 4))
                pads += [lo, hi]
                cur[r - 1 - i] = size + lo + hi
            body.append(f"{nv} = F.pad({v}, {tuple(pads)!r}, mode='{mode}')")
        elif kind == "upsample":                # nearest copies; the linear modes and bicubic weigh
            modes = ["nearest", "nearest-exact"]
            if dtype != "torch.int64":
                modes += [{3: "linear", 4: "bilinear", 5: "trilinear"}[r]] * 2 + (["bicubic"] if r == 4 else [])
            mode = rng.choice(modes)
            corners = f", align_corners={rng.random() < 0.5}" if mode not in ("nearest", "nearest-exact") else ""
            if mode in ("bilinear", "bicubic") and dtype == F32 and rng.random() < 0.5:
                corners += ", antialias=True"   # the CPU reference has no fp16 / bf16 antialiasing
            if rng.random() < 0.5:
                f = rng.choice([2, 3, 1.5] + ([0.5] if min(cur[2:]) >= 2 else []))
                body.append(f"{nv} = F.interpolate({v}, scale_factor={f}, mode='{mode}'{corners})")
                cur = cur[:2] + [int(c * f) for c in cur[2:]]
            else:
                size = [rng.randint(1, 9) for _ in cur[2:]]
                body.append(f"{nv} = F.interpolate({v}, size={tuple(size)!r}, mode='{mode}'{corners})")
                cur = cur[:2] + size
        elif kind == "flip":
            dims = sorted(rng.sample(range(r), rng.randint(1, r)))
            body.append(f"{nv} = torch.flip({v}, {dims})")
        elif kind == "roll":
            body.append(f"{nv} = torch.roll({v}, {rng.randint(-5, 7)}, dims={d})")
        elif kind == "index_select":
            k = rng.randint(1, 6)
            args.append(f"i{step}")
            inputs.append(f"torch.randint(0, {cur[d]}, ({k},))")
            body.append(f"{nv} = torch.index_select({v}, {d}, i{step})")
            cur[d] = k
        elif kind == "gather":                  # an index of the result's shape, k picks along d
            index = list(cur)
            index[d] = rng.randint(1, 6)
            args.append(f"i{step}")
            inputs.append(f"torch.randint(0, {cur[d]}, {tuple(index)!r})")
            body.append(f"{nv} = torch.gather({v}, {d - r if rng.random() < 0.3 else d}, i{step})")
            cur = index
        elif kind == "take":                    # x[:, i, j]: two index tensors on dims d, d + 1 (or d - 1, d)
            e = d + 1 if d + 1 < r else d - 1
            lo, hi = min(d, e), max(d, e)
            bshape = [rng.randint(1, 5) for _ in range(rng.randint(1, 2))]
            args += [f"i{step}", f"j{step}"]
            inputs += [f"torch.randint(-{cur[lo]}, {cur[lo]}, {tuple(bshape)!r})",
                       f"torch.randint(0, {cur[hi]}, {tuple(bshape[-1:])!r})"]
            body.append(f"{nv} = {v}[{':, ' * lo}i{step}, j{step}]")
            cur = cur[:lo] + bshape + cur[hi + 1:]
        elif kind == "unfold":                  # windows of `size` every `st` along d, as a new last dim
            size, st = rng.randint(1, cur[d]), rng.randint(1, 3)
            body.append(f"{nv} = {v}.unfold({d}, {size}, {st})")
            cur[d] = (cur[d] - size) // st + 1
            cur.append(size)
        elif kind == "diagonal":
            e = rng.choice([x for x in range(r) if x != d])
            off = rng.randint(-(cur[d] - 1), cur[e] - 1)
            length = min(cur[d], cur[e] - off) if off >= 0 else min(cur[d] + off, cur[e])
            body.append(f"{nv} = torch.diagonal({v}, {off}, {d}, {e})")
            cur = [c for k, c in enumerate(cur) if k not in (d, e)] + [length]
        elif kind == "transpose":
            e = rng.choice([x for x in range(r) if x != d])
            body.append(f"{nv} = {v}.transpose({d}, {e})" + (".contiguous()" if rng.random() < 0.5 else ""))
            cur[d], cur[e] = cur[e], cur[d]
        elif kind == "chunk":
            if cur[d] % 2 == 0:
                body.append(f"a{step}, b{step} = {v}.chunk(2, dim={d})")
            else:                               # odd: chunk's halves differ in size; narrow instead
                h = cur[d] // 2
                body.append(f"a{step}, b{step} = {v}.narrow({d}, 0, {h}), {v}.narrow({d}, {h}, {h})")
            body.append(f"{nv} = a{step} * 2 + b{step}")
            cur[d] = cur[d] // 2
        else:                                   # select
            i = rng.randrange(cur[d])
            body.append(f"{nv} = {v}.select({d}, {i})")
            cur.pop(d)
        notes.append(kind)
        v = nv
    tail = rng.choice(["none", "pointwise", "sum", "cumsum", "tri"])
    if tail == "tri" and len(cur) >= 2:         # tril / triu: aranges compared (iota move kernels)
        body.append(f"return torch.{rng.choice(['tril', 'triu'])}({v}, diagonal={rng.randint(-2, 2)})")
    elif tail == "pointwise" and dtype != "torch.int64":
        body.append(f"return {_unary(rng, v)}")
    elif tail == "sum" and dtype != "torch.int64":
        body.append(f"return {v}.sum(dim={rng.randrange(len(cur))})")
    elif tail == "cumsum" and dtype == F32 and "flip" not in notes:
        body.append(f"return torch.cumsum({v}, dim={rng.randrange(len(cur))})")
    else:
        tail = "none"
        body.append(f"return {v} * 1" if dtype != "torch.int64" else f"return {v} + 1")
    return FuzzCase(name, "move", _source(", ".join(args), body, inputs),
                    f"{dtype} {shape} {' -> '.join(notes)} -> {tail}")


def gen_matmul(rng: random.Random, name: str) -> FuzzCase:
    """Matrix products: torch.matmul with transposed operands (2-D, batched, a batch broadcast over a
    2-D right operand), F.linear with or without a bias, addmm with alpha and beta and a bias of
    several shapes; odd M, N, K; an elementwise op after it half the time."""
    dtype = _dtype(rng)
    m, n, k = (rng.choice([1, 3, 7, 16, 17, 33, 64, 65]) for _ in range(3))
    kind = rng.choice(["matmul", "batched", "broadcast", "linear", "addmm"])
    batch = [rng.choice([2, 3])] if kind in ("batched", "broadcast") else []
    ta, tb = rng.random() < 0.4, rng.random() < 0.4
    inputs, args = [], ["x", "y"]
    if kind == "linear":
        inputs = [_randn(batch + [m, k], dtype), _randn([n, k], dtype, 0.5)]
        bias = rng.random() < 0.7
        if bias:
            inputs.append(_randn([n], dtype))
            args.append("b")
        expr = f"F.linear(x, y{', b' if bias else ''})"
    elif kind == "addmm":
        inputs = [_randn([m, k], dtype), _randn([k, n], dtype, 0.5), _randn(rng.choice([[n], [m, n], [1, n]]), dtype)]
        args.append("b")
        expr = f"torch.addmm(b, x, y, beta={rng.choice([1.0, 0.5, 0.0])}, alpha={rng.choice([1.0, 2.0, -0.5])})"
    else:
        a_shape = batch + ([k, m] if ta else [m, k])
        b_shape = ([] if kind == "broadcast" else batch) + ([n, k] if tb else [k, n])
        inputs = [_randn(a_shape, dtype), _randn(b_shape, dtype, 0.5)]
        a = "x.transpose(-1, -2)" if ta else "x"
        b = "y.transpose(-1, -2)" if tb else "y"
        expr = f"torch.matmul({a}, {b})"
    body = [f"z = {expr}", f"return {_unary(rng, 'z')}" if rng.random() < 0.5 else "return z"]
    return FuzzCase(name, "matmul", _source(", ".join(args), body, inputs),
                    f"{dtype} {kind} m={m} n={n} k={k} batch={batch} ta={ta} tb={tb}")


def gen_conv(rng: random.Random, name: str) -> FuzzCase:
    """Convolutions (1-D to 3-D, transposed ones too) with random channels, groups (depthwise included),
    kernels, strides, padding and dilation, with or without a bias, and an elementwise op after them half
    the time."""
    dtype = _dtype(rng)
    dims = rng.choice([1, 2, 2, 3])
    groups = rng.choice([1, 1, 2, 3])
    cin = groups * rng.choice([1, 2, 3])
    cout = groups * rng.choice([1, 2, 4]) if rng.random() < 0.8 else cin     # depthwise when cin == groups
    for _ in range(100):
        kernel = [rng.choice([1, 2, 3, 5]) for _ in range(dims)]
        stride = [rng.choice([1, 1, 2, 3]) for _ in range(dims)]
        padding = [rng.randint(0, k // 2 + 1) for k in kernel]
        dilation = [rng.choice([1, 1, 2]) for _ in range(dims)]
        size = [rng.choice([1, 3, 5, 8, 9, 16, 17]) for _ in range(dims)]
        if all(d * (k - 1) + 1 <= sz + 2 * pd for d, k, sz, pd in zip(dilation, kernel, size, padding)) and \
                _numel([2, cin] + size) <= 3000:
            break
    bias = rng.random() < 0.6
    layer = (f"nn.Conv{dims}d({cin}, {cout}, {tuple(kernel)!r}, stride={tuple(stride)!r}, padding={tuple(padding)!r}, "
             f"dilation={tuple(dilation)!r}, groups={groups}, bias={bias})")
    if rng.random() < 0.3:
        # Transposed: output (i - 1) * s - 2 p + d (k - 1) + extra + 1 with extra < max(s, d); padding
        # kept within what the output needs to stay at least one element.
        extra = [rng.randrange(max(st, d)) for st, d in zip(stride, dilation)]
        padding = [min(pd, ((sz - 1) * st + d * (k - 1) + e) // 2)
                   for pd, sz, st, d, k, e in zip(padding, size, stride, dilation, kernel, extra)]
        layer = (f"nn.ConvTranspose{dims}d({cin}, {cout}, {tuple(kernel)!r}, stride={tuple(stride)!r}, "
                 f"padding={tuple(padding)!r}, output_padding={tuple(extra)!r}, groups={groups}, bias={bias}, "
                 f"dilation={tuple(dilation)!r})")
    cast = "" if dtype == F32 else f".to({dtype})"
    body = ["z = self.conv(x)", f"return {_unary(rng, 'z')}" if rng.random() < 0.5 else "return z"]
    return FuzzCase(name, "conv", _source("x", body, [_randn([rng.choice([1, 2])] + [cin] + size, dtype)],
                                         init=[f"self.conv = {layer}{cast}"]), f"{dtype} {layer} on {size}")


def gen_select(rng: random.Random, name: str) -> FuzzCase:
    """sort / argsort / topk / kthvalue / median / nanmedian along a random dim, after an elementwise op
    half the time. Ties only where the order is defined on both sides: fp16 / bf16 and integer
    inputs and relu-like ops (which tie often) are sorted stably; topk, kthvalue and median read
    fp32 through one-to-one ops (CPU and CUDA choose among tied indices differently, and fp32 randn
    rarely ties)."""
    rank = rng.randint(1, 4)
    shape = _shape(rng, rank)
    dim = rng.randrange(-rank, rank)
    kind = rng.choice(["sort", "argsort", "topk", "kthvalue", "median", "nanmedian"] +
                      (["median_all"] if _numel(shape) <= 16384 else []))      # the whole tensor: one row
    dtype = rng.choice([F32, F16, BF16, "torch.int64"]) if kind in ("sort", "argsort") else F32
    inputs = [f"torch.randint(-20, 20, {tuple(shape)!r})" if dtype == "torch.int64" else _randn(shape, dtype)]
    if dtype == "torch.int64" or rng.random() < 0.5:
        x = "x"
    elif kind in ("sort", "argsort"):
        x = _unary(rng, "x")        # relu's zeros tie: the stable order is defined
    else:                           # one-to-one on randn's values: no ties made here
        x = rng.choice(["x * 2.0 - 0.5", "torch.sin(x)", "torch.exp(x)", "-x"])
    if kind == "nanmedian":
        x = "torch.log(x + 1.5)"    # NaN where x < -1.5; a row of NaN only (whose index PyTorch leaves open) is rare
    length = shape[dim]
    desc = rng.random() < 0.5
    if kind == "sort":
        body = [f"v, i = torch.sort({x}, dim={dim}, descending={desc}, stable=True)", "return v, i"]
    elif kind == "argsort":
        body = [f"return torch.argsort({x}, dim={dim}, descending={desc}, stable=True)"]
    elif kind == "topk":
        k = rng.randint(1, length)
        body = [f"v, i = torch.topk({x}, {k}, dim={dim}, largest={desc})", f"return {_unary(rng, 'v')}, i"]
    elif kind == "kthvalue":
        k = rng.randint(1, length)
        body = [f"return torch.kthvalue({x}, {k}, dim={dim}, keepdim={desc})"]
    elif kind in ("median", "nanmedian"):
        body = [f"return torch.{kind}({x}, dim={dim}, keepdim={desc})"]
    else:
        body = [f"return torch.median({x})"]
    return FuzzCase(name, "select", _source("x", body, inputs), f"{dtype} {shape} {kind} dim={dim}")


def gen_scatter(rng: random.Random, name: str) -> FuzzCase:
    """index_add / index_put (accumulating, or assigning through unique indices) / index_reduce along a random dim,
    scatter_add / scatter_reduce (every reduction, with and without self) / scatter (unique indices
    per line, where the winner of a duplicate is left open) along a random dim; the source after an
    elementwise op half the time, the result through one a third of the time."""
    rank = rng.randint(1, 3)
    shape = _shape(rng, rank, 3000)
    dim = rng.randrange(rank)
    size = shape[dim]
    kind = rng.choice(["index_add", "index_put", "index_put_add", "index_assign", "index_reduce", "scatter_add",
                       "scatter_reduce", "scatter"])
    reduce = rng.choice(["sum", "prod", "mean", "amax", "amin"])
    dtype = rng.choice([F32, F32, F16, BF16, "torch.int64"])
    reducing = kind in ("scatter_reduce", "index_reduce")
    if kind in ("index_assign", "index_put_add", "scatter") or (reducing and reduce == "prod"):
        dtype = rng.choice([F32, "torch.int64"])
    if reducing and reduce == "mean" and dtype == "torch.int64":
        reduce = "sum" if kind == "scatter_reduce" else "amax"      # index_reduce has no sum

    def data(shp: list[int]) -> str:
        if dtype == "torch.int64":
            return f"torch.randint(-9, 9, {tuple(shp)!r})"
        if reduce == "prod" and reducing:
            return f"(torch.rand({tuple(shp)!r}) + 0.5)"        # products of a few stay in range
        return _randn(shp, dtype)

    src = "s" if dtype == "torch.int64" or rng.random() < 0.5 else _unary(rng, "s")
    if kind.startswith("index"):
        # r[:, i] = v and r[:, i] += v (a gather, an add and a store) through unique indices; index_add
        # and index_put(accumulate=True) through any.
        unique = kind in ("index_assign", "index_put_add")
        n = rng.randint(1, size) if unique else rng.choice([1, 3, size, 2 * size + 1])
        sshape = shape[:dim] + [n] + shape[dim + 1:]
        index = f"torch.randperm({size})[:{n}]" if unique else f"torch.randint(0, {size}, ({n},))"
        lead = ", ".join([":"] * dim + ["i"])
        if kind == "index_add":
            alpha = rng.choice([1, 2, -3] if dtype == "torch.int64" else [1.0, 0.5, -2.0])
            body = [f"r = y.index_add({dim}, i, {src}, alpha={alpha})"]
        elif kind == "index_reduce":
            reduce = "amin" if reduce == "sum" else reduce
            body = [f"r = y.index_reduce({dim}, i, {src}, {reduce!r}, include_self={rng.random() < 0.5})"]
        elif kind == "index_put":
            indices = ", ".join(["None"] * dim + ["i"])
            body = [f"r = torch.ops.aten.index_put.default(y, [{indices}], {src}, True)"]
        else:
            body = ["r = y.clone()", f"r[{lead}] {'=' if kind == 'index_assign' else '+='} {src}"]
    else:
        ishape = [rng.randint(1, m) for m in shape]
        sshape = [m + rng.choice([0, 0, 1, 2]) for m in ishape]
        if kind == "scatter":
            m = rng.randint(1, size)
            ishape[dim] = m
            sshape[dim] = max(sshape[dim], m)
            full = list(ishape)
            full[dim] = size
            index = f"torch.argsort(torch.rand({tuple(full)!r}), dim={dim}).narrow({dim}, 0, {m})"
            body = [f"r = y.scatter({dim}, i, {src})"]
        else:
            index = f"torch.randint(0, {size}, {tuple(ishape)!r})"
            if kind == "scatter_add":
                body = [f"r = y.scatter_add({dim}, i, {src})"]
            else:
                body = [f"r = y.scatter_reduce({dim}, i, {src}, {reduce!r}, include_self={rng.random() < 0.5})"]
    out = _unary(rng, "r") if dtype != "torch.int64" and rng.random() < 0.33 else "r"
    inputs = [data(sshape), index, data(shape)]
    return FuzzCase(name, "scatter", _source("s, i, y", body + [f"return {out}"], inputs),
                    f"{dtype} {shape} {kind} {reduce if reducing else ''} dim={dim}")


GENERATORS = {"pointwise": gen_pointwise, "reduce": gen_reduce, "softmax": gen_softmax, "norm": gen_norm,
              "loss": gen_loss, "scan": gen_scan, "pool": gen_pool, "long": gen_long,
              "compose": gen_compose, "move": gen_move, "matmul": gen_matmul, "conv": gen_conv,
              "select": gen_select, "scatter": gen_scatter}


def draw_cases(count: int, seed: int, families: list[str] | None = None) -> list[FuzzCase]:
    rng = random.Random(seed)
    fams = families or FAMILIES
    out = []
    for i in range(count):
        fam = fams[i % len(fams)]
        out.append(GENERATORS[fam](rng, f"fz{seed}_{i}_{fam}"))
    return out


# ---- running one case ------------------------------------------------------------------------------

TORCH_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
                "bfloat16": torch.bfloat16, "int64": torch.int64, "int32": torch.int32, "bool": torch.bool,
                "uint8": torch.uint8, "int8": torch.int8}


@dataclass
class Prepared:
    case: FuzzCase
    gen: Any = None
    inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    expected: list[torch.Tensor] = field(default_factory=list)
    expected64: list[torch.Tensor] | None = None
    schedules: list[dict] = field(default_factory=list)
    plans: list[Any] = field(default_factory=list)
    programs: list[Any] = field(default_factory=list)
    error: str | None = None          # a finding before any run
    skip: str | None = None           # the reference itself cannot run


def _forward(model: torch.nn.Module, args: list) -> list[torch.Tensor]:
    with torch.no_grad():
        out = model(*args)
    return list(out) if isinstance(out, (tuple, list)) else [out]


def prepare(case: FuzzCase, rng: random.Random) -> Prepared:
    from core.program import TensorInfo

    p = Prepared(case)
    try:
        task = load_task_from_source(case.source, case.name)
    except Exception as exc:                 # the generator wrote a task the loader refuses
        p.skip = f"task does not load: {exc}"
        return p
    model = task.make_model(0, "cpu")
    state = {k: v.clone() for k, v in model.state_dict().items()}
    args = task.make_inputs(0, "cpu")
    try:
        m64 = task.make_model(0, "cpu").double()
        m64.load_state_dict({k: v.double() if v.is_floating_point() else v for k, v in state.items()})
        p.expected64 = _forward(m64, [a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                                      for a in args])
    except Exception:
        p.expected64 = None
    try:
        p.expected = _forward(model, [a.clone() if isinstance(a, torch.Tensor) else a for a in args])
    except Exception as exc:                 # e.g. an op without a CPU kernel for this dtype
        specs = task.output_specs
        if p.expected64 is None or len(specs) != len(p.expected64):
            p.skip = f"the reference does not run on the CPU: {exc}"
            return p
        # The float64 model's outputs in the task's output dtypes stand in.
        p.expected = [e.to(getattr(torch, str(spec.dtype).removeprefix("torch.")))
                      for e, spec in zip(p.expected64, specs)]
    try:
        p.gen = generate(task)
    except CodegenError as exc:
        p.error = f"generate() refused an in-scope task: {exc}"
        return p
    except Exception:
        p.error = f"generate() crashed:\n{traceback.format_exc()}"
        return p
    named = dict(zip(task.input_names, args))
    named.update(state)
    try:
        p.inputs = {v.name: named[v.name].contiguous() for v in p.gen.graph.inputs}
    except KeyError as exc:
        p.error = f"graph input {exc} is neither a forward input nor a state_dict entry"
        return p
    env = {n: TensorInfo(tuple(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in p.inputs.items()}
    default = p.gen.spec.default()
    schedules = [default]
    try:
        for s in p.gen.spec.sample(rng, SCHEDULES + 2):
            if s != default and s not in schedules and len(schedules) <= SCHEDULES:
                schedules.append(s)
    except Exception:
        p.error = f"sampling schedules failed:\n{traceback.format_exc()}"
        return p
    for s in schedules:
        why = p.gen.spec.why_illegal(s)
        if why:
            p.error = f"the default schedule {s} is illegal: {why}"
            return p
        program = p.gen.program.with_schedule(s)
        try:
            plan = program.resolve(env)
        except Exception as exc:
            p.error = f"the plan at legal schedule {s} does not resolve: {exc}"
            return p
        threads = sum(launch.grid[0] * launch.grid[1] * launch.grid[2] * launch.block[0] for launch in plan.launches)
        if threads > MAX_THREADS_PER_EXE or any(launch.shared_bytes > DYNAMIC_SMEM_BYTES for launch in plan.launches):
            continue
        p.schedules.append(s)
        p.programs.append(program)
        p.plans.append(plan)
    return p


def _nbytes(shape, dtype: str) -> int:
    return torch.empty(tuple(shape), dtype=TORCH_DTYPES[dtype], device="meta").nbytes


def _run_code(index: int, program, plan, inputs: dict[str, torch.Tensor]) -> str:
    defines = "".join(f"#define {k} {v}\n" for k, v in program.schedule.items())
    undefs = "".join(f"#undef {k}\n" for k in program.schedule)
    source = program.source.replace('extern "C" ', "")
    lines = [f"namespace s{index} {{", defines + source, "int run() {"]
    lines += [f"    using namespace {ns};" for ns in sorted(set(re.findall(r"namespace (ca_g\d+) \{", source)))]
    names = {}
    for i, name in enumerate(inputs):
        names[name] = f"in{i}"
        lines.append(f'    unsigned char* in{i} = ca_read("in{i}.bin");')
    for buf in plan.buffers:
        names[buf.name] = f"b{len(names)}"
        fill = 0 if buf.zeroed else 0xA5     # a zeroed buffer holds zeros when the run starts
        lines.append(f"    unsigned char* {names[buf.name]} = ca_alloc({_nbytes(buf.shape, buf.dtype)}, {fill});")
    # Twice when a buffer is zeroed: the first run must leave it zeroed for the second.
    for _ in range(2 if any(b.zeroed for b in plan.buffers) else 1):
        for launch in plan.launches:
            lines.append("    " + emulated_launch(launch, names))
    for buf in plan.buffers:
        if buf.zeroed:
            lines += [f"    for (size_t i = 0; i < {_nbytes(buf.shape, buf.dtype)}; ++i)",
                      f'        if ({names[buf.name]}[i]) {{ fprintf(stderr, "zeroed buffer {buf.name} left nonzero\\n"); return 4; }}']
    for i, name in enumerate(plan.outputs):
        buf = next(b for b in plan.buffers if b.name == name)
        lines.append(f'    ca_write("out{index}_{i}.bin", {names[name]}, {_nbytes(buf.shape, buf.dtype)});')
    lines += ["    return 0;", "}", undefs + f"}}  // namespace s{index}"]
    return "\n".join(lines)


# mma.sync m16n8k16 (the matmul family's MMA=1): every lane of the warp publishes its fragments; each
# computes its own four results from the whole 16x16 A and 16x8 B tiles, decoded with the layout of
# the PTX ISA (lane = 4 * groupID + threadID_in_group; a register holds two elements, the lower k in
# its low half). A lane that skips the instruction deadlocks the warp barrier, as on the GPU.
WARP_MMA = r"""
static unsigned ca_mma_a[32][32][4], ca_mma_b[32][32][2];
// Its own fp16 / bf16 decoding: the programs' h2f / bf2f come later in the file, inside their namespaces.
static float ca_half_to_float(unsigned short h, bool bf16) {
    if (bf16) { unsigned u = (unsigned)h << 16; float f; memcpy(&f, &u, 4); return f; }
    const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    const float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(m | 0x400), e - 25);
    return (h & 0x8000) ? -v : v;
}
static void ca_warp_mma(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2], bool bf16) {
    const int w = ca_lin / 32, lane = ca_lin % 32, g = lane / 4, t = lane % 4;
    memcpy(ca_mma_a[w][lane], a, sizeof a);
    memcpy(ca_mma_b[w][lane], b, sizeof b);
    ca_warp_barrier[w].wait("mma.sync");
    auto element = [&](unsigned reg, int k) { return ca_half_to_float((unsigned short)(reg >> (16 * (k % 2))), bf16); };
    for (int q = 0; q < 4; ++q) {
        const int row = g + (q >= 2 ? 8 : 0), col = 2 * t + q % 2;
        float sum = 0.0f;
        for (int k = 0; k < 16; ++k) {
            const float x = element(ca_mma_a[w][row % 8 * 4 + k % 8 / 2][(row >= 8) + 2 * (k >= 8)], k);
            const float y = element(ca_mma_b[w][col * 4 + k % 8 / 2][k >= 8], k);
            sum += x * y;
        }
        d[q] += sum;
    }
    ca_warp_barrier[w].wait("mma.sync");
}
#define CA_WARP_MMA ca_warp_mma
// ldmatrix.sync.aligned.m8n8.x4.shared.b16: lane l gives row l % 8 of matrix l / 8; each lane gets,
// from each matrix i, the two elements of row l / 4 at columns 2 * (l % 4).
static const unsigned short* ca_ldm_row[32][32];
static void ca_warp_ldmatrix(unsigned (&r)[4], const unsigned short* row) {
    const int w = ca_lin / 32, lane = ca_lin % 32;
    ca_ldm_row[w][lane] = row;
    ca_warp_barrier[w].wait("ldmatrix");
    for (int i = 0; i < 4; ++i) {
        const unsigned short* p = ca_ldm_row[w][i * 8 + lane / 4] + 2 * (lane % 4);
        r[i] = (unsigned)p[0] | ((unsigned)p[1] << 16);
    }
    ca_warp_barrier[w].wait("ldmatrix");
}
#define CA_WARP_LDMATRIX ca_warp_ldmatrix
// ldmatrix...x4.trans: the same addresses; each lane gets, from each matrix i, the elements of column
// lane / 4 at rows 2 * (lane % 4) and 2 * (lane % 4) + 1.
static void ca_warp_ldmatrix_trans(unsigned (&r)[4], const unsigned short* row) {
    const int w = ca_lin / 32, lane = ca_lin % 32;
    ca_ldm_row[w][lane] = row;
    ca_warp_barrier[w].wait("ldmatrix.trans");
    for (int i = 0; i < 4; ++i) {
        const int rr = 2 * (lane % 4), col = lane / 4;
        r[i] = (unsigned)ca_ldm_row[w][i * 8 + rr][col] | ((unsigned)ca_ldm_row[w][i * 8 + rr + 1][col] << 16);
    }
    ca_warp_barrier[w].wait("ldmatrix.trans");
}
#define CA_WARP_LDMATRIX_TRANS ca_warp_ldmatrix_trans
"""


def _build(chunk: list[tuple[int, Prepared, int]], folder: Path, tag: str) -> tuple[Path | None, str]:
    """One executable for (run index, case, schedule number) triples; (path, g++ errors)."""
    code = [EMULATION, EMULATED_SMEM, WARP_MMA, "#define __CUDACC__", "#define __align__(n) __attribute__((aligned(n)))"]
    for k, p, j in chunk:
        code.append(_run_code(k, p.programs[j], p.plans[j], p.inputs))
    code += ["int main(int argc, char** argv) {", "    switch (atoi(argv[1])) {"]
    code += [f"    case {k}: return s{k}::run();" for k, _, _ in chunk]
    code += ["    }", "    return 1;", "}"]
    src = folder / f"fuzz_{tag}.cpp"
    src.write_text("\n".join(code))
    exe = folder / f"fuzz_{tag}"
    done = subprocess.run([GXX, "-std=c++17", "-O1", "-w", "-pthread", *SANITIZE, str(src), "-o", str(exe)],
                          capture_output=True, text=True, timeout=1200)
    return (exe if done.returncode == 0 else None), done.stderr


def _tolerance(dtype: torch.dtype) -> float:
    return 1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-4


def _mismatch(got: torch.Tensor, want: torch.Tensor, want64: torch.Tensor | None) -> str | None:
    """None when `got` matches the reference (the model in the task's dtype, or in float64 cast
    back, whichever is closer): elementwise atol = rtol = the dtype's tolerance, or for float32 a
    relative norm within 1e-5 with elementwise errors within 1e-3 (long sums)."""
    if got.shape != want.shape:
        return f"shape {tuple(got.shape)} != {tuple(want.shape)}"
    if got.dtype != want.dtype:
        return f"dtype {got.dtype} != {want.dtype}"
    if not want.is_floating_point():
        if torch.equal(got, want):
            return None
        bad = (got != want).nonzero()[:5].tolist()
        return f"{int((got != want).sum())} of {want.numel()} differ, first at {bad}"
    refs = [want] + ([want64.to(want.dtype)] if want64 is not None else [])
    tol = _tolerance(want.dtype)
    msgs = []
    for ref in refs:
        try:
            torch.testing.assert_close(got, ref, atol=tol, rtol=tol, equal_nan=True)
            return None
        except AssertionError as exc:
            msgs.append(str(exc).strip().splitlines())
        if want.dtype == torch.float32 and want64 is not None:
            g, r = got.double(), want64.double()
            finite = torch.isfinite(r)
            if torch.equal(torch.isnan(got), torch.isnan(r)) and torch.equal(g[~finite & ~torch.isnan(r)],
                                                                              r[~finite & ~torch.isnan(r)]):
                num = (g[finite] - r[finite]).norm()
                den = r[finite].norm().clamp_min(1e-30)
                if num / den <= 1e-5 and torch.allclose(g[finite], r[finite], atol=1e-3, rtol=1e-3):
                    return None
    return " | ".join(" ".join(m[:4]) for m in msgs)


@dataclass
class Outcome:
    case: FuzzCase
    failures: list[str] = field(default_factory=list)
    runs: int = 0
    skipped: str | None = None
    family: str | None = None


def run_fuzz(cases: list[FuzzCase], seed: int, folder: Path, jobs: int = 2) -> list[Outcome]:
    rng = random.Random(seed * 7919 + 1)
    prepared = [prepare(c, rng) for c in cases]
    outcomes = [Outcome(p.case) for p in prepared]
    runs: list[tuple[int, Prepared, int]] = []
    where: dict[int, tuple[int, int]] = {}      # run index -> (case number, schedule number)
    for n, (p, o) in enumerate(zip(prepared, outcomes)):
        if p.skip:
            o.skipped = p.skip
            continue
        if p.error:
            o.failures.append(p.error)
            continue
        o.family = p.gen.family
        casedir = folder / f"case{n}"
        casedir.mkdir(parents=True, exist_ok=True)
        (casedir / "task.py").write_text(p.case.source)
        for i, t in enumerate(p.inputs.values()):
            (casedir / f"in{i}.bin").write_bytes(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
        for j in range(len(p.schedules)):
            where[len(runs)] = (n, j)
            runs.append((len(runs), p, j))
    # Chunks of whole cases, built on `jobs` threads.
    chunks: list[list[tuple[int, Prepared, int]]] = []
    size = min(40, max(8, (len(runs) + 2 * jobs - 1) // (2 * jobs)))
    for r in runs:
        if not chunks or (len(chunks[-1]) >= size and chunks[-1][-1][1] is not r[1]):
            chunks.append([])
        chunks[-1].append(r)

    def build_and_run(item):
        c, chunk = item
        exe, err = _build(chunk, folder, str(c))
        if exe is None:
            # One case's source does not compile: find which, so the others still run.
            results = {}
            for k, p, j in chunk:
                one, err1 = _build([(k, p, j)], folder, f"{c}_{k}")
                if one is None:
                    results[k] = ("build", err1[:3000])
                else:
                    results[k] = _run_one(one, k, folder / f"case{where[k][0]}")
            return results
        return {k: _run_one(exe, k, folder / f"case{where[k][0]}") for k, _, _ in chunk}

    with ThreadPoolExecutor(jobs) as pool:
        results: dict[int, tuple[str, str]] = {}
        for res in pool.map(build_and_run, enumerate(chunks)):
            results.update(res)
    for k, (status, text) in sorted(results.items()):
        n, j = where[k]
        p, o = prepared[n], outcomes[n]
        o.runs += 1
        sched = p.schedules[j]
        if status == "build":
            o.failures.append(f"g++ failed at {sched}:\n{text}")
            continue
        if status != "ok":
            o.failures.append(f"the emulated kernels failed at {sched}:\n{text}")
            continue
        plan = p.plans[j]
        if len(plan.outputs) != len(p.expected):
            o.failures.append(f"{len(plan.outputs)} outputs, the model has {len(p.expected)}")
            continue
        for i, (oname, want) in enumerate(zip(plan.outputs, p.expected)):
            buf = next(b for b in plan.buffers if b.name == oname)
            data = bytearray((folder / f"case{n}" / f"out{k}_{i}.bin").read_bytes())
            got = torch.frombuffer(data, dtype=TORCH_DTYPES[buf.dtype]).reshape(want.shape).clone() \
                if _numel(buf.shape) == want.numel() else torch.frombuffer(data, dtype=TORCH_DTYPES[buf.dtype])
            want64 = p.expected64[i] if p.expected64 is not None else None
            bad = _mismatch(got, want, want64)
            if bad:
                o.failures.append(f"output {i} at {sched}: {bad}")
    return outcomes


def _run_one(exe: Path, k: int, casedir: Path) -> tuple[str, str]:
    env = {**os.environ, "ASAN_OPTIONS": "detect_leaks=0"}
    try:
        done = subprocess.run([str(exe), str(k)], cwd=casedir, capture_output=True, text=True, timeout=300, env=env)
    except subprocess.TimeoutExpired:
        return "timeout", "timed out after 300 s"
    if done.returncode != 0:
        return "crash", f"exit {done.returncode}: {done.stderr[-3000:]}"
    return "ok", ""


def report(outcomes: list[Outcome]) -> str:
    lines = []
    for o in outcomes:
        if o.failures:
            lines.append(f"== {o.case.name} ({o.case.note}) family={o.family}\n{o.case.source}")
            lines += ["   " + f.replace("\n", "\n   ") for f in o.failures[:4]]
    return "\n".join(lines)


@pytest.mark.skipif(GXX is None, reason="no host C++ compiler")
@pytest.mark.timeout(max(300, CASES * 12))
def test_generated_cuda_matches_the_model_on_random_tasks():
    cases = draw_cases(CASES, SEED, ONLY or None)
    if KEEP:
        folder = Path(KEEP)
        folder.mkdir(parents=True, exist_ok=True)
        outcomes = run_fuzz(cases, SEED, folder)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            outcomes = run_fuzz(cases, SEED, Path(tmp))
    failed = [o for o in outcomes if o.failures]
    skipped = [o for o in outcomes if o.skipped]
    text = report(outcomes)
    if KEEP:
        (Path(KEEP) / "failures.txt").write_text(text)
    assert len(skipped) <= len(cases) // 4, [(o.case.name, o.skipped) for o in skipped]
    assert not failed, f"{len(failed)} of {len(cases)} random tasks failed:\n{text[:20000]}"

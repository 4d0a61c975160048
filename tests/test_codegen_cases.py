"""Shared inputs of the codegen tests: example tasks, synthetic pointwise tasks, small inputs."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch

from core.tasks import load_task, load_task_from_source

TASKS = Path(__file__).resolve().parents[1] / "resources" / "tasks"

# Example tasks that generate() lowers (pure elementwise graphs).
POINTWISE_TASKS = ["act_gelu", "act_gelu_tanh_bf16", "act_hardswish_fp16", "act_leaky_relu", "act_mish",
                   "act_silu_bf16", "act_softplus", "fused_bias_gelu_scale_fp16"]

# Example tasks that generate() lowers with the row-reduction family.
ROWREDUCE_TASKS = ["red_sum_dim1"]      # the example softmaxes' rows fit the rownorm family

HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"

SYNTHETIC = {
    # Every listed activation at once: one kernel with many outputs.
    "zoo_activations": HEADER + '''
class Model(nn.Module):
    def forward(self, x):
        return (F.relu(x), F.leaky_relu(x, 0.2), F.elu(x), F.selu(x), F.gelu(x), F.gelu(x, approximate="tanh"),
                F.silu(x), F.mish(x), F.softplus(x, beta=0.5, threshold=5.0), F.softsign(x), F.hardtanh(x, -0.5, 2.0),
                F.hardsigmoid(x), F.hardswish(x), torch.sigmoid(x), torch.tanh(x), F.relu6(x), F.celu(x))

def get_inputs():
    return [3.0 * torch.randn(64, 256)]

def get_init_inputs():
    return []
''',
    # General broadcasting (neither input is a suffix of the output), comparisons, where, clamp, pow.
    "broadcast_where": HEADER + '''
class Model(nn.Module):
    def forward(self, x, y):
        z = torch.where(x > y, x * y, torch.clamp(x - y, min=-1.0, max=0.5))
        return torch.maximum(z ** 2, torch.minimum(x, y) / 3.0) + (x <= 0.25).float()

def get_inputs():
    return [torch.randn(4, 1, 6), torch.randn(5, 1)]

def get_init_inputs():
    return []
''',
    # Integer and fp16 inputs with promotion, a python scalar input, a weight of lower rank.
    "promote_scalar_fp16": HEADER + '''
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("shift", torch.linspace(-1.0, 1.0, 16, dtype=torch.float16))

    def forward(self, a, b, alpha):
        t = a * alpha + b + self.shift
        return torch.sqrt(torch.abs(t)) - torch.exp(-t.float()).to(torch.float16), torch.rsqrt(1.0 + t * t)

def get_inputs():
    return [torch.randint(-5, 5, (8, 16), dtype=torch.int32), torch.randn(8, 16, dtype=torch.float16), 0.75]

def get_init_inputs():
    return []
''',
    # bf16 math with a scalar-broadcast weight and the reciprocal / log / pow family.
    "bf16_math": HEADER + '''
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.full((1,), 1.5, dtype=torch.bfloat16))

    def forward(self, x):
        y = torch.log1p(x.abs()) * self.scale - torch.reciprocal(1.0 + x * x) + torch.pow(x, 3)
        return torch.neg(y).clamp(max=8.0)

def get_inputs():
    return [torch.randn(32, 24, dtype=torch.bfloat16)]

def get_init_inputs():
    return []
''',
    # Value classes and *_like constants (KL divergence's xlogy decomposes to isnan and where).
    "classify_like": HEADER + '''
class Model(nn.Module):
    def forward(self, x):
        y = torch.where(torch.isnan(x), torch.zeros_like(x), x) + torch.full_like(x, 0.5)
        return y * torch.isfinite(1e38 * x).float() - torch.isinf(1e38 * x).float() + torch.ones_like(x)

def get_inputs():
    return [torch.randn(7, 33)]

def get_init_inputs():
    return []
''',
    # pow with a tensor exponent and with a scalar base, fmax / fmin (a NaN loses to a number), the
    # special functions, signbit, logical_xor, and bitwise ops on integers and bools.
    "pow_bitwise_special": HEADER + '''
class Model(nn.Module):
    def forward(self, x, y, i, j):
        p = torch.pow(x.abs() + 0.5, y) + torch.pow(2.0, y) - torch.pow(1.5, x)
        n = torch.where(x > 1.5, torch.full_like(x, float("nan")), x)
        m = torch.fmax(n, y) - torch.fmin(n, y)
        s = torch.erfinv(0.9 * torch.tanh(x)) + torch.lgamma(x.abs() + 0.1) + torch.special.erfcx(y.abs()) + torch.i0(y)
        b = torch.signbit(x) ^ torch.logical_xor(x > 0, y > 0)
        k = (i & j) + (i | 6) - (i ^ j) + torch.bitwise_and(i, 3)
        return p, m, s, b, k

def get_inputs():
    return [torch.randn(9, 40), torch.randn(9, 40), torch.randint(-50, 50, (9, 40), dtype=torch.int32),
            torch.randint(0, 64, (9, 40), dtype=torch.int32)]

def get_init_inputs():
    return []
''',
    # Inverse and hyperbolic trig, two-operand math and Python's modulo (signs of both operands mixed).
    "trig_modulo": HEADER + '''
class Model(nn.Module):
    def forward(self, x, y):
        s = x.clamp(-0.95, 0.95)
        a = torch.asin(s) + torch.acos(s) * torch.atan(x) + torch.sinh(0.5 * x) - torch.cosh(0.3 * y)
        b = torch.asinh(x) + torch.acosh(1.0 + y.abs()) + torch.atanh(0.5 * s)
        c = torch.atan2(x, y) + torch.hypot(x, y) + torch.copysign(x, y) + torch.copysign(y, -1.0)
        d = torch.fmod(x, y) + torch.remainder(x, y) + torch.fmod(x, -1.5) + torch.remainder(x, 1.25)
        e = torch.clamp(x, min=y) - torch.clamp(x, max=0.5 * y) + torch.clamp(x, y - 1.0, y + 1.0)
        return a * b, c.half(), d, e

def get_inputs():
    return [3.0 * torch.randn(7, 33), 2.0 * torch.randn(7, 33) + 0.1]

def get_init_inputs():
    return []
''',
    # Row reductions in half precision, keepdim and a 3-D input.
    # Integer modulo both ways (Python's and C's), divisors of both signs, int32 and int64.
    "int_modulo": HEADER + '''
class Model(nn.Module):
    def forward(self, x, y):
        d = torch.where(y >= 0, y + 1, y)           # a divisor of either sign, never zero
        z = x.to(torch.int32)
        return torch.fmod(x, d), torch.remainder(x, d), x % 7, torch.fmod(x, -3), torch.remainder(z, -5), z % d.to(torch.int32)

def get_inputs():
    sign = torch.randint(0, 2, (5, 29)) * 2 - 1
    return [torch.randint(-50, 50, (5, 29)), sign * torch.randint(1, 9, (5, 29))]

def get_init_inputs():
    return []
''',
    "rowreduce_amax_fp16": HEADER + '''
class Model(nn.Module):
    def forward(self, x):
        return torch.amax(x, dim=-1, keepdim=True)

def get_inputs():
    return [torch.randn(6, 5, 300, dtype=torch.float16)]

def get_init_inputs():
    return []
''',
    "rowreduce_mean_bf16": HEADER + '''
class Model(nn.Module):
    def forward(self, x):
        return x.mean(dim=1)

def get_inputs():
    return [torch.randn(40, 1000, dtype=torch.bfloat16)]

def get_init_inputs():
    return []
''',
    # Few long rows (a block per row would leave the GPU idle): the row family's softmax.
    "rowreduce_softmax_bf16": HEADER + '''
class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)

def get_inputs():
    return [torch.randn(2, 3, 12288, dtype=torch.bfloat16)]

def get_init_inputs():
    return []
''',
}
ROWREDUCE_SYNTHETIC = ["rowreduce_amax_fp16", "rowreduce_mean_bf16", "rowreduce_softmax_bf16"]
POINTWISE_SYNTHETIC = sorted(set(SYNTHETIC) - set(ROWREDUCE_SYNTHETIC))


@lru_cache(maxsize=None)
def load(name: str):
    """A task by name (cached: loading runs the model on meta tensors)."""
    if name in SYNTHETIC:
        return load_task_from_source(SYNTHETIC[name], name)
    return load_task(TASKS / f"{name}.py")


def small_inputs(task, seed: int = 0) -> list:
    """Inputs of the task's dtypes with leading dims cut to 3 (the last dim kept, so weights still
    broadcast): the IR is checked on the CPU in milliseconds."""
    gen = torch.Generator().manual_seed(seed)
    full = task.make_inputs(seed, device="meta")
    out = []
    for value in full:
        if not isinstance(value, torch.Tensor):
            out.append(value)
            continue
        shape = [min(d, 3) for d in value.shape[:-1]] + list(value.shape[-1:])
        if value.dtype.is_floating_point:
            out.append((3.0 * torch.randn(shape, generator=gen)).to(value.dtype))
        else:
            out.append(torch.randint(-5, 5, shape, generator=gen).to(value.dtype))
    return out

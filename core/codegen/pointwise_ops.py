"""Elementwise semantics of ATen ops as C expressions, matching PyTorch's CUDA formulas.

`emit_op(node, args, ct)` returns the C expression of one node given its operands already
converted to the compute type `ct` (fp32 for fp16/bf16/fp32 results, double for fp64, the
integer type for integers). Comparisons get their operands in the promoted operand type.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from core.codegen.cuda_emit import STORAGE_CTYPE, literal, math_fn
from core.codegen.graph import Node

# Ops whose operands are compared in their promoted type and whose result is bool.
COMPARISONS = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
# Ops that classify a value (bool result): the operand keeps its own compute type (a float stays a
# float: no conversion to bool first). isnan(x) is x != x; integers are never NaN or infinite.
def _classify(kind: str) -> Callable[[str, str], str]:
    def emit(x: str, ct: str) -> str:
        if ct not in ("float", "double"):
            return "false" if kind in ("isnan", "isinf", "isposinf", "isneginf") else "true"
        inf = literal(math.inf, ct)
        return {"isnan": f"({x} != {x})",
                "isinf": f"({x} == {inf} || {x} == -{inf})",
                "isposinf": f"({x} == {inf})",
                "isneginf": f"({x} == -{inf})",
                "isfinite": f"({x} - {x} == ({ct})0)"}[kind]
    return emit


def _signbit(x: str, ct: str) -> str:
    if ct == "float":
        return f"((ca_f2u({x}) >> 31) != 0u)"        # -0.0 and a NaN with its sign bit set too
    if ct == "double":
        return f"({x} < 0.0 || 1.0 / {x} < 0.0)"      # -0.0 too; a NaN's sign bit is not read
    return f"({x} < 0)"


CLASSIFY = {k: _classify(k) for k in ("isnan", "isinf", "isposinf", "isneginf", "isfinite")}
CLASSIFY["signbit"] = _signbit
# Ops that only pass values through or create constants.
IDENTITY_OPS = {"clone", "alias", "_to_copy", "to", "contiguous", "lift_fresh_copy"}
CONSTANT_OPS = {"scalar_tensor", "full"}
# Not an ATen op: the element's index along attrs["dim"] (int64). The partitioner makes it from a
# gather that picks one element per row (partition._gather_as_pick); only row groups lower it.
IOTA = "cuda_agent_iota.default"


def _is_float(ct: str) -> bool:
    return ct in ("float", "double")


def _unary_math(name: str) -> Callable[[Node, list[str], str], str]:
    return lambda node, a, ct: f"{math_fn(name, ct)}({a[0]})"


def _clamp(x: str, lo: str | None, hi: str | None, ct: str) -> str:
    # torch.clamp propagates NaN: nan_min/nan_max do (min first, then max, as ATen does).
    if lo is not None:
        x = f"nan_max({x}, ({ct}){lo})"
    if hi is not None:
        x = f"nan_min({x}, ({ct}){hi})"
    return x


def _lit(node: Node, key: str, ct: str) -> str | None:
    value = node.attrs.get(key)
    return None if value is None else literal(value, ct)


def _pow_scalar(node: Node, a: list[str], ct: str) -> str:
    e = node.attrs["exponent"]
    x = a[0]
    if not _is_float(ct):
        if e == 2:
            return f"({x} * {x})"
        if e == 3:
            return f"({x} * {x} * {x})"
        raise LoweringError(f"integer pow with exponent {e!r}")
    one = literal(1, ct)
    special = {2: f"({x} * {x})", 3: f"({x} * {x} * {x})", 0.5: f"{math_fn('sqrt', ct)}({x})",
               -0.5: f"{math_fn('rsqrt', ct)}({x})", -1: f"({one} / {x})", -2: f"({one} / ({x} * {x}))",
               1: x}
    if e in special:
        return special[e]
    if e == 0:
        return one
    return f"{math_fn('pow', ct)}({x}, {literal(e, ct)})"


def _pow(node: Node, a: list[str], ct: str) -> str:
    """x ** scalar (Tensor_Scalar), tensor ** tensor (Tensor_Tensor), scalar ** tensor (Scalar)."""
    overload = node.op.partition(".")[2]
    if overload == "Tensor_Scalar":
        return _pow_scalar(node, a, ct)
    if not _is_float(ct):
        raise LoweringError("integer pow with a tensor exponent")
    if overload == "Scalar":
        return f"{math_fn('pow', ct)}({literal(node.attrs['self'], ct)}, {a[0]})"
    return f"{math_fn('pow', ct)}({a[0]}, {a[1]})"


def _fmax_fmin(name: str, op: str) -> Callable[[Node, list[str], str], str]:
    """torch.fmax / fmin: a NaN operand loses to a number (C's fmax / fmin do the same)."""
    def emit(node: Node, a: list[str], ct: str) -> str:
        if _is_float(ct):
            return f"{math_fn(name, ct)}({a[0]}, {a[1]})"
        return f"({a[0]} {op} {a[1]} ? {a[0]} : {a[1]})"
    return emit


def _bitwise(op: str) -> Callable[[Node, list[str], str], str]:
    def emit(node: Node, a: list[str], ct: str) -> str:
        if _is_float(ct):
            raise LoweringError("bitwise ops on floating-point values")
        return f"(({ct})({a[0]} {op} {a[1]}))"
    return emit


def _gelu(node: Node, a: list[str], ct: str) -> str:
    x = a[0]
    if node.attrs.get("approximate", "none") == "tanh":
        beta = literal(math.sqrt(2.0) * (2.0 / math.sqrt(math.pi)) * 0.5, ct)
        kappa = literal(0.044715, ct)
        return (f"({literal(0.5, ct)} * {x} * ({literal(1, ct)} + {math_fn('tanh', ct)}({beta} * "
                f"({x} + {kappa} * {x} * {x} * {x}))))")
    # 0.5x * (1 + erf) as one fused multiply-add 0.5x * erf + 0.5x (0.5x is exact): it differs from
    # eager's form by one rounding of 1 + erf, at most 0.5 |x| 2^-24 in absolute terms.
    half = f"({x} * {literal(0.5, ct)})"
    return f"({half} * {math_fn('erf', ct)}({x} * {literal(1 / math.sqrt(2.0), ct)}) + {half})"


def _elu(node: Node, a: list[str], ct: str) -> str:
    alpha, scale, in_scale = (float(node.attrs.get(k, 1.0)) for k in ("alpha", "scale", "input_scale"))
    x = a[0]
    neg = f"{math_fn('expm1', ct)}({x} * {literal(in_scale, ct)}) * {literal(alpha * scale, ct)}"
    return f"({x} <= {literal(0, ct)} ? {neg} : {x} * {literal(scale, ct)})"


def _softplus(node: Node, a: list[str], ct: str) -> str:
    beta = float(node.attrs.get("beta", 1.0))
    threshold = float(node.attrs.get("threshold", 20.0))
    x = a[0]
    bx = f"({x} * {literal(beta, ct)})"
    return (f"({bx} > {literal(threshold, ct)} ? {x} : {math_fn('log1p', ct)}({math_fn('exp', ct)}({bx}))"
            f" / {literal(beta, ct)})")


def _hardsigmoid(x: str, ct: str) -> str:
    # ATen's CUDA kernels multiply by one_sixth too (exact to 2^-23 relative, no IEEE division).
    clamped = _clamp(f"({x} + {literal(3, ct)})", literal(0, ct), literal(6, ct), ct)
    return div_by_literal(clamped, 6, ct) or f"({clamped} / {literal(6, ct)})"


def reciprocal_literal(c: float, ct: str) -> str | None:
    """The literal 1/c in `ct` (rounded once, as ATen computes `opmath_t(1) / scalar`), or None when
    multiplying by it is not safe: c is 0, inf or NaN, or 1/c is subnormal or overflows."""
    if ct not in ("float", "double") or not math.isfinite(float(c)) or float(c) == 0.0:
        return None
    if ct == "float":
        c32 = torch.tensor(float(c), dtype=torch.float32).item()   # the literal c as the kernel has it
        if c32 == 0.0 or not math.isfinite(c32):
            return None
        # 1/c32 rounded once to fp32: 1.0 / c32 in double is exact enough (53 bits) to round correctly.
        r = torch.tensor(1.0 / c32, dtype=torch.float32).item()
        tiny = 2.0 ** -126
    else:
        r, tiny = 1.0 / float(c), 2.0 ** -1022
    if not math.isfinite(r) or abs(r) < tiny:
        return None
    return literal(r, ct)


def div_by_literal(x: str, c: float, ct: str) -> str | None:
    """x / c as a multiply by the reciprocal. ATen's CUDA `div` does exactly this for a scalar
    divisor, so it matches eager on the GPU; the result is within 2^-23 relative of the IEEE
    quotient (exact when c is a power of two). None where reciprocal_literal refuses c."""
    r = reciprocal_literal(c, ct)
    return None if r is None else f"({x} * {r})"


def _add_sub(sign: str, reverse: bool = False) -> Callable[[Node, list[str], str], str]:
    def emit(node: Node, a: list[str], ct: str) -> str:
        x, y = (a[1], a[0]) if reverse else (a[0], a[1])
        alpha = node.attrs.get("alpha", 1)
        if alpha != 1:
            y = f"({literal(alpha, ct)} * {y})"
        return f"({x} {sign} {y})"
    return emit


def _div(node: Node, a: list[str], ct: str) -> str:
    mode = node.attrs.get("rounding_mode")
    if not _is_float(ct):              # integers: only with a rounding mode (true division promotes to float)
        if mode not in ("trunc", "floor"):
            raise LoweringError("integer division without a rounding mode")
        return f"ca_div_{mode}({a[0]}, {a[1]})"
    q = f"({a[0]} / {a[1]})"
    if mode is None:
        return q
    if mode == "trunc":
        return f"{math_fn('trunc', ct)}{q}"
    return f"{math_fn('floor', ct)}{q}"


def _leaky_relu(node: Node, a: list[str], ct: str) -> str:
    x, slope = a[0], float(node.attrs.get("negative_slope", 0.01))
    if ct == "float" and 0.0 < slope <= 1.0:
        # max(x, x * slope) is x for x > 0 and x * slope below: a multiply and one NaN-propagating max
        # (slope 0 would turn +inf into inf * 0 = NaN).
        return f"nan_max({x}, {x} * {literal(slope, ct)})"
    return f"({x} > {literal(0, ct)} ? {x} : {x} * {literal(slope, ct)})"


def _sign(node: Node, a: list[str], ct: str) -> str:
    x = a[0]
    return f"(({ct})({x} > ({ct})0) - ({ct})({x} < ({ct})0))"


def _float_math2(name: str) -> Callable[[Node, list[str], str], str]:
    """A two-operand C math function (atan2, hypot, copysign) on floats (PyTorch promotes
    integer operands of these to float)."""
    def emit(node: Node, a: list[str], ct: str) -> str:
        if not _is_float(ct):
            raise LoweringError(f"{name} on integers")
        return f"{math_fn(name, ct)}({a[0]}, {a[1]})"
    return emit


def _fmod(node: Node, a: list[str], ct: str) -> str:
    """C's remainder of a truncated division, as ATen's CUDA kernel (`%` on integers; a zero
    divisor is undefined there as here)."""
    return f"{math_fn('fmod', ct)}({a[0]}, {a[1]})" if _is_float(ct) else f"({a[0]} % {a[1]})"


def _remainder(node: Node, a: list[str], ct: str) -> str:
    return f"ca_remainder({a[0]}, {a[1]})"      # Python's modulo (cuda_emit's prelude), floats and integers


class LoweringError(Exception):
    """An op (or an op with these arguments) that the pointwise family cannot emit."""


_SHIFTED = ("int8", "uint8", "int16", "int32", "int64")


def _shift(kind: str) -> Callable[[Node, list[str], str], str]:
    """<< ("shl") or >> ("shr") on integers, as ATen's CUDA kernels: in the result's own width (an int8
    computed as int shifts as int8), a shift past it or negative gives 0 (left) or the sign (right)."""
    def emit(node: Node, a: list[str], ct: str) -> str:
        if node.dtype not in _SHIFTED or _is_float(ct):
            raise LoweringError(f"shifts of {node.dtype}")
        return f"(({ct})ca_{kind}<{STORAGE_CTYPE[node.dtype]}>({a[0]}, {a[1]}))"
    return emit


def _floats_only(name: str, ct: str) -> str:
    """'' for a float compute type (the caller goes on to emit), else a LoweringError."""
    if not _is_float(ct):
        raise LoweringError(f"{name} on integers")
    return ""


def _integers_only(name: str, ct: str) -> str:
    """'' for an integer compute type (the caller goes on to emit), else a LoweringError."""
    if _is_float(ct):
        raise LoweringError(f"{name} on floats")
    return ""


OPS: dict[str, Callable[[Node, list[str], str], str]] = {
    "add": _add_sub("+"), "sub": _add_sub("-"), "rsub": _add_sub("-", reverse=True),
    "mul": lambda n, a, ct: f"({a[0]} * {a[1]})",
    "div": _div,
    "neg": lambda n, a, ct: f"(-{a[0]})",
    "abs": lambda n, a, ct: f"{math_fn('fabs', ct)}({a[0]})" if _is_float(ct) else f"({a[0]} < 0 ? -{a[0]} : {a[0]})",
    "exp": _unary_math("exp"), "exp2": _unary_math("exp2"), "expm1": _unary_math("expm1"),
    "log": _unary_math("log"), "log2": _unary_math("log2"), "log10": _unary_math("log10"),
    "log1p": _unary_math("log1p"), "sqrt": _unary_math("sqrt"), "rsqrt": _unary_math("rsqrt"),
    "sin": _unary_math("sin"), "cos": _unary_math("cos"), "tan": _unary_math("tan"),
    "erf": _unary_math("erf"), "erfc": _unary_math("erfc"), "tanh": _unary_math("tanh"),
    "asin": _unary_math("asin"), "acos": _unary_math("acos"), "atan": _unary_math("atan"),
    "sinh": _unary_math("sinh"), "cosh": _unary_math("cosh"), "asinh": _unary_math("asinh"),
    "acosh": _unary_math("acosh"), "atanh": _unary_math("atanh"),
    "atan2": _float_math2("atan2"), "hypot": _float_math2("hypot"), "copysign": _float_math2("copysign"),
    "fmod": _fmod, "remainder": _remainder,
    "gcd": lambda n, a, ct: _integers_only("gcd", ct) or f"ca_gcd({a[0]}, {a[1]})",
    "lcm": lambda n, a, ct: _integers_only("lcm", ct) or f"ca_lcm({a[0]}, {a[1]})",
    "erfinv": _unary_math("erfinv"), "lgamma": _unary_math("lgamma"), "special_erfcx": _unary_math("erfcx"),
    "i0": _unary_math("cyl_bessel_i0"),
    "digamma": lambda n, a, ct: _floats_only("digamma", ct) or f"ca_digamma({a[0]})",
    "polygamma": lambda n, a, ct: _floats_only("polygamma", ct) or f"ca_polygamma({int(n.attrs.get('n', 0))}, {a[0]})",
    "special_zeta": lambda n, a, ct: _floats_only("zeta", ct) or f"ca_zeta({a[0]}, {a[1]})",
    "nextafter": _float_math2("nextafter"),
    "__lshift__": _shift("shl"), "bitwise_left_shift": _shift("shl"),
    "__rshift__": _shift("shr"), "bitwise_right_shift": _shift("shr"),
    "floor": _unary_math("floor"), "ceil": _unary_math("ceil"), "trunc": _unary_math("trunc"),
    "round": _unary_math("rint"),
    "reciprocal": lambda n, a, ct: f"({literal(1, ct)} / {a[0]})",
    "sigmoid": lambda n, a, ct: f"({literal(1, ct)} / ({literal(1, ct)} + {math_fn('exp', ct)}(-{a[0]})))",
    "silu": lambda n, a, ct: f"({a[0]} / ({literal(1, ct)} + {math_fn('exp', ct)}(-{a[0]})))",
    "relu": lambda n, a, ct: f"nan_max({a[0]}, {literal(0, ct)})" if ct == "float" else f"({a[0]} <= ({ct})0 ? ({ct})0 : {a[0]})",
    "leaky_relu": _leaky_relu,
    "elu": _elu,
    "gelu": _gelu,
    "softplus": _softplus,
    "mish": lambda n, a, ct: (f"({a[0]} * {math_fn('tanh', ct)}({a[0]} > {literal(20, ct)} ? {a[0]} : "
                              f"{math_fn('log1p', ct)}({math_fn('exp', ct)}({a[0]}))))"),
    "hardsigmoid": lambda n, a, ct: _hardsigmoid(a[0], ct),
    "hardswish": lambda n, a, ct: f"({a[0]} * {_hardsigmoid(a[0], ct)})",
    "hardtanh": lambda n, a, ct: _clamp(a[0], _lit(n, "min_val", ct), _lit(n, "max_val", ct), ct),
    "clamp": lambda n, a, ct: _clamp(a[0], _lit(n, "min", ct), _lit(n, "max", ct), ct),
    # clamp.Tensor: the lowering passes [x, min or None, max or None] (lower_pointwise._node_expr).
    "clamp.Tensor": lambda n, a, ct: _clamp(a[0], a[1], a[2], ct),
    "clamp_min": lambda n, a, ct: _clamp(a[0], _lit(n, "min", ct), None, ct),
    "clamp_max": lambda n, a, ct: _clamp(a[0], None, _lit(n, "max", ct), ct),
    "maximum": lambda n, a, ct: f"nan_max({a[0]}, {a[1]})",
    "minimum": lambda n, a, ct: f"nan_min({a[0]}, {a[1]})",
    "fmax": _fmax_fmin("fmax", ">"), "fmin": _fmax_fmin("fmin", "<"),
    "pow": _pow,
    "sign": _sign,
    "where": lambda n, a, ct: f"({a[0]} ? {a[1]} : {a[2]})",
    "logical_not": lambda n, a, ct: f"(!{a[0]})",
    "logical_and": lambda n, a, ct: f"({a[0]} && {a[1]})",
    "logical_or": lambda n, a, ct: f"({a[0]} || {a[1]})",
    "logical_xor": lambda n, a, ct: f"({a[0]} != {a[1]})",
    "bitwise_and": _bitwise("&"), "bitwise_or": _bitwise("|"), "bitwise_xor": _bitwise("^"),
    "bitwise_not": lambda n, a, ct: f"(!{a[0]})" if ct == "bool" else f"(~{a[0]})",
}


def _gelu_fast(node: Node, a: list[str], ct: str) -> str:
    x = a[0]
    if node.attrs.get("approximate", "none") == "tanh":
        # 0.5 * (1 + tanh(u)) == sigmoid(2u): x * sigmoid(2u) with no cancellation for x < 0 (where
        # 1 + tanh(u) loses the digits the approximate tanh has), relative error ~1e-6.
        two_u = (f"{literal(-2 * math.sqrt(2.0) * (2.0 / math.sqrt(math.pi)) * 0.5, ct)} * "
                 f"({x} + {literal(0.044715, ct)} * {x} * {x} * {x})")
        return f"({x} * ca_rcp_fast({literal(1, ct)} + ca_exp_fast({two_u})))"
    return f"({x} * ca_phi_fast({x}))"


# Forms for float results that are rounded to fp16/bf16 right after (see cuda_emit's ca_*_fast):
# their error (~1e-6 relative) is far below the 2^-11 / 2^-8 of that rounding. sigmoid and silu
# divide by 1 + exp(-x) >= 1, the range where ca_rcp_fast is accurate.
FAST_OPS: dict[str, Callable[[Node, list[str], str], str]] = {
    "exp": lambda n, a, ct: f"ca_exp_fast({a[0]})",
    "tanh": lambda n, a, ct: f"ca_tanh_fast({a[0]})",
    "sigmoid": lambda n, a, ct: f"ca_rcp_fast({literal(1, ct)} + ca_exp_fast(-{a[0]}))",
    "silu": lambda n, a, ct: f"({a[0]} * ca_rcp_fast({literal(1, ct)} + ca_exp_fast(-{a[0]})))",
    "gelu": _gelu_fast,
}

# Overloads that exist in the table above (others of the same op, e.g. bitwise_and.Scalar_Tensor,
# are not lowered and get a clear message).
SUPPORTED_OVERLOADS = {
    "add": {"Tensor", "Scalar"}, "sub": {"Tensor", "Scalar"}, "rsub": {"Scalar", "Tensor"},
    "mul": {"Tensor", "Scalar"}, "div": {"Tensor", "Scalar", "Tensor_mode", "Scalar_mode"},
    "pow": {"Tensor_Scalar", "Tensor_Tensor", "Scalar"}, "clamp": {"default", "Tensor"}, "clamp_min": {"default"}, "clamp_max": {"default"},
    "where": {"self"},
    "maximum": {"default"}, "minimum": {"default"}, "fmax": {"default"}, "fmin": {"default"},
    "bitwise_and": {"Tensor", "Scalar"}, "bitwise_or": {"Tensor", "Scalar"}, "bitwise_xor": {"Tensor", "Scalar"},
    "atan2": {"default"}, "hypot": {"default"}, "copysign": {"Tensor", "Scalar"}, "nextafter": {"default"},
    "special_zeta": {"default"}, "polygamma": {"default"}, "digamma": {"default"},
    "__lshift__": {"Tensor", "Scalar"}, "__rshift__": {"Tensor", "Scalar"},
    "bitwise_left_shift": {"Tensor", "Tensor_Scalar"}, "bitwise_right_shift": {"Tensor", "Tensor_Scalar"},
    "fmod": {"Tensor", "Scalar"}, "remainder": {"Tensor", "Scalar"}, "gcd": {"default"}, "lcm": {"default"},
    "eq": {"Tensor", "Scalar"}, "ne": {"Tensor", "Scalar"}, "lt": {"Tensor", "Scalar"},
    "le": {"Tensor", "Scalar"}, "gt": {"Tensor", "Scalar"}, "ge": {"Tensor", "Scalar"},
}


def is_pointwise(node: Node) -> bool:
    """True when the pointwise family has a lowering for this node (op and overload)."""
    base, _, overload = node.op.partition(".")
    if node.op == IOTA:
        return True
    if base in IDENTITY_OPS:
        return base != "_to_copy" or all(node.attrs.get(k) in (None, False) or k == "dtype" or
                                         (k == "memory_format" and node.attrs[k] == "torch.preserve_format") or
                                         (k == "layout" and node.attrs[k] == "torch.strided")   # the default, spelt out
                                         for k in ("layout", "device", "pin_memory", "memory_format"))
    if base in CONSTANT_OPS:
        return True
    if base in CLASSIFY:
        return overload == "default"
    if base not in OPS and base not in COMPARISONS:
        return False
    allowed = SUPPORTED_OVERLOADS.get(base)
    return allowed is None or overload in allowed

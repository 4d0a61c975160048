"""Elementwise semantics of ATen ops as C expressions, matching PyTorch's CUDA formulas.

`emit_op(node, args, ct)` returns the C expression of one node given its operands already
converted to the compute type `ct` (fp32 for fp16/bf16/fp32 results, double for fp64, the
integer type for integers). Comparisons get their operands in the promoted operand type.
"""
from __future__ import annotations

import math
from typing import Callable

from core.codegen.cuda_emit import literal, math_fn
from core.codegen.graph import Node

# Ops whose operands are compared in their promoted type and whose result is bool.
COMPARISONS = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
# Ops that only pass values through or create constants.
IDENTITY_OPS = {"clone", "alias", "_to_copy", "to", "contiguous", "lift_fresh_copy"}
CONSTANT_OPS = {"scalar_tensor", "full"}


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


def _gelu(node: Node, a: list[str], ct: str) -> str:
    x = a[0]
    if node.attrs.get("approximate", "none") == "tanh":
        beta = literal(math.sqrt(2.0) * (2.0 / math.sqrt(math.pi)) * 0.5, ct)
        kappa = literal(0.044715, ct)
        return (f"({literal(0.5, ct)} * {x} * ({literal(1, ct)} + {math_fn('tanh', ct)}({beta} * "
                f"({x} + {kappa} * {x} * {x} * {x}))))")
    return (f"({x} * {literal(0.5, ct)} * ({literal(1, ct)} + {math_fn('erf', ct)}({x} * "
            f"{literal(1 / math.sqrt(2.0), ct)})))")


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
    return f"({_clamp(f'({x} + {literal(3, ct)})', literal(0, ct), literal(6, ct), ct)} / {literal(6, ct)})"


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
    if not _is_float(ct):
        raise LoweringError("integer division")
    q = f"({a[0]} / {a[1]})"
    if mode is None:
        return q
    if mode == "trunc":
        return f"{math_fn('trunc', ct)}{q}"
    return f"{math_fn('floor', ct)}{q}"


def _sign(node: Node, a: list[str], ct: str) -> str:
    x = a[0]
    return f"(({ct})({x} > ({ct})0) - ({ct})({x} < ({ct})0))"


class LoweringError(Exception):
    """An op (or an op with these arguments) that the pointwise family cannot emit."""


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
    "floor": _unary_math("floor"), "ceil": _unary_math("ceil"), "trunc": _unary_math("trunc"),
    "round": _unary_math("rint"),
    "reciprocal": lambda n, a, ct: f"({literal(1, ct)} / {a[0]})",
    "sigmoid": lambda n, a, ct: f"({literal(1, ct)} / ({literal(1, ct)} + {math_fn('exp', ct)}(-{a[0]})))",
    "silu": lambda n, a, ct: f"({a[0]} / ({literal(1, ct)} + {math_fn('exp', ct)}(-{a[0]})))",
    "relu": lambda n, a, ct: f"({a[0]} <= ({ct})0 ? ({ct})0 : {a[0]})",
    "leaky_relu": lambda n, a, ct: f"({a[0]} > {literal(0, ct)} ? {a[0]} : {a[0]} * {literal(n.attrs.get('negative_slope', 0.01), ct)})",
    "elu": _elu,
    "gelu": _gelu,
    "softplus": _softplus,
    "mish": lambda n, a, ct: (f"({a[0]} * {math_fn('tanh', ct)}({a[0]} > {literal(20, ct)} ? {a[0]} : "
                              f"{math_fn('log1p', ct)}({math_fn('exp', ct)}({a[0]}))))"),
    "hardsigmoid": lambda n, a, ct: _hardsigmoid(a[0], ct),
    "hardswish": lambda n, a, ct: f"({a[0]} * {_hardsigmoid(a[0], ct)})",
    "hardtanh": lambda n, a, ct: _clamp(a[0], _lit(n, "min_val", ct), _lit(n, "max_val", ct), ct),
    "clamp": lambda n, a, ct: _clamp(a[0], _lit(n, "min", ct), _lit(n, "max", ct), ct),
    "clamp_min": lambda n, a, ct: _clamp(a[0], _lit(n, "min", ct), None, ct),
    "clamp_max": lambda n, a, ct: _clamp(a[0], None, _lit(n, "max", ct), ct),
    "maximum": lambda n, a, ct: f"nan_max({a[0]}, {a[1]})",
    "minimum": lambda n, a, ct: f"nan_min({a[0]}, {a[1]})",
    "pow": _pow_scalar,
    "sign": _sign,
    "where": lambda n, a, ct: f"({a[0]} ? {a[1]} : {a[2]})",
    "logical_not": lambda n, a, ct: f"(!{a[0]})",
    "logical_and": lambda n, a, ct: f"({a[0]} && {a[1]})",
    "logical_or": lambda n, a, ct: f"({a[0]} || {a[1]})",
    "bitwise_not": lambda n, a, ct: f"(!{a[0]})" if ct == "bool" else f"(~{a[0]})",
}
# Overloads that exist in the table above (others of the same op, e.g. pow.Tensor_Tensor or
# clamp.Tensor, are not lowered and get a clear message).
SUPPORTED_OVERLOADS = {
    "add": {"Tensor", "Scalar"}, "sub": {"Tensor", "Scalar"}, "rsub": {"Scalar", "Tensor"},
    "mul": {"Tensor", "Scalar"}, "div": {"Tensor", "Scalar", "Tensor_mode", "Scalar_mode"},
    "pow": {"Tensor_Scalar"}, "clamp": {"default"}, "where": {"self"},
    "maximum": {"default"}, "minimum": {"default"},
    "eq": {"Tensor", "Scalar"}, "ne": {"Tensor", "Scalar"}, "lt": {"Tensor", "Scalar"},
    "le": {"Tensor", "Scalar"}, "gt": {"Tensor", "Scalar"}, "ge": {"Tensor", "Scalar"},
}


def is_pointwise(node: Node) -> bool:
    """True when the pointwise family has a lowering for this node (op and overload)."""
    base, _, overload = node.op.partition(".")
    if base in IDENTITY_OPS:
        return base != "_to_copy" or all(node.attrs.get(k) in (None, False) or k == "dtype" or
                                         (k == "memory_format" and node.attrs[k] == "torch.preserve_format")
                                         for k in ("layout", "device", "pin_memory", "memory_format"))
    if base in CONSTANT_OPS:
        return True
    if base not in OPS and base not in COMPARISONS:
        return False
    allowed = SUPPORTED_OVERLOADS.get(base)
    return allowed is None or overload in allowed

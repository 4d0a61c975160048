"""The launch-plan expression language: semantics and safety."""

from __future__ import annotations

import builtins
import time

import pytest

from core.program import ExpressionError, ProgramError, ScalarArg, TensorInfo, TensorRef, parse_expression
from core.program.expressions import MAX_DEPTH, MAX_EXPRESSION_CHARS

ENV = {
    "x": TensorInfo((4, 8, 16), "float32"),
    "linear.weight": TensorInfo((64, 32), "float16"),
    "linear.bias": TensorInfo((64,), "float16"),
    "layers.0.weight": TensorInfo((10, 20), "float32"),
    "n": 1000,
    "alpha": 0.5,
    "BLOCK": 256,
    "VEC": 4,
}


def ev(text, env=ENV):
    return parse_expression(text).evaluate(env)


# ------------------------------------------------------------------ semantics


@pytest.mark.parametrize(
    "text, expected",
    [
        ("1 + 2 * 3", 7),
        ("(1 + 2) * 3", 9),
        ("7 - 10", -3),
        ("-n", -1000),
        ("+n", 1000),
        ("2 ** 10", 1024),
        ("7 % 3", 1),
        ("-7 % 3", 2),  # Python semantics: % and // floor
        ("-7 // 2", -4),
        ("n // BLOCK", 3),
        ("cdiv(n, BLOCK)", 4),
        ("cdiv(1024, 256)", 4),
        ("cdiv(0, 256)", 0),
        ("cdiv(x.numel, BLOCK * VEC)", 1),
        ("min(BLOCK, n)", 256),
        ("max(BLOCK, n, 7)", 1000),
        ("BLOCK if n > 512 else 128", 256),
        ("BLOCK if n < 512 else 128", 128),
        ("1 < 2 < 3", True),
        ("3 > 2 > 2", False),
        ("n == 1000 and BLOCK != 0", True),
        ("0 or VEC", 4),
        ("not 0", True),
        ("x.shape[0]", 4),
        ("x.shape[-1]", 16),
        ("x.shape[x.ndim - 2]", 8),
        ("x.numel", 4 * 8 * 16),
        ("x.ndim", 3),
        ("linear.weight.shape[0]", 64),
        ("linear.weight.shape[-1] * 2", 64),
        ("linear.bias.numel", 64),
        ("layers.0.weight.shape[1]", 20),
        ("layers.0.weight.numel + 1", 201),
        ("2 ** 63 - 1 + 2 ** 63", 2**64 - 1),  # uint64 max fits
    ],
)
def test_values(text, expected):
    value = ev(text)
    assert value == expected
    assert type(value) is type(expected)


def test_true_division_gives_float_and_floor_division_int():
    assert ev("n / 8") == 125.0 and isinstance(ev("n / 8"), float)
    assert ev("7.5 // 2") == 3 and isinstance(ev("7.5 // 2"), int)
    assert ev("alpha * 2") == 1.0


def test_bare_tensor_name_gives_a_tensor_reference():
    assert ev("x") == TensorRef("x", ENV["x"])
    assert ev("linear.weight") == TensorRef("linear.weight", ENV["linear.weight"])
    assert ev("layers.0.weight") == TensorRef("layers.0.weight", ENV["layers.0.weight"])
    assert ev("x if n > 0 else linear.weight") == TensorRef("x", ENV["x"])


def test_ternary_evaluates_only_the_chosen_branch():
    assert ev("n // VEC if VEC else 0") == 250
    assert ev("1 if VEC == 4 else n // 0") == 1


def test_typed_casts():
    assert ev("int32(x.shape[1])") == ScalarArg("int32", 8)
    assert ev("int64(x.numel)") == ScalarArg("int64", 512)
    assert ev("uint32(n)") == ScalarArg("uint32", 1000)
    assert ev("uint64(2 ** 63 - 1 + 2 ** 63)") == ScalarArg("uint64", 2**64 - 1)
    assert ev("float32(alpha)") == ScalarArg("float32", 0.5)
    assert ev("float64(n)") == ScalarArg("float64", 1000.0)
    assert ev("int32(n / 8)") == ScalarArg("int32", 125)  # an integral float is accepted
    assert ev("int32(-2 ** 31)") == ScalarArg("int32", -(2**31))
    assert ev("int64(int32(5))") == ScalarArg("int64", 5)
    assert ev("int32(5) * 2") == 10  # arithmetic drops the type


@pytest.mark.parametrize(
    "text, phrase",
    [
        ("int32(2 ** 31)", "does not fit in int32"),
        ("int32(-2 ** 31 - 1)", "does not fit in int32"),
        ("int32(x.numel * 2 ** 30)", "does not fit in int32"),
        ("int64(2 ** 63)", "does not fit in int64"),
        ("uint32(-1)", "does not fit in uint32"),
        ("uint32(2 ** 32)", "does not fit in uint32"),
        ("uint64(-1)", "does not fit in uint64"),
        ("float32(1e39)", "does not fit in float32"),
        ("int32(2.5)", "needs a whole number"),
        ("int32(x)", "tensor 'x' is used as a number"),
    ],
)
def test_cast_range_checks(text, phrase):
    with pytest.raises(ProgramError, match=phrase):
        ev(text)


def test_evaluate_int_accepts_integral_floats_only():
    assert parse_expression("n / 8").evaluate_int(ENV) == 125
    assert parse_expression("int32(7)").evaluate_int(ENV) == 7
    with pytest.raises(ProgramError, match="whole number, but is 2.5"):
        parse_expression("5 / 2").evaluate_int(ENV)
    with pytest.raises(ProgramError, match="'x' is a tensor"):
        parse_expression("x").evaluate_int(ENV)


@pytest.mark.parametrize(
    "text, phrase",
    [
        ("BLOK", "unknown name 'BLOK'; did you mean 'BLOCK'"),
        ("y.shape[0]", "unknown name 'y'"),
        ("linear.weight.foo", "'linear.weight' is a tensor"),
        ("n.shape[0]", "'n' is not a tensor"),
        ("n.foo", "'n' is a number and has no attribute 'foo'"),
        ("x.shape[3]", r"x.shape\[3\] is out of range: 'x' has 3 dimensions"),
        ("x.shape[-4]", "out of range"),
        ("x.shape[0.5]", "whole number"),
        ("x + 1", "tensor 'x' is used as a number; use x.shape"),
        ("n / 0", "division by zero"),
        ("n // (VEC - 4)", "division by zero"),
        ("n % 0", "modulo by zero"),
        ("cdiv(n, 0)", "divides by zero"),
        ("cdiv(n, 2.5)", "whole number"),
        ("2 ** 64", "out of range"),
        ("n * n * n * n * n * n * n", "out of range"),
        ("(-8) ** 0.5", "not a real number"),
        ("(alpha + 1) ** 5000", "too large"),
        ("0 ** -1", "negative power"),
    ],
)
def test_evaluation_errors(text, phrase):
    with pytest.raises(ProgramError, match=phrase) as info:
        ev(text)
    assert text in str(info.value)  # the message names the expression


def test_json_numbers_are_expressions():
    assert parse_expression(256).evaluate({}) == 256
    assert parse_expression(2.5).evaluate({}) == 2.5
    assert parse_expression(256).constant == 256
    assert parse_expression("-1").constant == -1  # constant folding
    assert parse_expression("x.shape[0]").constant is None
    with pytest.raises(ProgramError, match="got true"):
        parse_expression(True)
    with pytest.raises(ProgramError, match="finite"):
        parse_expression(float("nan"))
    with pytest.raises(ProgramError, match="got list"):
        parse_expression([1])  # type: ignore[arg-type]


def test_parsing_is_cached():
    assert parse_expression("cdiv(n, BLOCK) + 1") is parse_expression("cdiv(n, BLOCK) + 1")
    assert parse_expression("  n  ") is parse_expression("n")


def test_refs_lists_the_names_read():
    refs = parse_expression("cdiv(x.numel, BLOCK) + layers.0.weight.shape[0]").refs
    assert set(refs) == {("x",), ("BLOCK",), ("layers", "0", "weight")}


def test_a_name_that_is_not_a_usable_value_is_reported():
    with pytest.raises(ProgramError, match="'dims' is a list value"):
        ev("dims", {"dims": [1, 2]})


# ------------------------------------------------------------------ safety

ATTACKS = [
    "__import__('os')",
    "__import__('os').system('true')",
    "x.__class__",
    "x.__class__.__mro__",
    "().__class__.__bases__",
    "().__class__.__bases__[0].__subclasses__()",
    "x.shape.__getitem__(0)",
    "x.shape[0].__class__",
    "(1).real",
    "lambda: 1",
    "(lambda: 1)()",
    "[i for i in range(9)]",
    "{i: i for i in range(9)}",
    "{i for i in range(9)}",
    "sum(i for i in range(9))",
    "getattr(x, 'shape')",
    "open('/etc/passwd')",
    "eval('1')",
    "exec('1')",
    "print(1)",
    "range(10)",
    "'text'",
    "b'bytes'",
    "f'{n}'",
    "None",
    "...",
    "1j",
    "[1, 2]",
    "(1, 2)",
    "{}",
    "x[0]",
    "x.shape[0:2]",
    "x.shape",
    "x.size(0)",
    "x.numel()",
    "(y := 1)",
    "x @ x",
    "1 << 70",
    "n & 1",
    "~n",
    "n in x",
    "n is n",
    "max(*x)",
    "min(n, key=n)",
    "max(n)",
    "cdiv(1, 2, 3)",
    "int32()",
    "dtype(x)",
    "9 ** 9 ** 9",
    "10 ** 10 ** 10",
    "2 ** 2 ** 2 ** 2 ** 2",
    "(2 ** 63) * (2 ** 63)",
    "99999999999999999999999",
    "-" * 1999 + "1",
    "not " * 499 + "1",
    "(" * 900 + "1" + ")" * 900,
    "1+" * 999 + "1",
    "max(" * 300 + "1" + ", 1)" * 300,
    "1" * (MAX_EXPRESSION_CHARS + 1),
    "n+" * 5000 + "n",
    "",
    "   ",
    "n +",
    "n\nimport os",
    "n; import os",
    "\x00",
]


@pytest.mark.parametrize("text", ATTACKS)
def test_attacks_are_rejected_quickly(text):
    start = time.perf_counter()
    with pytest.raises(ProgramError):
        parse_expression(text).evaluate(ENV)
    assert time.perf_counter() - start < 0.5


def test_errors_are_expression_errors_with_the_problem():
    with pytest.raises(ExpressionError) as info:
        parse_expression("x.__class__")
    assert "double-underscore" in info.value.problem
    assert info.value.expression == "x.__class__"
    assert "\n" not in str(info.value)


def test_long_expressions_are_quoted_shortened():
    with pytest.raises(ProgramError) as info:
        parse_expression("n+" * 5000 + "n")
    assert "too long" in str(info.value)
    assert len(str(info.value)) < 300


def test_deep_nesting_is_capped():
    deep = "-(" * (MAX_DEPTH + 5) + "1" + ")" * (MAX_DEPTH + 5)
    chain = "1" + "+1" * (MAX_DEPTH + 5)
    for text in (deep, chain):
        with pytest.raises(ProgramError, match="nested too deeply|not valid syntax"):
            parse_expression(text)
    assert parse_expression("max(1, min(2, cdiv(n, BLOCK * (VEC + 1))))").evaluate(ENV) == 1


def test_evaluation_never_calls_eval_or_exec(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("eval/exec must never be used")

    monkeypatch.setattr(builtins, "eval", forbidden)
    monkeypatch.setattr(builtins, "exec", forbidden)
    expression = parse_expression("cdiv(x.numel, BLOCK * 3) + int32(n) * 0 + layers.0.weight.shape[-1]")
    assert expression.evaluate(ENV) == 1 + 0 + 20


def test_dunder_dotted_names_are_rejected_even_if_present_in_env():
    with pytest.raises(ProgramError, match="double-underscore"):
        ev("__builtins__", {"__builtins__": 1})

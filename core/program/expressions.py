"""The safe expression language of launch plans.

Expressions such as ``cdiv(x.numel, BLOCK * VEC)`` or ``int32(linear.weight.shape[0])`` are
parsed with ``ast.parse(mode="eval")`` and compiled into a small tree of our own node types
through an allow-list; nothing is ever passed to ``eval``/``exec`` and no Python attribute is
ever looked up, so a program file cannot reach the interpreter. Results are bounded (integers
stay within 64 bits, ``**`` is checked before it is computed, text length and nesting depth are
capped) so a hostile expression cannot burn CPU or memory.

Parsing is cached: a program is resolved for many shapes and each resolve only evaluates.
"""

from __future__ import annotations

import ast
import difflib
import functools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Union

from .errors import ProgramError
from .values import FLOAT_CTYPE_MAX, INT_CTYPE_RANGES, SCALAR_CTYPES, ScalarArg, TensorInfo

MAX_EXPRESSION_CHARS = 2000
MAX_DEPTH = 40
INT_MIN = -(2**63)  # integers must lie in [INT_MIN, INT_END): int64 and uint64 both fit
INT_END = 2**64

FUNCTIONS: tuple[str, ...] = ("min", "max", "cdiv", *SCALAR_CTYPES)
# Names that may not be used for tunables or buffers because they mean something else here.
RESERVED_NAMES = frozenset((*FUNCTIONS, "dtype"))
TENSOR_ATTRIBUTES = ("shape", "numel", "ndim")

_LANGUAGE_SUMMARY = (
    "expressions may use numbers, names, + - * / // % **, comparisons, and/or/not, "
    "'a if c else b', min(), max(), cdiv() and the typed casts " + ", ".join(f"{c}()" for c in SCALAR_CTYPES)
)


@dataclass(frozen=True)
class TensorRef:
    """The value of a bare tensor name: what a kernel argument turns into a device pointer."""

    name: str
    info: TensorInfo


Value = Union[int, float, bool, ScalarArg, TensorRef]
EnvValue = Union[TensorInfo, int, float, bool, ScalarArg]


class ExpressionError(ProgramError):
    """An expression is malformed or cannot be evaluated; ``problem`` says why."""

    def __init__(self, problem: str, expression: str | None = None) -> None:
        self.problem = problem
        self.expression = expression
        text = f"expression {quote(expression)}: {problem}" if expression is not None else problem
        super().__init__(text)


class _Problem(Exception):
    """Raised inside evaluation; Expression.evaluate adds the expression text."""


def quote(text: str, limit: int = 120) -> str:
    """Quote an expression for a message, shortened so a 2000-character one stays readable."""
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return "'" + text + "'"


# ---------------------------------------------------------------- evaluation helpers


def _number(value: Value) -> int | float:
    if isinstance(value, ScalarArg):
        return value.value
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, TensorRef):
        n = value.name
        raise _Problem(f"tensor '{n}' is used as a number; use {n}.shape[i], {n}.numel or {n}.ndim")
    raise _Problem(f"a value of type {type(value).__name__} cannot be used here")


def _integral(value: Value, what: str) -> int:
    number = _number(value)
    if isinstance(number, float):
        if not number.is_integer():
            raise _Problem(f"{what} must be a whole number, but is {number!r}")
        return int(number)
    return int(number)


def _checked(value: object) -> int | float:
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        if not INT_MIN <= value < INT_END:
            raise _Problem(f"the integer {value} is out of range (expressions use 64-bit integers)")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _Problem("the result is not a finite number")
        return value
    raise _Problem("the result is not a real number")


def _power(a: int | float, b: int | float) -> int | float:
    if isinstance(a, int) and isinstance(b, int):
        if b >= 0:
            # Refuse before computing: 9**9**9 must cost nothing.
            magnitude = abs(a)
            if magnitude >= 2 and (b > 128 or (magnitude.bit_length() - 1) * b >= 65):
                raise _Problem(f"{a} ** {b} is too large (expressions use 64-bit integers)")
        elif a == 0:
            raise _Problem("0 cannot be raised to a negative power")
    try:
        return a**b
    except OverflowError:
        raise _Problem(f"{a!r} ** {b!r} is too large") from None
    except ZeroDivisionError:
        raise _Problem("0.0 cannot be raised to a negative power") from None


def _binary(op: str, a: int | float, b: int | float) -> int | float:
    try:
        if op == "+":
            result = a + b
        elif op == "-":
            result = a - b
        elif op == "*":
            result = a * b
        elif op == "/":
            if b == 0:
                raise _Problem("division by zero")
            result = a / b
        elif op == "//":
            if b == 0:
                raise _Problem("division by zero")
            result = a // b
            if isinstance(result, float):  # '//' always gives an int
                result = int(_checked(result))
        elif op == "%":
            if b == 0:
                raise _Problem("modulo by zero")
            result = a % b
        else:  # "**"
            result = _power(a, b)
    except OverflowError:
        raise _Problem(f"{a!r} {op} {b!r} is too large") from None
    return _checked(result)


# ---------------------------------------------------------------- compiled nodes


class _Node:
    def eval(self, env: Mapping[str, EnvValue]) -> Value:
        raise NotImplementedError


class _Const(_Node):
    def __init__(self, value: int | float) -> None:
        self.value = value

    def eval(self, env: Mapping[str, EnvValue]) -> Value:
        return self.value


class _Ref(_Node):
    """A possibly dotted name (``x``, ``linear.weight``); the longest prefix found in env wins."""

    def __init__(self, parts: tuple[str, ...]) -> None:
        self.parts = parts
        self.text = ".".join(parts)
        # (key, number of parts it covers), longest first
        self.prefixes = [(".".join(parts[:k]), k) for k in range(len(parts), 0, -1)]

    def eval(self, env: Mapping[str, EnvValue]) -> Value:
        for key, k in self.prefixes:
            if key in env:
                value = env[key]
                break
        else:
            raise _Problem(_unknown_name_message(self.text, env))
        if k < len(self.parts):
            rest = self.parts[k]
            if isinstance(value, TensorInfo):
                raise _Problem(
                    f"'{key}' is a tensor; after its name only .shape[i], .numel or .ndim may follow, "
                    f"not '.{rest}' (unknown name '{self.text}')"
                )
            raise _Problem(f"'{key}' is a number and has no attribute '{rest}' (unknown name '{self.text}')")
        if isinstance(value, TensorInfo):
            return TensorRef(key, value)
        if isinstance(value, (int, float, ScalarArg)):
            return value
        raise _Problem(f"'{key}' is a {type(value).__name__} value, which expressions cannot use")


def _unknown_name_message(name: str, env: Mapping[str, EnvValue]) -> str:
    known = sorted(env)
    message = f"unknown name '{name}'"
    close = difflib.get_close_matches(name, known, n=3)
    if close:
        message += "; did you mean " + " or ".join(f"'{c}'" for c in close) + "?"
    if known:
        shown = ", ".join(known[:15]) + (f" and {len(known) - 15} more" if len(known) > 15 else "")
        message += f" (known names: {shown})"
    else:
        message += " (no names are defined here)"
    return message


def _tensor(ref: _Ref, env: Mapping[str, EnvValue], attribute: str) -> TensorRef:
    value = ref.eval(env)
    if not isinstance(value, TensorRef):
        raise _Problem(f"'{ref.text}' is not a tensor, so '{ref.text}.{attribute}' is not available")
    return value


class _ShapeOf(_Node):
    def __init__(self, ref: _Ref, index: _Node) -> None:
        self.ref = ref
        self.index = index

    def eval(self, env: Mapping[str, EnvValue]) -> Value:
        tensor = _tensor(self.ref, env, "shape")
        i = _integral(self.index.eval(env), f"the index of {self.ref.text}.shape[...]")
        shape = tensor.info.shape
        if not -len(shape) <= i < len(shape):
            raise _Problem(
                f"{self.ref.text}.shape[{i}] is out of range: '{self.ref.text}' has {len(shape)} "
                f"dimension{'s' if len(shape) != 1 else ''} (shape {shape})"
            )
        return shape[i]


class _TensorAttribute(_Node):
    def __init__(self, ref: _Ref, attribute: str) -> None:
        self.ref = ref
        self.attribute = attribute

    def eval(self, env: Mapping[str, EnvValue]) -> Value:
        info = _tensor(self.ref, env, self.attribute).info
        return info.numel if self.attribute == "numel" else info.ndim


class _Binary(_Node):
    def __init__(self, op: str, left: _Node, right: _Node) -> None:
        self.op, self.left, self.right = op, left, right

    def eval(self, env: Mapping[str, EnvValue]) -> Value:
        return _binary(self.op, _number(self.left.eval(env)), _number(self.right.eval(env)))


class _Unary(_Node):
    def __init__(self, op: str, operand: _Node) -> None:
        self.op, self.operand = op, operand

    def eval(self, env: Mapping[str, EnvValue]) -> Value:
        value = _number(self.operand.eval(env))
        if self.op == "not":
            return not value
        return _checked(-value if self.op == "-" else +value)


_COMPARE = {
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
}


class _Compare(_Node):
    def __init__(self, first: _Node, ops: list[str], rest: list[_Node]) -> None:
        self.first, self.ops, self.rest = first, ops, rest

    def eval(self, env: Mapping[str, EnvValue]) -> Value:
        left = _number(self.first.eval(env))
        for op, node in zip(self.ops, self.rest):
            right = _number(node.eval(env))
            if not _COMPARE[op](left, right):
                return False
            left = right
        return True


class _BoolOp(_Node):
    def __init__(self, is_and: bool, values: list[_Node]) -> None:
        self.is_and, self.values = is_and, values

    def eval(self, env: Mapping[str, EnvValue]) -> Value:
        value: int | float = False
        for node in self.values:
            value = _number(node.eval(env))
            if bool(value) != self.is_and:  # 'and' stops at the first falsy, 'or' at the first truthy
                return value
        return value


class _IfElse(_Node):
    def __init__(self, test: _Node, body: _Node, orelse: _Node) -> None:
        self.test, self.body, self.orelse = test, body, orelse

    def eval(self, env: Mapping[str, EnvValue]) -> Value:
        return self.body.eval(env) if _number(self.test.eval(env)) else self.orelse.eval(env)


class _Call(_Node):
    def __init__(self, function: str, args: list[_Node]) -> None:
        self.function, self.args = function, args

    def eval(self, env: Mapping[str, EnvValue]) -> Value:
        f = self.function
        if f in ("min", "max"):
            values = [_number(a.eval(env)) for a in self.args]
            return min(values) if f == "min" else max(values)
        if f == "cdiv":
            a = _integral(self.args[0].eval(env), "the first argument of cdiv()")
            b = _integral(self.args[1].eval(env), "the second argument of cdiv()")
            if b == 0:
                raise _Problem("cdiv() divides by zero")
            return _checked(-((-a) // b))
        return _cast(f, _number(self.args[0].eval(env)))


def _cast(ctype: str, value: int | float) -> ScalarArg:
    if ctype in INT_CTYPE_RANGES:
        if isinstance(value, float) and not value.is_integer():
            raise _Problem(f"{ctype}() needs a whole number, but got {value!r} (use // for integer division)")
        number = int(value)
        low, high = INT_CTYPE_RANGES[ctype]
        if not low <= number <= high:
            raise _Problem(f"{number} does not fit in {ctype} (range {low} to {high})")
        return ScalarArg(ctype, number)
    number = float(value)
    if abs(number) > FLOAT_CTYPE_MAX[ctype]:
        raise _Problem(f"{number!r} does not fit in {ctype}")
    return ScalarArg(ctype, number)


# ---------------------------------------------------------------- parsing

_BINARY_OPS = {
    ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/",
    ast.FloorDiv: "//", ast.Mod: "%", ast.Pow: "**",
}  # fmt: skip
_REJECTED_BINARY_OPS = {
    ast.LShift: "<<", ast.RShift: ">>", ast.BitAnd: "&", ast.BitOr: "|",
    ast.BitXor: "^", ast.MatMult: "@",
}  # fmt: skip
_COMPARE_OPS = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}
_ARITY = {"min": (2, None), "max": (2, None), "cdiv": (2, 2), **{c: (1, 1) for c in SCALAR_CTYPES}}

# A state_dict key such as "layers.0.weight" is not Python syntax ("layers.0" reads as a float);
# such dotted runs are swapped for placeholder names before parsing and swapped back after.
_DOTTED_RUN = re.compile(r"(?<![\w.])[A-Za-z_]\w*(?:\.\w+)+")


def _protect_dotted_names(text: str) -> tuple[str, dict[str, tuple[str, ...]]]:
    placeholders: dict[str, tuple[str, ...]] = {}

    def replace(match: re.Match[str]) -> str:
        parts = match.group(0).split(".")
        if not any(p[:1].isdigit() for p in parts[1:]):
            return match.group(0)
        name = f"_dotted{len(placeholders)}"
        while name in text:
            name = "_" + name
        placeholders[name] = tuple(parts)
        return name

    return _DOTTED_RUN.sub(replace, text), placeholders


class _Compiler:
    def __init__(self, placeholders: dict[str, tuple[str, ...]]) -> None:
        self.placeholders = placeholders
        self.refs: list[tuple[str, ...]] = []

    def parts(self, node: ast.expr) -> tuple[str, ...]:
        if isinstance(node, ast.Name):
            parts = self.placeholders.get(node.id, (node.id,))
        elif isinstance(node, ast.Attribute):
            parts = (*self.parts(node.value), node.attr)
        else:
            raise _Problem(
                "attribute access is only allowed on tensor names, as in x.shape[0], x.numel or x.ndim"
            )
        for part in parts:
            if part.startswith("__"):
                raise _Problem(f"the name '{'.'.join(parts)}' is not allowed (double-underscore names never are)")
        return parts

    def ref(self, parts: tuple[str, ...]) -> _Ref:
        self.refs.append(parts)
        return _Ref(parts)

    def compile(self, node: ast.AST) -> _Node:
        if isinstance(node, ast.Constant):
            value = node.value
            if isinstance(value, (bool, int)):
                return _Const(_checked(value))
            if isinstance(value, float):
                return _Const(_checked(value))
            if isinstance(value, str):
                raise _Problem("text (string) literals are not allowed")
            raise _Problem(f"the literal {value!r} is not allowed")
        if isinstance(node, (ast.Name, ast.Attribute)):
            parts = self.parts(node)
            if len(parts) > 1 and parts[-1] in ("numel", "ndim"):
                return _TensorAttribute(self.ref(parts[:-1]), parts[-1])
            if len(parts) > 1 and parts[-1] == "shape":
                name = ".".join(parts[:-1])
                raise _Problem(f"'{name}.shape' needs an index, e.g. {name}.shape[0]")
            return self.ref(parts)
        if isinstance(node, ast.Subscript):
            shape_of = isinstance(node.value, (ast.Name, ast.Attribute)) and self.parts(node.value)
            if not shape_of or len(shape_of) < 2 or shape_of[-1] != "shape":
                raise _Problem("indexing is only allowed on a tensor's shape, as in x.shape[0]")
            if isinstance(node.slice, (ast.Slice, ast.Tuple)):
                raise _Problem("a shape index must be a single number, as in x.shape[0] (no slices)")
            return _ShapeOf(self.ref(shape_of[:-1]), self.compile(node.slice))
        if isinstance(node, ast.BinOp):
            op = _BINARY_OPS.get(type(node.op))
            if op is None:
                symbol = _REJECTED_BINARY_OPS.get(type(node.op), type(node.op).__name__)
                raise _Problem(f"the operator '{symbol}' is not supported; {_LANGUAGE_SUMMARY}")
            left, right = self.compile(node.left), self.compile(node.right)
            if isinstance(left, _Const) and isinstance(right, _Const):  # fold, so 9**9**9 fails at parse time
                return _Const(_binary(op, left.value, right.value))
            return _Binary(op, left, right)
        if isinstance(node, ast.UnaryOp):
            ops = {ast.USub: "-", ast.UAdd: "+", ast.Not: "not"}
            if type(node.op) not in ops:
                raise _Problem(f"the operator '~' is not supported; {_LANGUAGE_SUMMARY}")
            unary = _Unary(ops[type(node.op)], self.compile(node.operand))
            return _Const(unary.eval({})) if isinstance(unary.operand, _Const) else unary
        if isinstance(node, ast.Compare):
            ops = []
            for op in node.ops:
                if type(op) not in _COMPARE_OPS:
                    word = {ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not"}.get(type(op), "?")
                    raise _Problem(f"the comparison '{word}' is not supported; use < <= > >= == !=")
                ops.append(_COMPARE_OPS[type(op)])
            return _Compare(self.compile(node.left), ops, [self.compile(c) for c in node.comparators])
        if isinstance(node, ast.BoolOp):
            return _BoolOp(isinstance(node.op, ast.And), [self.compile(v) for v in node.values])
        if isinstance(node, ast.IfExp):
            return _IfElse(self.compile(node.test), self.compile(node.body), self.compile(node.orelse))
        if isinstance(node, ast.Call):
            return self.call(node)
        if isinstance(node, ast.Lambda):
            raise _Problem("lambda is not allowed")
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            raise _Problem("comprehensions are not allowed")
        if isinstance(node, ast.NamedExpr):
            raise _Problem("assignment (:=) is not allowed")
        raise _Problem(f"{type(node).__name__} is not allowed; {_LANGUAGE_SUMMARY}")

    def call(self, node: ast.Call) -> _Node:
        if isinstance(node.func, ast.Attribute):
            raise _Problem(
                "method calls such as x.size(0) or x.numel() are not allowed; "
                "write x.shape[0], x.numel or x.ndim"
            )
        if not isinstance(node.func, ast.Name):
            raise _Problem("only the built-in functions can be called")
        name = node.func.id
        if name == "dtype":
            raise _Problem("dtype() is only allowed as a buffer's dtype, e.g. \"dtype\": \"dtype(x)\"")
        if name not in _ARITY:
            raise _Problem(f"the function '{name}' is not available; the functions are {', '.join(FUNCTIONS)}")
        if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
            raise _Problem(f"{name}() takes plain positional arguments only")
        low, high = _ARITY[name]
        count = len(node.args)
        if count < low or (high is not None and count > high):
            wanted = f"exactly {low}" if low == high else f"at least {low}"
            raise _Problem(f"{name}() takes {wanted} argument{'s' if low != 1 else ''}, not {count}")
        return _Call(name, [self.compile(a) for a in node.args])


def _depth(tree: ast.AST) -> int:
    deepest = 0
    stack = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > MAX_DEPTH:
            break
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return deepest


class Expression:
    """A parsed expression; evaluate it as often as needed against different environments."""

    __slots__ = ("text", "_root", "refs")

    def __init__(self, text: str, root: _Node, refs: tuple[tuple[str, ...], ...]) -> None:
        self.text = text
        self._root = root
        self.refs = refs  # every (dotted) name the expression reads, as parts

    def __repr__(self) -> str:
        return f"Expression({self.text!r})"

    @property
    def constant(self) -> int | float | None:
        """The value when the expression is a plain number literal, else None."""
        return self._root.value if isinstance(self._root, _Const) else None

    def evaluate(self, env: Mapping[str, EnvValue]) -> Value:
        try:
            return self._root.eval(env)
        except _Problem as problem:
            raise ExpressionError(str(problem), self.text) from None

    def evaluate_int(self, env: Mapping[str, EnvValue]) -> int:
        """Evaluate to an int (an integral float such as 4.0 is accepted)."""
        value = self.evaluate(env)
        if isinstance(value, TensorRef):
            raise ExpressionError(
                f"must be a whole number, but '{value.name}' is a tensor "
                f"(use {value.name}.shape[i], {value.name}.numel or {value.name}.ndim)",
                self.text,
            )
        number = value.value if isinstance(value, ScalarArg) else value
        if isinstance(number, float) and not number.is_integer():
            raise ExpressionError(f"must be a whole number, but is {number!r}", self.text)
        return int(number)


@functools.lru_cache(maxsize=8192)
def _parse_text(text: str) -> Expression:
    if not text:
        raise ExpressionError("is empty", text)
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(f"is too long ({len(text)} characters; the limit is {MAX_EXPRESSION_CHARS})", text)
    protected, placeholders = _protect_dotted_names(text)
    try:
        tree = ast.parse(protected, mode="eval")
    except SyntaxError as e:
        where = f" at column {e.offset}" if e.offset and not placeholders else ""
        detail = "" if e.msg == "invalid syntax" and not where else f" ({e.msg}{where})"
        raise ExpressionError(f"is not valid syntax{detail}", text) from None
    except (ValueError, RecursionError, MemoryError):
        raise ExpressionError("cannot be parsed", text) from None
    if _depth(tree) > MAX_DEPTH:
        raise ExpressionError(f"is nested too deeply (the limit is {MAX_DEPTH} levels)", text)
    compiler = _Compiler(placeholders)
    try:
        root = compiler.compile(tree.body)
    except _Problem as problem:
        raise ExpressionError(str(problem), text) from None
    return Expression(text, root, tuple(compiler.refs))


def parse_expression(source: str | int | float) -> Expression:
    """Parse (once; results are cached) an expression given as text or as a JSON number."""
    if isinstance(source, bool):
        raise ExpressionError(f"expected an expression (text or a number), got {str(source).lower()}")
    if isinstance(source, int):
        text = str(source)
    elif isinstance(source, float):
        if not math.isfinite(source):
            raise ExpressionError(f"expected a finite number, got {source!r}")
        text = repr(source)
    elif isinstance(source, str):
        text = source.strip()
    else:
        raise ExpressionError(f"expected an expression (text or a number), got {type(source).__name__}")
    return _parse_text(text)

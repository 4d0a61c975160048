"""C++ for the exported host launcher: launch-plan expressions, identifiers, string literals.

The launch plan's expressions (core/program/expressions.py, docs/program-format.md) have Python
semantics: ``//`` and ``%`` floor, ``/`` is a float division, casts check their range, a whole
number is required where a size is. ``translate`` turns a parsed expression into a C++
expression with the same value, using small checked helpers (namespace ``ca``, text in
``helpers_source``) wherever C++ differs from Python, so the exported launcher computes the
same grids, blocks and buffer shapes as the search did and fails where the search failed.

Static types: every sub-expression gets a kind, ``int`` (int64_t), ``float`` (double), ``bool``,
``tensor`` (an at::Tensor, valid only as a kernel argument or a ternary branch) or one of the cast
types (``int32`` ... ``float64``, what a kernel scalar argument needs). Integer arithmetic is
64-bit and, unlike the interpreter, not checked for overflow (sizes stay far below 2**63).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from core.program import expressions as ex
from core.program.expressions import Expression, ExpressionError, parse_expression
from core.program.values import SCALAR_CTYPES

INT, FLOAT, BOOL, TENSOR = "int", "float", "bool", "tensor"
INT_CASTS = ("int32", "int64", "uint32", "uint64")
FLOAT_CASTS = ("float32", "float64")

# C type of each typed cast: what the kernel argument local is declared as.
CAST_CPP_TYPES = {
    "int32": "int32_t",
    "int64": "int64_t",
    "uint32": "uint32_t",
    "uint64": "uint64_t",
    "float32": "float",
    "float64": "double",
}

# at::ScalarType of each dtype a tensor may have (names as in core.program.values.DTYPE_SIZES).
SCALAR_TYPES = {
    "float64": "at::ScalarType::Double",
    "float32": "at::ScalarType::Float",
    "float16": "at::ScalarType::Half",
    "bfloat16": "at::ScalarType::BFloat16",
    "float8_e4m3fn": "at::ScalarType::Float8_e4m3fn",
    "float8_e5m2": "at::ScalarType::Float8_e5m2",
    "complex64": "at::ScalarType::ComplexFloat",
    "complex128": "at::ScalarType::ComplexDouble",
    "int64": "at::ScalarType::Long",
    "int32": "at::ScalarType::Int",
    "int16": "at::ScalarType::Short",
    "int8": "at::ScalarType::Char",
    "uint64": "at::ScalarType::UInt64",
    "uint32": "at::ScalarType::UInt32",
    "uint16": "at::ScalarType::UInt16",
    "uint8": "at::ScalarType::Byte",
    "bool": "at::ScalarType::Bool",
}

# C++ operator precedence, higher binds tighter.
ATOM, UNARY, MUL, ADD, REL, EQ, AND, OR, COND = 100, 90, 80, 70, 60, 55, 40, 35, 20

CPP_KEYWORDS = frozenset(
    """
    alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t
    char32_t class compl concept const consteval constexpr constinit const_cast continue co_await
    co_return co_yield decltype default delete do double dynamic_cast else enum explicit export
    extern false float for friend goto if inline int long mutable namespace new noexcept not not_eq
    nullptr operator or or_eq private protected public register reinterpret_cast requires return
    short signed sizeof static static_assert static_cast struct switch template this thread_local
    throw true try typedef typeid typename union unsigned using virtual void volatile wchar_t while
    xor xor_eq final override import module restrict NULL
    """.split()
)


class TranslationError(Exception):
    """An expression cannot be written as C++; the message says why (the caller adds the field)."""


@dataclass(frozen=True)
class CppName:
    """What a plan name is in the launcher: kind "tensor", "tunable", "int", "float" or "bool"."""

    kind: str
    ident: str  # the C++ identifier (a tensor or scalar parameter, a buffer) or the tunable's macro


@dataclass(frozen=True)
class CppExpr:
    code: str
    kind: str  # INT, FLOAT, BOOL, TENSOR or a cast ctype
    prec: int = ATOM
    name: str = ""  # for a bare tensor: its plan name, for messages


# ---------------------------------------------------------------- translation


def translate(expression: Expression | str | int | float, names: Mapping[str, CppName]) -> CppExpr:
    """The C++ for one expression, given what each plan name is in the launcher."""
    if not isinstance(expression, Expression):
        try:
            expression = parse_expression(expression)
        except ExpressionError as e:
            raise TranslationError(e.problem) from None
    return _Translator(names).node(expression._root)


def whole_number(e: CppExpr) -> CppExpr:
    """e where a whole number is needed: floats must be integral (checked at run time)."""
    if e.kind == TENSOR:
        raise TranslationError(_tensor_as_number(e.name or e.code))
    if e.kind == FLOAT or e.kind in FLOAT_CASTS:
        return CppExpr(f"ca::whole({e.code})", INT)
    return numeric(e)


def numeric(e: CppExpr) -> CppExpr:
    """e as an operand of arithmetic: casts lose their C type, as in the interpreter."""
    if e.kind == TENSOR:
        raise TranslationError(_tensor_as_number(e.name or e.code))
    if e.kind in ("uint32", "uint64"):  # unsigned C arithmetic would wrap where Python goes negative
        return CppExpr(f"int64_t({e.code})", INT)
    if e.kind in INT_CASTS:
        return CppExpr(e.code, INT, e.prec)
    if e.kind in FLOAT_CASTS:
        return CppExpr(e.code if e.kind == "float64" else f"double({e.code})", FLOAT, e.prec if e.kind == "float64" else ATOM)
    return e


def _tensor_as_number(code: str) -> str:
    return f"tensor '{code}' is used as a number; use {code}.shape[i], {code}.numel or {code}.ndim"


def _paren(e: CppExpr, prec: int, right: bool = False) -> str:
    if e.prec < prec or (right and e.prec == prec and prec != ATOM):
        return f"({e.code})"
    return e.code


def _arith_kind(*operands: CppExpr) -> str:
    return FLOAT if any(o.kind == FLOAT for o in operands) else INT


def int_literal(value: int) -> CppExpr:
    if -(2**31) <= value < 2**31:
        return CppExpr(str(value), ATOM if value >= 0 else UNARY)
    if -(2**63) < value < 2**63:
        return CppExpr(f"{value}LL", ATOM if value >= 0 else UNARY)
    if value == -(2**63):
        return CppExpr("(-9223372036854775807LL - 1)", ATOM)
    raise TranslationError(f"the integer {value} does not fit in int64, which the exported launcher computes with")


class _Translator:
    def __init__(self, names: Mapping[str, CppName]) -> None:
        self.names = names

    def node(self, n: object) -> CppExpr:
        method = getattr(self, "_" + type(n).__name__.lstrip("_").lower(), None)
        if method is None:  # a node type added to the language but not here
            raise TranslationError(f"{type(n).__name__} cannot be exported yet")
        return method(n)

    # ---- leaves

    def _const(self, n: ex._Const) -> CppExpr:
        value = n.value
        if isinstance(value, bool):
            return CppExpr("true" if value else "false", BOOL)
        if isinstance(value, int):
            e = int_literal(value)
            return CppExpr(e.code, INT, e.prec)
        text = repr(float(value))  # '1e-05', '0.5', '2.0': valid C++ double literals
        return CppExpr(text, FLOAT, ATOM if not text.startswith("-") else UNARY)

    def _lookup(self, ref: ex._Ref) -> CppName:
        for key, k in ref.prefixes:
            if key in self.names:
                name = self.names[key]
                break
        else:
            raise TranslationError(_unknown(ref.text, self.names))
        if k < len(ref.parts):
            rest = ref.parts[k]
            if name.kind == TENSOR:
                raise TranslationError(
                    f"'{key}' is a tensor; after its name only .shape[i], .numel or .ndim may follow, not '.{rest}'"
                )
            raise TranslationError(f"'{key}' is a number and has no attribute '{rest}'")
        return name

    def _ref(self, n: ex._Ref) -> CppExpr:
        name = self._lookup(n)
        if name.kind == "tunable":
            return CppExpr(f"int64_t({name.ident})", INT)
        if name.kind == TENSOR:
            return CppExpr(name.ident, TENSOR, name=n.text)
        if name.kind in (INT, FLOAT, BOOL):
            return CppExpr(name.ident, name.kind)
        raise TranslationError(f"'{n.text}' cannot be used in an expression")

    def _tensor(self, ref: ex._Ref, attribute: str) -> str:
        name = self._lookup(ref)
        if name.kind != TENSOR:
            raise TranslationError(f"'{ref.text}' is not a tensor, so '{ref.text}.{attribute}' is not available")
        return name.ident

    def _shapeof(self, n: ex._ShapeOf) -> CppExpr:
        ident = self._tensor(n.ref, "shape")
        index = whole_number(self.node(n.index))
        return CppExpr(f"{ident}.size({index.code})", INT)  # at::Tensor::size wraps negative indices

    def _tensorattribute(self, n: ex._TensorAttribute) -> CppExpr:
        ident = self._tensor(n.ref, n.attribute)
        return CppExpr(f"{ident}.numel()" if n.attribute == "numel" else f"{ident}.dim()", INT)

    # ---- operators

    def _binary(self, n: ex._Binary) -> CppExpr:
        a, b = numeric(self.node(n.left)), numeric(self.node(n.right))
        ints = a.kind != FLOAT and b.kind != FLOAT
        if n.op in ("+", "-", "*"):
            prec = MUL if n.op == "*" else ADD
            return CppExpr(f"{_paren(a, prec)} {n.op} {_paren(b, prec, right=True)}", _arith_kind(a, b), prec)
        if n.op == "/":
            return CppExpr(f"ca::div({a.code}, {b.code})", FLOAT)
        if n.op == "//":
            return CppExpr(f"ca::{'floordiv' if ints else 'floordiv_f'}({a.code}, {b.code})", INT)
        if n.op == "%":
            return CppExpr(f"ca::{'mod' if ints else 'mod_f'}({a.code}, {b.code})", INT if ints else FLOAT)
        # "**": integer powers stay integers; a negative literal exponent gives a float, as in Python
        negative_literal = isinstance(n.right, ex._Const) and n.right.value < 0
        if ints and not negative_literal:
            return CppExpr(f"ca::ipow({a.code}, {b.code})", INT)
        return CppExpr(f"ca::fpow({a.code}, {b.code})", FLOAT)

    def _unary(self, n: ex._Unary) -> CppExpr:
        e = numeric(self.node(n.operand))
        if n.op == "not":
            return CppExpr(f"!{_paren(e, UNARY, right=True)}", BOOL, UNARY)
        kind = INT if e.kind == BOOL else e.kind
        if n.op == "+":
            return CppExpr(e.code, kind, e.prec)
        return CppExpr(f"-{_paren(e, UNARY, right=True)}", kind, UNARY)

    def _compare(self, n: ex._Compare) -> CppExpr:
        operands = [numeric(self.node(n.first))] + [numeric(self.node(r)) for r in n.rest]
        parts = []
        for i, op in enumerate(n.ops):
            prec = EQ if op in ("==", "!=") else REL
            parts.append(CppExpr(f"{_paren(operands[i], prec)} {op} {_paren(operands[i + 1], prec, right=True)}", BOOL, prec))
        if len(parts) == 1:
            return parts[0]
        return CppExpr(" && ".join(_paren(p, AND) for p in parts), BOOL, AND)

    def _boolop(self, n: ex._BoolOp) -> CppExpr:
        values = [numeric(self.node(v)) for v in n.values]
        if all(v.kind == BOOL for v in values):
            prec = AND if n.is_and else OR
            joiner = " && " if n.is_and else " || "
            return CppExpr(joiner.join(_paren(v, prec) for v in values), BOOL, prec)
        # Python returns an operand, not a bool: 'a and b' is b when a is true, else a.
        kind = FLOAT if any(v.kind == FLOAT for v in values) else INT
        result = values[-1]
        for a in reversed(values[:-1]):
            first, second = (result, a) if n.is_and else (a, result)
            code = f"{_paren(a, COND, True)} ? {_paren(first, COND, True)} : {_paren(second, COND, True)}"
            result = CppExpr(code, kind, COND)
        return result

    def _ifelse(self, n: ex._IfElse) -> CppExpr:
        test = numeric(self.node(n.test))
        body, orelse = self.node(n.body), self.node(n.orelse)
        if (body.kind == TENSOR) != (orelse.kind == TENSOR):
            raise TranslationError("one branch of 'a if c else b' is a tensor and the other a number; both must be the same")
        if body.kind == orelse.kind:
            kind = body.kind
        else:
            body, orelse = numeric(body), numeric(orelse)
            kind = FLOAT if FLOAT in (body.kind, orelse.kind) else INT
        code = f"{_paren(test, COND, True)} ? {_paren(body, COND, True)} : {_paren(orelse, COND, True)}"
        return CppExpr(code, kind, COND)

    def _call(self, n: ex._Call) -> CppExpr:
        f = n.function
        if f in ("min", "max"):
            args = [numeric(self.node(a)) for a in n.args]
            kind = FLOAT if any(a.kind == FLOAT for a in args) else INT
            ctype = "double" if kind == FLOAT else "int64_t"
            code = args[-1].code
            for a in reversed(args[:-1]):  # std::min takes two: nest them
                code = f"std::{f}<{ctype}>({a.code}, {code})"
            return CppExpr(code, kind)
        if f == "cdiv":
            a, b = (whole_number(self.node(x)) for x in n.args)
            return CppExpr(f"ca::cdiv({a.code}, {b.code})", INT)
        value = self.node(n.args[0])
        if f in INT_CASTS:
            return CppExpr(f"ca::to_{f}({whole_number(value).code})", f)
        if f in FLOAT_CASTS:
            return CppExpr(f"ca::to_{f}({numeric(value).code})", f)
        raise TranslationError(f"the function '{f}' cannot be exported")


def _unknown(name: str, names: Mapping[str, CppName]) -> str:
    known = sorted(names)
    shown = ", ".join(known[:15]) + (f" and {len(known) - 15} more" if len(known) > 15 else "")
    return f"unknown name '{name}' (known names: {shown or 'none'})"


# ---------------------------------------------------------------- identifiers and literals

_IDENTIFIER = re.compile(r"\b[A-Za-z_]\w*\b", re.ASCII)
_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)", re.MULTILINE)


def identifiers_in(code: str) -> set[str]:
    return set(_IDENTIFIER.findall(code))


def defined_macros(source: str) -> set[str]:
    """Names that the CUDA source #defines (a macro would rewrite a launcher identifier)."""
    return set(_DEFINE.findall(source))


def cpp_identifier(name: str, taken: set[str]) -> str:
    """A valid, unused C++ identifier for a plan name ('norm.weight' -> 'norm_weight'); adds it to taken."""
    ident = re.sub(r"\W", "_", name, flags=re.ASCII)
    ident = re.sub(r"_{2,}", "_", ident)  # double underscores are reserved in C++
    if not ident or ident[0].isdigit() or ident[0] == "_":
        ident = "t" + (ident if ident.startswith("_") else "_" + ident)
    if ident.startswith("ca_") or ident == "ca":  # the launcher's own locals start with ca_
        ident = "u_" + ident
    base, n = ident.rstrip("_") or "t", 2
    while ident in taken or ident in CPP_KEYWORDS:
        ident = f"{base}_{n}"
        n += 1
    taken.add(ident)
    return ident


def cpp_string(text: str) -> str:
    """A C++ string literal for any text (quotes, backslashes, newlines, non-ASCII escaped)."""
    out = []
    for byte in text.encode("utf-8"):
        c = chr(byte)
        if c in '"\\':
            out.append("\\" + c)
        elif c == "\n":
            out.append("\\n")
        elif 32 <= byte < 127 and c != "?":  # '?' escaped so no '??x' trigraph can form
            out.append(c)
        else:
            out.append(f"\\{byte:03o}")
    return '"' + "".join(out) + '"'


def cpp_comment(text: str) -> str:
    """Text safe inside a // comment: one line, no trailing backslash (line splice), ASCII only."""
    line = " ".join(str(text).split())
    line = "".join(c if 32 <= ord(c) < 127 else "_" for c in line)
    return line + "." if line.endswith("\\") else line


# ---------------------------------------------------------------- the helpers' C++ text


def helpers_source(function_name: str) -> str:
    """The namespace ``ca`` of checked helpers that the launcher calls (needs the PyTorch headers)."""
    body = _EXPRESSION_HELPERS + "\n" + _TORCH_HELPERS.replace("@FUNCTION@", function_name)
    return f"namespace {{\nnamespace ca {{\n\n{body}\n}}  // namespace ca\n}}  // namespace\n"


def expression_helpers_source() -> str:
    """Only the helpers translated expressions call: plain C++17 (<cmath>, <cstdint>, <cstdio>, <stdexcept>, <string>)."""
    return f"namespace {{\nnamespace ca {{\n\n{_EXPRESSION_HELPERS}\n}}  // namespace ca\n}}  // namespace\n"


_EXPRESSION_HELPERS = r"""// The launch plan's expressions have Python semantics (docs/program-format.md in CUDA Agent);
// these helpers give the launcher the same values and the same errors as the search had.
[[noreturn]] inline void fail(const std::string& problem) { throw std::domain_error(problem); }

// snprintf, not an ostream: see shape_text below on numbers streamed in nvcc-built code.
inline std::string show(double v) {
  char text[40];
  std::snprintf(text, sizeof text, "%.17g", v);
  return text;
}

inline double finite(double v) {
  if (!std::isfinite(v)) fail("the result is not a finite number");
  return v;
}

inline int64_t whole(double v) {
  if (!std::isfinite(v) || v != std::floor(v)) fail("must be a whole number, but is " + show(v));
  if (v < -9223372036854775808.0 || v >= 9223372036854775808.0) fail(show(v) + " is out of the 64-bit range");
  return static_cast<int64_t>(v);
}

inline double div(double a, double b) {
  if (b == 0) fail("division by zero");
  return finite(a / b);
}

inline int64_t floordiv(int64_t a, int64_t b) {
  if (b == 0) fail("division by zero");
  int64_t q = a / b;  // C++ truncates towards zero, Python floors
  if (a % b != 0 && ((a < 0) != (b < 0))) --q;
  return q;
}

inline int64_t floordiv_f(double a, double b) {
  if (b == 0) fail("division by zero");
  return whole(std::floor(a / b));
}

inline int64_t mod(int64_t a, int64_t b) {
  if (b == 0) fail("modulo by zero");
  int64_t r = a % b;  // Python's remainder has the sign of the divisor
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

inline double mod_f(double a, double b) {
  if (b == 0) fail("modulo by zero");
  double r = std::fmod(a, b);
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

inline int64_t ipow(int64_t base, int64_t exponent) {
  if (exponent < 0) fail("a negative integer exponent (" + std::to_string(exponent) + ") would give a float");
  int64_t result = 1;
  while (exponent > 0) {
    if ((exponent & 1) && __builtin_mul_overflow(result, base, &result)) fail("the power is too large for 64 bits");
    exponent >>= 1;
    if (exponent > 0 && __builtin_mul_overflow(base, base, &base)) fail("the power is too large for 64 bits");
  }
  return result;
}

inline double fpow(double a, double b) { return finite(std::pow(a, b)); }

inline int64_t cdiv(int64_t a, int64_t b) {
  if (b == 0) fail("cdiv() divides by zero");
  return -floordiv(-a, b);
}

inline int64_t in_range(int64_t v, int64_t low, int64_t high, const char* type) {
  if (v < low || v > high)
    fail(std::to_string(v) + " does not fit in " + type + " (range " + std::to_string(low) + " to " + std::to_string(high) + ")");
  return v;
}
inline int32_t to_int32(int64_t v) { return static_cast<int32_t>(in_range(v, INT32_MIN, INT32_MAX, "int32")); }
inline int64_t to_int64(int64_t v) { return v; }
inline uint32_t to_uint32(int64_t v) { return static_cast<uint32_t>(in_range(v, 0, UINT32_MAX, "uint32")); }
inline uint64_t to_uint64(int64_t v) { return static_cast<uint64_t>(in_range(v, 0, INT64_MAX, "uint64")); }
inline float to_float32(double v) {
  if (!std::isfinite(v) || std::fabs(v) > 3.4028234663852886e38) fail(show(v) + " does not fit in float32");
  return static_cast<float>(v);
}
inline double to_float64(double v) { return finite(v); }

inline int64_t buffer_dim(int64_t v) {
  if (v < 1) fail("evaluates to " + std::to_string(v) + "; every buffer dimension must be at least 1");
  return v;
}

inline unsigned int launch_dim(int64_t v, int64_t limit, const char* what) {
  if (v < 1 || v > limit)
    fail("evaluates to " + std::to_string(v) + "; a " + what + " dimension must be between 1 and " + std::to_string(limit));
  return static_cast<unsigned int>(v);
}

inline size_t shared_bytes(int64_t v) {
  if (v < 0) fail("evaluates to " + std::to_string(v) + " bytes; dynamic shared memory cannot be negative");
  return static_cast<size_t>(v);
}
"""

_TORCH_HELPERS = r"""// Name of the launcher, for error messages.
constexpr const char* kFunction = "@FUNCTION@";

// Evaluates one plan field; a failure names the field and its expression.
template <class F>
auto eval(const char* where, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, kFunction, ": ", where, ": ", e.what_without_backtrace());
  } catch (const std::exception& e) {
    TORCH_CHECK(false, kFunction, ": ", where, ": ", e.what());
  }
  throw std::logic_error("unreachable");
}

inline const char* dtype_name(at::ScalarType t) {
  switch (t) {
    case at::ScalarType::Double: return "float64";
    case at::ScalarType::Float: return "float32";
    case at::ScalarType::Half: return "float16";
    case at::ScalarType::BFloat16: return "bfloat16";
    case at::ScalarType::Long: return "int64";
    case at::ScalarType::Int: return "int32";
    case at::ScalarType::Short: return "int16";
    case at::ScalarType::Char: return "int8";
    case at::ScalarType::Byte: return "uint8";
    case at::ScalarType::Bool: return "bool";
    default: return c10::toString(t);
  }
}

// "[1001, 1003]", built by hand. Error messages carry no streamed integers: on the H200 machine
// (torch 2.11 cu130, nvcc 13, 2026-11-30) TORCH_CHECK(false, "n ", int64_t(2)) in a .cu file
// crashed the process instead of raising, while strings, C strings and devices were fine
// (scripts/export_crash.py shows it), so numbers go through std::to_string first.
inline std::string shape_text(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

// Checks one tensor argument and returns it contiguous: kernels read row-major arrays.
inline at::Tensor prepare(const at::Tensor& t, const char* what, at::ScalarType dtype, int64_t ndim) {
  TORCH_CHECK(t.defined(), kFunction, ": ", what, " is an undefined tensor");
  TORCH_CHECK(t.is_cuda(), kFunction, ": ", what, " must be a CUDA tensor, but it is on ", t.device());
  TORCH_CHECK(t.scalar_type() == dtype, kFunction, ": ", what, " must have dtype ", dtype_name(dtype), ", but has ",
              dtype_name(t.scalar_type()));
  TORCH_CHECK(t.dim() == ndim, kFunction, ": ", what, " must have ", std::to_string(ndim), " dimension(s) as in the task, but has shape ",
              shape_text(t));
  return t.contiguous();
}

inline void same_device(const at::Tensor& t, const at::Device& device, const char* what) {
  TORCH_CHECK(t.device() == device, kFunction, ": ", what, " is on ", t.device(), " but the first tensor is on ", device,
              "; all tensors must be on one GPU");
}

inline void check_cuda(cudaError_t status, const char* what) {
  TORCH_CHECK(status == cudaSuccess, kFunction, ": ", what, ": ", cudaGetErrorName(status), ": ",
              cudaGetErrorString(status));
}

// A kernel's static shared memory: with the dynamic amount past 48 KiB, a launch needs an opt-in.
inline size_t static_shared(const void* function, const char* what) {
  cudaFuncAttributes attributes;
  check_cuda(cudaFuncGetAttributes(&attributes, function), what);
  return attributes.sharedSizeBytes;
}
"""

# Names the launcher body and the binding use unqualified: a plan name must not shadow them.
# (The helpers are called as ca::name, so their own names need no protection.)
LAUNCHER_WORDS = frozenset(
    """
    at c10 cuda std ca pybind11 m dim3 size_t int64_t int32_t uint32_t uint64_t cudaStream_t
    cudaError_t cudaSuccess cudaLaunchKernel cudaGetLastError cudaFuncSetAttribute cudaFuncGetAttributes
    cudaFuncAttributes
    cudaFuncAttributeMaxDynamicSharedMemorySize TORCH_CHECK TORCH_EXTENSION_NAME PYBIND11_MODULE
    """.split()
)


def taken_identifiers(extra: Iterable[str] = ()) -> set[str]:
    """The starting set for cpp_identifier: keywords, launcher words, and any extra names."""
    return set(CPP_KEYWORDS) | set(LAUNCHER_WORDS) | set(extra)


__all__ = [
    "CAST_CPP_TYPES",
    "CppExpr",
    "CppName",
    "SCALAR_CTYPES",
    "SCALAR_TYPES",
    "TranslationError",
    "cpp_comment",
    "cpp_identifier",
    "cpp_string",
    "defined_macros",
    "expression_helpers_source",
    "helpers_source",
    "identifiers_in",
    "numeric",
    "taken_identifiers",
    "translate",
    "whole_number",
]

"""Find the ``__global__`` kernels of a CUDA source and whether each has C linkage.

This is a light scanner, not a C++ parser: it strips comments and string contents, then reads
the declaration that follows each ``__global__`` keyword. It handles the usual forms::

    extern "C" __global__ void k(...)
    extern "C" __global__ void __launch_bounds__(256, 2) k(...)
    extern "C" { __global__ void a(...) {...}  __global__ void b(...) {...} }

A kernel hidden behind a macro (``#define KERNEL extern "C" __global__``) is not seen.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class KernelDecl:
    name: str
    extern_c: bool  # declared with C linkage, so NVRTC keeps the name unmangled
    line: int  # 1-based line of the first declaration


def strip_comments_and_strings(source: str) -> str:
    """Blank out comments and the contents of string/char literals, keeping offsets and lines.

    The literal "C" is kept so that ``extern "C"`` stays recognisable.
    """
    out = list(source)
    i, n = 0, len(source)
    while i < n:
        c = source[i]
        if source.startswith("//", i):
            end = source.find("\n", i)
            end = n if end < 0 else end
            _blank(out, i, end)
            i = end
        elif source.startswith("/*", i):
            end = source.find("*/", i + 2)
            end = n if end < 0 else end + 2
            _blank(out, i, end)
            i = end
        elif c in "\"'":
            j = i + 1
            while j < n and source[j] != c and source[j] != "\n":
                j += 2 if source[j] == "\\" else 1
            end = min(j + 1, n)
            if source[i:end] != '"C"':
                _blank(out, i + 1, end - 1)
            i = end
        else:
            i += 1
    return "".join(out)


def _blank(chars: list[str], start: int, end: int) -> None:
    for k in range(start, end):
        if chars[k] != "\n":
            chars[k] = " "


_GLOBAL = re.compile(r"\b__global__\b")
_TOKEN = re.compile(r"[A-Za-z_]\w*|\S")
_EXTERN_C = re.compile(r'\bextern\s*"C"')
_EXTERN_C_BLOCK = re.compile(r'\bextern\s*"C"\s*\{')
# Attribute-like words whose parenthesised arguments come before the kernel name.
_SKIP_WITH_PARENS = {"__launch_bounds__", "__attribute__", "__maxnreg__", "__cluster_dims__", "__align__", "alignas"}


def _kernel_name(text: str, start: int) -> str | None:
    tokens = _TOKEN.finditer(text, start)
    pending: str | None = None
    depth_to_skip = 0
    for match in tokens:
        token = match.group(0)
        if depth_to_skip:
            depth_to_skip += {"(": 1, ")": -1}.get(token, 0)
            continue
        if token == "(":
            if pending in _SKIP_WITH_PARENS:
                depth_to_skip = 1
                pending = None
                continue
            return pending
        if token in ";{}":
            return None
        pending = token if token[0].isalpha() or token[0] == "_" else None
    return None


def _extern_c_blocks(text: str) -> list[tuple[int, int]]:
    blocks = []
    for match in _EXTERN_C_BLOCK.finditer(text):
        depth, i = 0, match.end() - 1
        while i < len(text):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    break
            i += 1
        blocks.append((match.start(), i))
    return blocks


@functools.lru_cache(maxsize=256)
def scan_kernels(source: str) -> tuple[KernelDecl, ...]:
    """Every ``__global__`` function in source order (first declaration of each name)."""
    text = strip_comments_and_strings(source)
    blocks = _extern_c_blocks(text)
    found: dict[str, KernelDecl] = {}
    for match in _GLOBAL.finditer(text):
        name = _kernel_name(text, match.end())
        if name is None:
            continue
        # The declaration's own prefix runs back to the previous ';', '{' or '}'.
        begin = max(text.rfind(c, 0, match.start()) for c in ";{}") + 1
        extern_c = bool(_EXTERN_C.search(text, begin, match.start())) or any(
            a < match.start() < b for a, b in blocks
        )
        line = text.count("\n", 0, match.start()) + 1
        if name in found:
            if extern_c and not found[name].extern_c:
                found[name] = KernelDecl(name, True, found[name].line)
            continue
        found[name] = KernelDecl(name, extern_c, line)
    return tuple(found.values())

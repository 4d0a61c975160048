"""A small plain-data IR of a captured reference: graph inputs, ATen-level nodes, outputs.

Operands of a node are either the name of a value (a graph input or an earlier node) or a
Python constant (int, float, bool, None). Non-tensor arguments of the ATen schema (dims,
`approximate`, `dtype`, ...) are attributes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union


@dataclass(frozen=True)
class Ref:
    """An operand that names a value of the graph (input, weight or node)."""

    name: str


Operand = Union[Ref, int, float, bool, None]


@dataclass
class GraphInput:
    name: str                    # forward parameter name, or state_dict key for weights
    kind: str                    # "input" (forward tensor) or "weight" (parameter or buffer)
    shape: tuple[int, ...]
    dtype: str


@dataclass
class Node:
    name: str
    op: str                      # ATen op with overload, e.g. "add.Tensor", "gelu.default"
    operands: list[Operand]      # tensor / scalar arguments in schema order
    attrs: dict[str, Any]        # the other schema arguments, by name (defaults filled in)
    shape: tuple[int, ...]
    dtype: str

    @property
    def base(self) -> str:
        """The op without its overload: "add" for "add.Tensor"."""
        return self.op.split(".")[0]


@dataclass
class Graph:
    task: str
    inputs: list[GraphInput]
    nodes: list[Node]
    outputs: list[str]           # names of nodes (or inputs) that forward returns, in order
    constants: dict[str, Any] = field(default_factory=dict)  # python-scalar forward args, by name

    def value(self, name: str) -> GraphInput | Node:
        for v in self.inputs:
            if v.name == name:
                return v
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def ops(self) -> list[str]:
        return [n.op for n in self.nodes]

    def describe(self) -> str:
        lines = [f"graph {self.task}:"]
        for v in self.inputs:
            lines.append(f"  {v.kind} {v.name}: {v.dtype}{list(v.shape)}")
        for n in self.nodes:
            ops = ", ".join(o.name if isinstance(o, Ref) else repr(o) for o in n.operands)
            attrs = "".join(f", {k}={v!r}" for k, v in n.attrs.items())
            lines.append(f"  {n.name}: {n.dtype}{list(n.shape)} = {n.op}({ops}{attrs})")
        lines.append(f"  return {', '.join(self.outputs)}")
        return "\n".join(lines)

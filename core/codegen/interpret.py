"""Run a captured Graph with PyTorch ATen ops on real tensors (CPU): the IR's reference semantics.

Used by tests to prove that capture kept every op, operand, attribute, shape and dtype: the
interpreted graph must reproduce the task's Model on the same inputs. It checks the IR, not the
generated CUDA.
"""
from __future__ import annotations

from typing import Any

import torch

from core.codegen.graph import Graph, Ref
from core.codegen.lower_matmul import CONV, MATMUL
from core.codegen.lower_scatter import SCATTER, interpret_scatter
from core.codegen.pointwise_ops import IOTA

_DTYPE_ATTRS = {"dtype"}


def _attr_value(key: str, value: Any) -> Any:
    if key in _DTYPE_ATTRS and isinstance(value, str):
        return getattr(torch, value)
    if key == "layout" and isinstance(value, str):
        return getattr(torch, value.removeprefix("torch."))
    if key == "memory_format" and isinstance(value, str):
        return getattr(torch, value.removeprefix("torch."))
    if key == "device" and isinstance(value, str):
        return torch.device("cpu")   # the graph was traced on meta; interpret on the CPU
    return value


def interpret(graph: Graph, inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """Evaluate the graph; `inputs` maps every graph input name (forward inputs and weights)."""
    env: dict[str, Any] = dict(inputs)
    for node in graph.nodes:
        if node.op == "getitem":
            env[node.name] = env[node.operands[0].name][node.attrs["index"]]
            continue
        if node.op == IOTA:        # the element's index along a dim (not an ATen op)
            d, shape = int(node.attrs["dim"]) % len(node.shape), tuple(node.shape)
            index = torch.arange(shape[d], dtype=torch.int64)
            env[node.name] = index.view([-1 if k == d else 1 for k in range(len(shape))]).expand(shape)
            continue
        if node.op == MATMUL:      # canonicalize's matrix product on the stored operands
            a, b = (env[o.name] for o in node.operands)
            a = a.transpose(-1, -2) if node.attrs.get("trans_a") else a
            b = b.transpose(-1, -2) if node.attrs.get("trans_b") else b
            env[node.name] = torch.matmul(a, b)
            continue
        if node.op == CONV:        # canonicalize's convolution without its bias
            x, w = (env[o.name] for o in node.operands)
            dims = x.dim() - 2
            env[node.name] = torch.ops.aten.convolution(x, w, None, node.attrs["stride"], node.attrs["padding"],
                                                        node.attrs["dilation"], bool(node.attrs.get("transposed")),
                                                        node.attrs.get("output_padding") or [0] * dims,
                                                        node.attrs["groups"])
            continue
        if node.op == SCATTER:     # canonicalize's index_put / scatter with every tensor an operand
            env[node.name] = interpret_scatter(node, [env[o.name] for o in node.operands])
            continue
        base, _, overload = node.op.partition(".")
        op = getattr(getattr(torch.ops.aten, base), overload)
        schema = op._schema
        operand_iter = iter(node.operands)
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        for arg in schema.arguments:
            if arg.name in node.attrs:
                value = _attr_value(arg.name, node.attrs[arg.name])
                if isinstance(value, list):          # cat's tensors: a list of values
                    value = [env[v.name] if isinstance(v, Ref) else v for v in value]
            else:
                value = next(operand_iter)
                value = env[value.name] if isinstance(value, Ref) else value
                if isinstance(value, (bool, int, float)) and str(arg.type) == "Tensor":
                    # A 0-dim tensor made in forward, captured as a number: a 0-dim tensor again,
                    # which type promotion treats as the number.
                    value = torch.tensor(value)
            if arg.kwarg_only:
                kwargs[arg.name] = value
            else:
                args.append(value)
        env[node.name] = op(*args, **kwargs)
    return [env[name] for name in graph.outputs]

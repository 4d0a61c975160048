"""Capture: trace a task's Model to core ATen with torch.export on meta tensors, into a Graph.

Decomposition: core ATen's table plus the norms (layer, group, batch, instance norm arrive as
var_mean and elementwise ops). Only forward's own outputs are kept (a training-mode BatchNorm's
running-statistics updates are dropped).

No data is drawn and nothing is computed: the model and its inputs live on the meta device, so
capturing a task with multi-GiB inputs is instant. Shapes and dtypes come from the traced
nodes' fake values. Python numbers given to forward are specialised into the graph as constants.
"""
from __future__ import annotations

import operator
import warnings
from typing import Any

import torch
from torch._decomp import get_decompositions

from core.codegen.errors import CodegenError
from core.codegen.graph import Graph, GraphInput, Node, Operand, Ref

# Schema argument types that are operands (values) rather than attributes. Optional tensors print
# as "Optional[Tensor]" (clamp.Tensor's bounds); python numbers print as "number" and stay
# attributes (`other` of add.Scalar, `min` of clamp).
_OPERAND_TYPES = {"Tensor", "Tensor?", "Optional[Tensor]", "Scalar", "Scalar?"}


def decomposition_table() -> Any:
    """Core ATen's decompositions plus the composite norms, so that every norm reaches the
    generators as reductions (var_mean) and elementwise ops. _softmax / _log_softmax stay ops:
    the row family lowers them over the last dim, the partitioner splits them over other dims."""
    aten = torch.ops.aten
    table = torch.export.default_decompositions()
    table.update(get_decompositions([
        aten.native_layer_norm, aten.native_group_norm, aten.native_batch_norm,
        aten._native_batch_norm_legit, aten._native_batch_norm_legit_no_training,
        aten._native_batch_norm_legit_functional,
    ]))
    return table


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _meta_model_and_inputs(task: Any) -> tuple[torch.nn.Module, list]:
    try:
        model = task.make_model(seed=0, device="meta")
    except Exception:
        # An __init__ that needs real data (.item(), numpy): build on the CPU, then drop the data.
        try:
            model = task.make_model(seed=0, device="cpu").to("meta")
        except Exception as exc:
            raise CodegenError(f"Task '{task.name}': could not build Model for capture "
                               f"({type(exc).__name__}: {exc}).", task=task.name) from exc
    try:
        inputs = task.make_inputs(seed=0, device="meta")
    except Exception:
        # get_inputs() that needs real data (.item(), numpy): draw on the CPU, then drop the data.
        inputs = [v.to("meta") if isinstance(v, torch.Tensor) else v
                  for v in task.make_inputs(seed=0, device="cpu")]
    return model, inputs


def export_program(task: Any) -> torch.export.ExportedProgram:
    """torch.export of the task's Model on meta tensors, decomposed to core ATen."""
    model, inputs = _meta_model_and_inputs(task)
    return _export(model, inputs, task.name)


def _export(model: torch.nn.Module, inputs: list, name: str) -> torch.export.ExportedProgram:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exported = torch.export.export(model, tuple(inputs))
            return exported.run_decompositions(decomposition_table())
    except Exception as exc:
        first = str(exc).strip().split("\n")[0][:300]
        raise CodegenError(f"Task '{name}': torch.export could not trace Model.forward to ATen "
                           f"({type(exc).__name__}: {first}). Data-dependent control flow, "
                           f".item() calls and Python-side loops over tensor values cannot be "
                           f"captured.", task=name) from exc


def capture(task: Any) -> Graph:
    """The task's forward as a Graph of ATen nodes with shapes and dtypes (traced on meta)."""
    model, inputs = _meta_model_and_inputs(task)
    scalars = {n: v for n, v in zip(task.input_names, inputs) if not isinstance(v, torch.Tensor)}
    return capture_module(model, inputs, task.name, list(task.input_names), scalars)


def capture_module(model: torch.nn.Module, inputs: list, name: str, input_names: list[str],
                   scalars: dict[str, Any] | None = None) -> Graph:
    """Capture any module on given inputs (meta or real); the graph fixes their shapes."""
    exported = _export(model, inputs, name)
    sig = exported.graph_signature
    names: dict[str, str] = {}       # fx placeholder name -> IR value name
    constants: dict[str, Any] = {}   # fx placeholder name -> fake value of a constant input
    graph_inputs: list[GraphInput] = []
    user_names = iter(input_names)
    for spec in sig.input_specs:
        kind = spec.kind.name
        placeholder = getattr(spec.arg, "name", None)
        if kind == "USER_INPUT":
            forward_name = next(user_names, None) or placeholder
            if placeholder is None:
                continue
            names[placeholder] = forward_name
        elif kind in ("PARAMETER", "BUFFER"):
            names[placeholder] = spec.target
        else:
            raise CodegenError(f"Task '{name}': the traced graph has a {kind.lower()} input "
                               f"'{spec.target}' (a tensor created inside forward or a lifted "
                               f"constant), which code generation does not support yet.", task=name)

    # Only what forward returns: export adds the new values of mutated buffers (running stats of a
    # training-mode BatchNorm) as outputs, which the evaluator does not compare.
    user_outputs = {spec.arg.name for spec in sig.output_specs
                    if spec.kind.name == "USER_OUTPUT" and hasattr(spec.arg, "name")}
    nodes: list[Node] = []
    outputs: list[str] = []
    for fx_node in exported.graph.nodes:
        if fx_node.op == "placeholder":
            val = fx_node.meta.get("val")
            if fx_node.name not in names or not isinstance(val, torch.Tensor):
                constants[fx_node.name] = val
                continue
            kind = "input" if names[fx_node.name] in input_names else "weight"
            graph_inputs.append(GraphInput(names[fx_node.name], kind, tuple(int(s) for s in val.shape),
                                           _dtype_name(val.dtype)))
        elif fx_node.op == "call_function" and _op_name(fx_node.target).startswith("_assert"):
            continue  # metadata assertions export inserts; they compute nothing
        elif fx_node.op == "call_function":
            nodes.append(_node(name, fx_node, names, constants))
            names[fx_node.name] = fx_node.name
        elif fx_node.op == "output":
            for out in fx_node.args[0]:
                if not isinstance(out, torch.fx.Node):
                    raise CodegenError(f"Task '{name}': forward returns a non-tensor value "
                                       f"({out!r}).", task=name)
                if out.name in user_outputs:
                    outputs.append(names[out.name])
        else:
            raise CodegenError(f"Task '{name}': unexpected graph node kind '{fx_node.op}' "
                               f"({fx_node.target}).", task=name)
    return Graph(task=name, inputs=graph_inputs, nodes=nodes, outputs=outputs,
                 constants=dict(scalars or {}))


def _node(task: str, fx_node: torch.fx.Node, names: dict[str, str], constants: dict[str, Any]) -> Node:
    target = fx_node.target
    schema = getattr(target, "_schema", None)
    op = _op_name(target)
    val = fx_node.meta.get("val")
    if target is operator.getitem and isinstance(fx_node.args[0], torch.fx.Node):
        # One result of a multi-output op (max.dim gives values and indices).
        return Node(name=fx_node.name, op="getitem", operands=[Ref(names[fx_node.args[0].name])],
                    attrs={"index": int(fx_node.args[1])}, shape=tuple(int(s) for s in val.shape),
                    dtype=_dtype_name(val.dtype))
    results = list(val) if isinstance(val, (tuple, list)) else [val]
    if schema is None or not results or not all(isinstance(v, torch.Tensor) for v in results):
        raise CodegenError(f"Task '{task}': the traced graph calls '{op}', which is not an "
                           f"ATen op with tensor results; code generation cannot lower it.",
                           task=task, ops=[op])
    operands: list[Operand] = []
    attrs: dict[str, Any] = {}
    for i, arg in enumerate(schema.arguments):
        if not arg.kwarg_only and i < len(fx_node.args):
            value = fx_node.args[i]
        elif arg.name in fx_node.kwargs:
            value = fx_node.kwargs[arg.name]
        elif arg.has_default_value():
            value = arg.default_value
        else:
            value = None
        if str(arg.type) in _OPERAND_TYPES:
            operands.append(_operand(task, value, names, constants, op))
        else:
            attrs[arg.name] = _attr(value, names)
    if len(results) > 1:
        attrs["results"] = [(tuple(int(s) for s in v.shape), _dtype_name(v.dtype)) for v in results]
    return Node(name=fx_node.name, op=op, operands=operands, attrs=attrs,
                shape=tuple(int(s) for s in results[0].shape), dtype=_dtype_name(results[0].dtype))


def _op_name(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return f"{target._schema.name.removeprefix('aten::')}.{target._overloadname}"
    return getattr(target, "__name__", str(target))


def _operand(task: str, value: Any, names: dict[str, str], constants: dict[str, Any], op: str) -> Operand:
    if isinstance(value, torch.fx.Node):
        if value.name in names:
            return Ref(names[value.name])
        raise CodegenError(f"Task '{task}': '{op}' uses '{value.name}', a constant tensor "
                           f"inside the traced graph, which code generation does not support yet.",
                           task=task, ops=[op])
    if value is None or isinstance(value, (bool, int, float)):
        return value
    raise CodegenError(f"Task '{task}': '{op}' has an operand of type {type(value).__name__} "
                       f"({value!r}) that code generation does not support.", task=task, ops=[op])


def _attr(value: Any, names: dict[str, str]) -> Any:
    if isinstance(value, torch.fx.Node):   # a tensor inside a list argument (cat, stack, index)
        return Ref(names.get(value.name, value.name))
    if isinstance(value, torch.dtype):
        return _dtype_name(value)
    if isinstance(value, torch.device):
        return None if value.type == "meta" else str(value)   # traced on meta: the task's device
    if isinstance(value, (torch.layout, torch.memory_format)):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_attr(v, names) for v in value]
    return value

"""generate(task) -> GeneratedProgram: capture the reference, pick a family, lower it.

Families so far: pointwise (a whole elementwise graph fused into one kernel) and rowreduce (one
reduction or softmax over the last dim). A graph with an op that no family lowers raises
CodegenError naming the first such op and the task.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from core.codegen.capture import capture
from core.codegen.errors import CodegenError
from core.codegen.graph import Graph
from core.codegen.lower_pointwise import lower_pointwise
from core.codegen.lower_rowreduce import is_rowreduce, lower_rowreduce
from core.codegen.pointwise_ops import is_pointwise
from core.codegen.schedule import Constraint, ScheduleSpec


@dataclass
class GeneratedProgram:
    program: Any                          # core.program.KernelProgram
    spec: ScheduleSpec                    # knobs + constraints (program.tunables mirrors the knobs)
    family: str
    graph: Graph
    notes: list[str] = field(default_factory=list)

    @property
    def space_constraints(self) -> list[Constraint]:
        """For core.search.ScheduleSpace.from_program(program, task, constraints=...)."""
        return self.spec.constraints


def kernel_name(task_name: str, family: str) -> str:
    name = re.sub(r"\W", "_", task_name)
    if not re.match(r"[A-Za-z_]", name):
        name = "k_" + name
    return f"{name}_{family}"


def generate_from_graph(graph: Graph) -> GeneratedProgram:
    from core.program import KernelProgram

    unsupported = [n for n in graph.nodes if not is_pointwise(n) and not is_rowreduce(n, graph)]
    if unsupported:
        first = unsupported[0]
        others = sorted({n.op for n in unsupported} - {first.op})
        also = f" (also without a lowering: {', '.join(others)})" if others else ""
        raise CodegenError(
            f"Task '{graph.task}': no code generator lowers '{first.op}' (node '{first.name}', "
            f"{first.dtype}{list(first.shape)}){also}. Code generation covers pure elementwise graphs "
            f"(arithmetic, comparisons, where, clamp and the common activations) and a lone "
            f"sum/mean/amax/amin/softmax/log-softmax over the last dim so far; write the kernel "
            f"program by hand or use another solution for this task.",
            task=graph.task, ops=[n.op for n in unsupported])
    reductions = [n for n in graph.nodes if not is_pointwise(n)]
    if not reductions:
        family, lowering = "pointwise", lower_pointwise(graph, kernel_name(graph.task, "pointwise"))
    elif len(graph.nodes) == 1:
        family, lowering = "rowreduce", lower_rowreduce(graph, kernel_name(graph.task, "rowreduce"))
    else:
        raise CodegenError(
            f"Task '{graph.task}': the graph combines the row reduction '{reductions[0].op}' with "
            f"other ops ({', '.join(n.op for n in graph.nodes if n is not reductions[0])}); "
            f"splitting a graph into several fused kernels is not implemented yet.",
            task=graph.task, ops=[n.op for n in graph.nodes])
    program = KernelProgram.from_json(lowering.program)
    return GeneratedProgram(program, lowering.spec, family, graph, lowering.notes)


def generate(task: Any) -> GeneratedProgram:
    """Capture the task's forward and lower it to one KernelProgram with its schedule space."""
    return generate_from_graph(capture(task))

"""Code generation: capture the reference graph, fuse, lower each group with a schedule of knobs.

See docs/codegen.md.
"""
from core.codegen.capture import capture
from core.codegen.errors import CodegenError
from core.codegen.generate import GeneratedProgram, generate, generate_from_graph
from core.codegen.graph import Graph, GraphInput, Node, Ref
from core.codegen.partition import Group, Partition, canonicalize
from core.codegen.schedule import Knob, ScheduleSpec

__all__ = ["CodegenError", "GeneratedProgram", "Graph", "GraphInput", "Group", "Knob", "Node", "Partition", "Ref",
           "ScheduleSpec", "canonicalize", "capture", "generate", "generate_from_graph"]

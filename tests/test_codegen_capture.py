"""Capture: example tasks trace to the expected ATen IR; the IR reproduces the Model on the CPU;
unsupported graphs give clear errors. (These check the IR, not the generated CUDA.)"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from core.codegen import CodegenError, Ref, capture, generate
from core.codegen.capture import capture_module
from core.codegen.interpret import interpret
from core.tasks import load_task, load_task_from_source
from tests.test_codegen_cases import HEADER, POINTWISE_TASKS, SYNTHETIC, load, small_inputs

# A task with an op no generator lowers (every example task is lowered).
UNLOWERED = Path(__file__).resolve().parent / "data" / "unlowered" / "mode_rows.py"


def test_capture_act_gelu_ir():
    g = capture(load("act_gelu"))
    assert [(v.name, v.kind, v.shape, v.dtype) for v in g.inputs] == [("x", "input", (8192, 8192), "float32")]
    assert g.ops() == ["gelu.default"]
    assert g.nodes[0].attrs["approximate"] == "none"
    assert g.outputs == [g.nodes[0].name]


def test_capture_keeps_attributes_and_dtypes():
    g = capture(load("act_gelu_tanh_bf16"))
    assert g.nodes[0].attrs["approximate"] == "tanh" and g.nodes[0].dtype == "bfloat16"
    g = capture(load("act_leaky_relu"))
    assert g.ops() == ["leaky_relu.default"] and g.nodes[0].attrs["negative_slope"] == 0.01
    g = capture(load("act_softplus"))   # decomposed: beta 2, threshold 10 become constants
    assert g.ops() == ["mul.Tensor", "exp.default", "log1p.default", "div.Tensor", "gt.Scalar", "where.self"]
    assert g.nodes[0].operands == [Ref("x"), 2.0] and g.nodes[4].attrs["other"] == 10.0
    assert g.nodes[4].dtype == "bool"


def test_capture_fused_names_weights_by_state_dict_key():
    g = capture(load("fused_bias_gelu_scale_fp16"))
    kinds = {v.name: (v.kind, v.shape, v.dtype) for v in g.inputs}
    assert kinds == {"bias": ("weight", (16384,), "float16"), "x": ("input", (8192, 16384), "float16")}
    assert g.ops() == ["add.Tensor", "gelu.default", "mul.Tensor", "clamp.default"]
    assert g.nodes[0].operands == [Ref("x"), Ref("bias")]
    assert g.nodes[2].operands[1] == 1.7                      # self.scale, a python float: a constant
    assert (g.nodes[3].attrs["min"], g.nodes[3].attrs["max"]) == (-4.0, 4.0)


def test_capture_hardswish_fp16_keeps_explicit_upcast():
    g = capture(load("act_hardswish_fp16"))
    assert g.ops()[0] == "_to_copy.default" and g.nodes[0].attrs["dtype"] == "float32"
    assert g.ops()[-1] == "_to_copy.default" and g.nodes[-1].dtype == "float16"


def test_capture_multi_output_and_python_scalar_input():
    g = capture(load("red_max_lastdim"))
    assert g.ops() == ["max.dim", "getitem", "getitem"]
    assert [g.value(o).dtype for o in g.outputs] == ["float32", "int64"]
    g = capture(load("promote_scalar_fp16"))
    assert g.constants == {"alpha": 0.75}
    assert [v.name for v in g.inputs if v.kind == "weight"] == ["shift"]


@pytest.mark.parametrize("name", POINTWISE_TASKS + sorted(SYNTHETIC) +
                         ["red_sum_dim1", "softmax_lastdim", "red_max_lastdim", "norm_rmsnorm_bf16",
                          "norm_layernorm", "loss_cosine_similarity"])
def test_interpreted_ir_matches_model_on_cpu(name):
    task = load(name)
    model = task.make_model(seed=0, device="cpu")
    inputs = small_inputs(task)
    scalars = {n: v for n, v in zip(task.input_names, inputs) if not isinstance(v, torch.Tensor)}
    graph = capture_module(model, inputs, name, task.input_names, scalars)
    env = {n: v for n, v in zip(task.input_names, inputs) if isinstance(v, torch.Tensor)}
    env.update(model.state_dict())
    with torch.no_grad():
        expected = model(*inputs)
    expected = list(expected) if isinstance(expected, (tuple, list)) else [expected]
    got = interpret(graph, env)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape
        atol, rtol = task.tolerance()
        torch.testing.assert_close(g, e, atol=atol, rtol=rtol, equal_nan=True)


def test_a_shape_that_depends_on_the_data_is_refused_clearly():
    source = HEADER + '''
class Model(nn.Module):
    def forward(self, x):
        return torch.unique(x) * 2.0

def get_inputs():
    return [torch.randint(0, 5, (64,)).float()]

def get_init_inputs():
    return []
'''
    with pytest.raises(CodegenError, match=r"Task 'distinct': '_unique2.default' returns a tensor whose shape depends "
                                           r"on the input's values"):
        generate(load_task_from_source(source, "distinct"))


def test_unsupported_op_message_names_op_and_task():
    # The most frequent value of each row: no family lowers it.
    source = HEADER + '''
class Model(nn.Module):
    def forward(self, x):
        return torch.mode(x, dim=1).values * 2.0

def get_inputs():
    return [torch.randn(300, 64)]

def get_init_inputs():
    return []
'''
    with pytest.raises(CodegenError) as info:
        generate(load_task_from_source(source, "row_mode"))
    text = str(info.value)
    assert "'row_mode'" in text and "'mode.default'" in text and "\n" not in text
    assert info.value.ops == ["mode.default", "getitem"] and info.value.task == "row_mode"
    with pytest.raises(CodegenError) as info:
        generate(load_task(UNLOWERED))
    # The op that computes is named first; the getitem of its values is listed after it.
    assert "no code generator lowers 'mode.default'" in str(info.value)
    assert info.value.ops == ["mode.default", "getitem"]


def test_capture_keeps_forward_outputs_only_and_decomposes_norms():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = torch.nn.BatchNorm2d(4)      # training mode: eager updates the running stats

        def forward(self, x):
            return self.bn(x)

    graph = capture_module(Model(), [torch.randn(2, 4, 3, 3)], "bn_train", ["x"])
    assert len(graph.outputs) == 1 and graph.value(graph.outputs[0]).shape == (2, 4, 3, 3)
    assert "var_mean.correction" in graph.ops() and not any("batch_norm" in op for op in graph.ops())
    model = Model()
    x = torch.randn(2, 4, 3, 3)
    env = {"x": x, **{k: v.clone() for k, v in model.state_dict().items()}}
    expected = model(x)
    torch.testing.assert_close(interpret(graph, env)[0], expected, atol=1e-5, rtol=1e-5)


def test_capture_optional_tensor_arguments_are_operands():
    graph = capture(load("loss_cosine_similarity"))
    clamp = next(n for n in graph.nodes if n.op == "clamp.Tensor")
    assert isinstance(clamp.operands[1], Ref) and clamp.operands[2] is None and "min" not in clamp.attrs
    to_copy = [n for n in capture(load("loss_cross_entropy")).nodes if n.op == "_to_copy.default"]
    assert to_copy and all(n.attrs["device"] is None for n in to_copy)     # traced on meta: no device


def test_untraceable_forward_gives_clear_error():
    source = HEADER + '''
class Model(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x

def get_inputs():
    return [torch.randn(8)]

def get_init_inputs():
    return []
'''
    task = load_task_from_source(source, "data_dependent")
    with pytest.raises(CodegenError, match=r"Task 'data_dependent': torch.export could not trace"):
        capture(task)


SCALAR_TENSORS = HEADER + '''
class Model(nn.Module):
    def forward(self, x):
        m = torch.tensor(0.25, device=x.device, dtype=x.dtype)
        s = torch.tensor(3, dtype=torch.int64).to(x.device)
        return torch.min(torch.maximum(x, m), torch.tensor(0.5)) * s + torch.tensor(2.0) * torch.tensor(1.5)

def get_inputs():
    return [torch.randn(16, 8)]

def get_init_inputs():
    return []
'''


def test_capture_takes_one_value_tensors_made_in_forward_as_numbers():
    """KernelBench writes `torch.min(x, torch.tensor(min_value))`: the 0-dim tensor (made on the CPU,
    or on x's device, which is meta while capturing) reaches the IR as a python number, and nodes
    of such constants alone (clone, .to(), 2.0 * 1.5) are evaluated during capture."""
    task = load_task_from_source(SCALAR_TENSORS, "scalar_tensors")
    g = capture(task)
    assert [v.name for v in g.inputs] == ["x"]
    assert g.ops() == ["maximum.default", "minimum.default", "mul.Tensor", "add.Tensor"]
    assert [n.operands[1] for n in g.nodes] == [0.25, 0.5, 3, 3.0]
    x = torch.randn(16, 8)
    (out,) = interpret(g, {"x": x})
    torch.testing.assert_close(out, task.make_model(0)(x), rtol=0, atol=0)
    assert out.dtype == torch.float32


def test_larger_tensor_made_in_forward_gives_clear_error():
    source = SCALAR_TENSORS.replace("torch.tensor(0.25, device=x.device, dtype=x.dtype)",
                                    "torch.tensor([0.25] * 8, device=x.device, dtype=x.dtype)")
    with pytest.raises(CodegenError, match=r"constant_tensor input 'lifted_tensor_0' of shape \[8\].*one value"):
        capture(load_task_from_source(source, "vector_constant"))

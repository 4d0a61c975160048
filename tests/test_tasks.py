"""core.tasks: the KernelBench-format loader, Task factories, suites and the example tasks (CPU only)."""

from __future__ import annotations

import gc
import hashlib
import inspect
import pickle
import random
import re
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from core.tasks import (
    SuiteError,
    SuiteResult,
    Task,
    TaskError,
    TensorSpec,
    load_suite,
    load_task,
    load_task_from_source,
    scan_suite,
)

ROOT = Path(__file__).resolve().parent.parent
BAD = ROOT / "tests" / "data" / "bad_tasks"
EXAMPLES = ROOT / "resources" / "tasks"

GOOD_SOURCE = '''# family: fused  minimum bytes: 1234  flops: 5_678
"""Linear, batch norm and GELU, scaled by a python number; also returns an argmax."""
from dataclasses import dataclass

import numpy as np
import random
import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Config:  # needs the module in sys.modules while the file executes
    features: int = 32


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.bn = nn.BatchNorm1d(out_features)

    def forward(self, x, scale):
        y = F.gelu(self.bn(self.linear(x))) * scale
        return y, y.argmax(dim=1)


def get_inputs():
    noise = torch.from_numpy(np.random.rand(8, 16).astype("float32")).mean() * random.random()
    return [torch.randn(8, 16) + noise, 0.5]


def get_init_inputs():
    return [16, Config().features]
'''


def small_task(body: str, inputs: str = "[torch.randn(4, 8)]", init: str = "[]",
               name: str = "small") -> Task:
    source = f"""import torch
import torch.nn as nn


class Model(nn.Module):
{body}


def get_inputs():
    return {inputs}


def get_init_inputs():
    return {init}
"""
    return load_task_from_source(source, name)


IDENTITY_BODY = "    def forward(self, x):\n        return x"


# ---- malformed files ----------------------------------------------------------------------------

BAD_CASES = {
    "syntax_error.py": ["syntax error", "line 9", "def forward(self x)"],
    "missing_names.py": ["missing Model, get_init_inputs"],
    "module_raises.py": ["executed", "ModuleNotFoundError", "no_such_module_for_cuda_agent_tests",
                         "line 4"],
    "model_not_module.py": ["Model", "function", "torch.nn.Module"],
    "get_inputs_raises.py": ["get_inputs()", "raised", "ValueError",
                             "input factory is broken on purpose", "line 12"],
    "get_init_inputs_raises.py": ["get_init_inputs()", "raised", "ZeroDivisionError"],
    "get_inputs_not_list.py": ["get_inputs()", "returned a Tensor", "float32[4, 4]", "list"],
    "get_init_inputs_not_list.py": ["get_init_inputs()", "returned an int", "list"],
    "get_inputs_no_tensor.py": ["get_inputs()", "no tensor", "int, float"],
    "model_init_fails.py": ["could not build Model", "[-8]", "ValueError",
                            "features must be positive", "line 10"],
    "forward_fails.py": ["forward", "failed", "x: float32[4, 8]", "RuntimeError",
                         "mat1 and mat2 shapes cannot be multiplied", "line 12"],
    "wrong_arity.py": ["3 values", "forward(x)"],
    "output_not_tensor.py": ["returned a dict", "tensor or a tuple/list of tensors"],
    "output_tuple_mixed.py": ["tuple of (Tensor, float)", "tensor or a tuple/list of tensors"],
}


def test_every_bad_file_has_a_case():
    assert {p.name for p in BAD.glob("*.py")} == set(BAD_CASES)


@pytest.mark.parametrize("file_name", sorted(BAD_CASES))
def test_bad_task_gives_one_clear_paragraph(file_name):
    path = BAD / file_name
    with pytest.raises(TaskError) as info:
        load_task(path)
    message = str(info.value)
    assert message.startswith(f"Task file '{path}'")
    for fragment in BAD_CASES[file_name]:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert "\n" not in message and "Traceback" not in message
    assert info.value.path == path and info.value.name == path.stem


def test_missing_names_lists_only_the_missing_ones():
    with pytest.raises(TaskError) as info:
        load_task(BAD / "missing_names.py")
    assert "get_inputs," not in str(info.value) and "get_inputs " not in str(info.value)


def test_missing_file(tmp_path):
    path = tmp_path / "nope.py"
    with pytest.raises(TaskError, match=r"nope\.py' does not exist"):
        load_task(path)


def test_not_a_py_file(tmp_path):
    path = tmp_path / "task.txt"
    path.write_text((BAD.parent.parent.parent / "resources/tasks/act_gelu.py").read_text())
    with pytest.raises(TaskError, match=r"task\.txt' is not a \.py file"):
        load_task(path)


def test_directory_is_not_a_task(tmp_path):
    folder = tmp_path / "folder.py"
    folder.mkdir()
    with pytest.raises(TaskError, match="is not a file"):
        load_task(folder)


def test_not_utf8(tmp_path):
    path = tmp_path / "latin.py"
    path.write_bytes(b"# caf\xe9\nimport torch\n")
    with pytest.raises(TaskError, match="not valid UTF-8"):
        load_task(path)


def test_source_errors_name_the_task():
    with pytest.raises(TaskError) as info:
        load_task_from_source("def broken(:\n    pass\n", "my_op")
    message = str(info.value)
    assert message.startswith("Task 'my_op' (given as source text) has a syntax error at line 1")
    assert info.value.path is None


def test_null_bytes_are_a_task_error():
    with pytest.raises(TaskError, match="cannot be compiled"):
        load_task_from_source("x = 1\0\n", "nul")


def test_long_exception_text_is_cut():
    body = "    def forward(self, x):\n        raise RuntimeError('w' * 5000)"
    with pytest.raises(TaskError) as info:
        small_task(body)
    message = str(info.value)
    assert len(message) < 700 and "wwwwwww..." in message


def test_failed_load_leaves_no_module_behind():
    before = set(sys.modules)
    with pytest.raises(TaskError):
        small_task("    def forward(self, x):\n        return 3")
    assert {m for m in set(sys.modules) - before if m.startswith("cuda_agent_task_")} == set()


# ---- a good task ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def good() -> Task:
    return load_task_from_source(GOOD_SOURCE, "good_op", path="somewhere/good_op.py")


def test_specs(good):
    assert good.name == "good_op"
    assert good.path == Path("somewhere/good_op.py")
    assert good.source == GOOD_SOURCE
    assert good.hash == hashlib.sha256(GOOD_SOURCE.encode()).hexdigest()
    assert good.input_names == ["x", "scale"]
    assert good.input_specs == [TensorSpec((8, 16), "float32"), None]
    assert good.output_specs == [TensorSpec((8, 32), "float32"), TensorSpec((8,), "int64")]
    assert list(good.param_specs) == ["linear.weight", "linear.bias", "bn.weight", "bn.bias",
                                      "bn.running_mean", "bn.running_var",
                                      "bn.num_batches_tracked"]
    assert good.param_specs["linear.weight"] == TensorSpec((32, 16), "float32")
    assert good.param_specs["bn.num_batches_tracked"] == TensorSpec((), "int64")
    assert good.init_inputs == [16, 32]
    assert good.specs_from == "meta"
    assert good.description.startswith("Linear, batch norm and GELU")
    assert (good.family, good.min_bytes, good.flops) == ("fused", 1234, 5678)


def test_tensor_spec_helpers():
    spec = TensorSpec((4, 3), "bfloat16")
    assert spec.numel == 12 and spec.itemsize == 2 and spec.nbytes == 24
    assert spec.torch_dtype is torch.bfloat16
    assert str(spec) == "bfloat16[4, 3]"
    assert TensorSpec.of(torch.zeros(2, 5, dtype=torch.int64)) == TensorSpec((2, 5), "int64")


def test_io_bytes(good):
    params = (32 * 16 + 32 + 4 * 32) * 4 + 8
    assert good.io_bytes() == 8 * 16 * 4 + params + 8 * 32 * 4 + 8 * 8


def test_no_header_means_none():
    task = small_task(IDENTITY_BODY)
    assert (task.family, task.min_bytes, task.flops, task.description) == (None, None, None, "")


def test_make_inputs_is_deterministic_per_seed(good):
    a, b, c = good.make_inputs(1), good.make_inputs(1), good.make_inputs(2)
    assert torch.equal(a[0], b[0])
    assert not torch.equal(a[0], c[0])
    assert a[1] == 0.5 and isinstance(a[1], float)  # python scalars stay as they are


def test_make_inputs_uses_the_default_device_and_moves_strays():
    task = small_task("    def forward(self, x, y):\n        return x + y",
                      inputs="[torch.randn(4, 8), torch.randn(4, 8, device='cpu')]")
    x, y = task.make_inputs(0, "meta")
    assert x.device.type == "meta" and y.device.type == "meta"
    x, y = task.make_inputs(0, torch.device("cpu"))
    assert x.device.type == "cpu" and not torch.equal(x, y)


def test_make_inputs_error_is_a_task_error():
    # .item() cannot run on meta tensors: the loader drew on the CPU, make_inputs(meta) fails.
    task = small_task(IDENTITY_BODY, inputs="[torch.randn(4, 8) + torch.randn(1).item()]")
    with pytest.raises(TaskError, match=r"get_inputs\(\) on device 'meta' failed"):
        task.make_inputs(0, "meta")


def test_out_of_memory_is_not_wrapped_as_a_task_error(monkeypatch):
    # The evaluator's judge and runner make room and draw again on torch.OutOfMemoryError; a
    # TaskError around it made that path unreachable for a set drawn inside get_inputs().
    task = small_task(IDENTITY_BODY)

    def out_of_memory(*args):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(task.module, "get_inputs", out_of_memory)
    with pytest.raises(torch.OutOfMemoryError):
        task.make_inputs(0)
    monkeypatch.setattr(task.module, "Model", out_of_memory)
    with pytest.raises(torch.OutOfMemoryError):
        task.make_model(0)


def test_make_model_is_deterministic_per_seed(good):
    a, b, c = good.make_model(7), good.make_model(7), good.make_model(8)
    assert a.training  # eval() is not forced
    for key, value in a.state_dict().items():
        assert torch.equal(value, b.state_dict()[key])
    assert not torch.equal(a.linear.weight, c.linear.weight)
    meta = good.make_model(7, "meta")
    assert meta.linear.weight.device.type == "meta"


def test_make_model_does_not_share_init_inputs():
    body = """    def __init__(self, w):
        super().__init__()
        w.mul_(0)
        self.w = nn.Parameter(w)

    def forward(self, x):
        return x * self.w"""
    task = small_task(body, init="[torch.ones(8)]")
    task.make_model(0)
    assert torch.equal(task.init_inputs[0], torch.ones(8))


def test_model_and_inputs_run_together(good):
    model = good.make_model(0)
    y, idx = model(*good.make_inputs(0))
    assert TensorSpec.of(y) == good.output_specs[0] and TensorSpec.of(idx) == good.output_specs[1]


def test_loading_keeps_global_rng_streams(good):
    torch.manual_seed(3), random.seed(3), np.random.seed(3)
    expected = (torch.rand(2), random.random(), np.random.rand())
    torch.manual_seed(3), random.seed(3), np.random.seed(3)
    load_task_from_source(GOOD_SOURCE, "again")
    assert torch.equal(torch.rand(2), expected[0])
    assert random.random() == expected[1] and np.random.rand() == expected[2]


def test_meta_path_does_not_run_the_real_forward_or_draw_on_cpu():
    source = """import torch
import torch.nn as nn

SEEN = []


class Model(nn.Module):
    def forward(self, x):
        SEEN.append(("forward", x.device.type))
        return x.sum(0)


def get_inputs():
    x = torch.randn(4, 8)
    SEEN.append(("draw", x.device.type))
    return [x]


def get_init_inputs():
    return []
"""
    task = load_task_from_source(source, "watched")
    assert task.module.SEEN == [("draw", "meta"), ("forward", "meta")]
    assert task.output_specs == [TensorSpec((8,), "float32")]


def test_falls_back_to_cpu_when_meta_cannot_run():
    # nonzero() has a data-dependent shape: meta cannot know it, a real run can.
    body = "    def forward(self, x):\n        return torch.nonzero(x > 0.5)"
    task = small_task(body, inputs="[torch.arange(10.0).reshape(2, 5) / 10]")
    assert task.specs_from == "cpu"
    assert task.output_specs == [TensorSpec((4, 2), "int64")]


def test_get_inputs_needing_real_data_falls_back_to_cpu():
    task = small_task(IDENTITY_BODY, inputs="[torch.randn(int(torch.tensor(3).item()), 2)]")
    assert task.input_specs == [TensorSpec((3, 2), "float32")]


def test_input_names_for_varargs():
    body = "    def forward(self, *xs):\n        return torch.stack(xs)"
    task = small_task(body, inputs="[torch.randn(3), torch.randn(3)]")
    assert task.input_names == ["xs0", "xs1"]
    assert task.output_specs == [TensorSpec((2, 3), "float32")]


@pytest.mark.parametrize("ret, expected", [
    ("x", (1e-4, 1e-4)),
    ("x.half()", (1e-2, 1e-2)),
    ("x.bfloat16()", (1e-2, 1e-2)),
    ("x.double()", (1e-7, 1e-7)),
    ("x.long()", (0.0, 0.0)),
    ("x > 0", (0.0, 0.0)),
    ("(x.long(), x.double())", (1e-7, 1e-7)),
    ("(x.double(), x.half())", (1e-2, 1e-2)),  # the loosest wins
])
def test_tolerance_from_output_dtypes(ret, expected):
    task = small_task(f"    def forward(self, x):\n        return {ret}")
    assert task.tolerance() == expected


def test_same_name_tasks_do_not_clash():
    a = small_task("    def forward(self, x):\n        return x * 2", name="twin")
    b = small_task("    def forward(self, x):\n        return x.sum()", name="twin")
    assert a.module.__name__ != b.module.__name__
    assert a.module.Model is not b.module.Model
    x = torch.ones(4, 8)
    assert a.make_model(0)(x).shape == (4, 8) and b.make_model(0)(x).shape == ()
    assert sys.modules[a.module.__name__] is a.module


def test_module_is_forgotten_with_its_task():
    task = small_task(IDENTITY_BODY, name="short_lived")
    module_name = task.module.__name__
    assert module_name in sys.modules
    del task
    gc.collect()
    assert module_name not in sys.modules


def test_objects_defined_in_a_task_pickle(good):
    config = good.module.Config(features=3)
    assert pickle.loads(pickle.dumps(config)) == config


def test_task_pickles_as_its_source(good):
    clone = pickle.loads(pickle.dumps(good))
    assert clone.hash == good.hash and clone.name == good.name and clone.path == good.path
    assert clone.output_specs == good.output_specs and clone.module is not good.module


def test_describe(good):
    text = good.describe()
    assert text.splitlines()[0] == "good_op  (fused)"
    for fragment in ["x: float32[8, 16]", "scale: scalar", "output[1]: int64[8]",
                     "linear.weight: float32[32, 16]", "and 1 more", "[16, 32]",
                     "atol 0.0001, rtol 0.0001"]:
        assert fragment in text, fragment


def test_tracebacks_show_source_lines_of_source_only_tasks(good):
    assert "class Model" in inspect.getsource(good.module.Model)


# ---- suites -------------------------------------------------------------------------------------

def _write(folder: Path, name: str, source: str) -> Path:
    path = folder / name
    path.write_text(source)
    return path


def test_load_suite_sorted(tmp_path):
    _write(tmp_path, "b_task.py", GOOD_SOURCE)
    _write(tmp_path, "a_task.py", GOOD_SOURCE)
    _write(tmp_path, "notes.md", "not a task")
    tasks = load_suite(tmp_path)
    assert [t.name for t in tasks] == ["a_task", "b_task"]
    assert tasks[0].path == tmp_path / "a_task.py"


def test_load_suite_lists_every_failure(tmp_path):
    _write(tmp_path, "good.py", GOOD_SOURCE)
    _write(tmp_path, "bad_one.py", (BAD / "forward_fails.py").read_text())
    _write(tmp_path, "bad_two.py", "def (:\n")
    with pytest.raises(SuiteError) as info:
        load_suite(tmp_path)
    message = str(info.value)
    assert isinstance(info.value, TaskError)
    assert "2 of 3 task files failed" in message
    assert "[bad_one.py]" in message and "mat1 and mat2" in message
    assert "[bad_two.py]" in message and "syntax error" in message
    result = info.value.result
    assert [t.name for t in result.tasks] == ["good"]


def test_scan_suite_keeps_good_and_bad(tmp_path):
    _write(tmp_path, "good.py", GOOD_SOURCE)
    bad = _write(tmp_path, "bad.py", "import torch\n")
    result = scan_suite(tmp_path)
    assert isinstance(result, SuiteResult) and not result.ok
    assert [t.name for t in result.tasks] == ["good"]
    assert list(result.errors) == [bad] and "missing Model" in str(result.errors[bad])


def test_scan_suite_of_the_bad_folder_reports_every_file():
    result = scan_suite(BAD)
    assert result.tasks == []
    assert sorted(p.name for p in result.errors) == sorted(BAD_CASES)


def test_suite_folder_errors(tmp_path):
    with pytest.raises(TaskError, match="does not exist or is not a directory"):
        load_suite(tmp_path / "missing")
    with pytest.raises(TaskError, match="contains no .py task files"):
        load_suite(tmp_path)
    assert scan_suite(tmp_path).tasks == [] and scan_suite(tmp_path).ok


# ---- the example tasks --------------------------------------------------------------------------

PREFIX_FAMILY = {"act": "activation", "red": "reduction", "softmax": "softmax", "norm": "norm",
                 "scan": "scan", "loss": "loss", "pool": "pool", "mm": "matmul", "conv": "conv",
                 "fused": "fused"}
GEMM_TFLOPS = {"float32": 51.2, "float16": 800.0, "bfloat16": 800.0}
COPY_BYTES_PER_S = 4.27e12


@pytest.fixture(scope="module")
def examples() -> list[Task]:
    load_task(EXAMPLES / "act_gelu.py")  # torch imports its meta machinery lazily, once
    return load_suite(EXAMPLES)


def test_examples_load_fast_on_the_meta_path(examples):
    assert len(examples) >= 30
    slowest = 0.0
    for task in examples:
        start = time.perf_counter()
        load_task(task.path)
        slowest = max(slowest, time.perf_counter() - start)
        assert task.specs_from == "meta", task.name
    assert slowest < 1.0


def test_examples_cover_every_family(examples):
    families = {t.family for t in examples}
    assert families == set(PREFIX_FAMILY.values())
    for task in examples:
        assert re.fullmatch(r"[a-z0-9_]+", task.name)
        assert PREFIX_FAMILY[task.name.split("_")[0]] == task.family, task.name
        assert task.description, task.name
    dtypes = {s.dtype for t in examples for s in t.output_specs}
    assert {"float32", "float16", "bfloat16", "int64"} <= dtypes
    for required in ["act_gelu", "act_silu_bf16", "act_mish", "act_softplus", "act_hardswish_fp16",
                     "act_leaky_relu", "red_argmax_dim1", "red_var_dim1", "red_l2norm_dim1",
                     "softmax_lastdim", "softmax_log_lastdim", "norm_layernorm",
                     "norm_rmsnorm_bf16", "norm_batchnorm2d_eval", "norm_batchnorm2d_train",
                     "norm_groupnorm", "norm_instancenorm2d", "scan_cumsum", "scan_cumprod",
                     "scan_cumsum_reverse", "scan_masked_cumsum", "loss_cross_entropy",
                     "loss_mse", "loss_smooth_l1", "loss_kl_div", "loss_cosine_similarity",
                     "loss_triplet_margin", "pool_max1d", "pool_avg2d", "pool_max3d",
                     "mm_square", "mm_tall_skinny", "mm_batched", "mm_transposed_b", "mm_matvec",
                     "mm_fp16", "mm_bf16_rect", "conv_2d", "conv_depthwise2d", "conv_1d",
                     "conv_3d", "conv_transpose2d", "fused_linear_gelu_scale",
                     "fused_conv_bn_relu", "fused_matmul_bias_residual_relu"]:
        assert required in {t.name for t in examples}, required


def test_example_headers_and_sizing(examples):
    for task in examples:
        assert task.min_bytes == task.io_bytes(), task.name
        assert task.flops and task.flops > 0, task.name
        dtype = next(s.dtype for s in task.input_specs if s is not None and s.dtype in GEMM_TFLOPS)
        memory_s = task.min_bytes / COPY_BYTES_PER_S
        compute_s = task.flops / (GEMM_TFLOPS[dtype] * 1e12)
        assert max(memory_s, compute_s) >= 50e-6, task.name
        assert task.min_bytes >= 2.5e8 or compute_s >= 100e-6, task.name
        in_out = sum(s.nbytes for s in task.input_specs + task.output_specs if s is not None)
        assert in_out <= 1.5e9, task.name


def test_example_flops_match_a_counter_for_gemms_and_convs(examples):
    for task in examples:
        model, inputs = task.make_model(0, "meta"), task.make_inputs(0, "meta")
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            model(*inputs)
        counted = counter.get_total_flops()
        if counted:
            assert counted <= task.flops <= 1.15 * counted, task.name


def test_example_inputs_are_random_and_device_free(examples):
    for task in examples:
        draw = inspect.getsource(task.module.get_inputs)
        assert "device" not in draw, task.name
        assert re.search(r"torch\.rand(n|int)?\(", draw), task.name
        assert not re.search(r"torch\.(zeros|ones|empty|full)\(", draw), task.name


def test_cross_entropy_targets_are_valid_classes(examples):
    task = next(t for t in examples if t.name == "loss_cross_entropy")
    logits, targets = task.make_inputs(0)
    assert targets.dtype == torch.int64
    assert 0 <= int(targets.min()) and int(targets.max()) < logits.shape[1]
    assert float(logits.std()) > 1.0


def test_readme_lists_every_example(examples):
    readme = (EXAMPLES / "README.md").read_text()
    for task in examples:
        assert f"| `{task.name}` | {task.family} |" in readme, task.name

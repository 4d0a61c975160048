"""The scatter family (core/codegen/lower_scatter.py): index_put (assignment and accumulation, one or
several index tensors, adjacent or not, negative indices, broadcast values), Tensor.index_add /
index_copy / index_fill / index_reduce, scatter_add, scatter_reduce (sum, prod, mean, amax, amin, with and without self), scatter of a
tensor and of a value, one-hot by scatter, F.fold (also of F.unfold), F.max_unpool1d / 2d and nn.EmbeddingBag (sum, mean,
per-sample weights, the last offset included, padding_idx, 2-D input, fp16), over fp32, fp64, fp16, bf16,
int64 and int32. Each case generates a scatter group, and its CUDA matches the Model under the fuzz
harness's CPU emulation (AddressSanitizer on; the threads of a block run concurrently, so the atomics
are exercised) at the default and a random legal schedule. The sources compile with NVRTC for sm_80
and sm_90. The GPU runs them against PyTorch's CUDA kernels in tests/gpu/test_codegen_cases_gpu.py."""
from __future__ import annotations

import pytest
import torch

from core.codegen import CodegenError, generate
from core.codegen.capture import capture_module
from core.codegen.interpret import interpret
from core.codegen.partition import canonicalize
from core.tasks import load_task_from_source
from core.toolchain import nvrtc_info
from tests.test_codegen_fuzz import GXX
from tests.test_codegen_kernelbench_style import _task as T
from tests.test_codegen_kernelbench_style import compile_cases, emulate_cases

# Indices a store (no reduction) reads are unique where they meet (PyTorch leaves the winner open).
PERM_ROWS = "torch.argsort(torch.rand(8, 50), dim=1)[:, :20]"
CASES = {
    "index_add_rows": T(["return y.index_add(0, i, x)"],
                        "[torch.randn(100, 16), torch.randint(0, 30, (100,)), torch.randn(30, 16)]", args="x, i, y"),
    "index_add_alpha_dim1_fp16": T(["return y.index_add(1, i, x, alpha=0.5)"],
                                   "[torch.randn(6, 40).half(), torch.randint(0, 9, (40,)), torch.randn(6, 9).half()]",
                                   args="x, i, y"),
    "index_put_accumulate_two_indices": T(["return y.index_put((i, j), v, accumulate=True)"],
                                          "[torch.randn(20, 7), torch.randint(-20, 20, (50,)), "
                                          "torch.randint(0, 7, (50,)), torch.randn(50)]", args="y, i, j, v"),
    "index_put_broadcast_value_non_adjacent": T(["y = y.clone()", "y[i, :, j] += v", "return y"],
                                                "[torch.randn(9, 5, 11), torch.randint(0, 9, (4, 3)), "
                                                "torch.randint(0, 11, (3,)), torch.randn(5)]", args="y, i, j, v"),
    "index_assign_rows": T(["y = y.clone()", "y[i] = x * 2", "return y"],
                           "[torch.randn(10, 32), torch.randperm(64)[:10], torch.randn(64, 32)]", args="x, i, y"),
    "index_put_int64": T(["return y.index_put((i,), x, accumulate=True)"],
                         "[torch.randint(-50, 50, (40, 3)), torch.randint(0, 12, (40,)), torch.randint(-9, 9, (12, 3))]",
                         args="x, i, y"),
    "scatter_add_rows": T(["return y.scatter_add(1, i, x)"],
                          "[torch.randn(8, 100), torch.randint(0, 50, (8, 100)), torch.randn(8, 50)]", args="x, i, y"),
    "scatter_add_src_larger_dim0_double": T(["return y.scatter_add(0, i, x)"],
                                            "[torch.randn(30, 9).double(), torch.randint(0, 7, (20, 5)), "
                                            "torch.randn(7, 6).double()]", args="x, i, y"),
    "scatter_reduce_amax_without_self": T(["return y.scatter_reduce(1, i, x, 'amax', include_self=False)"],
                                          "[torch.randn(8, 100), torch.randint(0, 60, (8, 100)), torch.randn(8, 60)]",
                                          args="x, i, y"),
    "scatter_reduce_amin_bf16": T(["return y.scatter_reduce(0, i, x, 'amin')"],
                                  "[torch.randn(40, 6).bfloat16(), torch.randint(0, 10, (40, 6)), "
                                  "torch.randn(10, 6).bfloat16()]", args="x, i, y"),
    "scatter_reduce_mean": T(["return y.scatter_reduce(1, i, x, 'mean')"],
                             "[torch.randn(4, 64), torch.randint(0, 20, (4, 64)), torch.randn(4, 20)]", args="x, i, y"),
    "scatter_reduce_mean_without_self": T(["return y.scatter_reduce(1, i, x, 'mean', include_self=False)"],
                                          "[torch.randn(4, 30), torch.randint(0, 40, (4, 30)), torch.randn(4, 40)]",
                                          args="x, i, y"),
    "scatter_reduce_mean_int": T(["return y.scatter_reduce(1, i, x, 'mean', include_self=False)"],
                                 "[torch.randint(-100, 100, (4, 30)), torch.randint(0, 12, (4, 30)), "
                                 "torch.randint(-100, 100, (4, 12))]", args="x, i, y"),
    "scatter_reduce_prod": T(["return y.scatter_reduce(1, i, x, 'prod')"],
                             "[torch.rand(4, 30) + 0.5, torch.randint(0, 12, (4, 30)), torch.randn(4, 12)]",
                             args="x, i, y"),
    "scatter_reduce_sum_int32": T(["return y.scatter_reduce(1, i, x, 'sum', include_self=False)"],
                                  "[torch.randint(-9, 9, (5, 30), dtype=torch.int32), torch.randint(0, 40, (5, 30)), "
                                  "torch.randint(-9, 9, (5, 40), dtype=torch.int32)]", args="x, i, y"),
    "scatter_src_rows": T(["return y.scatter(1, i, x)"], f"[torch.randn(8, 30), {PERM_ROWS}, torch.randn(8, 50)]",
                          args="x, i, y"),
    "scatter_value": T(["return y.scatter(1, i, 2.5)"], f"[{PERM_ROWS}, torch.randn(8, 50)]", args="i, y"),
    "one_hot_by_scatter": T(["return torch.zeros_like(x).scatter(1, t.unsqueeze(1), 1.0)"],
                            "[torch.randn(64, 10), torch.randint(0, 10, (64,))]", args="x, t"),
    "index_copy": T(["return y.index_copy(0, i, x)"], "[torch.randn(10, 16), torch.randperm(30)[:10], torch.randn(30, 16)]",
                    args="x, i, y"),
    "index_fill_dim1": T(["return y.index_fill(1, i, -1.5)"], "[torch.randn(30, 16), torch.randperm(16)[:5]]", args="y, i"),
    "index_reduce_amax": T(["return y.index_reduce(0, i, x, 'amax')"],
                           "[torch.randn(40, 6), torch.randint(0, 12, (40,)), torch.randn(12, 6)]", args="x, i, y"),
    "index_reduce_mean_dim1_without_self": T(["return y.index_reduce(1, i, x, 'mean', include_self=False)"],
                                             "[torch.randn(3, 40), torch.randint(0, 20, (40,)), torch.randn(3, 20)]",
                                             args="x, i, y"),
    "index_reduce_prod_int": T(["return y.index_reduce(0, i, x, 'prod')"],
                               "[torch.randint(-3, 4, (30, 4)), torch.randint(0, 9, (30,)), torch.randint(-3, 4, (9, 4))]",
                               args="x, i, y"),
    "max_unpool1d": T(["v, i = F.max_pool1d(x, 2, return_indices=True)", "return F.max_unpool1d(v, i, 2)"],
                      "[torch.randn(4, 8, 20)]"),
    "fold_of_unfold": T(["return F.fold(F.unfold(x, 3, padding=1), (12, 12), 3, padding=1)"], "[torch.randn(2, 4, 12, 12)]"),
    # nn.EmbeddingBag: index_select, then an index_add into the bags (capture's decomposition).
    "embedding_bag_sum_offsets": T(["return self.bag(i, o)"], "[torch.randint(0, 50, (40,)), torch.tensor([0, 7, 7, 30])]",
                                   ["self.bag = nn.EmbeddingBag(50, 16, mode='sum')"], args="i, o"),
    "embedding_bag_mean_2d": T(["return self.bag(i)"], "[torch.randint(0, 50, (6, 5))]",
                               ["self.bag = nn.EmbeddingBag(50, 12, mode='mean')"], args="i"),
    "embedding_bag_weighted_last_offset": T(["return self.bag(i, o, per_sample_weights=w)"],
                                            "[torch.randint(0, 30, (20,)), torch.tensor([0, 3, 20]), torch.rand(20)]",
                                            ["self.bag = nn.EmbeddingBag(30, 8, mode='sum', include_last_offset=True)"],
                                            args="i, o, w"),
    "embedding_bag_mean_padding_fp16": T(["return self.bag(i, o)"],
                                         "[torch.randint(0, 4, (30,)), torch.tensor([0, 2, 10])]",
                                         ["self.bag = nn.EmbeddingBag(20, 8, mode='mean', padding_idx=1).half()"],
                                         args="i, o"),
    # Around other groups: a transposed self, sliced indices, an expanded source, a softmax after,
    # two scatters in a row.
    "index_add_to_transposed": T(["return y.t().index_add(0, i, x)"],
                                 "[torch.randn(5, 6), torch.randint(0, 8, (5,)), torch.randn(6, 8)]", args="x, i, y"),
    "index_add_sliced": T(["return y.index_add(0, i[::2], x[::2])"],
                          "[torch.randn(10, 4), torch.randint(0, 7, (10,)), torch.randn(7, 4)]", args="x, i, y"),
    "scatter_add_expanded_source": T(["return y.scatter_add(1, i, x.expand(4, 9))"],
                                     "[torch.randn(1, 9), torch.randint(0, 5, (4, 9)), torch.randn(4, 5)]", args="x, i, y"),
    "scatter_add_then_softmax": T(["return torch.softmax(y.scatter_add(1, i, x), -1)"],
                                  "[torch.randn(4, 9), torch.randint(0, 5, (4, 9)), torch.randn(4, 5)]", args="x, i, y"),
    "two_index_adds": T(["a = y.index_add(0, i, x)", "return a.index_add(0, i, x * 2)"],
                        "[torch.randn(6, 3), torch.randint(0, 4, (6,)), torch.randn(4, 3)]", args="x, i, y"),
    "fold_col2im": T(["return F.fold(x, (7, 9), (3, 2), stride=(2, 1), padding=1)"], "[torch.randn(2, 18, 40)]"),
    "max_unpool2d": T(["v, i = F.max_pool2d(x, 2, return_indices=True)", "return F.max_unpool2d(torch.relu(v), i, 2)"],
                      "[torch.randn(2, 3, 10, 12)]"),
}


@pytest.mark.skipif(GXX is None, reason="no host C++ compiler")
@pytest.mark.timeout(900)
def test_scatters_generate_and_match_the_model(monkeypatch):
    for name in CASES:
        gen = generate(load_task_from_source(CASES[name], name))
        assert "scatter" in [g.family for g in gen.groups], (name, [g.family for g in gen.groups])
    outcomes = emulate_cases(CASES, 23, monkeypatch)
    assert all(o.runs == 2 for o in outcomes), [(o.case.name, o.runs) for o in outcomes]


@pytest.mark.skipif(not nvrtc_info()[0], reason="NVRTC is not available")
def test_scatters_compile_for_sm80_and_sm90(tmp_path_factory):
    compile_cases(CASES, tmp_path_factory.getbasetemp() / "scatter-cache")


class _IndexAdd(torch.nn.Module):
    def forward(self, x, i, y):
        return y.index_add(0, i, x) * 2


def test_canonical_scatter_node_keeps_every_tensor_an_operand_and_interprets_as_aten():
    x, i, y = torch.randn(12, 4), torch.randint(0, 5, (12,)), torch.randn(5, 4)
    graph = canonicalize(capture_module(_IndexAdd(), [x, i, y], "ia", ["x", "i", "y"]))
    node = next(n for n in graph.nodes if n.op == "ca_scatter.default")
    assert [o.name for o in node.operands] == ["y", "x", "i"] and node.attrs["reduce"] == "sum"
    assert node.attrs["mode"] == "index" and node.attrs["rshape"] == [12, 4]
    (out,) = interpret(graph, {"x": x, "i": i, "y": y})
    torch.testing.assert_close(out, y.index_add(0, i, x) * 2)


@pytest.mark.parametrize("body, args, inputs, op", [
    # a boolean mask: a shape known only at run time (torch.export refuses it first)
    ("return y.index_put((i,), x, accumulate=True)", "x, i, y",
     "[torch.randn(3, 4), torch.tensor([True, False, True]), torch.randn(3, 4)]", "index_put"),
    ("return y.scatter_reduce(1, i, x, 'amax')", "x, i, y",          # a bool tensor: no dtype of the family
     "[torch.rand(4, 6) > 0.5, torch.randint(0, 3, (4, 6)), torch.rand(4, 3) > 0.5]", "scatter_reduce"),
    ("return self.bag(i, o)", "i, o", "[torch.randint(0, 9, (12,)), torch.tensor([0, 5])]",   # mode "max"
     "_embedding_bag"),
])
def test_what_the_family_does_not_take_is_refused_with_the_op_named(body, args, inputs, op):
    init = ["self.bag = nn.EmbeddingBag(9, 4, mode='max')"] if "bag" in body else None
    with pytest.raises(CodegenError, match=op):
        generate(load_task_from_source(T([body], inputs, init, args=args), "refused"))

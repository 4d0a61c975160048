"""KernelProgram: JSON round trip, validation, resolve, schedules, hashing, solution files."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from core.program import (
    FORMAT,
    BufferSpec,
    KernelProgram,
    LaunchLimits,
    LaunchSpec,
    ModelNewSolution,
    ProgramError,
    ResolvedBuffer,
    ResolvedLaunch,
    ScalarArg,
    TensorArg,
    TensorInfo,
    human_bytes,
    load_solution,
    scan_kernels,
)

SOFTMAX_SOURCE = r"""
// Row softmax of a 2-D float32 tensor: one block per row, BLOCK threads stride over the columns.
extern "C" __global__ void __launch_bounds__(BLOCK)
softmax_rows(const float* __restrict__ x, float* __restrict__ y, int cols)
{
    extern __shared__ float scratch[];  // BLOCK floats
    const float* row = x + (size_t)blockIdx.x * cols;
    float* out = y + (size_t)blockIdx.x * cols;
    float m = __int_as_float(0xff800000);
    for (int c = threadIdx.x; c < cols; c += BLOCK) m = fmaxf(m, row[c]);
    scratch[threadIdx.x] = m;
    __syncthreads();
    for (int s = BLOCK / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) scratch[threadIdx.x] = fmaxf(scratch[threadIdx.x], scratch[threadIdx.x + s]);
        __syncthreads();
    }
    m = scratch[0];
    __syncthreads();
    float sum = 0.0f;
    for (int c = threadIdx.x; c < cols; c += BLOCK) sum += expf(row[c] - m);
    scratch[threadIdx.x] = sum;
    __syncthreads();
    for (int s = BLOCK / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) scratch[threadIdx.x] += scratch[threadIdx.x + s];
        __syncthreads();
    }
    const float inv = 1.0f / scratch[0];
    for (int c = threadIdx.x; c < cols; c += BLOCK) out[c] = expf(row[c] - m) * inv;
}
"""

SUM_SOURCE = r"""
// Sum of all elements: per-block partial sums, then one block adds them up.
extern "C" {
__global__ void block_sums(const float* __restrict__ x, float* __restrict__ partial, long long n)
{
    __shared__ float s[BLOCK];
    long long start = (long long)blockIdx.x * BLOCK * ITEMS + threadIdx.x;
    float acc = 0.0f;
    for (int k = 0; k < ITEMS; ++k) {
        long long i = start + (long long)k * BLOCK;
        if (i < n) acc += x[i];
    }
    s[threadIdx.x] = acc;
    __syncthreads();
    for (int w = BLOCK / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w) s[threadIdx.x] += s[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = s[0];
}

__global__ void final_sum(const float* __restrict__ partial, float* __restrict__ out, int count)
{
    __shared__ float s[BLOCK];
    float acc = 0.0f;
    for (int i = threadIdx.x; i < count; i += BLOCK) acc += partial[i];
    s[threadIdx.x] = acc;
    __syncthreads();
    for (int w = BLOCK / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w) s[threadIdx.x] += s[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) *out = s[0];
}
}  // extern "C"
"""


def softmax_dict() -> dict:
    return {
        "format": FORMAT,
        "name": "softmax_rows",
        "source": SOFTMAX_SOURCE,
        "tunables": {"BLOCK": [256, 128, 512, 1024]},
        "schedule": {"BLOCK": 256},
        "buffers": [{"name": "out", "shape": ["x.shape[0]", "x.shape[1]"], "dtype": "dtype(x)"}],
        "launches": [
            {
                "kernel": "softmax_rows",
                "grid": ["x.shape[0]"],
                "block": ["BLOCK"],
                "shared_bytes": "BLOCK * 4",
                "args": ["x", "out", "int32(x.shape[1])"],
            }
        ],
        "outputs": ["out"],
    }


def sum_dict() -> dict:
    return {
        "format": FORMAT,
        "name": "sum_all",
        "source": SUM_SOURCE,
        "tunables": {"BLOCK": [256, 512], "ITEMS": [4, 8]},
        "buffers": [
            {"name": "partial", "shape": ["cdiv(x.numel, BLOCK * ITEMS)"], "dtype": "float32"},
            {"name": "out", "shape": [], "dtype": "dtype(partial)"},
        ],
        "launches": [
            {
                "kernel": "block_sums",
                "grid": ["partial.shape[0]"],
                "block": ["BLOCK"],
                "args": ["x", "partial", "int64(x.numel)"],
            },
            {"kernel": "final_sum", "grid": [1], "block": ["BLOCK"], "args": ["partial", "out", "int32(partial.shape[0])"]},
        ],
        "outputs": ["out"],
    }


SOFTMAX_ENV = {"x": TensorInfo((4096, 1000), "float32")}


def softmax() -> KernelProgram:
    return KernelProgram.from_json(softmax_dict())


def one_paragraph(error: ProgramError) -> str:
    message = str(error)
    assert "\n" not in message and "Traceback" not in message
    return message


# ------------------------------------------------------------------ JSON


def test_round_trip_is_exact_and_canonical():
    program = softmax()
    text = program.to_json()
    again = KernelProgram.from_json(text)
    assert again == program
    assert again.to_json() == text
    assert json.loads(text)["tunables"]["BLOCK"] == [256, 128, 512, 1024]  # list order kept
    assert list(json.loads(text)) == sorted(json.loads(text))  # keys sorted
    two = KernelProgram.from_json(sum_dict())
    assert KernelProgram.from_json(two.to_json()) == two
    assert KernelProgram.from_json(two.to_dict()) == two


def test_to_json_does_not_depend_on_input_key_order():
    data = softmax_dict()
    reordered = {key: data[key] for key in reversed(list(data))}
    reordered["launches"] = [{k: v for k, v in reversed(list(launch.items()))} for launch in data["launches"]]
    assert KernelProgram.from_json(reordered).to_json() == softmax().to_json()


def test_defaults_name_shared_bytes_args_and_schedule():
    data = sum_dict()
    del data["name"]
    program = KernelProgram.from_json(data)
    assert program.name == "block_sums"  # first launched kernel
    assert program.schedule == {"BLOCK": 256, "ITEMS": 4}  # first value of each list
    assert program.launches[0].shared_bytes == 0
    data["launches"][1].pop("args")
    assert KernelProgram.from_json(data).launches[1].args == []
    direct = KernelProgram("p", SUM_SOURCE, tunables={"BLOCK": [512, 256]})
    assert direct.schedule == {"BLOCK": 512}


def test_load_with_source_file(tmp_path: Path):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "softmax.cu").write_text(SOFTMAX_SOURCE, encoding="utf-8")
    data = softmax_dict()
    del data["source"], data["name"]
    data["source_file"] = "kernels/softmax.cu"
    (tmp_path / "my softmax.json").write_text(json.dumps(data), encoding="utf-8")
    program = KernelProgram.load(tmp_path / "my softmax.json")
    assert program.source == SOFTMAX_SOURCE
    assert program.name == "my_softmax"  # from the file name
    assert "source_file" not in program.to_dict()  # the source travels inline
    assert program.content_hash() == softmax().content_hash()


def test_load_inline_source(tmp_path: Path):
    path = tmp_path / "p.json"
    path.write_text(softmax().to_json(), encoding="utf-8")
    assert KernelProgram.load(path) == softmax()


def test_load_errors_name_the_file(tmp_path: Path):
    path = tmp_path / "bad.json"
    path.write_text('{"format": "cuda-agent/program@1", "launches": [', encoding="utf-8")
    with pytest.raises(ProgramError, match="not valid JSON") as info:
        KernelProgram.load(path)
    assert str(path) in one_paragraph(info.value)
    with pytest.raises(ProgramError, match="not found"):
        KernelProgram.load(tmp_path / "missing.json")
    data = softmax_dict()
    data["launches"][0]["grid"] = ["x.shape[0"]
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ProgramError) as info:
        KernelProgram.load(path)
    assert str(path) in str(info.value) and "launches[0].grid[0]" in str(info.value)
    assert info.value.field == "launches[0].grid[0]"


def test_source_file_missing(tmp_path: Path):
    data = softmax_dict()
    del data["source"]
    data["source_file"] = "nope.cu"
    (tmp_path / "p.json").write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ProgramError, match=r"source_file: \"nope.cu\" was not found"):
        KernelProgram.load(tmp_path / "p.json")


def test_source_file_refused_without_base_dir():
    data = softmax_dict()
    del data["source"]
    data["source_file"] = "/etc/hostname"
    with pytest.raises(ProgramError, match="source_file: a program given as text"):
        KernelProgram.from_json(data)


def test_source_and_source_file_together():
    data = softmax_dict()
    data["source_file"] = "k.cu"
    with pytest.raises(ProgramError, match="source_file: give either"):
        KernelProgram.from_json(data, base_dir=".")


# ------------------------------------------------------------------ static validation, one test each


def mutate(change) -> dict:
    data = softmax_dict()
    change(data)
    return data


VALIDATION_CASES = {
    "unknown top-level field": (lambda d: d.update(comment="hi"), "comment", "unknown field"),
    "misspelt field": (lambda d: d.update(launch=d.pop("launches")), "launch", "did you mean 'launches'"),
    "wrong format": (lambda d: d.update(format="cuda-agent/program@2"), "format", 'expected "cuda-agent/program@1"'),
    "missing format": (lambda d: d.pop("format"), "format", "required"),
    "missing source": (lambda d: d.pop("source"), "source", "required"),
    "source not a string": (lambda d: d.update(source=["a"]), "source", "expected a string"),
    "empty source": (lambda d: d.update(source="  "), "source", "empty"),
    "no kernels": (lambda d: d.update(source="__device__ int f() { return 1; }"), "source", "no __global__ kernel"),
    "bad name": (lambda d: d.update(name="a/b"), "name", "not a valid program name"),
    "tunables not an object": (lambda d: d.update(tunables=[1]), "tunables", "expected an object"),
    "tunable not a list": (lambda d: d["tunables"].update(BLOCK=256), "tunables.BLOCK", "expected a list"),
    "tunable value not int": (lambda d: d["tunables"].update(BLOCK=[256, 1.5]), "tunables.BLOCK[1]", "expected an integer"),
    "tunable value bool": (lambda d: d["tunables"].update(BLOCK=[256, True]), "tunables.BLOCK[1]", "expected an integer"),
    "tunable empty list": (lambda d: d["tunables"].update(EMPTY=[]), "tunables.EMPTY", "non-empty list"),
    "tunable duplicate value": (lambda d: d["tunables"].update(V=[1, 2, 1]), "tunables.V[2]", "listed twice"),
    "tunable bad identifier": (lambda d: d["tunables"].update({"2X": [1]}), "tunables.2X", "not a valid C identifier"),
    "tunable C keyword": (lambda d: d["tunables"].update({"int": [1]}), "tunables.int", "reserved word"),
    "tunable function name": (lambda d: d["tunables"].update({"cdiv": [1]}), "tunables.cdiv", "reserved word"),
    "tunable CUDA builtin": (lambda d: d["tunables"].update({"blockDim": [1]}), "tunables.blockDim", "reserved word"),
    "tunable is a kernel name": (lambda d: d["tunables"].update(softmax_rows=[1]), "tunables.softmax_rows", "name of a kernel"),
    "tunable is a buffer name": (lambda d: d["tunables"].update(out=[1]), "tunables.out", "same name as a buffer"),
    "schedule not an object": (lambda d: d.update(schedule=[256]), "schedule", "expected an object"),
    "schedule unknown tunable": (lambda d: d["schedule"].update(BLOK=256), "schedule.BLOK", "not a tunable"),
    "schedule value not allowed": (lambda d: d["schedule"].update(BLOCK=300), "schedule.BLOCK", "not one of the allowed values"),
    "schedule value not int": (lambda d: d["schedule"].update(BLOCK="256"), "schedule.BLOCK", "expected an integer"),
    "buffers missing": (lambda d: d.pop("buffers"), "buffers", "required"),
    "buffer not an object": (lambda d: d.update(buffers=["out"]), "buffers[0]", "expected an object"),
    "buffer unknown field": (lambda d: d["buffers"][0].update(dtpe="float32"), "buffers[0].dtpe", "did you mean 'dtype'"),
    "buffer missing dtype": (lambda d: d["buffers"][0].pop("dtype"), "buffers[0].dtype", "required"),
    "buffer bad name": (lambda d: d["buffers"][0].update(name="my-out"), "buffers[0].name", "not a valid buffer name"),
    "buffer reserved name": (lambda d: d["buffers"][0].update(name="max"), "buffers[0].name", "reserved name"),
    "buffer duplicate": (lambda d: d["buffers"].append(dict(d["buffers"][0])), "buffers[1].name", "already declared"),
    "buffer shape not a list": (lambda d: d["buffers"][0].update(shape="x.shape"), "buffers[0].shape", "expected a list"),
    "buffer shape bad expression": (lambda d: d["buffers"][0]["shape"].__setitem__(1, "x.shape[1"), "buffers[0].shape[1]", "not valid syntax"),
    "buffer shape not an expression": (lambda d: d["buffers"][0]["shape"].__setitem__(1, None), "buffers[0].shape[1]", "expected an expression"),
    "buffer shape disallowed syntax": (lambda d: d["buffers"][0]["shape"].__setitem__(0, "x.__class__"), "buffers[0].shape[0]", "double-underscore"),
    "buffer uses later buffer": (
        lambda d: d["buffers"].insert(0, {"name": "tmp", "shape": ["out.shape[0]"], "dtype": "float32"}),
        "buffers[0].shape[0]",
        "declared later (buffers[1])",
    ),
    "buffer uses itself": (lambda d: d["buffers"][0].update(dtype="dtype(out)"), "buffers[0].dtype", "which is this buffer itself"),
    "buffer unknown dtype": (lambda d: d["buffers"][0].update(dtype="float"), "buffers[0].dtype", "unknown dtype"),
    "buffer torch dtype": (lambda d: d["buffers"][0].update(dtype="torch.float32"), "buffers[0].dtype", 'write "float32"'),
    "launches missing": (lambda d: d.pop("launches"), "launches", "required"),
    "launches empty": (lambda d: d.update(launches=[]), "launches", "at least one launch"),
    "launch unknown field": (
        lambda d: d["launches"][0].update(share_bytes=d["launches"][0].pop("shared_bytes")),
        "launches[0].share_bytes",
        "did you mean 'shared_bytes'",
    ),
    "launch missing kernel": (lambda d: d["launches"][0].pop("kernel"), "launches[0].kernel", "required"),
    "launch missing grid": (lambda d: d["launches"][0].pop("grid"), "launches[0].grid", "required"),
    "kernel not in source": (lambda d: d["launches"][0].update(kernel="softmax"), "launches[0].kernel", "no __global__ function named"),
    "kernel without extern C": (
        lambda d: d.update(source=d["source"].replace('extern "C" __global__', "__global__")),
        "launches[0].kernel",
        'declared without extern "C"',
    ),
    "grid too many dims": (lambda d: d["launches"][0].update(grid=[1, 1, 1, 1]), "launches[0].grid", "1 to 3"),
    "grid empty": (lambda d: d["launches"][0].update(grid=[]), "launches[0].grid", "1 to 3"),
    "block bad expression": (lambda d: d["launches"][0].update(block=["BLOCK +"]), "launches[0].block[0]", "not valid syntax"),
    "shared bytes bool": (lambda d: d["launches"][0].update(shared_bytes=True), "launches[0].shared_bytes", "expected an expression"),
    "shared bytes bad": (lambda d: d["launches"][0].update(shared_bytes="BLOCK * sizeof(float)"), "launches[0].shared_bytes", "function 'sizeof'"),
    "args not a list": (lambda d: d["launches"][0].update(args="x"), "launches[0].args", "expected a list"),
    "untyped literal arg": (lambda d: d["launches"][0]["args"].__setitem__(2, "1000"), "launches[0].args[2]", "scalar arguments need a type, e.g. int32(1000)"),
    "untyped JSON number arg": (lambda d: d["launches"][0]["args"].__setitem__(2, 0.5), "launches[0].args[2]", "e.g. float32(0.5)"),
    "arg disallowed syntax": (lambda d: d["launches"][0]["args"].__setitem__(0, "x[0]"), "launches[0].args[0]", "indexing is only allowed"),
    "outputs missing": (lambda d: d.pop("outputs"), "outputs", "required"),
    "outputs empty": (lambda d: d.update(outputs=[]), "outputs", "at least one output"),
    "output not a buffer": (lambda d: d.update(outputs=["result"]), "outputs[0]", "not a buffer declared"),
    "output twice": (lambda d: d.update(outputs=["out", "out"]), "outputs[1]", "listed twice"),
}


@pytest.mark.parametrize("case", list(VALIDATION_CASES))
def test_validation_error(case):
    change, field_path, phrase = VALIDATION_CASES[case]
    with pytest.raises(ProgramError) as info:
        KernelProgram.from_json(mutate(change))
    message = one_paragraph(info.value)
    assert message.startswith(field_path + ":") or message.startswith(field_path + " = "), message
    assert phrase in message, message
    assert info.value.field == field_path


@pytest.mark.parametrize(
    "text, phrase",
    [
        ('{"format": ', "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ("null", "must be a JSON object"),
    ],
)
def test_malformed_json(text, phrase):
    with pytest.raises(ProgramError, match=phrase):
        KernelProgram.from_json(text)


def test_validate_catches_edits_of_a_constructed_program():
    program = softmax()
    program.launches.append(LaunchSpec(kernel="softmax_rows", grid=["x.shape[0]"], block=["BLOCK"], args=["y"]))
    program.validate()  # unknown names are only known at resolve time
    program.launches[-1].grid = ["1", "2", "3", "4"]
    with pytest.raises(ProgramError, match=r"launches\[1\]\.grid: expected a list of 1 to 3"):
        program.validate()


# ------------------------------------------------------------------ resolve


def test_resolve_softmax():
    plan = softmax().resolve(SOFTMAX_ENV)
    assert plan.buffers == (ResolvedBuffer("out", (4096, 1000), "float32"),)
    assert plan.launches == (
        ResolvedLaunch(
            kernel="softmax_rows",
            grid=(4096, 1, 1),
            block=(256, 1, 1),
            shared_bytes=1024,
            args=(TensorArg("x"), TensorArg("out"), ScalarArg("int32", 1000)),
        ),
    )
    assert plan.outputs == ("out",)
    # the same program for other shapes, dtypes and schedules
    other = softmax().with_schedule({"BLOCK": 1024}).resolve({"x": TensorInfo((3, 7), "float16")})
    assert other.buffers[0] == ResolvedBuffer("out", (3, 7), "float16")
    assert other.launches[0].block == (1024, 1, 1) and other.launches[0].shared_bytes == 4096
    assert other.launches[0].args[2] == ScalarArg("int32", 7)


def test_resolve_two_launches_with_scratch_buffer():
    program = KernelProgram.from_json(sum_dict())
    assert program.kernel_names() == ["block_sums", "final_sum"]
    plan = program.resolve({"x": TensorInfo((1000, 1001), "float32")})
    blocks = -(-1000 * 1001 // (256 * 4))
    assert plan.buffers == (ResolvedBuffer("partial", (blocks,), "float32"), ResolvedBuffer("out", (), "float32"))
    first, second = plan.launches
    assert first == ResolvedLaunch(
        "block_sums", (blocks, 1, 1), (256, 1, 1), 0, (TensorArg("x"), TensorArg("partial"), ScalarArg("int64", 1001000))
    )
    assert second == ResolvedLaunch(
        "final_sum", (1, 1, 1), (256, 1, 1), 0, (TensorArg("partial"), TensorArg("out"), ScalarArg("int32", blocks))
    )
    assert plan.outputs == ("out",)
    tuned = program.with_schedule({"ITEMS": 8, "BLOCK": 512}).resolve({"x": TensorInfo((1000, 1001), "float32")})
    assert tuned.buffers[0].shape == (-(-1001000 // (512 * 8)),)


def test_resolve_parameters_scalars_and_3d_launches():
    source = 'extern "C" __global__ void linear(const float* x, const float* w, const float* b, float* y, float alpha, int n, int k) {}'
    data = {
        "format": FORMAT,
        "source": source,
        "tunables": {"TILE": [16, 32]},
        "buffers": [{"name": "y", "shape": ["x.shape[0]", "linear.weight.shape[0]"], "dtype": "dtype(linear.weight)"}],
        "launches": [
            {
                "kernel": "linear",
                "grid": ["cdiv(y.shape[1], TILE)", "cdiv(y.shape[0], TILE)", 1],
                "block": ["TILE", "TILE"],
                "shared_bytes": "2 * TILE * TILE * 4",
                "args": [
                    "x", "linear.weight", "linear.bias", "y",
                    "float32(alpha)", "int32(y.shape[1])", "int32(x.shape[-1])",
                ],
            }
        ],
        "outputs": ["y"],
    }  # fmt: skip
    env = {
        "x": TensorInfo((128, 64), "float32"),
        "linear.weight": TensorInfo((100, 64), "float32"),
        "linear.bias": TensorInfo((100,), "float32"),
        "alpha": 0.25,
    }
    launch = KernelProgram.from_json(data).resolve(env).launches[0]
    assert launch.grid == (7, 8, 1) and launch.block == (16, 16, 1) and launch.shared_bytes == 2048
    assert launch.args == (
        TensorArg("x"), TensorArg("linear.weight"), TensorArg("linear.bias"), TensorArg("y"),
        ScalarArg("float32", 0.25), ScalarArg("int32", 100), ScalarArg("int32", 64),
    )  # fmt: skip


def test_tensor_info_accepts_torch_metadata():
    torch = pytest.importorskip("torch")
    t = torch.empty(3, 5, dtype=torch.float16)
    info = TensorInfo(t.shape, str(t.dtype))
    assert info == TensorInfo((3, 5), "float16") and info.numel == 15 and info.ndim == 2


def resolve_error(change, env=None, limits=LaunchLimits()) -> ProgramError:
    program = KernelProgram.from_json(mutate(change))
    with pytest.raises(ProgramError) as info:
        program.resolve(SOFTMAX_ENV if env is None else env, limits)
    one_paragraph(info.value)
    return info.value


def test_resolve_unknown_name():
    error = resolve_error(lambda d: d["launches"][0].update(grid=["cdiv(x.shape[0], BLOK)"]))
    assert str(error).startswith("launches[0].grid[0] = 'cdiv(x.shape[0], BLOK)': unknown name 'BLOK'")
    assert "did you mean 'BLOCK'" in str(error)


def test_resolve_grid_zero():
    error = resolve_error(lambda d: None, env={"x": TensorInfo((0, 1000), "float32")})
    assert error.field == "buffers[0].shape[0]" and "evaluates to 0" in str(error)
    error = resolve_error(lambda d: d["buffers"][0].update(shape=[1]), env={"x": TensorInfo((0, 1000), "float32")})
    assert error.field == "launches[0].grid[0]" and "between 1 and" in str(error)


def test_resolve_grid_too_large():
    error = resolve_error(lambda d: d["launches"][0].update(grid=[1, "x.shape[0] * 100"]))
    assert error.field == "launches[0].grid[1]" and "between 1 and 65535" in str(error)


def test_resolve_block_dimension_too_large():
    error = resolve_error(lambda d: d["launches"][0].update(block=[1, 1, 128]))
    assert error.field == "launches[0].block[2]" and "between 1 and 64" in str(error)


def test_resolve_too_many_threads():
    error = resolve_error(lambda d: d["launches"][0].update(block=["BLOCK", 8]))
    assert error.field == "launches[0].block" and "2048 threads per block" in str(error)


def test_resolve_custom_limits():
    error = resolve_error(lambda d: None, limits=LaunchLimits(max_threads_per_block=128))
    assert "more than the limit of 128" in str(error)


def test_resolve_shared_bytes_too_large():
    error = resolve_error(lambda d: d["launches"][0].update(shared_bytes="x.shape[1] * 1024"))
    assert error.field == "launches[0].shared_bytes" and "232448" in str(error)


def test_resolve_negative_shared_bytes():
    error = resolve_error(lambda d: d["launches"][0].update(shared_bytes="-4"))
    assert error.field == "launches[0].shared_bytes"


def test_resolve_non_integer_grid():
    error = resolve_error(lambda d: d["launches"][0].update(grid=["x.shape[0] / 3"]))
    assert error.field == "launches[0].grid[0]" and "whole number" in str(error)


def test_resolve_tensor_as_grid():
    error = resolve_error(lambda d: d["launches"][0].update(grid=["x"]))
    assert error.field == "launches[0].grid[0]" and "'x' is a tensor" in str(error)


def test_resolve_buffer_too_large_in_human_units():
    error = resolve_error(lambda d: d["buffers"][0].update(shape=["x.shape[0]", 2**40]))
    assert error.field == "buffers[0]"
    assert "oversized allocation" in str(error) and "16.0 PiB" in str(error) and "1.0 TiB" in str(error)


def test_resolve_buffers_together_too_large():
    def change(d):
        d["buffers"].append({"name": "tmp", "shape": ["x.numel"], "dtype": "float64"})

    error = resolve_error(change, limits=LaunchLimits(max_buffer_bytes=40_000_000))
    assert error.field == "buffers" and "'tmp'" in str(error) and "MiB" in str(error)


def test_resolve_negative_buffer_dimension():
    error = resolve_error(lambda d: d["buffers"][0].update(shape=["-x.shape[0]"]))
    assert error.field == "buffers[0].shape[0]" and "-4096" in str(error)


def test_resolve_buffer_named_like_an_input():
    def change(d):
        d["buffers"].append({"name": "n", "shape": [1], "dtype": "float32"})

    error = resolve_error(change, env={**SOFTMAX_ENV, "n": 5})
    assert error.field == "buffers[1].name" and "same name as an input" in str(error)


def test_resolve_tunable_named_like_an_input():
    error = resolve_error(lambda d: None, env={**SOFTMAX_ENV, "BLOCK": 3})
    assert error.field == "tunables.BLOCK" and "same name as an input" in str(error)


def test_resolve_output_aliases_input():
    # The plan reads x, so without the task's names validate() cannot tell an input from a typo;
    # resolve() knows x is an input and says so.
    program = KernelProgram.from_json(mutate(lambda d: d.update(outputs=["x"])))
    with pytest.raises(ProgramError) as info:
        program.resolve(SOFTMAX_ENV)
    assert one_paragraph(info.value).startswith("outputs[0]: output 'x' aliases input 'x'")
    # an input that the plan does not read is caught when the program is loaded
    program.outputs = ["y"]
    with pytest.raises(ProgramError, match=r"outputs\[0\]: \"y\" is not a buffer"):
        program.validate()
    with pytest.raises(ProgramError, match="output 'y' aliases input 'y'"):
        program.resolve({**SOFTMAX_ENV, "y": TensorInfo((4096, 1000), "float32")})


def test_resolve_unknown_tensor_argument():
    error = resolve_error(lambda d: d["launches"][0]["args"].__setitem__(1, "y"))
    assert error.field == "launches[0].args[1]" and "unknown name 'y'" in str(error)


def test_resolve_untyped_scalar_input_argument():
    error = resolve_error(lambda d: d["launches"][0]["args"].append("alpha"), env={**SOFTMAX_ENV, "alpha": 0.5})
    assert error.field == "launches[0].args[3]" and "need a type, e.g. float32(alpha)" in str(error)


def test_resolve_untyped_shape_argument():
    error = resolve_error(lambda d: d["launches"][0]["args"].__setitem__(2, "x.shape[1]"))
    assert "e.g. int32(x.shape[1])" in str(error)


def test_resolve_int32_overflow_argument():
    error = resolve_error(lambda d: d["launches"][0]["args"].__setitem__(2, "int32(x.numel * 1024)"))
    assert error.field == "launches[0].args[2]" and "does not fit in int32" in str(error)


def test_resolve_dtype_of_unknown_tensor():
    error = resolve_error(lambda d: d["buffers"][0].update(dtype="dtype(y)"))
    assert error.field == "buffers[0].dtype" and "'y', which is not defined" in str(error)


def test_resolve_dtype_of_a_number():
    error = resolve_error(lambda d: d["buffers"][0].update(dtype="dtype(n)"), env={**SOFTMAX_ENV, "n": 3})
    assert "is not a tensor" in str(error)


# ------------------------------------------------------------------ schedules, options, hashing


def test_with_schedule_returns_a_new_program():
    program = softmax()
    tuned = program.with_schedule({"BLOCK": 512})
    assert tuned.schedule == {"BLOCK": 512} and program.schedule == {"BLOCK": 256}
    assert tuned.source == program.source and tuned.launches == program.launches
    tuned.launches[0].args.append("x")
    assert program.launches[0].args == ["x", "out", "int32(x.shape[1])"]  # no shared lists


def test_content_hash_of_a_schedule_equals_the_hash_of_the_copy():
    program = softmax()
    for schedule in ({"BLOCK": 512}, {"BLOCK": 256}, {"BLOCK": 1024}):
        assert program.content_hash(schedule) == program.with_schedule(schedule).content_hash()
    assert program.content_hash({"BLOCK": 512}) != program.content_hash()
    assert program.content_hash({}) == program.content_hash()


def test_with_schedule_accepts_numpy_integers():
    numpy = pytest.importorskip("numpy")
    assert softmax().with_schedule({"BLOCK": numpy.int64(128)}).schedule == {"BLOCK": 128}


def test_with_schedule_rejects_bad_values():
    with pytest.raises(ProgramError, match=r"schedule.BLOCK: 300 is not one of the allowed values \[256, 128, 512, 1024\]"):
        softmax().with_schedule({"BLOCK": 300})
    with pytest.raises(ProgramError, match="schedule.WARPS: 'WARPS' is not a tunable"):
        softmax().with_schedule({"WARPS": 4})
    with pytest.raises(ProgramError, match="schedule.BLOCK: expected an integer"):
        softmax().with_schedule({"BLOCK": 256.0})


def test_compile_options():
    program = KernelProgram.from_json(sum_dict())
    assert program.compile_options() == ["-DBLOCK=256", "-DITEMS=4"]
    assert program.with_schedule({"ITEMS": 8}).compile_options() == ["-DBLOCK=256", "-DITEMS=8"]
    data = softmax_dict()
    data.pop("tunables"), data.pop("schedule")
    data["source"] = data["source"].replace("BLOCK", "256")
    data["launches"][0]["block"] = [256]
    data["launches"][0]["shared_bytes"] = 1024
    assert KernelProgram.from_json(data).compile_options() == []


def test_content_hash():
    base = softmax()
    assert base.content_hash() == softmax().content_hash()
    assert len(base.content_hash()) == 64
    assert base.with_schedule({"BLOCK": 512}).content_hash() != base.content_hash()
    changed_source = mutate(lambda d: d.update(source=d["source"].replace("expf", "__expf")))
    assert KernelProgram.from_json(changed_source).content_hash() != base.content_hash()
    changed_plan = mutate(lambda d: d["launches"][0].update(shared_bytes="BLOCK * 8"))
    assert KernelProgram.from_json(changed_plan).content_hash() != base.content_hash()
    reordered = {k: v for k, v in reversed(list(softmax_dict().items()))}
    assert KernelProgram.from_json(json.dumps(reordered, indent=4)).content_hash() == base.content_hash()
    renamed = mutate(lambda d: d.update(name="other"))
    assert KernelProgram.from_json(renamed).content_hash() == base.content_hash()  # the name is cosmetic


def test_equality_and_copies():
    assert softmax() == softmax()
    other = copy.deepcopy(softmax())
    other.buffers[0] = BufferSpec("out", ["x.shape[0]", "x.shape[1]"], "float32")
    assert other != softmax()


# ------------------------------------------------------------------ CUDA source scanning


def test_kernel_scanning():
    source = r"""
    #include <cuda_fp16.h>
    // extern "C" __global__ void commented_out(float* x) {}
    /* __global__ void also_commented(float* x) {} */
    template <int N> __global__ void templated(float* x) {}
    extern "C" __global__ void __launch_bounds__(256, 2) bounded(float* x) { printf("__global__ void fake("); }
    extern "C" __global__ __launch_bounds__(128) void bounds_first(float* x);
    __global__ void mangled(float* x) {}
    extern "C" {
      __global__ void in_block_a(float* x) { if (x) { x[0] = 1; } }
      static __device__ float helper(float v) { return v; }
      __global__ void in_block_b(float* x) {}
    }
    __global__ void after_block(float* x) {}
    extern "C" __global__ void bounds_first(float* x) {}
    """
    kernels = {k.name: k.extern_c for k in scan_kernels(source)}
    assert kernels == {
        "templated": False,
        "bounded": True,
        "bounds_first": True,
        "mangled": False,
        "in_block_a": True,
        "in_block_b": True,
        "after_block": False,
    }
    assert [k.name for k in scan_kernels(source)][:2] == ["templated", "bounded"]


def test_human_bytes():
    assert human_bytes(512) == "512 bytes"
    assert human_bytes(1536) == "1.5 KiB"
    assert human_bytes(2**40) == "1.0 TiB"


# ------------------------------------------------------------------ solution files

MODEL_NEW = """
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return torch.softmax(x, self.dim)
"""


def test_load_solution_json(tmp_path: Path):
    path = tmp_path / "softmax.json"
    path.write_text(softmax().to_json(), encoding="utf-8")
    assert load_solution(path) == softmax()


def test_load_solution_python(tmp_path: Path):
    path = tmp_path / "fast_softmax.py"
    path.write_text(MODEL_NEW, encoding="utf-8")
    solution = load_solution(path)
    assert isinstance(solution, ModelNewSolution)
    assert solution.name == "fast_softmax" and solution.path == path and solution.source == MODEL_NEW
    assert len(solution.content_hash()) == 64
    assert solution.content_hash() != ModelNewSolution("x", MODEL_NEW + "\n", None).content_hash()
    assert solution.content_hash() == ModelNewSolution("other", MODEL_NEW, None).content_hash()


def test_load_solution_is_not_executed(tmp_path: Path):
    marker = tmp_path / "ran"
    path = tmp_path / "sneaky.py"
    path.write_text(f"open({str(marker)!r}, 'w').close()\n" + MODEL_NEW, encoding="utf-8")
    assert isinstance(load_solution(path), ModelNewSolution)
    assert not marker.exists()


def test_load_solution_without_model_new(tmp_path: Path):
    path = tmp_path / "nope.py"
    path.write_text(MODEL_NEW.replace("ModelNew", "Model") + "\ndef f():\n    class ModelNew: pass\n", encoding="utf-8")
    with pytest.raises(ProgramError, match="does not define a top-level class ModelNew") as info:
        load_solution(path)
    assert str(path) in one_paragraph(info.value)


def test_load_solution_syntax_error(tmp_path: Path):
    path = tmp_path / "broken.py"
    path.write_text("class ModelNew(nn.Module):\n    def forward(self, x)\n        return x\n", encoding="utf-8")
    with pytest.raises(ProgramError, match="not valid Python: .* at line 2") as info:
        load_solution(path)
    assert str(path) in str(info.value)


def test_load_solution_other_extension(tmp_path: Path):
    path = tmp_path / "kernel.cu"
    path.write_text(SOFTMAX_SOURCE, encoding="utf-8")
    with pytest.raises(ProgramError, match=r"unsupported solution file type '\.cu'"):
        load_solution(path)


def test_load_solution_missing_file(tmp_path: Path):
    with pytest.raises(ProgramError, match="not found"):
        load_solution(tmp_path / "missing.py")
    with pytest.raises(ProgramError, match="not found"):
        load_solution(tmp_path / "missing.json")


# ------------------------------------------------------------------ the documentation's examples

DOCS = Path(__file__).resolve().parents[1] / "docs" / "program-format.md"


def doc_files() -> dict[str, str]:
    import re

    text = DOCS.read_text(encoding="utf-8")
    return dict(re.findall(r"File `([^`]+)`:\n\n```\w+\n(.*?)```", text, flags=re.S))


def test_docs_examples_load_and_resolve_as_described(tmp_path: Path):
    files = doc_files()
    assert {"softmax_task.py", "softmax_rows.cu", "softmax_rows.json", "sum_all.json"} <= set(files)
    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")

    softmax_program = KernelProgram.load(tmp_path / "softmax_rows.json")
    plan = softmax_program.resolve(SOFTMAX_ENV)
    assert plan == softmax().resolve(SOFTMAX_ENV)
    assert softmax_program.compile_options() == ["-DBLOCK=256"]
    faster = softmax_program.with_schedule({"BLOCK": 512}).resolve(SOFTMAX_ENV).launches[0]
    assert faster.block == (512, 1, 1) and faster.shared_bytes == 2048

    sum_program = KernelProgram.load(tmp_path / "sum_all.json")
    plan = sum_program.resolve({"x": TensorInfo((1000, 1001), "float32")})
    assert plan.buffers[0].shape == (978,) and plan.buffers[1].shape == ()
    assert plan.launches[0].grid == (978, 1, 1) and plan.launches[0].args[2] == ScalarArg("int64", 1001000)
    assert plan.launches[1].args[2] == ScalarArg("int32", 978)
    documented, tested = sum_program.to_dict(), KernelProgram.from_json(sum_dict()).to_dict()
    assert documented.pop("source") != "" and tested.pop("source") != ""
    assert documented == tested


@pytest.mark.skipif(__import__("shutil").which("nvcc") is None, reason="nvcc not installed")
def test_docs_kernels_compile_with_nvcc(tmp_path: Path):
    import subprocess

    files = doc_files()
    sources = {"softmax_rows.cu": files["softmax_rows.cu"], "sum_all.cu": json.loads(files["sum_all.json"])["source"]}
    for name, source in sources.items():
        (tmp_path / name).write_text(source, encoding="utf-8")
        result = subprocess.run(
            ["nvcc", "-arch=sm_90", "-cubin", "-DBLOCK=256", "-DITEMS=4", name, "-o", name + ".cubin"],
            cwd=tmp_path, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr


def test_zeroed_buffers_round_trip_and_only_scratch_can_be_zeroed():
    data = sum_dict()
    plain_hash = KernelProgram.from_json(data).content_hash()
    assert "zeroed" not in KernelProgram.from_json(data).to_dict()["buffers"][0]   # old programs keep their JSON
    data["buffers"][0]["zeroed"] = True
    program = KernelProgram.from_json(data)
    assert program.buffers[0].zeroed and not program.buffers[1].zeroed
    assert KernelProgram.from_json(program.to_json()).buffers[0].zeroed
    assert program.content_hash() != plain_hash
    plan = program.resolve({"x": TensorInfo((1000, 1001), "float32")})
    assert plan.buffers[0].zeroed and not plan.buffers[1].zeroed

    data["buffers"][0]["zeroed"] = 1
    with pytest.raises(ProgramError, match=r"buffers\[0\]\.zeroed.*expected true or false"):
        KernelProgram.from_json(data)
    data["buffers"][0]["zeroed"] = False
    data["buffers"][1]["zeroed"] = True
    with pytest.raises(ProgramError, match="output 'out' is a zeroed buffer"):
        KernelProgram.from_json(data)

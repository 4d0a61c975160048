"""CPU tests for core.toolchain: NVRTC compiles, diagnostics, cache, compile pool, ptxas report, occupancy.

NVRTC comes from the nvidia-cuda-nvrtc wheel (no GPU needed); the resource-report tests need nvcc.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from core.toolchain import (CompileCache, CompilePool, CompileResult, Diagnostic, KernelResources,
                            PoolClosedError, ToolchainError, build_options, compile_cuda, compile_key_for,
                            default_cache_dir, find_header_dirs, find_nvcc, max_active_blocks, nvrtc_info,
                            parse_nvrtc_log, parse_ptxas_verbose, resource_report, theoretical_occupancy)
from core.toolchain import nvrtc as nvrtc_module
from core.toolchain import resources as resources_module
from core.toolchain.nvrtc import choose_header_dirs

NVRTC_OK = nvrtc_info()[0]
needs_nvrtc = pytest.mark.skipif(not NVRTC_OK, reason=f"NVRTC unavailable: {nvrtc_info()[2]}")
needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found (resource_report needs it)")

ELF_MAGIC = b"\x7fELF"

VECTOR_ADD = textwrap.dedent("""\
    extern "C" __global__ void vector_add(const float* a, const float* b, float* c, int n) {
      int i = blockIdx.x * blockDim.x + threadIdx.x;
      if (i < n) c[i] = a[i] + b[i];
    }
    """)

# Line 4 uses an undefined name, line 3 declares an unused variable (a warning).
BAD_SOURCE = textwrap.dedent("""\
    // a comment so the error is not on line 1
    extern "C" __global__ void broken(float* x) {
      int unused = 3;
      x[threadIdx.x] = y + 1.0f;
    }
    """)

# Each explicit instantiation fully unrolls a 2000-step dependent chain; NVVM needs ~4 s per copy
# on the 2-core CI machine (about 12 s for the three), far past the 2 s timeout used below.
SLOW_NVRTC_SOURCE = textwrap.dedent("""\
    template <int SEED>
    __global__ void slow_kernel(float* x) {
      float a = x[threadIdx.x] + SEED, b = x[threadIdx.x + 1];
      #pragma unroll
      for (int i = 0; i < 2000; ++i) {
        a = a * b + __sinf(a);
        b = b * a - (float)(i + SEED);
        if (a > b) x[i & 1023] = a;
      }
      x[threadIdx.x] = a + b;
    }
    template __global__ void slow_kernel<0>(float*);
    template __global__ void slow_kernel<1>(float*);
    template __global__ void slow_kernel<2>(float*);
    """)


# ---------------------------------------------------------------------------------------------
# compile_cuda
# ---------------------------------------------------------------------------------------------
@needs_nvrtc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_good_source_compiles_to_cubin(arch):
    result = compile_cuda(VECTOR_ADD, arch=arch)
    assert result.ok and result.status == "ok", result.log
    assert result.cubin is not None and result.cubin.startswith(ELF_MAGIC)
    assert result.arch == arch
    assert not result.errors and result.error_summary() == ""
    assert not result.cached and len(result.key) == 64


@needs_nvrtc
def test_bad_source_reports_line_and_source_text():
    result = compile_cuda(BAD_SOURCE)
    assert not result.ok and result.status == "error" and result.cubin is None
    errors = result.errors
    assert len(errors) == 1
    err = errors[0]
    assert err.line == 4
    assert err.source_line == "  x[threadIdx.x] = y + 1.0f;"
    assert err.column == 20          # the caret points at "y"
    assert 'identifier "y" is undefined' in err.message
    warnings = result.warnings
    assert [w.line for w in warnings] == [3] and "unused" in warnings[0].message
    summary = result.error_summary()
    assert summary.startswith('line 4: identifier "y" is undefined\n    x[threadIdx.x] = y + 1.0f;')
    assert "unused" not in summary   # warnings are not errors


@needs_nvrtc
def test_define_options_reach_the_source():
    source = textwrap.dedent("""\
        static_assert(BLOCK == 256, "BLOCK must be 256");
        extern "C" __global__ void k(float* x) { x[threadIdx.x] = BLOCK; }
        """)
    assert compile_cuda(source, options=["-DBLOCK=256"]).ok
    wrong = compile_cuda(source, options=["-DBLOCK=128"])
    assert not wrong.ok and wrong.errors[0].line == 1 and "BLOCK must be 256" in wrong.error_summary()
    # Caller options come after the defaults, so a later -D wins and NVRTC sees them in order.
    assert compile_cuda(source, options=["-DBLOCK=128", "-UBLOCK", "-DBLOCK=256"]).ok
    assert not compile_cuda(source).ok


def test_build_options_order_and_overrides():
    opts = build_options("sm_90", ["-DBLOCK=256", "-DVEC=4"])
    assert opts[:3] == ["-arch=sm_90", "--std=c++17", "-lineinfo"]
    assert opts[-2:] == ["-DBLOCK=256", "-DVEC=4"]
    assert "-default-device" not in opts
    # A caller's own --std replaces the default instead of doubling it.
    assert [o for o in build_options("sm_90", ["--std=c++20"]) if "std" in o] == ["--std=c++20"]
    with pytest.raises(ValueError, match="arch="):
        build_options("sm_90", ["-arch=sm_80"])


@needs_nvrtc
def test_bad_arch_and_bad_option_give_clear_errors():
    virtual = compile_cuda(VECTOR_ADD, arch="compute_90")
    assert not virtual.ok and "real GPU architecture" in virtual.error_summary()
    unknown = compile_cuda(VECTOR_ADD, arch="sm_95")
    assert not unknown.ok and "cannot compile for sm_95" in unknown.error_summary()
    arch_option = compile_cuda(VECTOR_ADD, options=["-arch=sm_80"])
    assert not arch_option.ok and "pass arch=" in arch_option.error_summary()
    bogus = compile_cuda(VECTOR_ADD, options=["--no-such-option"])
    assert not bogus.ok and "--no-such-option" in bogus.error_summary()
    assert compile_cuda(VECTOR_ADD, arch="90").arch == "sm_90"


@needs_nvrtc
def test_fp16_and_bf16_headers():
    source = textwrap.dedent("""\
        #include <cuda_fp16.h>
        #include <cuda_bf16.h>
        extern "C" __global__ void cast(const float* x, __half* h, __nv_bfloat16* b) {
          int i = threadIdx.x;
          h[i] = __float2half(x[i]);
          b[i] = __float2bfloat16(x[i]);
        }
        """)
    result = compile_cuda(source)
    headers = find_header_dirs()
    if headers.cuda_include is not None:
        assert result.ok, result.log
        assert result.cubin.startswith(ELF_MAGIC)
    else:
        # Without headers the user is told where they come from.
        assert not result.ok
        assert "cuda_fp16.h" in result.error_summary() and "pip install" in result.error_summary()


@needs_nvrtc
def test_cccl_headers_from_nvrtc():
    source = textwrap.dedent("""\
        #include <cuda/std/cstdint>
        extern "C" __global__ void k(cuda::std::int64_t* x) { x[threadIdx.x] = 1; }
        """)
    if find_header_dirs().cccl_include is None:
        pytest.skip("no CCCL headers on this machine")
    result = compile_cuda(source)
    assert result.ok, result.log


@needs_nvrtc
def test_missing_headers_error_says_how_to_get_them(monkeypatch):
    monkeypatch.setattr(nvrtc_module, "find_header_dirs", lambda: choose_header_dirs(12, [], nvrtc_version="12.9"))
    result = compile_cuda("#include <cuda_fp16.h>\nextern \"C\" __global__ void k(__half* h) {}\n")
    assert not result.ok and result.errors[0].line == 1
    summary = result.error_summary()
    assert 'cuda_fp16.h' in summary and "hint: no CUDA headers found" in summary
    assert "pip install nvidia-cuda-runtime-cu12" in summary and "#include <cuda_fp16.h>" in summary


def _fake_include(root: Path, name: str, version: int, cccl: bool = False) -> Path:
    inc = root / name
    inc.mkdir(parents=True)
    (inc / "cuda_fp16.h").write_text("// fake\n")
    (inc / "cuda_runtime_api.h").write_text(f"#define CUDART_VERSION  {version}\n")
    if cccl:
        (inc / "cccl" / "cuda" / "std").mkdir(parents=True)
        (inc / "cccl" / "cuda" / "std" / "type_traits").write_text("// fake\n")
    return inc


def test_header_choice_prefers_nvrtc_major_version(tmp_path):
    cu13 = _fake_include(tmp_path, "nvidia/cu13/include", 13000, cccl=True)
    cu12 = _fake_include(tmp_path, "nvidia/cuda_runtime/include", 12090)
    bundle = tmp_path / "cupy_cccl"
    (bundle / "cuda" / "std").mkdir(parents=True)
    (bundle / "cuda" / "std" / "type_traits").write_text("// fake\n")

    for_12 = choose_header_dirs(12, [cu13, cu12], cupy_cccl=bundle, nvrtc_version="12.9")
    assert for_12.cuda_include == str(cu12) and for_12.cuda_version == "12.9" and for_12.matched
    assert for_12.cccl_include == str(bundle)          # cu12 headers have no cccl: CuPy's bundle
    assert for_12.options() == [f"-I{bundle}", f"-I{cu12}"]

    for_13 = choose_header_dirs(13, [cu13, cu12], cupy_cccl=bundle, nvrtc_version="13.0")
    assert for_13.cuda_include == str(cu13) and for_13.cccl_include == str(cu13 / "cccl")

    mismatched = choose_header_dirs(12, [cu13], cupy_cccl=bundle, nvrtc_version="12.9")
    assert mismatched.cuda_include == str(cu13) and not mismatched.matched
    assert mismatched.cccl_include == str(bundle) and "do not match" in mismatched.note

    none = choose_header_dirs(12, [], cupy_cccl=None, nvrtc_version="12.9")
    assert none.cuda_include is None and none.options() == [] and "nvidia-cuda-runtime-cu12" in none.note


def test_missing_cupy_gives_install_hint_not_importerror(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)          # makes `import cupy` raise ImportError
    monkeypatch.setitem(sys.modules, "cupy.cuda", None)
    state = nvrtc_module._nvrtc.__wrapped__()
    assert state.module is None and "cuda-agent[cuda12]" in state.detail and "cuda-agent[cuda13]" in state.detail
    monkeypatch.setattr(nvrtc_module, "_nvrtc", lambda: state)
    result = compile_cuda(VECTOR_ADD)
    assert not result.ok and result.status == "error" and result.cubin is None
    assert "pip install 'cuda-agent[cuda12]'" in result.error_summary()
    available, version, detail = nvrtc_module.nvrtc_info()
    assert available is False and version is None and "cuda-agent[cuda13]" in detail


@needs_nvrtc
def test_nvrtc_info_reports_version_and_headers():
    available, version, detail = nvrtc_info()
    assert available and version and version[0].isdigit() and "." in version
    assert f"NVRTC {version}" in detail and "headers" in detail


# ---------------------------------------------------------------------------------------------
# diagnostics
# ---------------------------------------------------------------------------------------------
def test_parse_log_variants():
    source = "line one\ntemplate <int N> struct F;\nint z = F<3>::v;\n"
    log = textwrap.dedent("""\
        kernel.cu(3): error: incomplete type "F<3>" is not allowed
          int z = F<3>::v;
                  ^
                  detected during instantiation of "F<3>" at line 3

        kernel.cu(3): note #2431-D: expression not folded to a constant
          int z = F<3>::v;
                  ^

        /usr/local/cuda/include/cuda_fp8.hpp(1460): error: this declaration has no storage class or type specifier
              __NV_SILENCE_DEPRECATION_BEGIN
              ^

        kernel.cu(1): warning #177-D: variable "x" was declared but never referenced
          line one
               ^

        Remark: The warnings can be suppressed with "-diag-suppress <warning-number>"

        ptxas error   : Entry function 'k' uses too much shared data (0x40000 bytes, 0xc000 max)
        nvrtc: error: invalid value for --gpu-architecture (-arch)
        2 errors detected in the compilation of "kernel.cu".
        """)
    diags = parse_nvrtc_log(log, source)
    assert [(d.severity, d.line) for d in diags] == [
        ("error", 3), ("error", None), ("warning", 1), ("error", None), ("error", None)]
    first = diags[0]
    assert first.source_line == "int z = F<3>::v;" and first.column == 9
    assert "detected during instantiation" in first.message and "note: expression not folded" in first.message
    assert diags[1].message.startswith("/usr/local/cuda/include/cuda_fp8.hpp(1460): this declaration")
    assert diags[2].column == 6
    assert diags[3].message.startswith("ptxas: Entry function 'k' uses too much shared data")
    assert diags[4].message == "invalid value for --gpu-architecture (-arch)"


def test_error_summary_limits_and_fallbacks():
    diags = [Diagnostic("error", i, None, f"problem {i}", f"code {i}") for i in range(1, 9)]
    result = CompileResult(ok=False, status="error", cubin=None, log="", diagnostics=diags)
    summary = result.error_summary()
    assert summary.splitlines()[:2] == ["line 1: problem 1", "    code 1"]
    assert "line 5: problem 5" in summary and "line 6" not in summary and summary.endswith("... and 3 more errors")
    timeout = CompileResult(ok=False, status="timeout", cubin=None, log="compile exceeded 30.0 s and was killed")
    assert timeout.error_summary() == "compile exceeded 30.0 s and was killed"


# ---------------------------------------------------------------------------------------------
# cache
# ---------------------------------------------------------------------------------------------
@needs_nvrtc
def test_cache_hit_on_second_compile(tmp_path):
    cache = CompileCache(tmp_path / "cache")
    first = compile_cuda(VECTOR_ADD, cache=cache)
    second = compile_cuda(VECTOR_ADD, cache=cache)
    assert first.ok and not first.cached
    assert second.ok and second.cached and second.cubin == first.cubin and second.key == first.key
    assert second.seconds < first.seconds / 5
    assert second.arch == "sm_90"


@needs_nvrtc
def test_cache_key_changes_with_source_options_arch():
    base = compile_key_for(VECTOR_ADD, arch="sm_90", options=["-DA=1", "-DB=2"])
    assert base == compile_key_for(VECTOR_ADD, arch="sm_90", options=("-DA=1", "-DB=2"))
    others = {
        compile_key_for(VECTOR_ADD + "\n", arch="sm_90", options=["-DA=1", "-DB=2"]),
        compile_key_for(VECTOR_ADD, arch="sm_80", options=["-DA=1", "-DB=2"]),
        compile_key_for(VECTOR_ADD, arch="sm_90", options=["-DA=1", "-DB=3"]),
        compile_key_for(VECTOR_ADD, arch="sm_90", options=["-DB=2", "-DA=1"]),   # order matters
        compile_key_for(VECTOR_ADD, arch="sm_90", options=["-DA=1", "-DB=2"], filename="other.cu"),
    }
    assert base not in others and len(others) == 5


@needs_nvrtc
def test_failed_compiles_are_cached_with_diagnostics(tmp_path):
    cache = CompileCache(tmp_path)
    first = compile_cuda(BAD_SOURCE, cache=cache)
    again = compile_cuda(BAD_SOURCE, cache=cache)
    assert not again.ok and again.cached and again.status == "error"
    assert again.diagnostics == first.diagnostics and again.error_summary() == first.error_summary()


def test_timeouts_and_crashes_are_not_cached(tmp_path):
    cache = CompileCache(tmp_path)
    for status in ("timeout", "crashed"):
        result = CompileResult(ok=False, status=status, cubin=None, log="x", key="ab" * 32)
        assert cache.put(result) is False
        assert cache.get(result.key) is None


@needs_nvrtc
def test_corrupt_cache_entries_are_ignored_and_rewritten(tmp_path):
    cache = CompileCache(tmp_path)
    first = compile_cuda(VECTOR_ADD, cache=cache)
    meta = tmp_path / first.key[:2] / f"{first.key}.json"
    cubin = meta.with_suffix(".cubin")

    meta.write_text("{not json")
    assert cache.get(first.key) is None and not meta.exists()
    rebuilt = compile_cuda(VECTOR_ADD, cache=cache)
    assert rebuilt.ok and not rebuilt.cached and meta.exists()

    cubin.write_bytes(cubin.read_bytes()[:100])          # truncated cubin: checksum mismatch
    assert cache.get(first.key) is None
    assert not compile_cuda(VECTOR_ADD, cache=cache).cached
    assert compile_cuda(VECTOR_ADD, cache=cache).cached

    data = json.loads(meta.read_text())
    data["key"] = "0" * 64                                 # entry that claims another key
    meta.write_text(json.dumps(data))
    assert cache.get(first.key) is None


def test_cache_prunes_least_recently_used(tmp_path):
    writer = CompileCache(tmp_path, max_bytes=10**9)
    keys = [f"{i:02d}" * 32 for i in range(8)]
    for i, key in enumerate(keys):
        assert writer.put(CompileResult(ok=True, status="ok", cubin=bytes(10_000), log="", key=key, arch="sm_90"))
        meta = tmp_path / key[:2] / f"{key}.json"
        os.utime(meta, (1_000_000 + i, 1_000_000 + i))     # deterministic ages: key 0 oldest
    os.utime(tmp_path / keys[0][:2] / f"{keys[0]}.json", (2_000_000, 2_000_000))   # key 0 used last
    assert writer.size_bytes() > 80_000
    capped = CompileCache(tmp_path, max_bytes=50_000)
    assert capped.prune() > 0
    assert capped.size_bytes() <= 40_000
    assert capped.get(keys[0]) is not None                 # recently used survives
    assert capped.get(keys[1]) is None                     # oldest unused is gone
    assert capped.get(keys[7]) is not None


def test_cache_put_enforces_size_cap(tmp_path):
    cache = CompileCache(tmp_path, max_bytes=50_000)
    for i in range(10):
        cache.put(CompileResult(ok=True, status="ok", cubin=bytes(10_000), log="", key=f"{i:02d}" * 32, arch="sm_90"))
    assert cache.size_bytes() <= 50_000
    assert cache.get("09" * 32) is not None                # the newest entry is kept


def test_default_cache_dir_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_AGENT_CACHE", str(tmp_path / "here"))
    assert default_cache_dir() == tmp_path / "here" / "compile"     # beside baselines/ and ceilings/
    assert CompileCache().directory == tmp_path / "here" / "compile"
    monkeypatch.delenv("CUDA_AGENT_CACHE")
    assert default_cache_dir() == Path.home() / ".cache" / "cuda-agent" / "compile"


# ---------------------------------------------------------------------------------------------
# compile pool
# ---------------------------------------------------------------------------------------------
FAKE_COMPILERS = textwrap.dedent("""\
    import os, signal, time
    from core.toolchain.diagnostics import CompileResult

    def compile(source, *, arch, options, filename):
        if source.startswith("sleep:"):
            time.sleep(float(source[6:].split("#")[0]))
        elif source == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        elif source == "raise":
            raise ValueError("injected failure")
        return CompileResult(ok=True, status="ok", cubin=b"\\x7fELF" + source.encode(), log="",
                             arch=arch, seconds=0.0)
    """)


@pytest.fixture
def fake_compilers(tmp_path, monkeypatch):
    """A module the spawned workers can import by name (spawn copies sys.path to the child)."""
    folder = tmp_path / "fakes"
    folder.mkdir()
    (folder / "toolchain_fake_compilers.py").write_text(FAKE_COMPILERS)
    monkeypatch.syspath_prepend(str(folder))
    return "toolchain_fake_compilers:compile"


def test_pool_injected_timeout_kills_and_recovers(fake_compilers):
    with CompilePool(workers=1, timeout=1.0, cache=None, compile_fn=fake_compilers) as pool:
        assert pool.worker_pids() == [None]                  # workers start lazily
        assert pool.compile("warm").ok
        old_pid = pool.worker_pids()[0]
        start = time.perf_counter()
        result = pool.compile("sleep:30")
        elapsed = time.perf_counter() - start
        assert result.status == "timeout" and not result.ok and result.cubin is None
        assert result.log == "compile exceeded 1.0 s and was killed"
        assert elapsed < 2.0
        after = pool.compile("next")
        assert after.ok and after.cubin == b"\x7fELFnext"
        assert pool.worker_pids()[0] not in (None, old_pid)


def test_pool_crash_is_reported_and_worker_replaced(fake_compilers):
    with CompilePool(workers=1, timeout=20.0, cache=None, compile_fn=fake_compilers) as pool:
        crashed = pool.compile("crash")
        assert crashed.status == "crashed" and not crashed.ok and "SIGSEGV" in crashed.log
        raised = pool.compile("raise")
        assert raised.status == "crashed" and "ValueError: injected failure" in raised.log
        assert pool.compile("fine").ok


def test_pool_runs_jobs_in_parallel_with_futures(fake_compilers):
    with CompilePool(workers=2, timeout=20.0, cache=None, compile_fn=fake_compilers) as pool:
        for f in [pool.submit("warm-a"), pool.submit("warm-b")]:
            f.result()
        start = time.perf_counter()
        futures = [pool.submit(f"sleep:0.6#{i}") for i in range(4)]   # "#i" keeps the sources distinct
        results = [f.result() for f in futures]
        elapsed = time.perf_counter() - start
        assert all(r.ok for r in results)
        assert elapsed < 2.0            # one worker would need 2.4 s
        # Many threads submitting at once: every job answered, each with its own result.
        with ThreadPoolExecutor(6) as threads:
            futures = list(threads.map(lambda i: pool.submit(f"job{i}"), range(24)))
        assert sorted(f.result().cubin for f in futures) == sorted(b"\x7fELFjob%d" % i for i in range(24))


def test_pool_joins_a_compile_of_the_same_source_in_flight(fake_compilers):
    with CompilePool(workers=2, timeout=20.0, cache=None, compile_fn=fake_compilers) as pool:
        first = pool.submit("sleep:0.5#same")
        second = pool.submit("sleep:0.5#same")        # e.g. the loop asking for what compile-ahead started
        other = pool.submit("sleep:0.5#other")
        assert second is first and other is not first
        assert first.result().ok and other.result().ok
        again = pool.submit("sleep:0.5#same")          # done jobs are forgotten: a fresh compile
        assert again is not first and again.result().ok


def test_pool_close_cancels_and_refuses(fake_compilers):
    pool = CompilePool(workers=1, timeout=20.0, cache=None, compile_fn=fake_compilers)
    running = pool.submit("sleep:10#running")
    queued = pool.submit("sleep:10#queued")
    deadline = time.monotonic() + 10
    while pool.worker_pids() == [None] and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)                       # let the worker take the job
    start = time.perf_counter()
    pool.close()
    assert time.perf_counter() - start < 5.0
    with pytest.raises(PoolClosedError):
        running.result(timeout=5)
    assert queued.cancelled()
    with pytest.raises(PoolClosedError):
        pool.submit("late")
    assert pool.worker_pids() == [None]


def test_pool_reports_unloadable_compile_fn(tmp_path):
    with CompilePool(workers=1, timeout=20.0, cache=None, compile_fn="no_such_module_xyz:compile") as pool:
        result = pool.compile("anything")
        assert result.status == "crashed" and "no_such_module_xyz" in result.log


@needs_nvrtc
def test_pool_real_nvrtc_timeout_then_next_compile_succeeds(tmp_path):
    cache = CompileCache(tmp_path)
    with CompilePool(workers=1, timeout=2.0, cache=cache) as pool:
        warm = pool.compile(VECTOR_ADD)                     # worker started and NVRTC loaded
        assert warm.ok and warm.cubin.startswith(ELF_MAGIC)
        old_pid = pool.worker_pids()[0]
        start = time.perf_counter()
        slow = pool.compile(SLOW_NVRTC_SOURCE)
        elapsed = time.perf_counter() - start
        assert slow.status == "timeout" and slow.log == "compile exceeded 2.0 s and was killed"
        assert elapsed < 3.0
        assert slow.key not in cache                        # timeouts are not cached
        fresh = pool.compile(VECTOR_ADD.replace("a[i] + b[i]", "a[i] - b[i]"))
        assert fresh.ok and fresh.cubin.startswith(ELF_MAGIC) and not fresh.cached
        assert pool.worker_pids()[0] not in (None, old_pid)


@needs_nvrtc
def test_pool_checks_cache_before_dispatch(tmp_path):
    cache = CompileCache(tmp_path)
    with CompilePool(workers=1, timeout=30.0, cache=cache) as pool:
        first = pool.compile(VECTOR_ADD, options=["-DUNUSED=1"])
        assert first.ok and not first.cached
        assert first.key == compile_key_for(VECTOR_ADD, options=["-DUNUSED=1"])
        again = pool.submit(VECTOR_ADD, options=["-DUNUSED=1"])
        assert again.done()                                 # answered in the caller's thread
        assert again.result().cached and again.result().cubin == first.cubin
        bad = pool.compile(BAD_SOURCE)
        assert not bad.ok and bad.errors[0].line == 4
        assert pool.submit(BAD_SOURCE).result().cached     # failures are cached too


# ---------------------------------------------------------------------------------------------
# resources and occupancy
# ---------------------------------------------------------------------------------------------
RESOURCE_SOURCE = textwrap.dedent("""\
    extern "C" __global__ void smem_kernel(const float* x, float* y) {
      __shared__ float s[N];
      s[threadIdx.x] = x[threadIdx.x];
      __syncthreads();
      y[threadIdx.x] = s[N - 1 - threadIdx.x];
    }
    template <typename T>
    __global__ void spill_kernel(T* y, int n) {
      T a[64];
      for (int i = 0; i < 64; ++i) a[i] = y[i * n];
      T s = 0;
      for (int i = 0; i < 64; ++i) s += a[(i * 7 + n) & 63] * a[i];
      y[threadIdx.x] = s;
    }
    template __global__ void spill_kernel<float>(float*, int);
    """)


@needs_nvcc
def test_resource_report_shared_memory_and_defines():
    report = resource_report(RESOURCE_SOURCE, arch="sm_90", options=["-DN=256"])
    smem = report["smem_kernel"]
    assert isinstance(smem, KernelResources)
    assert smem.shared_bytes == 256 * 4 and smem.barriers == 1 and smem.registers > 0
    assert smem.spill_stores == 0 and smem.spill_loads == 0
    assert "_Z12spill_kernelIfEvPT_i" in report           # C++ kernels keep their mangled symbol
    assert resource_report(RESOURCE_SOURCE, arch="sm_90", options=["-DN=512"])["smem_kernel"].shared_bytes == 2048


@needs_nvcc
def test_resource_report_spills_under_register_cap():
    report = resource_report(RESOURCE_SOURCE, arch="sm_80", options=["-DN=32", "-maxrregcount=16"])
    spill = report["_Z12spill_kernelIfEvPT_i"]
    assert spill.registers <= 24                           # ptxas raises 16 to its sm_80 minimum of 24
    assert spill.spill_stores > 0 and spill.spill_loads > 0 and spill.stack_bytes > 0
    assert spill.constant_bytes > 0                        # sm_80 reports the parameter bank cmem[0]


@needs_nvcc
def test_resource_report_errors_are_toolchain_errors():
    with pytest.raises(ToolchainError, match=r"kernel\.cu\(1\): error"):
        resource_report("int x = ;\n")


@needs_nvrtc
def test_ptxas_statistics_from_nvrtc_log():
    # NVRTC prints the same ptxas report into its log, so the cubin's own numbers need no nvcc.
    result = compile_cuda(RESOURCE_SOURCE, arch="sm_80", options=["-DN=256", "--ptxas-options=-v"])
    assert result.ok, result.log
    report = parse_ptxas_verbose(result.log)
    assert report["smem_kernel"].shared_bytes == 1024 and report["smem_kernel"].barriers == 1
    assert report["_Z12spill_kernelIfEvPT_i"].stack_bytes > 0
    assert not result.errors


def test_resource_report_without_nvcc(monkeypatch):
    monkeypatch.setattr(resources_module, "find_nvcc", lambda: None)
    with pytest.raises(ToolchainError, match="needs nvcc"):
        resource_report(VECTOR_ADD)


def test_parse_ptxas_verbose_canned():
    text = textwrap.dedent("""\
        ptxas info    : 0 bytes gmem
        ptxas info    : Function properties for helper
            16 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
        ptxas info    : Compiling entry function 'k1' for 'sm_90'
        ptxas info    : Function properties for k1
            1072 bytes stack frame, 1024 bytes spill stores, 1144 bytes spill loads
        ptxas info    : Used 24 registers, used 0 barriers, 1088 bytes cumulative stack size, 364 bytes cmem[0]
        ptxas info    : Compiling entry function 'k2' for 'sm_90'
        ptxas info    : Function properties for k2
            0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
        ptxas info    : Used 14 registers, used 1 barriers, 4096 bytes smem, 368 bytes cmem[0], 8 bytes cmem[2]
        """)
    report = parse_ptxas_verbose(text)
    assert set(report) == {"k1", "k2"}
    assert report["k1"] == KernelResources(registers=24, shared_bytes=0, spill_stores=1024, spill_loads=1144,
                                           stack_bytes=1088, constant_bytes=364, barriers=0)
    assert report["k2"] == KernelResources(registers=14, shared_bytes=4096, spill_stores=0, spill_loads=0,
                                           stack_bytes=0, constant_bytes=376, barriers=1)


@pytest.mark.parametrize("registers, shared, threads, arch, expected", [
    (32, 0, 256, "sm_90", 1.0),            # 8 blocks x 8 warps = 64 warps
    (64, 0, 1024, "sm_90", 0.5),           # 2048 regs/warp -> 32 warps fit
    (64, 0, 1024, "sm_80", 0.5),
    (255, 0, 128, "sm_90", 0.125),         # 8192 regs/warp -> 2 warps per sub-partition
    (32, 100 * 1024, 256, "sm_90", 0.25),  # (100 KB + 1 KB reserved) x 2 fits in 228 KB
    (32, 100 * 1024, 256, "sm_80", 0.125), # only 1 block fits in 164 KB
    (32, 100 * 1024, 256, "sm_86", 0.0),   # over sm_86's 99 KB per block: cannot launch
    (32, 228 * 1024, 256, "sm_90", 0.0),   # over 227 KB per block
    (16, 0, 32, "sm_90", 0.5),             # 32 resident blocks x 1 warp
    (16, 0, 32, "sm_89", 0.5),             # 24 blocks / 48 warps
    (16, 0, 32, "sm_86", 1 / 3),           # 16 blocks / 48 warps
    (32, 0, 1024, "sm_86", 2 / 3),         # 48 warps per SM: one 32-warp block
    (40, 0, 256, "sm_90", 0.75),           # 1280 regs/warp -> 12 per partition -> 48 warps -> 6 blocks
    (32, 0, 96, "sm_90", 63 / 64),         # 3-warp blocks: 21 blocks x 3 = 63 warps of 64 (warp limit)
    (32, 0, 2048, "sm_90", 0.0),           # more than 1024 threads per block
])
def test_theoretical_occupancy_known_values(registers, shared, threads, arch, expected):
    assert theoretical_occupancy(registers, shared, threads, arch) == pytest.approx(expected)


def test_occupancy_limits_and_errors():
    assert max_active_blocks(32, 0, 256, "sm_90") == 8
    assert max_active_blocks(32, 0, 256, "sm_90a") == 8
    assert max_active_blocks(16, 0, 64, "sm_90", barriers=16) == 4   # 64 named barriers per SM / 16
    with pytest.raises(ValueError, match="sm_75"):
        theoretical_occupancy(32, 0, 256, "sm_61")
    with pytest.raises(ValueError):
        theoretical_occupancy(32, 0, 0, "sm_90")


@needs_nvrtc
def test_compile_ptx_gives_readable_ptx_or_the_log():
    from core.toolchain import compile_ptx

    ok, ptx = compile_ptx(VECTOR_ADD, arch="sm_80", options=["-DUNUSED=1"])
    assert ok and ".visible .entry vector_add" in ptx and ".target sm_80" in ptx
    ok, log = compile_ptx(BAD_SOURCE, arch="sm_90")
    assert not ok and "undefined" in log
    ok, why = compile_ptx(VECTOR_ADD, arch="sm_90", options=["-arch=sm_80"])
    assert not ok and "sets the architecture" in why


def test_pool_runs_a_compile_someone_waits_for_before_queued_speculative_ones(fake_compilers):
    with CompilePool(workers=1, timeout=20.0, cache=None, compile_fn=fake_compilers) as pool:
        pool.compile("warm")
        busy = pool.submit("sleep:0.6#busy")                       # holds the only worker
        ahead = [pool.submit(f"sleep:0.6#ahead{i}", speculative=True) for i in range(3)]
        time.sleep(0.1)
        start = time.perf_counter()
        urgent = pool.compile("urgent")
        waited = time.perf_counter() - start
        assert urgent.ok and waited < 1.5                          # behind `busy` only, not the 1.8 s queued
        assert not all(f.done() for f in ahead)
        assert busy.result().ok and all(f.result().ok for f in ahead)


def test_pool_moves_a_speculative_compile_to_the_front_when_someone_asks_for_it(fake_compilers):
    with CompilePool(workers=1, timeout=20.0, cache=None, compile_fn=fake_compilers) as pool:
        pool.compile("warm")
        busy = pool.submit("sleep:0.6#busy")
        ahead = [pool.submit(f"sleep:0.6#ahead{i}", speculative=True) for i in range(3)]
        time.sleep(0.1)
        start = time.perf_counter()
        joined = pool.submit("sleep:0.6#ahead2")                   # the last prediction, now wanted
        assert joined is ahead[2]
        assert joined.result().ok and time.perf_counter() - start < 1.6     # not after ahead0 and ahead1 (2.3 s)
        assert not ahead[1].done()
        assert busy.result().ok and all(f.result().ok for f in ahead)      # each compiled once, all answered
        assert pool.submit("sleep:0.6#ahead2", speculative=True) is not joined    # done jobs are forgotten


def test_pool_keeps_one_worker_for_compiles_someone_waits_for(fake_compilers):
    with CompilePool(workers=3, timeout=20.0, cache=None, compile_fn=fake_compilers) as pool:
        assert pool.reserved_urgent
        for f in [pool.submit(f"sleep:0.3#warm{i}") for i in range(3)]:     # start all three workers
            assert f.result().ok
        assert None not in pool.worker_pids()
        ahead = [pool.submit(f"sleep:1.5#ahead{i}", speculative=True) for i in range(4)]
        time.sleep(0.2)
        start = time.perf_counter()
        urgent = pool.compile("sleep:0.1#urgent")                  # nobody predicted it
        waited = time.perf_counter() - start
        assert urgent.ok and waited < 0.8                          # not behind a 1.5 s prediction
        assert sum(f.running() for f in ahead) == 2                # predictions never took the third
        assert all(f.result().ok for f in ahead)
    with CompilePool(workers=2, timeout=20.0, cache=None, compile_fn=fake_compilers) as small:
        assert not small.reserved_urgent                           # two workers: both compile ahead


def test_pool_withdraws_a_queued_speculative_compile_but_not_one_someone_waits_for(fake_compilers):
    with CompilePool(workers=1, timeout=20.0, cache=None, compile_fn=fake_compilers) as pool:
        pool.compile("warm")
        busy = pool.submit("sleep:0.4#busy", speculative=True)
        stale = pool.submit("sleep:0.6#stale", speculative=True)
        wanted = pool.submit("sleep:0.1#wanted", speculative=True)
        time.sleep(0.1)                                             # `busy` is compiling: taken
        assert not pool.withdraw("sleep:0.4#busy")                 # started: runs to the end
        assert pool.submit("sleep:0.1#wanted") is wanted            # now the loop waits for it
        assert not pool.withdraw("sleep:0.1#wanted")
        start = time.perf_counter()
        assert pool.withdraw("sleep:0.6#stale") and stale.cancelled()
        assert not pool.withdraw("sleep:0.6#stale")                 # gone
        assert wanted.result().ok and busy.result().ok
        assert time.perf_counter() - start < 0.9
        again = pool.submit("sleep:0.6#stale", speculative=True)    # predicted again: compiled anew
        assert again.result().ok

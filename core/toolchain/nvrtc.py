"""In-process CUDA C++ -> cubin with NVRTC, through CuPy's low-level binding.

Only ``cupy.cuda.nvrtc`` (createProgram / compileProgram / getCUBIN / getProgramLog /
destroyProgram) is used: it needs libnvrtc but no driver and no GPU. CuPy's high-level
compiler asks the CUDA runtime for the device and fails on a machine without a driver.

Options NVRTC gets, in order: ``-arch=sm_XX`` (a real architecture, so the output is a cubin),
``--std=c++17``, ``-lineinfo`` (source lines for profilers), ``-I`` for the CUDA headers found
on this machine (see find_header_dirs), then the caller's options (``-DBLOCK=256``...).
``-default-device`` is deliberately not added: with it, helper functions without
``__device__`` compile under NVRTC but not under nvcc, and exported kernels are built by nvcc.
Nothing is prepended to the source, so NVRTC's line numbers are the user's line numbers.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from .cache import CompileCache, compile_key
from .diagnostics import CompileResult, Diagnostic, parse_nvrtc_log

INSTALL_HINT = (
    "Install CuPy with the NVRTC wheel: pip install 'cuda-agent[cuda12]' for CUDA 12 drivers or "
    "pip install 'cuda-agent[cuda13]' for CUDA 13 drivers (no GPU is needed to compile)."
)
DEFAULT_OPTIONS = ("--std=c++17", "-lineinfo")

_ARCH = re.compile(r"^(?:sm_?)?(\d{2,3})([af]?)$")


# --------------------------------------------------------------------------------------------
# NVRTC loading
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _NvrtcState:
    module: object | None     # cupy.cuda.nvrtc, or None when unavailable
    version: str | None       # "12.9"
    major: int | None
    supported: tuple[int, ...]
    detail: str               # what was loaded, or why nothing was (with the install hint)


@functools.lru_cache(maxsize=1)
def _nvrtc() -> _NvrtcState:
    try:
        import cupy
        from cupy.cuda import nvrtc as module
    except Exception as exc:   # ImportError, or CuPy failing during its own import
        return _NvrtcState(None, None, None, (), f"CuPy is not available ({type(exc).__name__}: {exc}). {INSTALL_HINT}")
    try:
        major, minor = module.getVersion()
        supported = tuple(int(a) for a in module.getSupportedArchs())
    except Exception as exc:   # libnvrtc missing or not loadable
        return _NvrtcState(None, None, None, (),
                           f"CuPy {cupy.__version__} is installed but NVRTC (libnvrtc) could not be loaded "
                           f"({type(exc).__name__}: {exc}). {INSTALL_HINT}")
    return _NvrtcState(module, f"{major}.{minor}", int(major), supported,
                       f"NVRTC {major}.{minor} via CuPy {cupy.__version__}")


def nvrtc_version() -> str | None:
    return _nvrtc().version


# --------------------------------------------------------------------------------------------
# CUDA headers (cuda_fp16.h, cuda_bf16.h, cuda/std/...)
# --------------------------------------------------------------------------------------------
# NVRTC ships no CUDA headers: without -I, `#include <cuda_fp16.h>` fails with "could not open
# source file". They live in the nvidia-cuda-runtime wheel (cu12: nvidia/cuda_runtime/include,
# cu13: nvidia/cu13/include), in a toolkit (CUDA_HOME, /usr/local/cuda, beside nvcc), and CuPy
# bundles CCCL (cuda/std, cub, thrust). Headers of the same major version as NVRTC are preferred:
# NVRTC 12.9 with CUDA 13.0 headers handles cuda_fp16.h/cuda_bf16.h but not cuda_fp8.h or
# cooperative_groups.h (they use macros only newer NVRTC builtins define).
@dataclass(frozen=True)
class HeaderDirs:
    cuda_include: str | None
    cuda_version: str | None          # of the chosen headers, e.g. "13.0"
    cccl_include: str | None          # directory holding cuda/std/...
    matched: bool                     # headers and NVRTC share the major version
    note: str                         # one line for nvrtc_info and for failed #include hints

    def options(self) -> list[str]:
        # CCCL first: a CUDA 12 toolkit also has cuda/std directly under include/.
        return [f"-I{d}" for d in (self.cccl_include, self.cuda_include) if d]


def _header_version(include: Path) -> tuple[int, int] | None:
    for name, macro in (("cuda_runtime_api.h", "CUDART_VERSION"), ("cuda.h", "CUDA_VERSION")):
        try:
            text = (include / name).read_text(errors="replace")
        except OSError:
            continue
        m = re.search(rf"#define\s+{macro}\s+(\d+)", text)
        if m:
            value = int(m.group(1))
            return value // 1000, (value % 1000) // 10
    return None


def _nvidia_wheel_dirs() -> list[Path]:
    """site-packages/nvidia folders (a namespace package, possibly several)."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(p) for p in spec.submodule_search_locations]


def _toolkit_includes(root: Path) -> list[Path]:
    return [root / "include", *sorted(root.glob("targets/*/include"))]


def _nvcc_includes() -> list[Path]:
    """nvcc's own include dirs. /usr/local/bin/nvcc can be a wrapper script, so ask nvcc itself."""
    nvcc = shutil.which("nvcc")
    if not nvcc:
        return []
    found = _toolkit_includes(Path(os.path.realpath(nvcc)).parent.parent)
    if any((p / "cuda_fp16.h").is_file() for p in found):
        return found
    try:
        out = subprocess.run([nvcc, "--dryrun", "-cubin", "-x", "cu", os.devnull, "-o", os.devnull],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return found
    text = out.stdout + out.stderr
    m = re.search(r'INCLUDES="?-I"?([^"\s]+)', text)
    if m:
        found.insert(0, Path(os.path.normpath(m.group(1))))
    return found


def _unique_with_fp16(dirs: Iterable[Path]) -> list[Path]:
    result: list[Path] = []
    seen: set[Path] = set()
    for d in dirs:
        if (d / "cuda_fp16.h").is_file() and d.resolve() not in seen:
            seen.add(d.resolve())
            result.append(d)
    return result


def cuda_include_candidates(nvrtc_major: int | None = None) -> list[Path]:
    """Folders holding cuda_fp16.h, in search order: wheels, CUDA_HOME/CUDA_PATH, /usr/local/cuda,
    then nvcc's own (asked only when nothing earlier has NVRTC's major version: it runs nvcc)."""
    dirs: list[Path] = []
    for nvidia in _nvidia_wheel_dirs():
        dirs += sorted(nvidia.glob("cu[0-9]*/include"), reverse=True)     # cu13 layout: nvidia/cu13/include
        dirs.append(nvidia / "cuda_runtime" / "include")                  # cu12 layout
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            dirs += _toolkit_includes(Path(os.environ[env]))
    dirs += _toolkit_includes(Path("/usr/local/cuda"))
    found = _unique_with_fp16(dirs)
    if not any((v := _header_version(d)) is not None and v[0] == nvrtc_major for d in found):
        found = _unique_with_fp16([*found, *_nvcc_includes()])
    return found


def _runtime_wheel(nvrtc_major: int | None) -> str:
    """The pip package with CUDA headers matching an NVRTC major version."""
    major = nvrtc_major or 12
    return "nvidia-cuda-runtime" if major >= 13 else f"nvidia-cuda-runtime-cu{major}"


def _cupy_cccl() -> Path | None:
    try:
        spec = importlib.util.find_spec("cupy")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "_core" / "include" / "cupy" / "_cccl" / "libcudacxx"
    return path if (path / "cuda" / "std").is_dir() else None


def _has_cccl(d: Path) -> bool:
    return (d / "cuda" / "std" / "type_traits").is_file()


def choose_header_dirs(nvrtc_major: int | None, candidates: Sequence[Path],
                       wheel_cccl: Sequence[Path] = (), cupy_cccl: Path | None = None,
                       nvrtc_version: str | None = None) -> HeaderDirs:
    """Pick CUDA and CCCL include dirs; a pure function of what was found (tested on fake trees)."""
    versions = {d: _header_version(d) for d in candidates}
    matched = [d for d in candidates if versions[d] is not None and versions[d][0] == nvrtc_major]
    cuda = matched[0] if matched else (candidates[0] if candidates else None)
    version = versions.get(cuda) if cuda is not None else None
    version_text = f"{version[0]}.{version[1]}" if version else None
    own_cccl = [p for p in ((cuda, cuda / "cccl") if cuda is not None else ()) if _has_cccl(p)]
    other_cccl = [p for p in wheel_cccl if _has_cccl(p)]
    bundle = [cupy_cccl] if cupy_cccl is not None else []
    # Same-version CCCL goes with same-version headers; CuPy's bundle is built for its NVRTC.
    order = own_cccl + other_cccl + bundle if matched else bundle + own_cccl + other_cccl
    cccl = order[0] if order else None
    if cuda is None:
        note = ("no CUDA headers found, so #include <cuda_fp16.h>/<cuda_bf16.h> fails; install them with "
                f"pip install {_runtime_wheel(nvrtc_major)} or set CUDA_HOME to a CUDA toolkit")
    elif matched:
        note = f"CUDA {version_text} headers from {cuda}"
    else:
        note = (f"CUDA {version_text or '?'} headers from {cuda} do not match NVRTC {nvrtc_version or '?'}: "
                "cuda_fp16.h/cuda_bf16.h work, newer headers (cuda_fp8.h, cooperative_groups.h) may not; "
                f"pip install {_runtime_wheel(nvrtc_major)} gives matching ones")
    if cccl is not None:
        note += f"; CCCL (cuda/std) from {cccl}"
    return HeaderDirs(str(cuda) if cuda else None, version_text, str(cccl) if cccl else None,
                      bool(matched), note)


@functools.lru_cache(maxsize=1)
def find_header_dirs() -> HeaderDirs:
    state = _nvrtc()
    wheel_cccl = [d / "cuda_cccl" / "include" for d in _nvidia_wheel_dirs()]
    return choose_header_dirs(state.major, cuda_include_candidates(state.major), wheel_cccl, _cupy_cccl(),
                              state.version)


def nvrtc_info() -> tuple[bool, str | None, str]:
    """(available, version like "12.9", one-paragraph detail incl. where the CUDA headers come from)."""
    state = _nvrtc()
    if state.module is None:
        return False, None, state.detail
    return True, state.version, f"{state.detail}; {find_header_dirs().note}"


# --------------------------------------------------------------------------------------------
# Options and keys
# --------------------------------------------------------------------------------------------
class OptionError(ValueError):
    pass


def normalize_arch(arch: str | int) -> str:
    """"sm_90", "90", 90, "sm_90a" -> "sm_90"/"sm_90a". Virtual archs (compute_XX) give PTX, not a cubin."""
    text = str(arch).strip().lower()
    m = _ARCH.match(text)
    if not m:
        raise OptionError(f"arch {arch!r} is not a real GPU architecture; use the form sm_90 (sm_80, sm_86, "
                          "sm_89, sm_90, sm_90a ...): a cubin needs a real architecture, not compute_XX")
    return f"sm_{m.group(1)}{m.group(2)}"


def build_options(arch: str, options: Iterable[str], headers: HeaderDirs | None = None) -> list[str]:
    """Full NVRTC option list: arch, defaults the caller did not override, include dirs, caller's options."""
    user = list(options)
    for opt in user:
        if not isinstance(opt, str):
            raise OptionError(f"compile option {opt!r} is not a string; pass options like '-DBLOCK=256'")
        if opt.startswith(("-arch", "--gpu-architecture", "-code", "--gpu-code")):
            raise OptionError(f"compile option {opt!r} sets the architecture; pass arch='sm_90' instead")
    result = [f"-arch={arch}"]
    if not any(o.startswith(("-std", "--std")) for o in user):
        result.append("--std=c++17")
    if not any(o in ("-lineinfo", "--generate-line-info") for o in user):
        result.append("-lineinfo")
    if headers is not None:
        result += headers.options()
    return result + user


def compile_key_for(source: str, *, arch: str = "sm_90", options: Iterable[str] = (),
                    filename: str = "kernel.cu", extra: str = "") -> str:
    """The cache key compile_cuda uses for these arguments (the pool checks the cache with it)."""
    state = _nvrtc()
    try:
        arch_n = normalize_arch(arch)
        opts = build_options(arch_n, options, find_header_dirs() if state.module is not None else None)
    except OptionError:
        arch_n, opts = str(arch), ["<invalid>", *map(str, options)]
    return compile_key(source, opts, arch_n, state.version, filename, extra)


# --------------------------------------------------------------------------------------------
# Compile
# --------------------------------------------------------------------------------------------
_CUDA_HEADER = re.compile(r'open source file "((?:cuda|cub|thrust|nv|cooperative_groups|crt)[^"]*|mma\.h|sm_\d+[^"]*)"')


def _failure(message: str, *, arch: str, key: str, start: float) -> CompileResult:
    return CompileResult(ok=False, status="error", cubin=None, log=message,
                         diagnostics=[Diagnostic("error", None, None, message, None)],
                         seconds=time.perf_counter() - start, cached=False, key=key, arch=arch)


def compile_cuda(source: str, *, arch: str = "sm_90", options: Iterable[str] = (),
                 filename: str = "kernel.cu", cache: CompileCache | None = None) -> CompileResult:
    """Compile CUDA C++ to a cubin in this process. Never raises for bad source, bad options or a
    missing NVRTC: those come back as CompileResult(ok=False, status="error") with a clear log."""
    start = time.perf_counter()
    options = list(options)
    state = _nvrtc()
    if state.module is None:
        # Not cached: the problem is this machine, not the source.
        return CompileResult(ok=False, status="error", cubin=None, log=state.detail, diagnostics=[],
                             seconds=time.perf_counter() - start, cached=False, key="", arch=str(arch))
    key = compile_key_for(source, arch=arch, options=options, filename=filename)
    try:
        arch_n = normalize_arch(arch)
        number = int(re.sub(r"\D", "", arch_n))
        if state.supported and number not in state.supported:
            raise OptionError(f"NVRTC {state.version} cannot compile for {arch_n}; it supports "
                              + ", ".join(f"sm_{a}" for a in state.supported))
        headers = find_header_dirs()
        full_options = build_options(arch_n, options, headers)
    except OptionError as exc:
        return _failure(str(exc), arch=str(arch), key=key, start=start)

    if cache is not None:
        hit = cache.get(key)
        if hit is not None:
            return hit

    nvrtc = state.module
    ok, cubin, log, failure = False, None, "", ""
    try:
        prog = nvrtc.createProgram(source, filename, [], [])
    except Exception as exc:
        return _failure(f"NVRTC could not create a program from the source ({exc})", arch=arch_n, key=key, start=start)
    try:
        try:
            nvrtc.compileProgram(prog, full_options)
            ok = True
        except nvrtc.NVRTCError as exc:
            failure = str(exc)
        log = nvrtc.getProgramLog(prog) or ""
        if ok:
            cubin = bytes(nvrtc.getCUBIN(prog))
    except Exception as exc:   # anything else from the binding: report, do not raise
        ok, failure = False, f"{type(exc).__name__}: {exc}"
    finally:
        try:
            nvrtc.destroyProgram(prog)
        except Exception:
            pass

    diagnostics = parse_nvrtc_log(log, source, filename)
    if not ok:
        diagnostics = _with_header_hint(diagnostics, headers)
        if not any(d.severity == "error" for d in diagnostics):
            message = f"NVRTC failed ({failure or 'no cubin'}) without an error in its log"
            diagnostics.append(Diagnostic("error", None, None, message, None))
            log = f"{log}\n{message}".strip()
    result = CompileResult(ok=ok, status="ok" if ok else "error", cubin=cubin, log=log,
                           diagnostics=diagnostics, seconds=time.perf_counter() - start,
                           cached=False, key=key, arch=arch_n)
    if cache is not None:
        cache.put(result)
    return result


def compile_ptx(source: str, *, arch: str = "sm_90", options: Iterable[str] = (),
                filename: str = "kernel.cu") -> tuple[bool, str]:
    """(True, PTX) or (False, NVRTC's log): the same source and options as compile_cuda, built for
    the virtual architecture (compute_XX) so that NVRTC keeps the PTX. For reading, not running."""
    state = _nvrtc()
    if state.module is None:
        return False, state.detail
    try:
        arch_n = normalize_arch(arch)
        virtual = "compute_" + re.sub(r"\D", "", arch_n) + ("a" if arch_n.endswith("a") else "")
        full_options = [f"-arch={virtual}"] + build_options(arch_n, options, find_header_dirs())[1:]
    except OptionError as exc:
        return False, str(exc)
    nvrtc = state.module
    try:
        prog = nvrtc.createProgram(source, filename, [], [])
    except Exception as exc:
        return False, f"NVRTC could not create a program from the source ({exc})"
    try:
        try:
            nvrtc.compileProgram(prog, full_options)
        except nvrtc.NVRTCError as exc:
            return False, (nvrtc.getProgramLog(prog) or "").strip() or str(exc)
        ptx = nvrtc.getPTX(prog)
        return True, ptx.decode(errors="replace").rstrip("\x00") if isinstance(ptx, bytes) else str(ptx)
    except Exception as exc:   # anything else from the binding: report, do not raise
        return False, f"{type(exc).__name__}: {exc}"
    finally:
        try:
            nvrtc.destroyProgram(prog)
        except Exception:
            pass


def _with_header_hint(diagnostics: list[Diagnostic], headers: HeaderDirs) -> list[Diagnostic]:
    """The first error about a missing CUDA header, or inside a CUDA header of another version than
    NVRTC, gets a line saying where headers come from and how to get matching ones."""
    if headers.cuda_include and headers.cccl_include and headers.matched:
        return diagnostics
    out, hinted = [], False
    for d in diagnostics:
        in_header = (not headers.matched and headers.cuda_include is not None and d.line is None
                     and d.message.startswith(headers.cuda_include))
        if not hinted and d.severity == "error" and (_CUDA_HEADER.search(d.message) or in_header):
            d = Diagnostic(d.severity, d.line, d.column, f"{d.message}\nhint: {headers.note}", d.source_line)
            hinted = True
        out.append(d)
    return out

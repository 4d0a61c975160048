"""CUDA toolchain: NVRTC compiles (in-process and in a killable process pool), an on-disk
compile cache, NVRTC log diagnostics, and ptxas resource usage / occupancy."""

from .cache import CompileCache, compile_key, default_cache_dir
from .diagnostics import CompileResult, Diagnostic, parse_nvrtc_log
from .nvrtc import (HeaderDirs, OptionError, build_options, compile_cuda, compile_key_for, compile_ptx, find_header_dirs,
                    normalize_arch, nvrtc_info, nvrtc_version)
from .pool import CompilePool, PoolClosedError
from .resources import (KernelResources, ToolchainError, find_nvcc, max_active_blocks, parse_ptxas_verbose,
                        resource_report, theoretical_occupancy)

__all__ = [
    "CompileCache", "CompilePool", "CompileResult", "Diagnostic", "HeaderDirs", "KernelResources",
    "OptionError", "PoolClosedError", "ToolchainError", "build_options", "compile_cuda", "compile_key", "compile_ptx",
    "compile_key_for", "default_cache_dir", "find_header_dirs", "find_nvcc", "max_active_blocks",
    "normalize_arch", "nvrtc_info", "nvrtc_version", "parse_nvrtc_log", "parse_ptxas_verbose",
    "resource_report", "theoretical_occupancy",
]

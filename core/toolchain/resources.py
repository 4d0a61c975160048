"""Per-kernel resource usage (ptxas -v through nvcc) and theoretical occupancy.

NVRTC does not print ptxas statistics, so resource_report compiles the same source with
``nvcc -cubin -arch=sm_XX -Xptxas -v``. nvcc 13.0 prints, per kernel::

    ptxas info    : Compiling entry function 'smem_kernel' for 'sm_90'
    ptxas info    : Function properties for smem_kernel
        0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
    ptxas info    : Used 14 registers, used 1 barriers, 1024 bytes smem, 368 bytes cmem[0]

(``N bytes smem`` and ``cmem[...]`` only appear when non-zero, ``N bytes cumulative stack size``
when a kernel has a stack.) Kernel names are the symbol names: extern "C" kernels as written,
C++ kernels mangled (that is what a module lookup needs).

NVRTC prints the same report into its program log when compiled with ``--ptxas-options=-v``;
parse_ptxas_verbose(result.log) reads that too, with no nvcc needed.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from .nvrtc import OptionError, normalize_arch

log = logging.getLogger(__name__)


class ToolchainError(Exception):
    """A build tool is missing or failed; the message says which and what to do."""


@dataclass
class KernelResources:
    registers: int
    shared_bytes: int        # static shared memory (dynamic shared memory is set at launch)
    spill_stores: int
    spill_loads: int
    stack_bytes: int         # max of the stack frame and the cumulative stack size
    constant_bytes: int      # constant bank bytes ptxas reports for the kernel (parameters etc.)
    barriers: int = 0        # named barriers used (__syncthreads counts as one)


# --------------------------------------------------------------------------------------------
# nvcc
# --------------------------------------------------------------------------------------------
def find_nvcc() -> str | None:
    """$NVCC, $CUDA_HOME/bin, $CUDA_PATH/bin, PATH, /usr/local/cuda/bin."""
    env = os.environ.get("NVCC")
    if env and shutil.which(env):
        return shutil.which(env)
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(var)
        if root and (Path(root) / "bin" / "nvcc").is_file():
            return str(Path(root) / "bin" / "nvcc")
    found = shutil.which("nvcc")
    if found:
        return found
    fallback = Path("/usr/local/cuda/bin/nvcc")
    return str(fallback) if fallback.is_file() else None


# NVRTC options with the same meaning for nvcc; the value after "=" is kept.
_PASS_PREFIXES = ("-D", "-U", "-I", "-maxrregcount", "--maxrregcount", "-use_fast_math", "--use_fast_math",
                  "-ftz", "--ftz", "-prec-div", "--prec-div", "-prec-sqrt", "--prec-sqrt", "-fmad", "--fmad",
                  "-std", "--std", "-lineinfo", "--generate-line-info", "-restrict", "--restrict",
                  "--extra-device-vectorization", "-extra-device-vectorization")
_RENAMES = {"--define-macro=": "-D", "--undefine-macro=": "-U", "--include-path=": "-I"}


def nvcc_options(options: Iterable[str]) -> list[str]:
    """NVRTC options -> nvcc options; NVRTC-only ones (e.g. -default-device) are dropped with a log line."""
    out: list[str] = []
    for opt in options:
        for long, short in _RENAMES.items():
            if opt.startswith(long):
                opt = short + opt[len(long):]
        if opt.startswith(_PASS_PREFIXES):
            out.append(opt)   # nvcc has the same short and long spellings as NVRTC for these
        else:
            log.info("resource_report: option %r has no nvcc equivalent here and is left out", opt)
    if not any(o.startswith(("-std", "--std")) for o in out):
        out.insert(0, "-std=c++17")
    return out


_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_BARRIERS = re.compile(r"used (\d+) barriers")
_SMEM = re.compile(r"(\d+) bytes smem")
_CMEM = re.compile(r"(\d+) bytes cmem\[\d+\]")
_CUMULATIVE = re.compile(r"(\d+) bytes cumulative stack size")


def parse_ptxas_verbose(text: str) -> dict[str, KernelResources]:
    """Parse `ptxas -v` output (one architecture) into per-kernel resources."""
    kernels: dict[str, KernelResources] = {}
    stacks: dict[str, tuple[int, int, int]] = {}
    current: str | None = None
    props_for: str | None = None
    for line in text.splitlines():
        if m := _ENTRY.search(line):
            current = m.group(1)
            kernels[current] = KernelResources(0, 0, 0, 0, 0, 0)
        elif m := _PROPS.search(line):
            props_for = m.group(1)
        elif m := _STACK.search(line):
            if props_for is not None:
                stacks[props_for] = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
        elif (m := _USED.search(line)) and current is not None:
            k = kernels[current]
            k.registers = int(m.group(1))
            k.barriers = int(b.group(1)) if (b := _BARRIERS.search(line)) else 0
            k.shared_bytes = int(s.group(1)) if (s := _SMEM.search(line)) else 0
            k.constant_bytes = sum(int(c) for c in _CMEM.findall(line))
            k.stack_bytes = int(c.group(1)) if (c := _CUMULATIVE.search(line)) else 0
    for name, k in kernels.items():
        frame, stores, loads = stacks.get(name, (0, 0, 0))
        k.stack_bytes = max(k.stack_bytes, frame)
        k.spill_stores, k.spill_loads = stores, loads
    return kernels


def resource_report(source: str, *, arch: str = "sm_90", options: Iterable[str] = (),
                    timeout: float = 120.0) -> dict[str, KernelResources]:
    """Registers, shared memory, spills, stack and constant bytes per kernel, from nvcc/ptxas.
    Raises ToolchainError when nvcc is missing, fails or runs past `timeout` seconds."""
    try:
        arch = normalize_arch(arch)
    except OptionError as exc:
        raise ToolchainError(str(exc)) from None
    nvcc = find_nvcc()
    if nvcc is None:
        raise ToolchainError(
            "resource_report needs nvcc (the CUDA toolkit compiler, which runs ptxas -v) but found none: "
            "looked at $NVCC, $CUDA_HOME/bin, $CUDA_PATH/bin, PATH and /usr/local/cuda/bin. Install the CUDA "
            "toolkit or set NVCC to its path; compiling with NVRTC works without it.")
    with tempfile.TemporaryDirectory(prefix="cuda-agent-ptxas-") as tmp:
        src = Path(tmp) / "kernel.cu"
        src.write_text(source)
        cmd = [nvcc, "-cubin", f"-arch={arch}", "-Xptxas", "-v", *nvcc_options(options),
               "-o", "kernel.cubin", "kernel.cu"]   # relative, so messages say kernel.cu(12)
        try:
            proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise ToolchainError(f"nvcc ran past {timeout:.0f} s while building the resource report for "
                                 f"{arch} and was stopped") from None
        except OSError as exc:
            raise ToolchainError(f"could not run nvcc at {nvcc}: {exc}") from None
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        lines = [ln for ln in output.splitlines() if ln.strip() and "ptxas info" not in ln][:12]
        raise ToolchainError(f"nvcc could not build the source for the resource report ({arch}, exit code "
                             f"{proc.returncode}):\n" + "\n".join(lines))
    return parse_ptxas_verbose(output)


# --------------------------------------------------------------------------------------------
# Occupancy (rules of cuda_occupancy.h, CUDA 13.0, default shared memory carveout)
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _SM:
    max_warps: int              # maxThreadsPerMultiprocessor / 32
    max_blocks: int             # resident blocks per SM
    smem_per_sm: int            # sharedMemPerMultiprocessor (max carveout)
    smem_per_block: int         # sharedMemPerBlockOptin
    reserved_smem: int          # reservedSharedMemPerBlock (driver, sm_80+)
    smem_granularity: int
    barriers_per_block_slot: int  # named barriers available = max_blocks * this

_WARP = 32
_REGS_PER_SM = 65536
_REGS_PER_BLOCK = 65536
_REG_GRANULARITY = 256         # registers are allocated per warp in units of 256
_MAX_REGS_PER_THREAD = 255     # ptxas never assigns more
_SUB_PARTITIONS = 4

_ARCHS: dict[int, _SM] = {
    70: _SM(64, 32, 98304, 98304, 0, 256, 2),
    75: _SM(32, 16, 65536, 65536, 0, 256, 2),
    80: _SM(64, 32, 167936, 166912, 1024, 128, 2),
    86: _SM(48, 16, 102400, 101376, 1024, 128, 1),
    89: _SM(48, 24, 102400, 101376, 1024, 128, 1),
    90: _SM(64, 32, 233472, 232448, 1024, 128, 2),
    100: _SM(64, 32, 233472, 232448, 1024, 128, 2),
}


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


def max_active_blocks(registers: int, shared_bytes: int, block_threads: int, arch: str = "sm_90",
                      barriers: int = 0) -> int:
    """Resident blocks per SM (the occupancy calculator's min over warps, registers, shared memory,
    block slots and barriers). shared_bytes = static + dynamic shared memory per block."""
    try:
        number = int(re.sub(r"\D", "", normalize_arch(arch)))
    except OptionError as exc:
        raise ValueError(str(exc)) from None
    sm = _ARCHS.get(number)
    if sm is None:
        raise ValueError(f"theoretical_occupancy knows sm_{'/sm_'.join(map(str, _ARCHS))}, not {arch}")
    if block_threads <= 0 or registers < 0 or shared_bytes < 0 or barriers < 0:
        raise ValueError(f"occupancy inputs must be positive: block_threads={block_threads}, "
                         f"registers={registers}, shared_bytes={shared_bytes}, barriers={barriers}")
    if block_threads > 1024:
        return 0
    warps = -(-block_threads // _WARP)
    limits = [sm.max_blocks, sm.max_warps // warps]

    if registers > _MAX_REGS_PER_THREAD:
        return 0
    if registers > 0:
        per_warp = _round_up(registers * _WARP, _REG_GRANULARITY)
        # The hardware check assumes the block's warps are spread over all 4 sub-partitions.
        if per_warp * _round_up(warps, _SUB_PARTITIONS) > _REGS_PER_BLOCK or per_warp * warps > _REGS_PER_BLOCK:
            return 0
        warps_per_partition = (_REGS_PER_SM // _SUB_PARTITIONS) // per_warp
        limits.append(warps_per_partition * _SUB_PARTITIONS // warps)

    smem = _round_up(shared_bytes + sm.reserved_smem, sm.smem_granularity)
    if smem > sm.smem_per_block + sm.reserved_smem:
        return 0
    if smem > 0:
        limits.append(sm.smem_per_sm // smem)

    if barriers > 0:
        limits.append(sm.max_blocks * sm.barriers_per_block_slot // barriers)
    return max(0, min(limits))


def theoretical_occupancy(registers: int, shared_bytes: int, block_threads: int, arch: str = "sm_90",
                          barriers: int = 0) -> float:
    """Active warps / maximum warps per SM, 0..1 (0 when the block cannot launch at all)."""
    blocks = max_active_blocks(registers, shared_bytes, block_threads, arch, barriers)
    number = int(re.sub(r"\D", "", normalize_arch(arch)))
    return blocks * -(-block_threads // _WARP) / _ARCHS[number].max_warps

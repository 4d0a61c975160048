"""Diagnose the exported launcher's argument checks on a GPU machine: build act_gelu's .cu once,
then call it with bad arguments, each in its own interpreter (a crash ends only that one), and
print how each ended; under gdb when gdb is there, for a native backtrace.
Run from the repository root:  PYTHONPATH=. python3 scripts/export_crash.py"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = {
    "good": "x",
    "cpu": "x.cpu()",
    "double": "x.double()",
    "flat": "x.reshape(-1)",
    "three_d": "x.reshape(1, 1001, 1003)",
    "empty": "torch.empty(0, 5, device='cuda')",
}


VARIANTS = r"""
#include <torch/extension.h>
#include <stdexcept>
void v_plain(at::Tensor t) { TORCH_CHECK(false, "plain text only"); }
void v_device(at::Tensor t) { TORCH_CHECK(false, "on ", t.device()); }
void v_int(at::Tensor t) { TORCH_CHECK(false, "rank ", int64_t(2)); }
void v_dim(at::Tensor t) { TORCH_CHECK(t.dim() == 2, "has ", t.dim()); }
void v_str(at::Tensor t) { TORCH_CHECK(false, "shape ", std::string("[12]")); }
void v_cstr(at::Tensor t) { std::string m = "dims " + std::to_string(t.dim()); TORCH_CHECK(false, m.c_str()); }
void v_throw(at::Tensor t) { throw std::invalid_argument("dims " + std::to_string(t.dim())); }
void v_size(at::Tensor t) { int64_t n = t.size(0); TORCH_CHECK(false, "size0 is big: ", n > 5 ? "yes" : "no"); }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("v_plain", &v_plain); m.def("v_device", &v_device); m.def("v_int", &v_int); m.def("v_dim", &v_dim);
  m.def("v_str", &v_str); m.def("v_cstr", &v_cstr); m.def("v_throw", &v_throw); m.def("v_size", &v_size);
}
"""


def _try(so: Path, module: str, call: str) -> str:
    code = (f"import torch, importlib.util as u; s = u.spec_from_file_location({module!r}, {str(so)!r}); "
            f"m = u.module_from_spec(s); s.loader.exec_module(m); x = torch.randn(1001, 1003, device='cuda')\n"
            f"try:\n    y = {call}; torch.cuda.synchronize(); print('returned')\n"
            f"except (RuntimeError, ValueError) as e:\n    print('raised:', type(e).__name__, str(e)[:200])\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    return f"rc {done.returncode}: {(done.stdout + done.stderr).strip()[-400:]}"


def main() -> None:
    sys.path.insert(0, str(ROOT))
    from torch.utils import cpp_extension

    from core.program import KernelProgram
    from core.project.export import export_candidate
    from core.tasks import load_task

    nvcc = shutil.which("nvcc")
    dry = subprocess.run([nvcc, "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull],
                         capture_output=True, text=True)
    top = re.search(r"^#\$ TOP=(.+)$", dry.stdout + dry.stderr, re.MULTILINE)
    if top:
        os.environ["CUDA_HOME"] = os.path.normpath(top.group(1).strip())
        cpp_extension.CUDA_HOME = os.environ["CUDA_HOME"]
    work = Path(tempfile.mkdtemp(prefix="export_crash_"))
    res = export_candidate(KernelProgram.load(ROOT / "resources/programs/act_gelu.json"),
                           load_task(ROOT / "resources/tasks/act_gelu.py"), work / "out",
                           {"candidate_id": 0, "gpu": "diag"}, name="act_gelu")
    build = work / "build"
    build.mkdir()
    (work / "variants.cu").write_text(VARIANTS)
    (work / "vbuild").mkdir()
    cpp_extension.load(name="variants_diag", sources=[str(work / "variants.cu")], build_directory=str(work / "vbuild"))
    vso = next((work / "vbuild").glob("variants_diag*.so"))
    for fn in ("v_plain", "v_device", "v_int", "v_dim", "v_str", "v_cstr", "v_throw", "v_size"):
        print(f"== variant {fn}: {_try(vso, 'variants_diag', f'm.{fn}(x.reshape(-1))')}")
    cpp_extension.load(name="act_gelu_diag", sources=[str(res.cu)], build_directory=str(build))
    so = next(build.glob("act_gelu_diag*.so"))
    print("built", so)
    gdb = shutil.which("gdb")
    for name, expr in CASES.items():
        code = (f"import torch, importlib.util as u; s = u.spec_from_file_location('act_gelu_diag', {str(so)!r}); "
                f"m = u.module_from_spec(s); s.loader.exec_module(m); x = torch.randn(1001, 1003, device='cuda')\n"
                f"try:\n    y = m.forward({expr}); torch.cuda.synchronize(); print('returned', [t.shape for t in y])\n"
                f"except RuntimeError as e:\n    print('raised:', str(e)[:300])\n")
        cmd = [sys.executable, "-c", code]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        print(f"== {name}: rc {done.returncode}: {(done.stdout + done.stderr).strip()[-600:]}")
        if done.returncode < 0 and gdb:
            g = subprocess.run([gdb, "-batch", "-ex", "run", "-ex", "bt 25", "--args", *cmd],
                               capture_output=True, text=True, timeout=300)
            print("\n".join(l for l in g.stdout.splitlines() if l.startswith("#"))[:6000])
    print("gdb:", gdb)


if __name__ == "__main__":
    main()

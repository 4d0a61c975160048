"""Load KernelBench-format task files: `class Model(nn.Module)`, `get_inputs()`, `get_init_inputs()`.

The file's text is executed into a fresh module object under a unique name (two tasks named
alike never clash), registered in sys.modules while the Task lives so that dataclasses and
pickling inside the file work. Output and weight shapes come from a run on meta tensors (no
data, no compute); only when that fails (an op without a meta kernel, a data-dependent op)
is the model built and run for real on the CPU. Every failure is a TaskError whose message is
one paragraph naming the file and the problem.
"""

from __future__ import annotations

import hashlib
import inspect
import itertools
import linecache
import random
import re
import sys
import traceback
import types
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, NoReturn

import numpy as np
import torch

from core.tasks.task import Task, TaskError, TensorSpec, _copy_inputs, exception_text, where_text

REQUIRED_NAMES = ("Model", "get_inputs", "get_init_inputs")

_module_counter = itertools.count(1)
_linecache_users: dict[str, int] = {}  # file name -> live tasks whose text linecache holds

# "# family: norm  minimum bytes: 536870912  flops: 123" anywhere in the first lines.
_HEADER_RE = re.compile(
    r"^#\s*family:\s*(?P<family>[\w-]+)"
    r"(?:.*?minimum bytes:\s*(?P<bytes>[\d_,]+))?"
    r"(?:.*?flops:\s*(?P<flops>[\d_,]+))?", re.MULTILINE)


def load_task(path: str | Path) -> Task:
    """Load one KernelBench-format .py file; the task is named after the file's stem."""
    path = Path(path)
    where = where_text(path.stem, path)
    if not path.exists():
        raise TaskError(f"{where} does not exist.", path=path, name=path.stem)
    if not path.is_file():
        raise TaskError(f"{where} is not a file (a task is one .py file).", path=path, name=path.stem)
    if path.suffix != ".py":
        raise TaskError(f"{where} is not a .py file: a task is a Python module with class Model, "
                        f"get_inputs() and get_init_inputs().", path=path, name=path.stem)
    try:
        source = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise TaskError(f"{where} is not valid UTF-8 text ({exc.reason} at byte {exc.start}).",
                        path=path, name=path.stem) from exc
    except OSError as exc:
        raise TaskError(f"{where} cannot be read: {exception_text(exc)}.",
                        path=path, name=path.stem) from exc
    return load_task_from_source(source, path.stem, path)


def load_task_from_source(source: str, name: str, path: str | Path | None = None) -> Task:
    """Load a task from its source text; `path` is only used in messages and kept on the Task."""
    path = Path(path) if path is not None else None
    fail = _Failer(name, path)
    filename = str(path) if path is not None else f"<task {name}>"
    try:
        code = compile(source, filename, "exec", dont_inherit=True)
    except SyntaxError as exc:
        if exc.lineno is None:  # e.g. null bytes in the source
            fail(f"cannot be compiled: {exc.msg}", exc)
        text = f": `{exc.text.strip()}`" if exc.text and exc.text.strip() else ""
        col = f", column {exc.offset}" if exc.offset else ""
        fail(f"has a syntax error at line {exc.lineno}{col}: {exc.msg}{text}", exc)
    except ValueError as exc:  # null bytes, on some Python versions
        fail(f"cannot be compiled: {exception_text(exc)}", exc)

    module = types.ModuleType(_module_name(name))
    module.__file__ = filename
    # Tracebacks and inspect.getsource() show the text that was executed, even when the file
    # does not exist here (source sent over a pipe) or has changed on disk since.
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    _linecache_users[filename] = _linecache_users.get(filename, 0) + 1
    sys.modules[module.__name__] = module
    try:
        with _rng_preserved():
            task = _load_into(module, code, source, name, path, fail)
    except BaseException:
        _forget(module.__name__, filename)
        raise
    weakref.finalize(task, _forget, module.__name__, filename)
    return task


# ---- suites ------------------------------------------------------------------------------------

@dataclass
class SuiteResult:
    """Every task of a folder that loaded, and every file that did not with its TaskError."""

    tasks: list[Task] = field(default_factory=list)
    errors: dict[Path, TaskError] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.errors

    def error_summary(self) -> str:
        return " ".join(f"[{p.name}] {e}" for p, e in self.errors.items())


class SuiteError(TaskError):
    """load_suite() found failing files; `.result` holds the tasks that loaded and every error."""

    def __init__(self, message: str, result: SuiteResult, folder: Path):
        super().__init__(message, path=folder)
        self.result = result


def scan_suite(folder: str | Path) -> SuiteResult:
    """Load every *.py file of `folder` (not recursive, sorted by name), keeping the failures.

    Raises TaskError only when `folder` is not a directory.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise TaskError(f"Task folder '{folder}' does not exist or is not a directory.", path=folder)
    result = SuiteResult()
    for file in sorted(folder.glob("*.py"), key=lambda p: p.name):
        try:
            result.tasks.append(load_task(file))
        except TaskError as exc:
            result.errors[file] = exc
    return result


def load_suite(folder: str | Path) -> list[Task]:
    """Load every *.py file of `folder` (sorted by name) and return the tasks.

    Strict: if any file fails, raises one SuiteError (a TaskError) whose message lists every
    failing file with its reason and whose `.result` is the complete SuiteResult; a folder with
    no .py file is a TaskError too. Use scan_suite() to get the good tasks and the failures
    without raising.
    """
    result = scan_suite(folder)
    if result.errors:
        count = len(result.errors)
        raise SuiteError(f"Task folder '{folder}': {count} of {count + len(result.tasks)} task "
                         f"files failed to load. {result.error_summary()}", result, Path(folder))
    if not result.tasks:
        raise TaskError(f"Task folder '{folder}' contains no .py task files.", path=folder)
    return result.tasks


# ---- the steps of one load ---------------------------------------------------------------------

class _Failer:
    """Raises TaskError("<Task file 'x.py'> <problem>.") for one task."""

    def __init__(self, name: str, path: Path | None):
        self.name, self.path = name, path
        self.where = where_text(name, path)

    def __call__(self, problem: str, cause: BaseException | None = None) -> NoReturn:
        err = TaskError(f"{self.where} {problem.rstrip('.')}.", path=self.path, name=self.name)
        raise err from cause


def _load_into(module: types.ModuleType, code: types.CodeType, source: str, name: str,
               path: Path | None, fail: _Failer) -> Task:
    filename = module.__file__
    try:
        exec(code, module.__dict__)
    except (Exception, SystemExit) as exc:
        fail(f"failed while its module was executed: {_with_line(exc, filename)}", exc)

    missing = [n for n in REQUIRED_NAMES if n not in module.__dict__]
    if missing:
        fail(f"is missing {', '.join(missing)}: a task file needs class Model(nn.Module), "
             f"get_inputs() and get_init_inputs()")
    model_cls = module.Model
    if not (isinstance(model_cls, type) and issubclass(model_cls, torch.nn.Module)):
        fail(f"defines Model as {type(model_cls).__name__}, not as a subclass of torch.nn.Module")
    for fn in ("get_inputs", "get_init_inputs"):
        if not callable(getattr(module, fn)):
            fail(f"defines {fn} as a {type(getattr(module, fn)).__name__}, not as a function")

    init_inputs = _call_factory(module.get_init_inputs, "get_init_inputs", "cpu", filename, fail)
    probe = _Probe(model_cls, module.get_inputs, init_inputs, filename, fail)
    input_specs = [TensorSpec.of(v) if isinstance(v, torch.Tensor) else None for v in probe.inputs]
    if not any(s is not None for s in input_specs):
        fail(f"has get_inputs() returning no tensor (got {_type_list(probe.inputs)}): "
             f"a task needs at least one tensor input")
    input_names = _input_names(model_cls, len(probe.inputs))
    _check_arity(model_cls, probe.inputs, fail)
    outputs, state = probe.run()

    header = _header(source)
    return Task(
        name=name, path=path, source=source,
        hash=hashlib.sha256(source.encode("utf-8")).hexdigest(),
        input_names=input_names, input_specs=input_specs,
        output_specs=[TensorSpec.of(t) for t in outputs],
        param_specs={k: TensorSpec.of(v) for k, v in state.items() if isinstance(v, torch.Tensor)},
        init_inputs=init_inputs,
        description=(module.__doc__ or "").strip().split("\n")[0].strip(),
        family=header[0], min_bytes=header[1], flops=header[2],
        specs_from=probe.specs_from, module=module)


class _Probe:
    """Finds the inputs, outputs and state_dict shapes: on meta tensors first, else on the CPU."""

    def __init__(self, model_cls: type, get_inputs: Callable, init_inputs: list, filename: str,
                 fail: _Failer):
        self.model_cls, self.get_inputs, self.init_inputs = model_cls, get_inputs, init_inputs
        self.filename, self.fail = filename, fail
        self.specs_from = "meta"
        self._cpu_inputs: list | None = None
        try:
            # Factory calls inside get_inputs() make meta tensors: no data drawn, instant.
            self.inputs = _call_factory(get_inputs, "get_inputs", "meta", filename, fail,
                                        wrap_errors=False)
        except TaskError:
            raise
        except Exception:
            self.inputs = self.cpu_inputs()  # e.g. .item() or numpy inside get_inputs()

    def cpu_inputs(self) -> list:
        if self._cpu_inputs is None:
            self._cpu_inputs = _call_factory(self.get_inputs, "get_inputs", "cpu", self.filename,
                                             self.fail)
        return self._cpu_inputs

    def run(self) -> tuple[list[torch.Tensor], dict[str, Any]]:
        init_inputs = _copy_inputs(self.init_inputs)
        try:
            args = [v.to("meta") if isinstance(v, torch.Tensor) else v for v in self.inputs]
            with torch.device("meta"), torch.no_grad():
                model = self.model_cls(*init_inputs)
                out = model(*args)
        except Exception:  # no meta kernel, data-dependent op...: run it for real
            return self._run_cpu()
        return self._outputs(out), model.state_dict()

    def _run_cpu(self) -> tuple[list[torch.Tensor], dict[str, Any]]:
        self.specs_from = "cpu"
        try:
            with torch.device("cpu"):
                model = self.model_cls(*_copy_inputs(self.init_inputs))
        except Exception as exc:
            self.fail(f"could not build Model(*get_init_inputs()) with init inputs "
                      f"{_short_repr(self.init_inputs)}: {_with_line(exc, self.filename)}", exc)
        inputs = self.cpu_inputs()
        try:
            with torch.device("cpu"), torch.no_grad():
                out = model(*inputs)
        except Exception as exc:
            names = _input_names(self.model_cls, len(inputs))
            shown = ", ".join(f"{n}: {_value_text(v)}" for n, v in zip(names, inputs))
            self.fail(f"has a Model.forward that failed on inputs ({shown}): "
                      f"{_with_line(exc, self.filename)}", exc)
        return self._outputs(out), model.state_dict()

    def _outputs(self, out: Any) -> list[torch.Tensor]:
        if isinstance(out, torch.Tensor):
            return [out]
        if isinstance(out, (tuple, list)) and out and all(isinstance(t, torch.Tensor) for t in out):
            return list(out)
        if isinstance(out, (tuple, list)):
            what = "an empty " + type(out).__name__ if not out else \
                f"{_a(type(out).__name__)} of ({_type_list(out)})"
        else:
            what = _a(type(out).__name__)
        self.fail(f"has a Model.forward that returned {what}: it must return a tensor or a "
                  f"tuple/list of tensors")


def _call_factory(fn: Callable, fn_name: str, device: str, filename: str, fail: _Failer,
                  *, wrap_errors: bool = True) -> list:
    """Call get_inputs()/get_init_inputs() and check it gives a list or tuple.

    With wrap_errors=False an exception raised by `fn` propagates as it is (the caller retries).
    """
    try:
        with torch.device(device):
            value = fn()
    except Exception as exc:
        if not wrap_errors:
            raise
        fail(f"has a {fn_name}() that raised {_with_line(exc, filename)}", exc)
    if not isinstance(value, (list, tuple)):
        fail(f"has a {fn_name}() that returned {_a(type(value).__name__)} "
             f"({_value_text(value)}): it must return a list (or tuple)")
    return list(value)


def _input_names(model_cls: type, count: int) -> list[str]:
    """forward's parameter names (excluding self) for `count` inputs; *args become args0, args1..."""
    try:
        params = list(inspect.signature(model_cls.forward).parameters.values())[1:]
    except (TypeError, ValueError):
        params = []
    names: list[str] = []
    for p in params:
        if len(names) == count:
            break
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
        elif p.kind == p.VAR_POSITIONAL:
            names += [f"{p.name}{i}" for i in range(count - len(names))]
    names += [f"input{i}" for i in range(len(names), count)]
    return names


def _check_arity(model_cls: type, inputs: list, fail: _Failer) -> None:
    try:
        sig = inspect.signature(model_cls.forward)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(None, *inputs)
    except TypeError as exc:
        params = ", ".join(str(p) for p in list(sig.parameters.values())[1:])
        fail(f"has get_inputs() giving {len(inputs)} values but Model.forward({params}) "
             f"does not accept them: {exc}", exc)


def _header(source: str) -> tuple[str | None, int | None, int | None]:
    head = "\n".join(source.splitlines()[:10])
    m = _HEADER_RE.search(head)
    if not m:
        return None, None, None

    def number(text: str | None) -> int | None:
        return int(text.replace("_", "").replace(",", "")) if text else None

    return m.group("family"), number(m.group("bytes")), number(m.group("flops"))


def _with_line(exc: BaseException, filename: str) -> str:
    """The exception text plus the last line of the task file its traceback passed through."""
    line = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename == filename:
            line = frame.lineno
    return exception_text(exc) + (f" (at line {line})" if line is not None else "")


def _value_text(v: Any) -> str:
    return str(TensorSpec.of(v)) if isinstance(v, torch.Tensor) else _short_repr(v)


def _a(word: str) -> str:
    return ("an " if word[:1].lower() in "aeiou" else "a ") + word


def _type_list(values: Any) -> str:
    return ", ".join(type(v).__name__ for v in values) or "nothing"


def _short_repr(value: Any, limit: int = 120) -> str:
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _module_name(name: str) -> str:
    safe = re.sub(r"\W", "_", name) or "task"
    return f"cuda_agent_task_{safe}_{next(_module_counter)}"


def _forget(module_name: str, filename: str) -> None:
    sys.modules.pop(module_name, None)
    users = _linecache_users.pop(filename, 1) - 1
    if users > 0:  # another live task was loaded under the same file name
        _linecache_users[filename] = users
    else:
        linecache.cache.pop(filename, None)


@contextmanager
def _rng_preserved() -> Iterator[None]:
    """Loading a task must not move anyone's random streams (torch CPU, random, numpy)."""
    torch_state = torch.random.get_rng_state()
    py_state = random.getstate()
    np_state = np.random.get_state()
    try:
        yield
    finally:
        torch.random.set_rng_state(torch_state)
        random.setstate(py_state)
        np.random.set_state(np_state)

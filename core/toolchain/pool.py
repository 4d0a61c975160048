"""CompilePool: NVRTC compiles in worker processes with a hard timeout.

NVRTC does not look at signals while it compiles, so an alarm cannot stop a runaway compile
(heavy template recursion, a huge unrolled loop): the pool SIGKILLs the worker instead and
starts a fresh one. A worker that dies on its own (a segfault inside NVRTC) is reported as
"crashed" and replaced the same way.

Layout: one dispatcher thread per worker slot takes jobs from a shared queue, sends one job at a
time over the slot's Pipe and waits for the answer with a deadline. The cache is consulted in the
caller's thread before a job is queued, so a hit returns an already-completed Future.
Workers use the "spawn" start method: no forked copy of a parent that may hold CUDA or Qt state.
"""

from __future__ import annotations

import importlib
import itertools
import multiprocessing
import os
import queue
import signal
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable, Iterable

from .cache import CompileCache
from .diagnostics import CompileResult
from .nvrtc import compile_key_for, nvrtc_info, nvrtc_version

DEFAULT_COMPILE_FN = "core.toolchain.nvrtc:compile_cuda"
# Spawning a worker and importing CuPy takes about a second; a worker that is not ready after
# this long is broken (not just slow), and the job it was meant for is reported as crashed.
WORKER_START_TIMEOUT = 120.0


class PoolClosedError(RuntimeError):
    """The pool was closed before this compile finished."""


_DEFAULT = object()   # "use CompileCache()" (None means no cache)


def _resolve(name: str) -> Callable[..., CompileResult]:
    """'package.module:function' or 'package.module.function' -> the function."""
    module_name, sep, attr = name.partition(":")
    if not sep:
        module_name, _, attr = name.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"compile_fn {name!r} must name a function as 'package.module:function'")
    fn = getattr(importlib.import_module(module_name), attr)
    if not callable(fn):
        raise TypeError(f"compile_fn {name!r} is not callable")
    return fn


def _worker_main(conn, compile_fn: str) -> None:
    """Worker process: announce readiness, then serve one job at a time until EOF or None."""
    # Ctrl+C reaches the whole process group; the parent decides what to stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        fn = _resolve(compile_fn)
        if compile_fn == DEFAULT_COMPILE_FN:
            nvrtc_info()   # load libnvrtc and find headers now, not on the first (timed) job
    except BaseException as exc:
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return     # parent went away
        if job is None:
            return
        try:
            result = fn(job["source"], arch=job["arch"], options=job["options"], filename=job["filename"])
            if not isinstance(result, CompileResult):
                raise TypeError(f"returned {type(result).__name__}, not CompileResult")
        except Exception as exc:
            message = f"compile function {compile_fn} raised {type(exc).__name__}: {exc}"
            result = CompileResult(ok=False, status="crashed", cubin=None, log=message, arch=job["arch"])
        conn.send(result)


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class _WorkerStartError(RuntimeError):
    pass


class _Slot:
    """One worker process and its pipe; used only by its dispatcher thread (plus close())."""

    def __init__(self, ctx, compile_fn: str, index: int):
        self._ctx = ctx
        self._compile_fn = compile_fn
        self._index = index
        self._lock = threading.Lock()
        self.process = None
        self.conn = None
        self.ready = False
        self.closed = False

    def start(self) -> None:
        """Launch a worker (returns at once; readiness is awaited in ensure_ready)."""
        with self._lock:
            if self.closed:
                raise PoolClosedError("compile pool is closed")
            parent_conn, child_conn = self._ctx.Pipe(duplex=True)
            process = self._ctx.Process(target=_worker_main, args=(child_conn, self._compile_fn),
                                        name=f"cuda-agent-compile-{self._index}", daemon=True)
            process.start()
            child_conn.close()   # only the child holds its end now, so its death reads as EOF here
            self.process, self.conn, self.ready = process, parent_conn, False

    def ensure_ready(self) -> None:
        if self.process is None or not self.process.is_alive():
            self.kill()
            self.start()
        if self.ready:
            return
        if not self.conn.poll(WORKER_START_TIMEOUT):
            self.kill()
            raise _WorkerStartError(f"compile worker did not start within {WORKER_START_TIMEOUT:.0f} s")
        try:
            message = self.conn.recv()
        except (EOFError, OSError):
            code = self._reap()
            raise _WorkerStartError(f"compile worker died while starting ({_describe_exit(code)})")
        if message[0] != "ready":
            self.kill()
            raise _WorkerStartError(f"compile worker could not load {self._compile_fn}: {message[1]}")
        self.ready = True

    def _reap(self) -> int | None:
        process = self.process
        if process is None:
            return None
        process.join(5)
        return process.exitcode

    def kill(self) -> None:
        with self._lock:
            process, conn = self.process, self.conn
            self.process, self.conn, self.ready = None, None, False
        if process is not None and process.is_alive():
            process.kill()      # SIGKILL: NVRTC ignores gentler signals until it returns
        if process is not None:
            process.join(5)
            try:
                process.close()
            except ValueError:
                pass
        if conn is not None:
            conn.close()

    def pid(self) -> int | None:
        process = self.process
        return process.pid if process is not None and process.is_alive() else None


@dataclass
class _Job:
    future: Future
    payload: dict
    key: str
    arch: str
    cacheable: bool = field(default=True)
    speculative: bool = False          # compiled ahead for a candidate that may never be asked for
    taken: bool = False                # a dispatcher has it (an urgent job can be queued twice)


# Queue priorities: shutdown first, then compiles someone waits for, then speculative ones.
_STOP, _URGENT, _SPECULATIVE = -1, 0, 1
# From this many workers on, one worker takes only compiles someone waits for: speculative ones
# (compile-ahead's predictions) can fill the others, but a candidate nobody predicted never waits
# for a stale prediction's compile to finish before its own can start.
RESERVE_URGENT_FROM = 3


class CompilePool:
    """Compile CUDA sources in `workers` processes, each job limited to `timeout` seconds.

    ``cache`` defaults to CompileCache() (env CUDA_AGENT_CACHE or ~/.cache/cuda-agent/compile);
    pass None for no cache. ``compile_fn`` ('module:function', or a module-level function) replaces
    compile_cuda in the workers; tests use it to inject slow or crashing compiles.
    """

    def __init__(self, workers: int = 2, timeout: float = 30.0, cache: CompileCache | None = _DEFAULT,  # type: ignore[assignment]
                 compile_fn: str | Callable[..., CompileResult] | None = None):
        if workers < 1:
            raise ValueError(f"CompilePool needs at least one worker, got workers={workers}")
        if timeout <= 0:
            raise ValueError(f"CompilePool timeout must be positive, got {timeout}")
        self.workers = int(workers)
        self.timeout = float(timeout)
        self.cache: CompileCache | None = CompileCache() if cache is _DEFAULT else cache
        if compile_fn is None:
            compile_fn = DEFAULT_COMPILE_FN
        elif callable(compile_fn):
            compile_fn = f"{compile_fn.__module__}:{compile_fn.__qualname__}"
        self.compile_fn: str = compile_fn
        self._ctx = multiprocessing.get_context("spawn")
        # (priority, sequence, job or None to stop a dispatcher): a compile the caller waits for
        # overtakes queued speculative ones (compile-ahead's predictions).
        self._jobs: queue.PriorityQueue[tuple[int, int, _Job | None]] = queue.PriorityQueue()
        # Urgent jobs are also queued here, for the reserved worker; whichever dispatcher takes a
        # job first runs it, the other skips it (_Job.taken).
        self._urgent_jobs: queue.Queue[tuple[int, int, _Job | None]] = queue.Queue()
        self.reserved_urgent = self.workers >= RESERVE_URGENT_FROM
        self._sequence = itertools.count()
        self._slots = [_Slot(self._ctx, self.compile_fn, i) for i in range(self.workers)]
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False
        # Jobs queued or compiling, by cache key: a second submit of the same source (the loop's
        # own compile of a candidate that compile-ahead already started) joins the first.
        self._inflight: dict[str, _Job] = {}

    # -- public API --------------------------------------------------------------------------
    def submit(self, source: str, *, arch: str = "sm_90", options: Iterable[str] = (),
               filename: str = "kernel.cu", speculative: bool = False) -> Future:
        """Queue a compile; the Future resolves to a CompileResult (never to an exception, except
        PoolClosedError when the pool is closed first). A `speculative` compile (one nobody waits
        for yet) waits behind every other queued compile; a later non-speculative submit of the same
        source joins it and moves it to the front."""
        options = list(options)
        extra = "" if self.compile_fn == DEFAULT_COMPILE_FN else self.compile_fn
        key = compile_key_for(source, arch=arch, options=options, filename=filename, extra=extra)
        # Results are only cached when NVRTC is loadable here: its version is part of the key.
        cacheable = self.cache is not None and nvrtc_version() is not None
        if cacheable:
            hit = self.cache.get(key)
            if hit is not None:
                future: Future = Future()
                future.set_running_or_notify_cancel()
                future.set_result(hit)
                return future
        with self._lock:
            if self._closed:
                raise PoolClosedError("submit() on a closed CompilePool")
            queued = self._inflight.get(key)
            if queued is not None and not queued.future.cancelled():
                if queued.speculative and not speculative and not queued.taken:
                    queued.speculative = False      # now someone waits for it: queue it again, in front
                    self._queue(_URGENT, queued)
                return queued.future
            self._start_dispatchers()
            future = Future()
            payload = {"source": source, "arch": str(arch), "options": options, "filename": filename}
            job = _Job(future, payload, key, str(arch), cacheable, speculative)
            self._inflight[key] = job
            future.add_done_callback(lambda f, key=key: self._forget(key, f))
            self._queue(_SPECULATIVE if speculative else _URGENT, job)
        return future

    def _queue(self, priority: int, job: _Job) -> None:
        entry = (priority, next(self._sequence), job)
        self._jobs.put(entry)
        if priority == _URGENT and self.reserved_urgent:
            self._urgent_jobs.put(entry)

    def withdraw(self, source: str, *, arch: str = "sm_90", options: Iterable[str] = (),
                 filename: str = "kernel.cu") -> bool:
        """Cancel a queued speculative compile of this source that nobody waits for (a prediction
        that went stale), so it does not hold a worker. True when one was cancelled."""
        options = list(options)
        extra = "" if self.compile_fn == DEFAULT_COMPILE_FN else self.compile_fn
        key = compile_key_for(source, arch=arch, options=options, filename=filename, extra=extra)
        with self._lock:
            job = self._inflight.get(key)
            if job is None or not job.speculative or job.taken:
                return False
            return job.future.cancel()     # the dispatcher skips it; _forget drops it from _inflight

    def _forget(self, key: str, future: Future) -> None:
        # No lock: close() cancels futures while holding it, which runs this callback.
        job = self._inflight.get(key)
        if job is not None and job.future is future:
            self._inflight.pop(key, None)

    def compile(self, source: str, *, arch: str = "sm_90", options: Iterable[str] = (),
                filename: str = "kernel.cu", speculative: bool = False) -> CompileResult:
        return self.submit(source, arch=arch, options=options, filename=filename, speculative=speculative).result()

    def worker_pids(self) -> list[int | None]:
        """Process id per slot (None where no worker runs); for monitoring and tests."""
        return [slot.pid() for slot in self._slots]

    def close(self) -> None:
        """Kill the workers; queued jobs are cancelled, running ones fail with PoolClosedError."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for jobs in (self._jobs, self._urgent_jobs):
                while True:
                    try:
                        _, _, job = jobs.get_nowait()
                    except queue.Empty:
                        break
                    if job is not None:
                        job.future.cancel()
            for _ in self._threads:
                self._jobs.put((_STOP, next(self._sequence), None))
            self._urgent_jobs.put((_STOP, next(self._sequence), None))
        for slot in self._slots:
            with slot._lock:
                slot.closed = True
            slot.kill()
        for thread in self._threads:
            thread.join(10)

    def __enter__(self) -> CompilePool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------------
    def _start_dispatchers(self) -> None:
        """Threads start with the first job; each owns one slot, whose worker starts on its first job.
        With reserved_urgent, the last slot's thread serves only the urgent queue."""
        if self._threads:
            return
        for slot in self._slots:
            reserved = self.reserved_urgent and slot is self._slots[-1]
            jobs = self._urgent_jobs if reserved else self._jobs
            thread = threading.Thread(target=self._dispatch, args=(slot, jobs), daemon=True,
                                      name=f"cuda-agent-compile-dispatch-{slot._index}")
            thread.start()
            self._threads.append(thread)

    def _dispatch(self, slot: _Slot, jobs: queue.Queue) -> None:
        while True:
            _, _, job = jobs.get()
            if job is None:
                return
            with self._lock:
                if job.taken:
                    continue       # the second entry of a job moved to the front, already taken
                job.taken = True
            if self._closed:
                job.future.cancel()
                continue
            if not job.future.set_running_or_notify_cancel():
                continue   # cancelled while queued
            try:
                result = self._run(slot, job)
            except PoolClosedError as exc:
                job.future.set_exception(exc)
                continue
            except BaseException as exc:   # a bug here must not leave the caller waiting forever
                job.future.set_exception(exc)
                continue
            result.key = job.key
            if job.cacheable and self.cache is not None:
                self.cache.put(result)
            job.future.set_result(result)

    def _run(self, slot: _Slot, job: _Job) -> CompileResult:
        start = time.perf_counter()
        for attempt in (1, 2):   # a worker that died while idle is replaced once, silently
            try:
                slot.ensure_ready()
                conn = slot.conn   # local: close() may clear slot.conn from another thread
                conn.send(job.payload)
                break
            except _WorkerStartError as exc:
                if self._closed:
                    raise PoolClosedError("compile pool closed while a worker was starting") from exc
                return self._failed(job, "crashed", f"{exc}; a fresh worker will be started for the next job", start)
            except (OSError, EOFError, AttributeError) as exc:   # conn gone: pool closed, or worker died idle
                if self._closed:
                    raise PoolClosedError("compile pool closed") from exc
                slot.kill()
                if attempt == 2:
                    return self._failed(job, "crashed", f"compile worker was lost before the job started ({exc})", start)
        sent = time.perf_counter()
        try:
            if conn.poll(self.timeout):
                return conn.recv()
        except (EOFError, OSError):
            if self._closed:
                raise PoolClosedError("compile pool closed while this job was compiling")
            code = slot._reap()
            slot.kill()
            self._restart(slot)
            return self._failed(job, "crashed", f"compile worker died while compiling ({_describe_exit(code)}); "
                                "a fresh worker was started", start)
        if self._closed:
            raise PoolClosedError("compile pool closed while this job was compiling")
        slot.kill()
        self._restart(slot)
        result = self._failed(job, "timeout", f"compile exceeded {self.timeout:.1f} s and was killed", start)
        result.seconds = time.perf_counter() - sent
        return result

    def _restart(self, slot: _Slot) -> None:
        """Start the replacement right away, so it imports CuPy while the caller handles the result."""
        try:
            slot.start()
        except PoolClosedError:
            pass

    @staticmethod
    def _failed(job: _Job, status: str, message: str, start: float) -> CompileResult:
        return CompileResult(ok=False, status=status, cubin=None, log=message, diagnostics=[],
                             seconds=time.perf_counter() - start, cached=False, key=job.key, arch=job.arch)

"""Background work whose results land in the GUI thread.

DESIGN section 9: a lambda or plain function connected to a signal emitted in a worker thread
runs in that worker thread; only a @Slot method of a QObject living in the GUI thread is queued
to the GUI thread. So every result travels through ResultBridge: the worker thread emits, the
bridge's own @Slot runs in the GUI thread and calls the callback there.

A worker thread must never hold the last reference to a Qt object either: when it drops it, the
object is destroyed in that thread, and ~QObject (which takes a Qt lock, then asks for the GIL)
deadlocks against the GUI thread (which holds the GIL and waits for that lock in connect()).
So the callbacks, which hold the window, stay in the GUI thread: a worker sees only a token.
"""
from __future__ import annotations

import itertools
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

from PySide6.QtCore import QCoreApplication, QObject, Signal, Slot


@dataclass
class Outcome:
    """What a background call produced: its value, or the exception it raised."""

    value: Any = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class ResultBridge(QObject):
    """register(callback) -> token in the GUI thread; post(token, value) from any thread ->
    callback(value) in the GUI thread. post(token, None) drops the callback uncalled."""

    _posted = Signal(object, object)      # (token, Outcome or None); Python ints, no C++ int range

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)  # created in the GUI thread, so it lives there
        self._closed = False
        self._callbacks: dict[int, Callable[[Any], None]] = {}
        self._tokens = itertools.count(1)
        self._posted.connect(self._deliver)

    def register(self, callback: Callable[[Any], None]) -> int:
        token = next(self._tokens)
        self._callbacks[token] = callback
        return token

    def post(self, token: int, value: Any) -> None:
        if self._closed:
            return
        try:
            self._posted.emit(token, value)
        except RuntimeError:  # the window was destroyed while a worker finished
            pass

    @Slot(object, object)
    def _deliver(self, token: int, value: Any) -> None:
        callback = self._callbacks.pop(token, None)
        if callback is not None and value is not None and not self._closed:
            callback(value)

    def close(self) -> None:
        """Drop every result posted from now on (the window is closing), and the callbacks."""
        self._closed = True
        self._callbacks.clear()


class Background:
    """A few worker threads for loads, probes and compile waits; results come back as Outcomes."""

    def __init__(self, parent: QObject, workers: int = 3):
        # The bridge must outlive the window: a worker that finishes after the window is gone (the
        # GPU probe takes seconds) still emits on it. Emitting on a bridge being deleted crashed
        # the process, so the bridge belongs to the application and is retired after the workers.
        app = QCoreApplication.instance()
        self.bridge = ResultBridge(app if app is not None else parent)
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="cuda-agent-gui")

    def submit(self, fn: Callable[..., Any], *args: Any, on_done: Callable[[Outcome], None],
               **kwargs: Any) -> Future:
        """Run fn(*args, **kwargs) in a worker; on_done(Outcome) in the GUI thread. Call from the GUI
        thread; fn and its arguments must not be Qt objects or hold any (see the module's note)."""
        bridge = self.bridge
        token = bridge.register(on_done)
        future = self._executor.submit(fn, *args, **kwargs)
        # This callback runs in the worker thread: it only emits, the bridge hops threads.
        future.add_done_callback(lambda f: bridge.post(token, None if f.cancelled() else _outcome(f)))
        return future

    def shutdown(self) -> None:
        """Drop results from now on; the bridge is deleted once the last worker has finished."""
        self.bridge.close()
        self._executor.shutdown(wait=False, cancel_futures=True)
        bridge, executor = self.bridge, self._executor
        _RETIRED.append(bridge)       # so the retiring thread never drops the wrapper's last reference

        def retire() -> None:
            executor.shutdown(wait=True)   # nothing can emit on the bridge after this
            bridge.deleteLater()           # thread-safe: the GUI thread deletes it

        threading.Thread(target=retire, name="cuda-agent-gui-retire", daemon=True).start()


_RETIRED: list[ResultBridge] = []


def _outcome(future: Future) -> Outcome:
    error = future.exception()
    return Outcome(error=error) if error is not None else Outcome(value=future.result())

"""Background work whose results land in the GUI thread.

DESIGN section 9: a lambda or plain function connected to a signal emitted in a worker thread
runs in that worker thread; only a @Slot method of a QObject living in the GUI thread is queued
to the GUI thread. So every result travels through ResultBridge: the worker thread emits, the
bridge's own @Slot runs in the GUI thread and calls the callback there.
"""
from __future__ import annotations

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
    """post(callback, value) from any thread -> callback(value) in the GUI thread."""

    _posted = Signal(object, object)

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)  # created in the GUI thread, so it lives there
        self._closed = False
        self._posted.connect(self._deliver)

    def post(self, callback: Callable[[Any], None], value: Any) -> None:
        if self._closed:
            return
        try:
            self._posted.emit(callback, value)
        except RuntimeError:  # the window was destroyed while a worker finished
            pass

    @Slot(object, object)
    def _deliver(self, callback: Callable[[Any], None], value: Any) -> None:
        if not self._closed:
            callback(value)

    def close(self) -> None:
        """Drop every result posted from now on (the window is closing)."""
        self._closed = True


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
        future = self._executor.submit(fn, *args, **kwargs)
        # This callback runs in the worker thread: it only emits, the bridge hops threads.
        future.add_done_callback(lambda f: None if f.cancelled() else self.bridge.post(on_done, _outcome(f)))
        return future

    def shutdown(self) -> None:
        """Drop results from now on; the bridge is deleted once the last worker has finished."""
        self.bridge.close()
        self._executor.shutdown(wait=False, cancel_futures=True)
        bridge, executor = self.bridge, self._executor

        def retire() -> None:
            executor.shutdown(wait=True)   # nothing can emit on the bridge after this
            bridge.deleteLater()           # thread-safe: the GUI thread deletes it

        threading.Thread(target=retire, name="cuda-agent-gui-retire", daemon=True).start()


def _outcome(future: Future) -> Outcome:
    error = future.exception()
    return Outcome(error=error) if error is not None else Outcome(value=future.result())

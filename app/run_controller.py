"""One search run, driven from the GUI (DESIGN section 9).

The optimiser runs in a QThread: its set-up (which may start the GPU evaluator, seconds) and its
loop both happen there. Its events, emitted in that thread, are appended to a deque; a timer in
the GUI thread drains the deque about 30 times a second and hands the page one batch. So tens of
thousands of events cost the GUI a few dozen redraws a second, never one signal per event.

Commands (pause, resume, stop, fork) call the optimiser's thread-safe methods directly; none of
them waits for the loop (pause takes effect before the next proposal, stop after the candidate
in flight).
"""
from __future__ import annotations

import collections
import threading
import time
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QThread, QTimer, Signal, Slot

from core.search.events import CandidateEvaluated
from core.search.session import RunConfig, RunSetup, RunSetupError, open_run

DRAIN_INTERVAL_MS = 33          # ~30 Hz
HISTORY_AHEAD = 10 * 400        # events a history reader may queue ahead of the drain
MAX_EVENTS_PER_DRAIN = 250     # bounds one tick's work (~125 candidates) when the loop outruns the screen


class _RunWorker(QObject):
    """Lives in the run thread; everything it does happens there."""

    ready = Signal(object)          # RunSetup
    done = Signal(object)           # RunSummary
    failed = Signal(str)

    def __init__(self, config: RunConfig, sink: collections.deque):
        super().__init__()
        self.config = config
        self.sink = sink
        self.setup: RunSetup | None = None
        self.cancelled = threading.Event()

    @Slot()
    def run(self) -> None:
        try:
            self.setup = open_run(self.config, observers=[self.sink.append], starting=self._starting)
        except RunSetupError as exc:
            self.failed.emit(str(exc))
            return
        except Exception as exc:  # an evaluator that could not start, a file that vanished...
            self.failed.emit(f"the run could not start: {type(exc).__name__}: {exc}")
            return
        if self.cancelled.is_set():          # stopped while the evaluator was starting
            self.setup.optimizer.stop()
        self.ready.emit(self.setup)
        try:
            summary = self.setup.optimizer.run()
        except Exception as exc:
            self.failed.emit(f"the run failed: {type(exc).__name__}: {exc}")
            summary = None
        finally:
            self.setup.close()
            if self.setup.remembered:         # the run joined the user's memory (or why not)
                self.sink.append(("status", self.setup.remembered))
        if summary is not None:
            self.done.emit(summary)

    def _starting(self, text: str) -> None:
        self.sink.append(("status", text))


class RunController(QObject):
    """Start, pause, resume, stop and fork one run at a time; batches of events come out."""

    events = Signal(list)            # a batch of core.search.events objects, in order
    status = Signal(str)             # a line for the status bar ("starting the evaluator...")
    state_changed = Signal(str)      # "idle", "starting", "running", "paused", "stopping", "loading"
    ready = Signal(object)           # RunSetup, once the run has started
    finished = Signal(object)        # RunSummary
    failed = Signal(str)
    history_loaded = Signal(int)     # a recorded project has been streamed in: its candidate count

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self._queue: collections.deque = collections.deque()
        self._thread: QThread | None = None
        self._worker: _RunWorker | None = None
        self.setup: RunSetup | None = None
        self.state = "idle"
        self._reader: threading.Thread | None = None
        self._timer = QTimer(self)
        self._timer.setInterval(DRAIN_INTERVAL_MS)
        self._timer.timeout.connect(self._drain)

    # ---- commands ------------------------------------------------------------------------------

    def start(self, config: RunConfig) -> None:
        if self.state != "idle":
            raise RuntimeError("a run is already in progress; stop it first")
        self._queue.clear()
        self.setup = None
        self._thread = QThread()
        self._worker = _RunWorker(config, self._queue)
        self._worker.moveToThread(self._thread)
        self._thread.started.connect(self._worker.run)
        # Worker signals cross threads into these slots (queued: they run in the GUI thread).
        self._worker.ready.connect(self._on_ready)
        self._worker.done.connect(self._on_done)
        self._worker.failed.connect(self._on_failed)
        self._set_state("starting")
        self._timer.start()
        self._thread.start()

    def load_history(self, project_path: str | Path) -> None:
        """Stream a recorded project's candidates through the same buffer as a live run's events
        (read in a thread; the views fill at the drain rate, the window stays responsive)."""
        from core.search.history import project_events

        if self.state != "idle":
            raise RuntimeError("a run is in progress; stop it before opening a project")
        self._queue.clear()
        self.setup = None
        queue = self._queue

        def read() -> None:
            n = 0
            try:
                for event in project_events(project_path):
                    queue.append(event)
                    n += isinstance(event, CandidateEvaluated)
                    # Stay a few drains ahead and no more: a reader that runs flat out holds the GIL
                    # that every repaint of the window needs.
                    while len(queue) > HISTORY_AHEAD:
                        time.sleep(0.01)
                queue.append(("history_done", n))
            except Exception as exc:   # a corrupt or foreign file: said in the window, never raised
                queue.append(("history_error", str(exc) or type(exc).__name__))

        self._set_state("loading")
        self._timer.start()
        self._reader = threading.Thread(target=read, name="cuda-agent-history", daemon=True)
        self._reader.start()

    def pause(self) -> None:
        if self.setup is not None and self.state == "running":
            self.setup.optimizer.pause()
            self._set_state("paused")

    def resume(self) -> None:
        if self.setup is not None and self.state == "paused":
            self.setup.optimizer.resume()
            self._set_state("running")

    def stop(self) -> None:
        if self.state in ("idle", "stopping", "loading"):
            return
        if self._worker is not None:
            self._worker.cancelled.set()
        if self.setup is not None:
            self.setup.optimizer.stop()
        self._set_state("stopping")

    def fork(self, candidate_id: int, name: str | None = None) -> Any:
        """A new branch from a recorded candidate; the run continues from it after the current episode."""
        if self.setup is None or self.state not in ("running", "paused"):
            raise RuntimeError("fork needs a running (or paused) search")
        return self.setup.optimizer.fork(candidate_id, name)

    def wait(self, ms: int = 30_000) -> bool:
        """Wait for the run thread to end (tests and application exit)."""
        return self._thread.wait(ms) if self._thread is not None else True

    @property
    def running(self) -> bool:
        return self.state != "idle"

    # ---- from the run thread -------------------------------------------------------------------

    @Slot(object)
    def _on_ready(self, setup: RunSetup) -> None:
        self.setup = setup
        self.ready.emit(setup)
        if self.state == "starting":
            self._set_state("running")

    # The run's last events may still be queued: the verdict goes in behind them, so the views
    # receive everything at the drain rate before `finished` (or `failed`) is emitted.
    @Slot(object)
    def _on_done(self, summary: Any) -> None:
        self._queue.append(("finished", summary))
        self._timer.start()

    @Slot(str)
    def _on_failed(self, message: str) -> None:
        self._queue.append(("failed", message))
        self._timer.start()

    def _end(self) -> None:
        self._timer.stop()
        if self._thread is not None:
            self._thread.quit()
            self._thread.wait(10_000)
            self._thread.deleteLater()
        if self._worker is not None:
            self._worker.deleteLater()
        self._thread, self._worker = None, None
        self._set_state("idle")

    def _set_state(self, state: str) -> None:
        if state != self.state:
            self.state = state
            self.state_changed.emit(state)

    # ---- the 30 Hz drain -------------------------------------------------------------------------

    @Slot()
    def _drain(self, limit: int = MAX_EVENTS_PER_DRAIN) -> None:
        batch = []
        end: tuple | None = None
        while self._queue and len(batch) < limit:
            item = self._queue.popleft()
            if isinstance(item, tuple):
                if item[0] == "status":
                    self.status.emit(item[1])
                else:
                    end = item       # the run or the history reader is done
                    break
            else:
                batch.append(item)
        if batch:
            self.events.emit(batch)
        if end is None:
            return
        kind, value = end
        if kind in ("finished", "failed"):
            self._end()
            (self.finished if kind == "finished" else self.failed).emit(value)
            return
        self._timer.stop()
        self._set_state("idle")
        if kind == "history_done":
            self.history_loaded.emit(value)
        else:
            self.failed.emit(f"the project could not be read: {value}")

    def pending(self) -> int:
        """Events waiting for the next drain (for tests and the status bar)."""
        return len(self._queue)

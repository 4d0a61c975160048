"""The local pool: one supervisor (judge, warm runner, spares) per GPU, candidates go to a free one.

Evaluations on different GPUs run concurrently (call `evaluate` from several threads); on one GPU
they are serialised, since timing needs the GPU to itself.
"""
from __future__ import annotations

import queue
import threading
from contextlib import contextmanager
from typing import Iterator, Sequence

from .supervisor import GpuSupervisor, SupervisorSettings


def visible_devices() -> list[int]:
    from .probe import probe_gpus

    probe = probe_gpus()
    if not probe.can_run:
        raise RuntimeError(f"cannot evaluate on this machine: {probe.reason}")
    return [g["index"] for g in probe.gpus]


class LocalPool:
    def __init__(self, task_name: str, task_source: str, devices: Sequence[int],
                 settings: SupervisorSettings | None = None, **supervisor_kwargs):
        if not devices:
            raise ValueError("a pool needs at least one GPU")
        self.devices = list(devices)
        self.supervisors: list[GpuSupervisor] = []
        errors: list[BaseException] = []
        lock = threading.Lock()

        def start(index: int) -> None:
            try:
                sup = GpuSupervisor(index, task_name, task_source, settings, **supervisor_kwargs)
            except BaseException as exc:  # reported below, after every start has finished
                with lock:
                    errors.append(exc)
                return
            with lock:
                self.supervisors.append(sup)

        # Each GPU's processes import torch and build a context: start them side by side.
        threads = [threading.Thread(target=start, args=(d,), name=f"start-gpu{d}") for d in self.devices]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            self.close()
            raise RuntimeError(f"could not start the evaluator on every GPU: {errors[0]}") from errors[0]
        self.supervisors.sort(key=lambda s: s.device_index)
        self._free: queue.Queue[GpuSupervisor] = queue.Queue()
        for sup in self.supervisors:
            self._free.put(sup)

    @property
    def first(self) -> GpuSupervisor:
        return self.supervisors[0]

    @contextmanager
    def acquire(self) -> Iterator[GpuSupervisor]:
        """A supervisor nobody else is using; waits until one is free."""
        sup = self._free.get()
        try:
            yield sup
        finally:
            self._free.put(sup)

    def close(self) -> None:
        for sup in self.supervisors:
            sup.close()
        self.supervisors = []

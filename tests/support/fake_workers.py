"""Stand-ins for the GPU processes, to test the supervisor's process logic on any machine.

The fake runner obeys the candidate: a ProgramArtifact whose program says {"behaviour": X}
answers normally ("ok"), slowly ("slow"), dies ("die"), hangs ("hang"), reports a fatal CUDA
error ("cuda_error"), sends outputs that make the fake judge die ("kill_judge"), leaves work on
another stream at every timing ("side_stream") or only at its first timing ("stray_once": an
honest kernel on a host that hiccuped once), or replays answers it remembers ("replay": 1 ms on
the timing sets, 10 ms on each unseen set, which it meets for the first time; "replay_stray_once"
also strays at its first timing, so it is timed twice). With "judge_oom" its outputs run the fake
judge out of GPU memory, with "judge_oom_unless_lean" only when the request does not ask the runner
to be lean; with "judge_recomputes" the fake judge says it computed references it had not kept.
"""
from __future__ import annotations

import os
import time

from core.evaluation import protocol as P

GPU = {"name": "Fake GPU", "arch": "sm_90", "l2_bytes": 1 << 20, "shared_per_block_optin": 49152}


def _behaviour(artifact) -> str:
    if isinstance(artifact, P.ProgramArtifact):
        return artifact.program.get("behaviour", "ok")
    return "ok"


def fake_runner_main(conn, device_index, role, scratch):
    timings: dict[str, int] = {}
    n_samples = 21     # like the timer: at least 20 repetitions, more for a longer timed phase (5 ms each)
    conn.send(P.Ready(role, os.getpid(), dict(GPU), 0.0))
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            os._exit(0)
        if isinstance(msg, P.Shutdown):
            os._exit(0)
        if isinstance(msg, P.SetTask):
            n_samples = max(20, int(msg.timed_ms / 5)) + 1
            conn.send(P.TaskReady((1e-4, 1e-4)))
        elif isinstance(msg, P.Activate):
            conn.send(P.Verdict(True))
        elif isinstance(msg, (P.Check, P.Time, P.Interleave)):
            b = _behaviour(msg.artifact)
            if b == "die":
                os._exit(9)
            if b == "hang":
                time.sleep(3600)
            if b == "slow":
                time.sleep(1.0)
            if b == "cuda_error":
                conn.send(P.Failure("crashed", "CUDA error: an illegal memory access was encountered", fatal=True))
                os._exit(70)
            if isinstance(msg, P.Check):
                outputs = (("kill-judge",),) if b == "kill_judge" else ()
                if b == "judge_oom" or (b == "judge_oom_unless_lean" and not msg.lean):
                    outputs = (("judge-oom",),)
                if b == "judge_recomputes":
                    outputs = (("recompute",),)
                conn.send(P.CheckDone(outputs, dict(msg.bundle.fingerprints), [{"pid": os.getpid(), "name": "k"}]))
            else:
                key = msg.artifact.content_hash if isinstance(msg.artifact, P.ProgramArtifact) else ""
                timings[key] = timings.get(key, 0) + 1
                stray = b == "side_stream" or (b in ("stray_once", "replay_stray_once") and timings[key] == 1)
                # An honest kernel takes as long on new inputs; a replaying one only the first time.
                first_meeting = b.startswith("replay") and timings[key] == 1
                unseen = [10.0 if first_meeting else 1.0 for _ in msg.bundle.unseen_sets]
                baseline = [2.0] * (2 * msg.rounds) if isinstance(msg, P.Interleave) else []
                conn.send(P.TimeDone([1.0 + 0.01 * i for i in range(n_samples)], 0.5 if stray else 0.0, (), 0,
                                     baseline_samples_ms=baseline, unseen_samples_ms=unseen))
        elif isinstance(msg, P.TimeBaseline):
            conn.send(P.TimeDone([2.0] * 21, 0.0, (), 0))


def fake_judge_main(conn, device_index, scratch):
    conn.send(P.Ready("judge", os.getpid(), dict(GPU), 0.0))
    next_id = 1
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            os._exit(0)
        if isinstance(msg, P.Shutdown):
            os._exit(0)
        if isinstance(msg, P.SetTask):
            conn.send(P.TaskReady((1e-4, 1e-4), flops=0))
        elif isinstance(msg, P.Prepare):
            unseen = tuple(P.InputSet(f"unseen{i}", 1, i) for i in range(msg.unseen_sets))
            conn.send(P.Bundle(next_id, (), (), {"set0": (1.0, 2.0)}, unseen, room_for_next=True))
            next_id += 1
        elif isinstance(msg, P.Judge):
            if msg.outputs == (("kill-judge",),):
                os._exit(9)
            if msg.outputs == (("judge-oom",),):
                conn.send(P.Failure("crashed", "judge error: OutOfMemoryError: CUDA out of memory",
                                    details={"out_of_memory": True}))
                continue
            if msg.outputs == (("recompute",),):
                conn.send(P.Verdict(True, details={"references_computed_again": True}))
                continue
            conn.send(P.Verdict(True))
        elif isinstance(msg, P.Release):
            conn.send(P.Verdict(True))

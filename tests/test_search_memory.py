"""The policy's memory of seen workloads (core/search/memory.py): votes, building, storage, training."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from core.search.features import ACTION_SIZE, STATE_SIZE, action_features, action_vector, evaluate_vector
from core.search.memory import MemoryEntry, ScheduleMemory, entry_from_record
from core.search.policies.ppo import PPOPolicy
from core.search.space import Knob, ScheduleSpace
from core.search.training import describe_records, train
from tests.support.replay_run import made_up_ms, record_project

KNOBS = {"BLOCK": [128, 256, 512], "VEC": [1, 2, 4]}


def _entry(task: str, descriptor: list[float], *schedules: tuple[int, int]) -> MemoryEntry:
    return MemoryEntry(task, descriptor, KNOBS, [{"BLOCK": b, "VEC": v} for b, v in schedules])


@pytest.fixture(scope="module")
def record(tmp_path_factory) -> Path:
    return record_project(tmp_path_factory.mktemp("memory") / "rec.cuagent")


def test_votes_are_shares_of_near_best_schedules_weighted_by_similarity():
    memory = ScheduleMemory([_entry("near", [0.0, 0.0], (512, 4), (512, 2)),
                             _entry("far", [1.0, 1.0], (128, 1))])
    votes = memory.votes([0.0, 0.0], KNOBS)
    far = math.exp(-2.0 / 0.2)          # the far entry's weight relative to the near one's 1
    assert votes[("BLOCK", 512)] == pytest.approx(1.0 / (1.0 + far))
    assert votes[("BLOCK", 128)] == pytest.approx(far / (1.0 + far))
    assert votes[("VEC", 4)] == pytest.approx(0.5 / (1.0 + far))
    assert votes[("BLOCK", 256)] == 0.0
    # shares of one knob sum to 1 over its values
    assert sum(votes[("VEC", v)] for v in KNOBS["VEC"]) == pytest.approx(1.0)


def test_excluded_tasks_and_unknown_knobs_get_no_votes():
    memory = ScheduleMemory([_entry("a", [0.0], (512, 4)), _entry("b", [0.0], (128, 1))])
    assert memory.votes([0.0], KNOBS, exclude={"a"})[("BLOCK", 128)] == pytest.approx(1.0)
    assert memory.votes([0.0], KNOBS, exclude={"a", "b"}) == {}
    assert memory.votes([0.0], {"ITEMS": [1, 2]}) == {}
    # a descriptor of another layout is not comparable: no weight
    assert memory.votes([0.0, 0.0], KNOBS) == {}


def test_a_later_entry_of_the_same_task_replaces_the_earlier_one():
    memory = ScheduleMemory([_entry("a", [0.0], (512, 4))])
    memory.add(_entry("a", [0.0], (128, 1)))
    assert len(memory) == 1 and memory.entries[0].schedules == [{"BLOCK": 128, "VEC": 1}]


def test_a_record_gives_its_near_best_schedules_fastest_first(record):
    entry = entry_from_record(record)
    assert entry is not None and entry.task == "act_gelu"
    assert set(entry.knobs) == {"BLOCK", "UNROLL"}
    best = min(made_up_ms({"BLOCK": b, "UNROLL": u}) for b in (64, 128, 256, 512, 1024) for u in (1, 2, 4, 8))
    times = [made_up_ms(s) for s in entry.schedules]
    assert entry.schedules and times == sorted(times) and all(t <= best / 0.97 for t in times)
    assert entry.schedules[0] == {"BLOCK": 512, "UNROLL": 4}


def test_memory_survives_json_and_a_ppo_checkpoint(tmp_path):
    memory = ScheduleMemory([_entry("a", [0.5, 0.25], (512, 4))])
    again = ScheduleMemory.from_json(json.loads(json.dumps(memory.to_json())))
    assert again == memory
    with pytest.raises(ValueError, match="memory"):
        ScheduleMemory.from_json({"format": "something else"})
    policy = PPOPolicy(STATE_SIZE, ACTION_SIZE, seed=0)
    policy.memory = memory
    path = tmp_path / "w.json"
    policy.save(path)
    from core.search.policies.ppo import load_weights

    assert load_weights(path).memory == memory


def test_votes_enter_each_actions_features():
    space = ScheduleSpace([Knob("BLOCK", (128, 256, 512)), Knob("VEC", (1, 2, 4))])
    votes = {("BLOCK", 128): 0.1, ("BLOCK", 256): 0.2, ("BLOCK", 512): 0.7}     # none for VEC
    rows = action_features(space, {"BLOCK": 256, "VEC": 1}, votes=votes)
    assert {len(r) for r in rows} == {ACTION_SIZE}
    to_512 = rows[space.actions.index(next(a for a in space.actions if a.knob == "BLOCK" and a.value == 512))]
    assert to_512[-6:] == pytest.approx([1.0, 0.7, 0.2, 0.5, 0.0, 0.0])   # voted, new, current, gain; not a jump,
    #                                                                    not "evaluate now"
    vec_rows = [r for r, a in zip(rows, space.actions) if a.knob == "VEC"]
    assert all(r[-6:] == [0.0] * 6 for r in vec_rows)
    # without votes the rows are what they were before the memory
    plain = action_features(space, {"BLOCK": 256, "VEC": 1})
    assert all(r[-6:] == [0.0] * 6 for r in plain)
    assert evaluate_vector()[-6:] == [0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    knob = Knob("BLOCK", (128, 256, 512))
    assert action_vector(knob, 128, 256, 256, None, 1, votes)[-5:-2] == pytest.approx([0.1, 0.2, -0.1])


def test_a_policy_without_memory_has_no_votes():
    policy = PPOPolicy(STATE_SIZE, ACTION_SIZE, seed=0)
    space = ScheduleSpace([Knob("BLOCK", (128, 256))])
    assert policy.votes(object(), space) is None


def test_training_remembers_its_records_but_a_visit_never_sees_its_own(record, monkeypatch):
    seen: list[dict | None] = []
    original = PPOPolicy.votes

    def spy(self, task, space):
        out = original(self, task, space)
        seen.append(out)
        return out

    monkeypatch.setattr(PPOPolicy, "votes", spy)
    info = describe_records([record])[0]
    policy, _ = train([info], rounds=2, budget=4, seed=0)
    assert policy.memory.tasks == ["act_gelu"]
    assert seen and all(v is None for v in seen)            # the only entry is the visited task itself
    assert policy.memory_exclude == set()
    # after training, the same task (as a user's rerun would be) does get its own votes
    from core.tasks import load_task
    from tests.support.replay_run import TASK_PATH, search_program

    space = ScheduleSpace.from_program(search_program(), load_task(TASK_PATH))
    votes = original(policy, load_task(TASK_PATH), space)
    assert votes is not None and votes[("BLOCK", 512)] == pytest.approx(1.0)
    unmemorised, _ = train([info], rounds=1, budget=4, seed=0, memory=False)
    assert len(unmemorised.memory) == 0


# ---- the user's memory file: runs remembered and recalled (session.py) ---------------------------

def test_a_memory_file_round_trips_and_a_foreign_file_is_refused(record, tmp_path):
    from core.search.memory import load_memory, remember, save_memory

    path = tmp_path / "sub" / "memory.json"
    assert len(load_memory(path)) == 0                       # no file yet: an empty memory
    entry = remember(record, path)
    assert entry is not None and load_memory(path).tasks == ["act_gelu"]
    save_memory(load_memory(path), path)                     # rewriting keeps it
    assert load_memory(path).entries[0] == entry
    assert not list(path.parent.glob(".*.tmp"))              # no temporary file left behind
    path.write_text('{"not": "a memory"}')
    with pytest.raises(ValueError, match="memory"):
        load_memory(path)
    path.write_text("{broken")
    with pytest.raises(ValueError, match="not a cuda-agent memory file"):
        load_memory(path)


def test_a_run_with_too_few_schedules_is_not_remembered(record, tmp_path):
    from core.search.memory import MIN_MEASURED, remember

    small = tmp_path / "small.cuagent"
    small.write_bytes(record.read_bytes())
    from core.project import Project

    with Project.open(small) as project:
        ids = [c.id for c in project.candidates()][MIN_MEASURED - 2:]
        project._db.execute(f"DELETE FROM candidates WHERE id IN ({','.join(map(str, ids))})")
        project._db.commit()
    assert remember(small, tmp_path / "m.json") is None and not (tmp_path / "m.json").exists()


def open_run_and_close(config):
    from core.search.session import open_run

    setup = open_run(config)
    setup.close()
    return setup


def _replay_config(record, tmp_path, policy="ppo", **kw):
    from core.search.session import RunConfig
    from tests.support.replay_run import TASK_PATH, search_program

    program = tmp_path / "prog.json"
    program.write_text(search_program().to_json())
    return RunConfig(task=TASK_PATH, project=tmp_path / f"{policy}.cuagent", program=program, policy=policy,
                     budget=4, replay=[record], **kw)


def test_ppo_recalls_the_users_runs_and_a_replay_is_not_remembered(record, tmp_path, own_memory_file):
    from core.search.memory import load_memory, remember
    from core.search.session import open_run

    remember(record, own_memory_file)
    assert len(open_run_and_close(_replay_config(record, tmp_path)).optimizer.policy.recall) == 0   # off by default
    setup = open_run(_replay_config(record, tmp_path, memory=True))
    try:
        assert setup.optimizer.policy.recall.tasks == ["act_gelu"]
        assert any("recalling 1 of your earlier runs" in n for n in setup.notes)
        shipped = len(setup.optimizer.policy.memory)
        assert shipped and any(f"remembering the near-best schedules of {shipped})" in n for n in setup.notes)
        votes = setup.optimizer.policy.votes(setup.optimizer.task, setup.optimizer.space)
        assert votes[("BLOCK", 512)] == pytest.approx(1.0, abs=1e-3)   # its own near-best: BLOCK=512, UNROLL=4
        assert setup.remember_to is None                          # a replay measured nothing new
        setup.optimizer.run()
    finally:
        setup.close()
    assert setup.remembered is None and load_memory(own_memory_file).tasks == ["act_gelu"]
    # the shipped weights' memory is untouched by the recall (a checkpoint never carries it)
    assert "act_gelu" in setup.optimizer.policy.memory.tasks
    assert "recall" not in setup.optimizer.policy.state_dict()


@pytest.mark.parametrize("from_default", [False, True])
def test_ppo_starts_from_its_memorys_first_pick_unless_told_the_default(record, tmp_path, from_default):
    from core.project import Project
    from core.search.memory import ranked_schedules
    from core.search.session import open_run

    setup = open_run(_replay_config(record, tmp_path, from_default=from_default))
    try:
        opt = setup.optimizer
        votes = opt.policy.votes(opt.task, opt.space)
        assert votes      # the shipped weights' memory votes for this one-kernel task
        top = next(s for s in ranked_schedules(votes, {k.name: k.values for k in opt.space.knobs}, opt.space.default())
                   if opt.space.legal(s))
        assert top != opt.space.default()      # else the two starts could not be told apart
        assert any("memory ranks highest" in n for n in setup.notes) is not from_default
        opt.run()
    finally:
        setup.close()
    with Project.open(tmp_path / "ppo.cuagent", readonly=True) as project:
        first = next(project.candidates(limit=1))
    assert dict(first.schedule) == (opt.space.default() if from_default else top)


def test_the_other_policies_and_no_memory_recall_nothing(record, tmp_path, own_memory_file):
    from core.search.memory import remember
    from core.search.session import open_run

    remember(record, own_memory_file)
    for policy, memory in (("ppo-untrained", True), ("random", True), ("ppo", False)):    # False: the default
        setup = open_run(_replay_config(record, tmp_path, policy=policy, memory=memory))
        try:
            assert len(getattr(setup.optimizer.policy, "recall", [])) == 0
            assert not any("recalling" in n for n in setup.notes)
        finally:
            setup.close()


def test_a_run_on_a_gpu_is_remembered_when_it_closes(record, tmp_path, own_memory_file):
    from core.project import Project
    from core.search.memory import load_memory
    from core.search.session import RunSetup

    class Pool:
        closed = False

        def close(self):
            self.closed = True

    # What open_run builds for a GPU run, with the record standing in for the run's project.
    copy = tmp_path / "run.cuagent"
    copy.write_bytes(record.read_bytes())
    setup = RunSetup(None, Project.open(copy), Pool(), replaying=False, remember_to=own_memory_file)
    setup.close()
    assert setup.pool.closed and load_memory(own_memory_file).tasks == ["act_gelu"]
    assert setup.remembered.startswith("remembered 1 near-best schedules of act_gelu")
    own_memory_file.write_text("{broken")                       # a damaged file is reported, not replaced
    setup = RunSetup(None, Project.open(copy), Pool(), replaying=False, remember_to=own_memory_file)
    setup.close()
    assert setup.remembered.startswith("warning: this run was not remembered")
    assert own_memory_file.read_text() == "{broken"


def test_a_damaged_memory_file_is_reported_and_left_alone(record, tmp_path, own_memory_file):
    from core.search.session import open_run

    own_memory_file.write_text("{broken")
    config = _replay_config(record, tmp_path, memory=True)
    setup = open_run(config)
    try:
        assert any("your remembered runs are not used" in n for n in setup.notes)
        assert setup.remember_to is None and len(setup.optimizer.policy.recall) == 0
    finally:
        setup.close()
    assert own_memory_file.read_text() == "{broken"


def test_ranked_schedules_are_every_combination_once_best_first():
    import itertools

    from core.search.memory import ranked_schedules, vote_score

    knobs = {"A": [1, 2, 3], "B": [10, 20], "C": [7, 8], "D": [0, 1]}     # D has no votes: it stays fixed
    votes = {("A", 1): 0.2, ("A", 2): 0.5, ("A", 3): 0.3, ("B", 10): 0.9, ("B", 20): 0.1,
             ("C", 7): 0.0, ("C", 8): 1.0}
    fixed = {"A": 1, "B": 10, "C": 7, "D": 1}
    out = list(ranked_schedules(votes, knobs, fixed))
    every = [dict(zip("ABC", values), D=1) for values in itertools.product(*(knobs[k] for k in "ABC"))]
    assert len(out) == len(every) == 12 and sorted(map(str, out)) == sorted(map(str, every))
    scores = [vote_score(votes, s) for s in out]
    assert scores == sorted(scores, reverse=True)
    assert out[0] == {"A": 2, "B": 10, "C": 8, "D": 1}
    assert len(list(ranked_schedules(votes, knobs, fixed, limit=5))) == 5
    assert list(ranked_schedules({}, knobs, fixed)) == []                    # no votes: nothing to rank


def test_a_replay_trial_can_leave_its_project_to_be_remembered(record, tmp_path):
    from core.search.benchmark import search_record
    from core.search.policies import make_policy

    kept = tmp_path / "trial.cuagent"
    trial = search_record(record, lambda space: make_policy("random", space), "random", 0, 12, "skip", keep=kept)
    assert kept.is_file() and trial.evaluations == 12
    entry = entry_from_record(kept)
    assert entry is not None and entry.task == "act_gelu"


def test_a_run_that_starts_from_the_memorys_pick_notes_the_default_for_its_replays(record, tmp_path):
    from core.project import Project
    from core.search.benchmark import record_default, search_record
    from core.search.policies import make_policy

    kept = tmp_path / "ppo.cuagent"
    search_record(record, lambda space: make_policy("ppo", space), "ppo", 0, 6, "skip", keep=kept)
    with Project.open(record, readonly=True) as source:
        program, default = record_default(source)     # the sweep started from the default
    assert default is not None and default.candidate_hash == program.content_hash()
    with Project.open(kept, readonly=True) as made:
        first = next(made.candidates(limit=1))
        assert first.candidate_hash != program.content_hash()     # the run started from the memory's pick
        assert first.extra["default"] == program.schedule
        changed = [f"{k}={v}" for k, v in first.schedule.items() if program.schedule.get(k) != v]
        assert changed and first.origin == "ppo:start: " + ", ".join(changed)
        replayed, _ = record_default(made)
    assert replayed.content_hash() == program.content_hash()     # a replay of it searches from the default

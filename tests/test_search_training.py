"""`cuda-agent train`'s logic on made-up records (CPU): the split, mask-to-record, learning, weights."""
from __future__ import annotations

from pathlib import Path

import pytest

from core.project import Project
from core.search.policies import make_policy
from core.search.training import RecordInfo, describe_records, split_records, train
from tests.support.replay_run import record_project


@pytest.fixture(scope="module")
def record(tmp_path_factory) -> Path:
    return record_project(tmp_path_factory.mktemp("train") / "rec.cuagent")


@pytest.fixture(scope="module")
def sparse_record(tmp_path_factory, record) -> Path:
    """The same record with half of its schedules deleted: a record that cannot answer everything."""
    path = tmp_path_factory.mktemp("sparse") / "sparse.cuagent"
    path.write_bytes(record.read_bytes())
    with Project.open(path) as project:
        ids = [c.id for c in project.candidates()]
        project._db.execute(f"DELETE FROM candidates WHERE id IN ({','.join(map(str, ids[1::2]))})")
        project._db.commit()
    return path


def test_split_holds_out_every_third_task_of_each_family():
    infos = [RecordInfo(Path(f"{n}.cuagent"), n, n.split("_")[0], 5)
             for n in ["act_a", "act_b", "act_c", "act_d", "red_a", "red_b", "pool_a"]]
    train_set, held = split_records(infos)
    assert [r.task for r in held] == ["act_b", "red_b"]
    assert {r.task for r in train_set} == {"act_a", "act_c", "act_d", "red_a", "pool_a"}
    assert split_records(infos, held_out_every=0)[1] == []


def test_training_proposes_only_what_the_record_answers(sparse_record):
    info = describe_records([sparse_record])[0]
    policy, report = train([info], rounds=2, budget=6, seed=0)
    assert len(report.episodes) == 2 and all(e.task == "act_gelu" for e in report.episodes)
    assert policy.trained_on == ["act_gelu"] and policy.meta["rounds"] == 2
    # every evaluation of a round was answered by the record (a miss would be "not counted")
    assert all(e.evaluations > 0 for e in report.episodes)


def _improving_probability(policy) -> float:
    """The policy's probability, at the default schedule, of an edit that makes the made-up time faster."""
    from core.search.features import action_features, state_vector
    from core.search.policies import SearchState
    from core.search.space import ScheduleSpace
    from core.tasks import load_task
    from tests.support.replay_run import TASK_PATH, made_up_ms, search_program

    task = load_task(TASK_PATH)
    space = ScheduleSpace.from_program(search_program(), task)
    start = space.default()
    state = SearchState(start, state_vector(space, task, None, start, "measured", None, 1.2, 0, 8),
                        actions=action_features(space, start))
    mask = space.mask(start)
    probs = policy.probabilities(state, mask)
    return sum(p for i, p in enumerate(probs)
               if mask[i] and made_up_ms(space.apply(start, i)) < made_up_ms(start) * 0.99)


def test_training_makes_improving_edits_likelier(record, tmp_path):
    info = describe_records([record])[0]
    untrained = make_policy("ppo-untrained", None, seed=0)
    before = _improving_probability(untrained)
    policy, report = train([info], rounds=100, budget=8, seed=0)
    assert report.updates > 0 and len(report.round_medians(8)) == 100
    after = _improving_probability(policy)
    assert after > before + 0.15, (before, after)
    weights = tmp_path / "ppo.json"
    policy.save(weights)
    assert make_policy("ppo", None, weights=weights).trained_on == ["act_gelu"]
    assert _improving_probability(make_policy("ppo", None, weights=weights)) == pytest.approx(after)


def test_the_train_command_logs_progress_and_writes_loadable_weights(record, tmp_path, capsys):
    from core.cli import main

    assert main(["train", str(tmp_path / "missing.cuagent")]) == 2
    weights = tmp_path / "ppo.json"
    assert main(["train", str(record), "--out", str(weights), "--rounds", "2", "--budget", "6", "--hold-out", "0"]) == 0
    out = capsys.readouterr().out
    # Not a terminal (a log): one line per round instead of a progress bar.
    assert "round 1 of 2 done" in out and "round 2 of 2 done" in out and f"weights written to {weights}" in out
    policy = make_policy("ppo", weights=weights)
    assert policy.meta["trained_on"] == ["act_gelu"] and policy.meta["held_out"] == []

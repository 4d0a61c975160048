"""`cuda-agent train`'s logic on made-up records (CPU): the split, mask-to-record, learning, weights."""
from __future__ import annotations

import math
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
    folds = [[r.task for r in split_records(infos, fold=k)[1]] for k in range(3)]
    assert folds == [["act_a", "act_d", "pool_a", "red_a"], ["act_b", "red_b"], ["act_c"]]


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
    assert policy.memory.tasks == ["act_gelu"]          # the weights remember what they were trained on
    assert main(["train", str(record), "--out", str(weights), "--rounds", "1", "--budget", "4", "--hold-out", "0",
                 "--no-memory"]) == 0
    assert len(make_policy("ppo", weights=weights).memory) == 0


def test_the_target_bonus_pays_once_per_episode_and_never_past_the_start():
    from core.search.reward import RewardConfig, RewardTracker

    plain = RewardConfig()
    config = RewardConfig(target_ms=1.0, target_bonus=3.0)
    # no eager/compile times: only the shaped term and the target bonus
    assert RewardTracker(plain).reward("measured", 0.9, 1.2, None, None) == pytest.approx(math.log(1.2 / 0.9))
    tracker = RewardTracker(config)
    assert tracker.reward("measured", 1.1, 1.2, None, None) == pytest.approx(math.log(1.2 / 1.1))
    assert tracker.reward("measured", 0.9, 1.1, None, None) == pytest.approx(math.log(1.1 / 0.9) + 3.0)
    assert tracker.reward("measured", 0.8, 0.9, None, None) == pytest.approx(math.log(0.9 / 0.8))   # paid once
    started_past = RewardTracker(config)
    started_past.start_from(0.95, None, None)
    assert started_past.reward("measured", 0.9, 0.95, None, None) == pytest.approx(math.log(0.95 / 0.9))
    assert RewardTracker(RewardConfig(target_ms=1.0)).reward("measured", 0.9, 1.2, None, None) == \
        pytest.approx(math.log(1.2 / 0.9))       # no bonus configured: the run's reward


def test_random_starts_start_visits_from_recorded_schedules(record, monkeypatch):
    import core.search.training as training
    from core.search.training import recorded_schedules
    from tests.support.replay_run import made_up_fails, search_program

    schedules = recorded_schedules(record)
    # every measured schedule once (the made-up failure is not a place to start from)
    assert len(schedules) == 19 and all(not made_up_fails(s) for s in schedules)
    assert search_program().schedule in schedules
    starts, firsts = [], []
    real = training.search_record

    def spy(*args, **kwargs):
        starts.append(kwargs.get("start"))
        return real(*args, **kwargs)

    monkeypatch.setattr(training, "search_record", spy)
    info = describe_records([record])[0]
    train([info], rounds=12, budget=4, seed=0)
    assert starts == [None] * 12                  # off: every visit from the default
    starts.clear()
    policy, report = train([info], rounds=12, budget=4, seed=0, random_starts=1.0, target_bonus=1.0)
    assert all(s in schedules for s in starts) and len({tuple(sorted(s.items())) for s in starts}) > 3
    assert policy.meta["random_starts"] == 1.0 and policy.meta["target_bonus"] == 1.0
    starts.clear()
    train([info], rounds=40, budget=4, seed=0, random_starts=0.5)
    assert 5 < sum(s is not None for s in starts) < 35


def test_the_train_command_writes_the_temperature_for_use(record, tmp_path):
    from core.cli import main
    from core.search.policies.ppo import load_weights

    weights = tmp_path / "sharp.json"
    assert main(["train", str(record), "--out", str(weights), "--rounds", "1", "--budget", "4", "--hold-out", "0",
                 "--temperature", "0.5", "--target-bonus", "1"]) == 0
    assert load_weights(weights).config.temperature == 0.5
    assert main(["train", str(record), "--out", str(weights), "--temperature", "0"]) == 2
    assert main(["train", str(record), "--out", str(weights), "--random-starts", "1.5"]) == 2

"""Action space, masks, reward, replay pool and policies (CPU only)."""
from __future__ import annotations

import math
import random

import pytest

from core.evaluation.results import Status
from core.search.features import feature_size
from core.search.policies import SearchState, Transition, make_policy
from core.search.policies.ppo import PPOConfig, PPOPolicy, gae
from core.search.replay import NOT_RECORDED, ReplayPool
from core.search.reward import RewardConfig, RewardTracker
from core.search.space import Action, Knob, ScheduleSpace
from core.tasks import load_task
from tests.support.replay_run import TASK_PATH, made_up_ms, record_project, search_program


@pytest.fixture(scope="module")
def task():
    return load_task(TASK_PATH)


def test_space_from_program_masks_unresolvable_and_no_op_actions(task):
    space = ScheduleSpace.from_program(search_program(), task)
    assert Action("BLOCK", 2048) in space.actions
    s = space.default()
    assert s == {"BLOCK": 256, "UNROLL": 1}
    mask = space.mask(s)
    for action, ok in zip(space.actions, mask):
        if action.value == s[action.knob] or (action.knob == "BLOCK" and action.value == 2048):
            assert not ok, action
        else:
            assert ok, action
    assert "1024" in (space.why_illegal({"BLOCK": 2048, "UNROLL": 1}) or "")
    assert len(list(space.enumerate())) == 5 * 4
    assert len(list(space.enumerate(cap=7))) == 7


def test_constraints_are_pluggable():
    space = ScheduleSpace([Knob("A", (1, 2, 4)), Knob("B", (1, 2))],
                          constraints=[lambda s: "A*B > 4" if s["A"] * s["B"] > 4 else None])
    assert space.why_illegal({"A": 4, "B": 2}) == "A*B > 4"
    assert space.mask({"A": 4, "B": 1}) == [True, True, False, False, False]
    rng = random.Random(0)
    assert all(space.legal(space.sample(rng)) for _ in range(50))


@pytest.mark.parametrize("name", ["random", "evolution", "ppo"])
def test_no_masked_action_is_ever_chosen(name):
    space = ScheduleSpace([Knob(f"K{i}", (1, 2, 3, 4)) for i in range(3)])
    n = 6
    policy = make_policy(name, space, n, seed=1)
    rng = random.Random(3)
    schedule = space.default()
    for i in range(1000):
        mask = [rng.random() < 0.2 for _ in space.actions]
        if not any(mask):
            mask[rng.randrange(len(mask))] = True
        state = SearchState(schedule, [rng.random() for _ in range(n)], last_status="measured", last_ms=1.0)
        a = policy.propose(state, mask, rng)
        assert mask[a], (i, a)
        nxt = SearchState(space.apply(schedule, a), state.features, last_status="measured", last_ms=rng.random())
        policy.observe(Transition(state, a, rng.random(), nxt, i % 4 == 3))
        if i % 50 == 49:
            policy.update()


def test_gae_on_a_known_problem():
    adv, ret = gae([1.0, 0.0, 2.0], [0.5, 0.5, 0.5], [False, False, True], gamma=0.5, lam=1.0)
    # returns: r2 = 2; r1 = 0 + .5*2 = 1; r0 = 1 + .5*1 = 1.5
    assert ret == pytest.approx([1.5, 1.0, 2.0])
    assert adv == pytest.approx([1.0, 0.5, 1.5])


def test_ppo_learns_a_bandit():
    arms, best = 8, 5
    policy = PPOPolicy(4, arms, seed=0, config=PPOConfig(lr=1e-2, min_batch=32, entropy_coef=0.0))
    rng = random.Random(0)
    features = [1.0, 0.0, 0.5, -0.5]
    mask = [True] * arms
    mask[2] = False
    state = SearchState({}, features)
    for _ in range(40):
        for _ in range(32):
            a = policy.propose(state, mask, rng)
            r = (1.0 if a == best else 0.0) + rng.gauss(0, 0.1)
            policy.observe(Transition(state, a, r, state, True))
        assert policy.update() is not None
    probs = policy.probabilities(features, mask)
    assert probs[best] > 0.8, probs
    assert probs[2] == 0.0
    # a checkpoint round-trips through JSON-able data
    other = PPOPolicy(4, arms, seed=9)
    other.load_state_dict(policy.state_dict())
    assert other.probabilities(features, mask) == pytest.approx(probs)


def test_reward_formula():
    t = RewardTracker(RewardConfig())
    assert t.reward("wrong", None, 1.0, 1.2, 1.0) == -1.0
    assert t.reward("rejected", None, 1.0, 1.2, 1.0) == -0.5
    # 1.0 -> 0.9: shaping log(1/0.9); beats eager 1.2 by >5 % (bonus 1), not compile 1.0 (0.9*1.05 > 0.9... check)
    r = t.reward("measured", 0.9, 1.0, 1.2, 1.0)
    assert r == pytest.approx(math.log(1 / 0.9) + 1.0 + 2.0)      # 0.9 * 1.05 = 0.945 <= 1.0: both milestones
    assert t.reward("measured", 0.9, 0.9, 1.2, 1.0) == 0.0        # milestones pay once
    t2 = RewardTracker()
    assert t2.reward("measured", 0.97, None, 1.2, 1.0) == pytest.approx(1.0)   # beats eager only


def test_replay_pool_answers_from_the_record(tmp_path):
    path = record_project(tmp_path / "rec.cuagent")
    pool = ReplayPool.from_files([path])
    assert len(pool) == 20
    program = search_program()
    res = pool.evaluate(program.with_schedule({"BLOCK": 512, "UNROLL": 4}))
    assert res.status is Status.MEASURED
    assert res.measurement.timing.median_ms == pytest.approx(made_up_ms({"BLOCK": 512, "UNROLL": 4}))
    assert res.measurement.kernels[0].registers == 32
    assert pool.evaluate(program.with_schedule({"BLOCK": 1024, "UNROLL": 8})).status is Status.COMPILE_ERROR
    miss = pool.evaluate(program.with_schedule({"BLOCK": 2048, "UNROLL": 1}))
    assert miss.status is Status.REJECTED and miss.reason == NOT_RECORDED and pool.misses == 1
    assert pool.baselines().eager.median_ms == pytest.approx(1.2)


def test_feature_vector_size_is_stable(task):
    space = ScheduleSpace.from_program(search_program(), task)
    assert feature_size(space, task) == feature_size(space, task, {"sms": 10}) > len(space.actions)

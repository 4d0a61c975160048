"""Action space, masks, reward, replay pool and policies (CPU only)."""
from __future__ import annotations

import math
import random

import pytest

from core.evaluation.results import Status
from core.search.features import ACTION_SIZE, STATE_SIZE, action_features, feature_size, state_vector
from core.search.policies import SearchState, Transition, make_policy
from core.search.policies.ppo import PPOConfig, PPOPolicy, gae, gumbel_max, load_weights
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
    policy = make_policy("ppo-untrained" if name == "ppo" else name, space, seed=1)
    rng = random.Random(3)
    schedule = space.default()
    for i in range(1000):
        mask = [rng.random() < 0.2 for _ in space.actions]
        if not any(mask):
            mask[rng.randrange(len(mask))] = True
        state = SearchState(schedule, [rng.random() for _ in range(STATE_SIZE)], last_status="measured", last_ms=1.0,
                            actions=action_features(space, schedule))
        a = policy.propose(state, mask, rng)
        assert mask[a], (i, a)
        nxt = SearchState(space.apply(schedule, a), state.features, last_status="measured", last_ms=rng.random(),
                          actions=state.actions)
        policy.observe(Transition(state, a, rng.random(), nxt, i % 4 == 3))
        if i % 50 == 49:
            policy.update()


def test_gumbel_max_draws_from_the_distribution_and_never_a_masked_action():
    probs = [0.5, 0.3, 0.15, 0.05, 0.0]
    mask = [True, True, True, True, False]
    rng = random.Random(0)
    n = 20000
    counts = [0] * len(probs)
    for _ in range(n):
        counts[gumbel_max(probs, mask, rng)] += 1
    assert counts[4] == 0
    for p, c in zip(probs, counts):
        assert abs(c / n - p) < 4 * math.sqrt(p * (1 - p) / n) + 1e-9, counts
    # A masked action keeps its probability out of the draw; all allowed ones at zero: the likeliest allowed.
    assert all(gumbel_max([0.9, 0.1], [False, True], rng) == 1 for _ in range(200))
    assert gumbel_max([0.0, 0.0, 1.0], [True, True, False], random.Random(1)) in (0, 1)


def test_gumbel_max_keeps_its_pick_when_the_probabilities_move_a_little():
    """What compile-ahead relies on: a preview made with a guessed state picks what the loop picks
    from the same rng once the state is known, far more often than one uniform through the CDF."""
    gen = random.Random(7)
    same_gumbel = same_cdf = 0
    trials = 2000
    for _ in range(trials):
        p = [gen.random() ** 3 for _ in range(40)]
        q = [x * math.exp(gen.gauss(0, 0.3)) for x in p]      # logits moved by noise of 0.3
        p, q = [x / sum(p) for x in p], [x / sum(q) for x in q]
        seed, mask = gen.random(), [True] * 40
        same_gumbel += gumbel_max(p, mask, random.Random(seed)) == gumbel_max(q, mask, random.Random(seed))
        same_cdf += (random.Random(seed).choices(range(40), weights=p)[0]
                     == random.Random(seed).choices(range(40), weights=q)[0])
    assert same_gumbel / trials > 0.75
    assert same_gumbel > same_cdf + 0.1 * trials, (same_gumbel, same_cdf)


def test_gae_on_a_known_problem():
    adv, ret = gae([1.0, 0.0, 2.0], [0.5, 0.5, 0.5], [False, False, True], gamma=0.5, lam=1.0)
    # returns: r2 = 2; r1 = 0 + .5*2 = 1; r0 = 1 + .5*1 = 1.5
    assert ret == pytest.approx([1.5, 1.0, 2.0])
    assert adv == pytest.approx([1.0, 0.5, 1.5])


def _bandit_state(arms: int, features: list[float]) -> SearchState:
    """Arms told apart only by their action features (one-hot in the first slots)."""
    actions = [[1.0 if j == i else 0.0 for j in range(ACTION_SIZE)] for i in range(arms)]
    return SearchState({}, features, actions=actions)


def test_ppo_learns_a_bandit(tmp_path):
    arms, best = 8, 5
    policy = PPOPolicy(4, ACTION_SIZE, seed=0, config=PPOConfig(lr=1e-2, min_batch=32, entropy_coef=0.0))
    rng = random.Random(0)
    state = _bandit_state(arms, [1.0, 0.0, 0.5, -0.5])
    mask = [True] * arms
    mask[2] = False
    for _ in range(40):
        for _ in range(32):
            a = policy.propose(state, mask, rng)
            r = (1.0 if a == best else 0.0) + rng.gauss(0, 0.1)
            policy.observe(Transition(state, a, r, state, True))
        assert policy.update() is not None
    probs = policy.probabilities(state, mask)
    assert probs[best] > 0.8, probs
    assert probs[2] == 0.0
    # a checkpoint round-trips through JSON-able data, and through a file
    other = PPOPolicy(4, ACTION_SIZE, seed=9)
    other.load_state_dict(policy.state_dict())
    assert other.probabilities(state, mask) == pytest.approx(probs)
    policy.save(tmp_path / "w.json")
    assert load_weights(tmp_path / "w.json").probabilities(state, mask) == pytest.approx(probs)
    with pytest.raises(ValueError, match="state"):
        PPOPolicy(5, ACTION_SIZE).load_state_dict(policy.state_dict())


def test_ppo_scores_any_number_of_actions_with_the_same_weights():
    """What it learned about an action's features carries to a space with more or fewer actions."""
    policy = PPOPolicy(4, ACTION_SIZE, seed=0, config=PPOConfig(lr=1e-2, min_batch=32, entropy_coef=0.0))
    rng = random.Random(1)
    for _ in range(40):
        for _ in range(32):
            arms = rng.choice([3, 6, 9])       # the rewarded arm is the one whose feature 0 is set
            state = _bandit_state(arms, [0.0] * 4)
            a = policy.propose(state, [True] * arms, rng)
            policy.observe(Transition(state, a, 1.0 if a == 0 else 0.0, state, True))
        policy.update()
    for arms in (2, 5, 12):                    # sizes never seen in training
        assert policy.probabilities(_bandit_state(arms, [0.0] * 4), [True] * arms)[0] > 0.7


def test_ppo_temperature_sharpens_choices_and_travels_with_the_weights(tmp_path):
    """PPOConfig.temperature divides the scores: probabilities are softmax(scores / T), the same when
    choosing, in probabilities() and in the update's log-probabilities; the weights file carries it."""
    import json

    import torch

    policy = PPOPolicy(4, ACTION_SIZE, seed=0)
    arms = 6
    state = _bandit_state(arms, [1.0, 0.0, 0.5, -0.5])
    mask = [True] * arms
    mask[1] = False
    base = torch.tensor(policy.probabilities(state, mask))
    policy.save(tmp_path / "w.json")
    data = json.loads((tmp_path / "w.json").read_text())
    assert data["config"]["temperature"] == 1.0
    data["config"]["temperature"] = 0.25
    (tmp_path / "sharp.json").write_text(json.dumps(data))
    sharp = load_weights(tmp_path / "sharp.json")
    assert sharp.config.temperature == 0.25
    probs = torch.tensor(sharp.probabilities(state, mask))
    expected = torch.where(torch.tensor(mask), base.clamp_min(1e-30).log() * 4, torch.tensor(float("-inf")))
    assert probs.tolist() == pytest.approx(torch.softmax(expected, 0).tolist(), abs=1e-5)
    assert probs[1] == 0.0 and probs.max() > base.max()
    choice = sharp.propose(state, mask, random.Random(0))
    assert sharp._pending["logp"] == pytest.approx(math.log(probs[choice]), abs=1e-5)


def test_ppo_without_action_features_is_a_clear_error():
    policy = PPOPolicy(4, ACTION_SIZE)
    with pytest.raises(ValueError, match="one feature vector per action"):
        policy.propose(SearchState({}, [0.0] * 4), [True, True], random.Random(0))


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
    t3 = RewardTracker()
    t3.start_from(1.1, 1.2, 1.0)             # the episode starts past eager (1.1 * 1.05 <= 1.2), not compile
    assert t3.reward("measured", 0.9, 1.1, 1.2, 1.0) == pytest.approx(math.log(1.1 / 0.9) + 2.0)


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


def test_features_have_one_size_for_every_space(task):
    small = ScheduleSpace.from_program(search_program(), task)
    big = ScheduleSpace([Knob("G0_BLOCK", (256, 128)), Knob("G0_VEC", (1, 4)), Knob("G1_ROW_MODE", (0, 1)),
                         Knob("G1_BLOCK", (256, 512, 1024))])
    for space in (small, big):
        schedule = space.default()
        state = state_vector(space, task, {"sms": 10}, schedule, "measured", None, 1.0, 2, 8)
        assert len(state) == STATE_SIZE == feature_size(space, task)
        rows = action_features(space, schedule)
        assert len(rows) == len(space.actions) and {len(r) for r in rows} == {ACTION_SIZE}
    # the same knob name gives the same name features whatever its group; the group slot differs
    rows = action_features(big, big.default())
    block0, block1 = rows[0], rows[next(i for i, a in enumerate(big.actions) if a.knob == "G1_BLOCK")]
    assert block0[:16] == block1[:16] and block0[16:18] != block1[16:18]


def test_make_policy_names_and_weights(tmp_path):
    space = ScheduleSpace([Knob("BLOCK", (1, 2))])
    assert make_policy("ppo-untrained", space).trained_on == []
    trained = PPOPolicy(STATE_SIZE, ACTION_SIZE, seed=3)
    trained.meta = {"trained_on": ["a", "b"]}
    trained.save(tmp_path / "p.json")
    assert make_policy("ppo", space, weights=tmp_path / "p.json").trained_on == ["a", "b"]
    with pytest.raises(FileNotFoundError):
        make_policy("ppo", space, weights=tmp_path / "missing.json")
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("greedy", space)


def test_gae_passes_a_moves_unevaluated_edits_back_undiscounted():
    # edit (not evaluated), edit (not evaluated), evaluation earning 1: all three share the return
    adv, ret = gae([0.0, 0.0, 1.0], [0.0, 0.0, 0.0], [False, False, True], gamma=0.5, lam=0.95,
                   timed=[False, False, True])
    assert ret == pytest.approx([1.0, 1.0, 1.0])
    # the same three as evaluations: discounted twice
    _, ret = gae([0.0, 0.0, 1.0], [0.0, 0.0, 0.0], [False, False, True], gamma=0.5, lam=1.0)
    assert ret == pytest.approx([0.25, 0.5, 1.0])


def test_ppo_scores_evaluate_now_and_never_picks_it_masked():
    space = ScheduleSpace([Knob(f"K{i}", (1, 2, 3, 4)) for i in range(3)])
    policy = make_policy("ppo-untrained", space, seed=2)
    assert policy.max_edits > 1
    rng = random.Random(4)
    schedule = space.default()
    actions = action_features(space, schedule, evaluate=True)
    assert len(actions) == len(space.actions) + 1 and actions[-1][-1] == 1.0
    assert all(a[-1] == 0.0 for a in actions[:-1])
    picks = set()
    for i in range(300):
        mask = [rng.random() < 0.3 for _ in actions]
        mask[-1] = i % 2 == 0
        if not any(mask):
            mask[0] = True
        state = SearchState(schedule, [rng.random() for _ in range(STATE_SIZE)], actions=actions)
        a = policy.propose(state, mask, rng)
        assert mask[a]
        picks.add(a == len(space.actions))
    assert picks == {True, False}

"""--recurrent: the memory layer against a step-by-step cell, its state at episode boundaries under both autoreset
modes, the update's replay against the rollout, the truncation bootstrap under the state that reached the final
observation, and a task that only a memory can learn (trained, resumed, evaluated)."""

import copy
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import ConstantRewardEnv, short_args

import ppo_continuous
import ppo_discrete
import ppo_vector_sameStep

ALL = [ppo_discrete, ppo_continuous, ppo_vector_sameStep]


class RecallEnv(gym.Env):
    """A cue of -1 or +1 is shown at the first of 3 steps only; the last step pays for an action that matches it
    (Discrete: action 1 for +1; Box: 1 - |action - cue| / 2). A policy without memory earns 0.5 at best."""

    def __init__(self, box_actions=False):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32) if box_actions else gym.spaces.Discrete(2)

    def observation(self):
        return np.array([self.cue if self.steps == 0 else 0.0, float(self.steps == 2)], np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps, self.cue = 0, float(self.np_random.choice([-1.0, 1.0]))
        return self.observation(), {}

    def step(self, action):
        self.steps += 1
        if self.steps < 3:
            return self.observation(), 0.0, False, False, {}
        if isinstance(self.action_space, gym.spaces.Box):
            return self.observation(), 1.0 - abs(float(np.clip(action[0], -1, 1)) - self.cue) / 2, True, False, {}
        return self.observation(), float((action == 1) == (self.cue > 0)), True, False, {}


gym.register("test/Recall-v0", entry_point=RecallEnv)
gym.register("test/RecallBox-v0", entry_point=RecallEnv, kwargs={"box_actions": True})
gym.register("test/CountingTruncatedBox-v0", entry_point=ConstantRewardEnv, max_episode_steps=20,
             kwargs={"count_steps": True, "box_actions": True})


def env_id(ppo, name):
    return f"test/{name}{'Box' if ppo is ppo_continuous else ''}-v0"


def step_by_step(agent, features, state, keep):
    """Brute force: the memory's cell applied one row at a time, with the memory's own weights; the state after each
    row kept before it is zeroed where keep is 0. Returns outputs [T, N, H] and states [T, N, S]."""
    lstm = isinstance(agent.memory, torch.nn.LSTM)
    cell = (torch.nn.LSTMCell if lstm else torch.nn.GRUCell)(agent.memory.input_size, agent.memory.hidden_size)
    cell.load_state_dict({name[: -len("_l0")]: value for name, value in agent.memory.state_dict().items()})
    outputs, states = [], []
    for row, keep_row in zip(features, keep):
        if lstm:
            h, c = cell(row, tuple(state.chunk(2, dim=1)))
            state = torch.cat([h, c], dim=1)
        else:
            h = state = cell(row, state)
        outputs.append(h)
        states.append(state)
        state = state * keep_row.unsqueeze(1)
    return torch.stack(outputs), torch.stack(states)


def make_agent(ppo, recurrent):
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")])
    return ppo.Agent(envs, ppo.Args(hidden_size=16, recurrent=recurrent))


@pytest.mark.parametrize("recurrent", ["lstm", "gru"])
@pytest.mark.parametrize("ppo", ALL, ids=lambda module: module.__name__)
def test_memory_reads_each_sub_env_as_a_cell_step_by_step_and_forgets_at_each_episode_end(ppo, recurrent):
    torch.manual_seed(0)
    agent = make_agent(ppo, recurrent)
    size = agent.initial_state(1).shape[1]
    assert size == (32 if recurrent == "lstm" else 16)
    for steps, keep in [(9, (torch.rand(9, 5) > 0.3).float()), (6, torch.zeros(6, 5)), (4, torch.ones(4, 5)),
                        (1, torch.tensor([[1.0, 0.0, 1.0, 0.0, 1.0]]))]:
        x, state = torch.randn(steps, 5, 4), torch.randn(5, size)
        with torch.no_grad():
            features, final = agent.remember(x, state, keep)
            expected, states = step_by_step(agent, x, state, keep)
        torch.testing.assert_close(features, expected.flatten(0, 1), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(final, states[-1] * keep[-1].unsqueeze(1), rtol=1e-5, atol=1e-6)
        # a sequence read in two halves, the state carried between them, is the sequence read at once
        if steps > 1:
            half = steps // 2
            first, carried = agent.remember(x[:half], state, keep[:half])
            second, _ = agent.remember(x[half:], carried, keep[half:])
            torch.testing.assert_close(torch.cat([first, second]), features, rtol=1e-5, atol=1e-6)
    none = make_agent(ppo, "none")
    x, state = torch.randn(3, 2, 4), none.initial_state(2)
    features, after = none.remember(x, state, torch.ones(3, 2))
    assert none.memory is None and after.shape == (2, 0) and torch.equal(features, x.flatten(0, 1))


@pytest.mark.parametrize("ppo", ALL, ids=lambda module: module.__name__)
def test_sequences_of_16_steps_start_from_the_state_the_whole_rollout_reaches_under_the_current_weights(ppo):
    """--sequence-length: each sequence's first state is recomputed at each epoch's start, so under any weights every
    row's features are those of the whole rollout replayed from its start (episode ends inside sequences and at their
    edges), under the first weights and under changed ones; the gradient alone stops at a sequence's start."""
    torch.manual_seed(0)
    agent = make_agent(ppo, "lstm")
    obs, start = torch.randn(64, 3, 4), torch.randn(3, agent.initial_state(1).shape[1])
    keep = (torch.rand(64, 3) > 0.1).float()
    keep[15, 0] = keep[31, 1] = 0.0  # an episode ending on a sequence's last row
    for epoch in range(2):
        with torch.no_grad():
            weights = (torch.ones_like(keep),) if ppo is ppo_vector_sameStep else ()  # SAME_STEP: every row weighs 1
            rows = [{int(row): feature for mb, hidden in ppo.sequence_minibatches(agent, obs, start, keep, *weights, 4,
                                                                                 length)
                     for row, feature in zip(mb, hidden)} for length in (0, 16)]
        real = int((keep > 0).sum()) if ppo is not ppo_vector_sameStep else keep.numel()
        assert sorted(rows[0]) == sorted(rows[1]) == list(range(real))
        torch.testing.assert_close(torch.stack([rows[1][row] for row in range(real)]),
                                   torch.stack([rows[0][row] for row in range(real)]), rtol=1e-5, atol=1e-6)
        agent.memory.weight_hh_l0.data += 0.5  # the next epoch's weights


@pytest.mark.parametrize("ppo", ALL, ids=lambda module: module.__name__)
def test_no_minibatch_of_sequences_holds_fewer_than_2_real_rows_though_autoreset_rows_drop_out(ppo):
    """Advantages are normalized per minibatch: a minibatch of one real row has no std (NaN loss). Four sequences of
    2 steps in 4 minibatches, two of them an autoreset row (SAME_STEP: a departed agent's) and one real row: fewer
    minibatches, each real row once."""
    agent = make_agent(ppo, "lstm")
    obs, start, valid = torch.randn(4, 2, 4), torch.zeros(2, agent.initial_state(1).shape[1]), torch.ones(4, 2)
    valid[0, 0] = valid[2, 1] = 0.0  # the first sequence of sub-env 0 and the second of sub-env 1
    for seed in range(10):  # shuffles
        torch.manual_seed(seed)
        weights = (valid,) if ppo is ppo_vector_sameStep else ()  # SAME_STEP: the rows' weights beside the memory's
        rows = [mb.tolist() for mb, _ in ppo.sequence_minibatches(agent, obs, start, valid, *weights, 4, 2)]
        assert min(map(len, rows)) >= 2 and sorted(sum(rows, [])) == list(range(6)), rows


def spy_on_memory(ppo, monkeypatch):
    """Records every call of Agent.remember: (x, state in, keep, features, state out)."""
    calls, remember = [], ppo.Agent.remember

    def spy(agent, x, state, keep=None):
        features, after = remember(agent, x, state, keep)
        calls.append((x.detach().clone(), state.detach().clone(), keep, features.detach().clone(),
                      after.detach().clone()))
        return features, after

    monkeypatch.setattr(ppo.Agent, "remember", spy)
    return calls


@pytest.mark.parametrize("ppo", ALL, ids=lambda module: module.__name__)
def test_the_state_is_zero_exactly_at_each_episode_start_in_training_and_in_evaluation(ppo, in_tmp, monkeypatch):
    """Observation 0 is an episode's first (a step count). NEXT_STEP's autoreset row reads the final observation
    (20) under its episode's state; the state is zero from the next episode's first row on, and never else."""
    calls = spy_on_memory(ppo, monkeypatch)
    args = short_args(ppo, env_id=env_id(ppo, "CountingTruncated"), recurrent="lstm", total_timesteps=512,
                      **({} if ppo is ppo_discrete else {"norm_obs": False, "norm_reward": False}))
    path = ppo.train(args)
    stepwise = [call for call in calls if call[0].shape[:2] == (1, args.num_envs)]  # rollout rows and next_obs
    assert len(stepwise) == 512 // args.num_envs + 512 // (args.num_envs * args.num_steps)  # + next_obs, each rollout
    counts = torch.cat([call[0][0, :, 0] for call in stepwise])
    zero = torch.cat([(call[1] == 0).all(dim=1) for call in stepwise])
    assert (counts == 0).any() and (counts == 20).any() == (ppo is not ppo_vector_sameStep)
    assert torch.equal(zero, counts == 0)
    calls.clear()
    checkpoint = ppo.load_checkpoint(path)
    ppo.evaluate(ppo.Args(**{**checkpoint["args"], "eval_checkpoint": path, "eval_episodes": 3}), checkpoint)
    assert len(calls) == 60 and all(call[0].shape[:2] == (1, 1) for call in calls)
    assert [bool((call[1] == 0).all()) for call in calls] == [step % 20 == 0 for step in range(60)]


def update_spy(ppo, monkeypatch, first_minibatches):
    """Records, for each update's first minibatch (the parameters are still those of the rollout), the log-probability
    and value the update computes from the replayed features beside the rollout's."""
    real_loss, count = ppo.ppo_loss, [0]

    def spy(agent, hidden, mb, *rest):
        masks = () if ppo is ppo_continuous else (mb.get("masks"),)  # the categorical scripts' policy takes masks
        if count[0] % 4 == 0:  # 2 minibatches, 2 epochs
            with torch.no_grad():
                logprob = agent.policy(hidden, mb["actions"], *masks)[1]
                first_minibatches.append((logprob, mb["logprobs"], agent.critic(hidden).view(-1), mb["values"]))
        count[0] += 1
        return real_loss(agent, hidden, mb, *rest)

    monkeypatch.setattr(ppo, "ppo_loss", spy)


@pytest.mark.parametrize("recurrent, sequence_length", [("lstm", 0), ("gru", 0), ("lstm", 16)])
@pytest.mark.parametrize("ppo", ALL, ids=lambda module: module.__name__)
def test_the_update_replays_the_rollout_exactly_with_masks_and_episode_ends(ppo, recurrent, sequence_length, in_tmp,
                                                                           monkeypatch):
    """The usual recurrent-PPO bug: the update's features differ from the rollout's (a wrong start state, a reset at
    the wrong row), so the first ratio is not 1. Here every update's first minibatch reproduces the rollout's
    log-probabilities and values (float rounding aside), on short episodes with action masks (categorical); whole
    rollouts, or sequences of 16 steps cut across episodes, each from the state the rollout reached there."""
    first_minibatches = []
    update_spy(ppo, monkeypatch, first_minibatches)
    env = "test/MaskedMultiDiscrete-info-v0" if ppo is not ppo_continuous else "Pendulum-v1"
    ppo.train(short_args(ppo, env_id=env, recurrent=recurrent, num_envs=4, num_steps=64, num_minibatches=2,
                         update_epochs=2, total_timesteps=768, sequence_length=sequence_length))
    assert len(first_minibatches) == 3
    for logprob, old_logprob, value, old_value in first_minibatches:
        assert len(logprob) >= 100
        torch.testing.assert_close(logprob, old_logprob, rtol=0, atol=2e-5)
        torch.testing.assert_close(value, old_value, rtol=0, atol=2e-5)


@pytest.mark.parametrize("ppo", ALL, ids=lambda module: module.__name__)
def test_a_truncation_bootstraps_its_final_observation_under_the_state_that_reached_it(ppo, in_tmp, monkeypatch):
    """next_values of a row whose episode was truncated (observation 20, the step count): V of the final observation,
    read by the memory from the state after the episode's last row, as a step-by-step cell computes it."""
    seen, remember = {}, ppo.Agent.remember

    def spy(agent, x, state, keep=None):
        if x.shape[0] > 1 and "gae" not in seen:  # the first values' pass, a group of sub-envs at a time, before GAE
            seen.setdefault("agent", copy.deepcopy(agent))
            seen.setdefault("groups", []).append((x.clone(), state.clone(), keep.clone()))
        return remember(agent, x, state, keep)

    compute_advantages = ppo.compute_advantages
    monkeypatch.setattr(ppo.Agent, "remember", spy)
    monkeypatch.setattr(ppo, "compute_advantages",  # the rollout's arrays are refilled by the next one: copied
                        lambda *a: seen.setdefault("gae", [np.copy(v) for v in a[:5]]) and compute_advantages(*a))
    args = short_args(ppo, env_id=env_id(ppo, "CountingTruncated"), recurrent="lstm", total_timesteps=512,
                      num_steps=128, **({} if ppo is ppo_discrete else {"norm_obs": False, "norm_reward": False}))
    ppo.train(args)
    agent, (xs, starts, keeps) = seen["agent"], zip(*seen["groups"])  # the groups, in the order of the sub-envs
    x, start, keep = torch.cat(xs, dim=1), torch.cat(starts), torch.cat(keeps, dim=1)
    rewards, values, next_values, terminations, dones = seen["gae"]
    with torch.no_grad():
        outputs, states = step_by_step(agent, x, start, keep)
        expected = agent.critic(outputs).squeeze(-1).numpy()
        np.testing.assert_allclose(values, expected, rtol=0, atol=1e-5)
        ended = np.argwhere(dones[:-1] > 0)
        assert len(ended) >= 4 and not terminations.any()
        for t, env in ended:
            if ppo is ppo_vector_sameStep:  # SAME_STEP: the final observation came in the info; the row after resets
                h = step_by_step(agent, torch.full((1, 1, 1), 20.0), states[t, env: env + 1], torch.ones(1, 1))[0]
                bootstrap = agent.critic(h).item()
            else:  # NEXT_STEP: the autoreset row t + 1 reads the final observation from the state after row t
                assert x[t + 1, env, 0] == 20 and keep[t + 1, env] == 0
                bootstrap = expected[t + 1, env]
            assert next_values[t, env] == pytest.approx(bootstrap, abs=1e-5)


@pytest.mark.parametrize("ppo", ALL, ids=lambda module: module.__name__)
def test_a_task_that_needs_memory_is_learned_resumed_and_evaluated(ppo, in_tmp, monkeypatch):
    """RecallEnv: the cue is gone when the action is due. With an LSTM every script learns it within 4,096 steps
    (evaluation carries the state through each episode); without memory, or resumed, as it was."""
    settings = dict(env_id=env_id(ppo, "Recall"), total_timesteps=4096, num_envs=4, num_steps=64, num_minibatches=2,
                    update_epochs=8, learning_rate=3e-3, checkpoint_interval=0, ent_coef=0.0,
                    **({} if ppo is ppo_discrete else {"norm_reward": False}))
    scores = {}
    for recurrent in ("none", "lstm"):
        path = ppo.train(short_args(ppo, exp_name=recurrent, recurrent=recurrent, **settings))
        checkpoint = ppo.load_checkpoint(path)
        args = ppo.Args(**{**checkpoint["args"], "eval_checkpoint": path, "eval_episodes": 20})
        scores[recurrent] = np.mean(ppo.evaluate(args, checkpoint))
    assert scores["none"] <= 0.6 and scores["lstm"] >= 0.95  # blind at the decision: 0.5
    assert np.mean(ppo.evaluate(ppo.Args(**{**vars(args), "eval_sample": True}), checkpoint)) >= 0.8
    assert any(name.startswith("memory.") for name in checkpoint["model"])
    monkeypatch.setattr(sys, "argv", [ppo.SCRIPT, "--resume", path, "--total-timesteps", "4352"])
    ppo.train(*ppo.parse_args())
    resumed = ppo.load_checkpoint(path)
    assert resumed["global_step"] == 4352 and resumed["args"]["recurrent"] == "lstm"
    args = ppo.Args(**{**resumed["args"], "eval_checkpoint": path, "eval_episodes": 20})
    assert np.mean(ppo.evaluate(args, resumed)) >= 0.95
    resumed["model"]["memory.weight_hh_l0"][0, 0] = float("nan")
    torch.save(resumed, "nan.pt")
    with pytest.raises(SystemExit, match="nan.pt holds non-finite weights"):
        ppo.load_checkpoint("nan.pt")
    monkeypatch.setattr(sys, "argv", [ppo.SCRIPT, "--resume", path, "--total-timesteps", "4608", "--recurrent", "gru"])
    with pytest.raises(SystemExit, match="the checkpoint's model does not fit .*memory.weight_ih_l0"):
        ppo.train(*ppo.parse_args())


@pytest.mark.parametrize("engine", ["ale-py", "envpool"])
@pytest.mark.parametrize("ppo", [ppo_discrete, ppo_vector_sameStep], ids=lambda module: module.__name__)
def test_atari_with_memory_sees_one_frame_and_reads_it_through_the_cnn_then_the_lstm(ppo, engine, in_tmp):
    pytest.importorskip("ale_py" if engine == "ale-py" else "envpool")
    if ppo is ppo_vector_sameStep and engine == "envpool":
        pytest.skip("ppo_vector_sameStep.py steps gymnasium's envs only")
    env_id, backend = ("ALE/Pong-v5", "gymnasium") if engine == "ale-py" else ("Pong-v5", "envpool")
    args = ppo.Args(env_id=env_id, recurrent="lstm", num_envs=2, num_steps=32, total_timesteps=64,
                    **({"env_backend": backend} if ppo is ppo_discrete else {"vectorization_mode": "sync"}))
    envs = ppo.make_envs(args, 2, None, *(["sync"] if ppo is ppo_vector_sameStep else [1]))
    assert envs.single_observation_space.shape == (1, 84, 84)  # one frame; four without memory
    agent = ppo.Agent(envs, ppo.Args(recurrent="lstm"))
    assert isinstance(agent.encoder, ppo.NatureCNN) and agent.memory.hidden_size == 128
    obs, _ = envs.reset(seed=1)
    features, state = agent.remember(torch.from_numpy(obs[None]), agent.initial_state(2), torch.ones(1, 2))
    assert features.shape == (2, 128) and state.shape == (2, 256)
    envs.close()
    model = ppo.load_checkpoint(ppo.train(args))["model"]
    assert model["memory.weight_ih_l0"].shape == (512, 512)  # the LSTM's four gates on the CNN's 512 features


@pytest.mark.parametrize("recurrent", ["none", "gru"])
@pytest.mark.parametrize("ppo", ALL, ids=lambda module: module.__name__)
def test_each_epochs_minibatches_cover_the_batch_once_in_a_fresh_order_with_or_without_memory(ppo, recurrent):
    """minibatches(), train()'s one call for detail 6: each epoch its minibatches hold every row of the batch once,
    with the features of that row (without memory: the row's observation; with it: the rollout replayed in order),
    and the next epoch shuffles again."""
    torch.manual_seed(0)
    agent = make_agent(ppo, recurrent)
    obs, start, valid = torch.randn(8, 2, 4), agent.initial_state(2), torch.ones(8, 2)
    replayed = (obs, start, valid, valid.numpy()) if ppo is ppo_vector_sameStep else (obs, start, valid)
    args = ppo.Args(num_minibatches=4, sequence_length=2, recurrent=recurrent)
    b_obs = obs.flatten(0, 1)  # every row a transition: the batch in the rollout's order (step, then sub-env)
    with torch.no_grad():
        features, _ = agent.remember(obs, start, valid)
        epochs = [list(ppo.minibatches(agent, b_obs, replayed, args)) for epoch in range(2)]
    orders = []
    for epoch in epochs:
        rows = torch.cat([mb for mb, _ in epoch])
        assert len(epoch) == 4 and sorted(rows.tolist()) == list(range(16))
        for mb, hidden in epoch:
            torch.testing.assert_close(hidden, features[mb], rtol=1e-5, atol=1e-6)
        orders.append(rows.tolist())
    assert orders[0] != orders[1]

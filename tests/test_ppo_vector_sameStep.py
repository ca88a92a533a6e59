"""What only ppo_vector_sameStep.py does; the shared behaviour is tested in test_common.py."""

import glob
import os
import re
import signal
import subprocess
import time

import numpy as np
import pytest
import torch
from conftest import scalars, short_args, start, wait_for

import ppo_vector_sameStep as ppo

GAMMA, LAM = 0.9, 0.8


def same_step_rollout(rng, num_steps=60, num_envs=3):
    """Random rollout data as SAME_STEP gives it: every row real, episode ends anywhere. Within an episode
    the next value is the next row's value; after an episode end it is V(final observation), unrelated."""
    rewards, values, final_values = (rng.normal(size=(num_steps, num_envs)).astype(np.float32) for _ in range(3))
    terminations = (rng.random((num_steps, num_envs)) < 0.1).astype(np.float32)
    truncations = ((rng.random((num_steps, num_envs)) < 0.1) & (terminations == 0)).astype(np.float32)
    dones = np.maximum(terminations, truncations)
    next_values = np.where(dones > 0, final_values, np.concatenate([values[1:], final_values[-1:]]))
    return rewards, values, next_values, terminations, truncations, dones


def test_returns_with_lambda_one_bootstrap_from_the_final_value_only_on_truncation():
    rng = np.random.default_rng(1)
    rewards, values, next_values, terminations, truncations, dones = same_step_rollout(rng)
    returns = ppo.compute_advantages(rewards, values, next_values, terminations, dones, GAMMA, 1.0) + values
    num_steps, num_envs = rewards.shape
    for env in range(num_envs):
        for t in range(num_steps):
            end = next((k for k in range(t, num_steps) if dones[k, env]), num_steps - 1)
            expected = sum(GAMMA ** (k - t) * rewards[k, env] for k in range(t, end + 1))
            if not terminations[end, env]:  # truncated, or cut by the rollout's end: V of the true next observation
                expected += GAMMA ** (end - t + 1) * next_values[end, env]
            assert returns[t, env] == pytest.approx(expected, rel=1e-4, abs=1e-4)


@pytest.mark.parametrize("norm_obs", [False, True])
def test_truncated_episodes_bootstrap_from_the_normalized_final_observation(in_tmp, monkeypatch, norm_obs):
    """The env's observation counts the steps of the episode, 20 steps to a truncation: the final observation
    (20) never comes back from step() under SAME_STEP (that returns the next episode's 0), only in final_obs."""
    normalized_final = []
    normalize_obs = ppo.normalize_obs

    def spy_normalize(obs, obs_rms, args, update, floats=None):
        result = normalize_obs(obs, obs_rms, args, update, floats)
        if (obs == 20).any():
            assert not update, "a final observation must not be counted twice in the statistics"
            normalized_final.extend(result[obs[:, 0] == 20, 0].tolist())
        return result

    critic_inputs = []
    encode = ppo.Agent.encode

    def spy_encode(agent, x):
        critic_inputs.extend(x.reshape(-1).tolist())
        return encode(agent, x)

    monkeypatch.setattr(ppo, "normalize_obs", spy_normalize)
    monkeypatch.setattr(ppo.Agent, "encode", spy_encode)
    ppo.train(short_args(ppo, env_id="test/CountingTruncated-v0", total_timesteps=512, norm_obs=norm_obs))
    assert len(normalized_final) == 2 * (256 // 20)  # every episode end of both sub-envs
    if not norm_obs:
        assert normalized_final == [20.0] * len(normalized_final)
    assert set(np.float32(normalized_final).tolist()) <= set(np.float32(critic_inputs).tolist())


def test_sync_and_async_give_identical_runs(in_tmp):
    runs = []
    for mode in ("sync", "async"):
        path = ppo.train(short_args(ppo, env_id="CartPole-v1", exp_name=mode, vectorization_mode=mode))
        runs.append((scalars(os.path.dirname(path)), torch.load(path, weights_only=True)["model"]))
    (tags_sync, model_sync), (tags_async, model_async) = runs
    for tag in ("losses/policy_loss", "losses/value_loss", "charts/episodic_return"):
        assert tags_sync[tag] == tags_async[tag]
    for name in model_sync:
        assert torch.equal(model_sync[name], model_async[name])


def test_sigterm_to_every_process_ends_the_run_with_a_checkpoint_and_no_traceback(tmp_path):
    """A cluster scheduler may send SIGTERM to the whole process group: the workers die at once."""
    process = start("ppo_vector_sameStep.py", "--total-timesteps", "10000000", "--num-envs", "2", "--num-steps", "256",
                    "--checkpoint-interval", "0", cwd=tmp_path, stderr=subprocess.PIPE, start_new_session=True)
    wait_for(lambda: glob.glob(str(tmp_path / "runs" / "*" / "events.*")), timeout=60)
    time.sleep(2.0)
    os.killpg(process.pid, signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=60)
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    # Caught in a step, the dead workers read as a failed env; caught in the update, as a normal stop.
    if process.returncode == 128 + signal.SIGTERM:
        assert "Resume with: " in stdout
    else:
        assert process.returncode == 1 and re.search(r"error: Pendulum-v1 (raised|lost a worker process, which was "
                                                     r"stopped by SIGTERM)", stderr), stderr
        assert "checkpoint of the last complete iteration" in stderr, stderr
    assert glob.glob(str(tmp_path / "runs" / "*" / "checkpoint.pt"))


def test_discrete_and_box_action_spaces_get_their_own_policy_head(in_tmp, capsys):
    for env_id, discrete in (("CartPole-v1", True), ("Pendulum-v1", False)):
        path = ppo.train(short_args(ppo, env_id=env_id, total_timesteps=512))
        checkpoint = ppo.load_checkpoint(path)
        assert ("actor_logstd" in checkpoint["model"]) is not discrete
        args = ppo.Args(**{**checkpoint["args"], "eval_checkpoint": path, "eval_episodes": 2})
        assert len(ppo.evaluate(args, checkpoint)) == 2
    assert "mean return" in capsys.readouterr().out





def test_the_critic_reads_the_final_observations_of_the_rows_that_ended_an_episode_and_no_others(in_tmp, monkeypatch):
    """Under SAME_STEP a final observation exists only where a step ended an episode: after each rollout the critic
    reads those rows alone (not every row of the rollout, most of them never written)."""
    ended, final_rows = [], []
    remember, compute_advantages = ppo.Agent.remember, ppo.compute_advantages

    def spy_remember(agent, x, state, keep=None):
        if x.shape[:2] != (1, 2) and x.shape[0] == 1:  # one row per final observation, not the 2 sub-envs' next ones
            final_rows.append(x.shape[1])
        return remember(agent, x, state, keep)

    def spy_advantages(rewards, values, next_values, terminations, dones, *rest):
        ended.append(int(dones.sum()))
        return compute_advantages(rewards, values, next_values, terminations, dones, *rest)

    monkeypatch.setattr(ppo.Agent, "remember", spy_remember)
    monkeypatch.setattr(ppo, "compute_advantages", spy_advantages)
    ppo.train(short_args(ppo, env_id="test/ConstantTruncatedBox-v0"))  # 20-step episodes, 2 sub-envs, 256 steps each
    assert final_rows == ended == [24, 26]


def test_memory_with_categorical_actions_takes_the_memory_defaults_and_box_actions_keep_theirs(monkeypatch):
    """As in ppo_discrete.py: --recurrent with Discrete actions takes MEMORY_DEFAULTS (flags given win); Box actions
    keep the script's defaults."""
    monkeypatch.setattr("sys.argv", ["ppo_vector_sameStep.py", "--env-id", "CartPole-v1", "--recurrent", "lstm"])
    args, _ = ppo.parse_args()
    assert (args.norm_reward, args.num_minibatches, args.sequence_length) == (True, 4, 16)
    monkeypatch.setattr("sys.argv", ["ppo_vector_sameStep.py", "--env-id", "CartPole-v1", "--recurrent", "gru",
                                     "--sequence-length", "0"])
    assert ppo.parse_args()[0].sequence_length == 0
    monkeypatch.setattr("sys.argv", ["ppo_vector_sameStep.py", "--env-id", "Pendulum-v1", "--recurrent", "lstm"])
    args, _ = ppo.parse_args()
    assert (args.num_minibatches, args.sequence_length) == (ppo.Args.num_minibatches, 0)

"""What only ppo_continuous.py does; the shared behaviour is tested in test_common.py."""

import glob
import os
import re
import shlex
import shutil
from dataclasses import asdict
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch
import tyro
from conftest import ROOT, readme_own_env, scalars, short_args, start

import ppo_continuous as ppo


def test_log_probability_and_entropy_are_those_of_a_diagonal_normal():
    torch.manual_seed(0)
    spaces = SimpleNamespace(single_observation_space=gym.spaces.Box(-1, 1, (5,)), single_action_space=gym.spaces.Box(-1, 1, (3,)))
    agent = ppo.Agent(spaces, ppo.Args())
    with torch.no_grad():
        agent.actor_logstd.copy_(torch.tensor([[-0.5, 0.0, 0.7]]))
        x = torch.randn(1000, 5)
        action, logprob, entropy = agent.policy(agent.encode(x))
    reference = torch.distributions.Normal(agent.actor(x).detach(), agent.actor_logstd.exp().detach())
    torch.testing.assert_close(logprob, reference.log_prob(action).sum(-1))
    torch.testing.assert_close(entropy, reference.entropy().sum(-1))
    torch.testing.assert_close(action.std(0), agent.actor_logstd.exp()[0].detach(), atol=0.1, rtol=0)


def test_env_gets_clipped_actions_while_the_buffer_keeps_the_sampled_ones(in_tmp, monkeypatch):
    """On an env with bounds [-0.4, 0.4] x [0, 2], std-1 samples often fall outside; the env must never see them."""
    captured = {}
    real_transitions, ppo_loss = ppo.real_transitions, ppo.ppo_loss

    def spy_transitions(valid, **rollout):
        captured.setdefault("rollout", (valid.copy(), rollout["obs"].copy(), rollout["actions"].copy(),
                                        rollout["logprobs"].copy()))
        return real_transitions(valid, **rollout)

    def spy_loss(agent, *rest):
        if "logprob" not in captured:  # first minibatch: the agent is still the one that collected the rollout
            valid, obs, actions, _ = captured["rollout"]
            with torch.no_grad():
                captured["logprob"] = agent.policy(torch.from_numpy(obs), torch.from_numpy(actions))[1].numpy()
        return ppo_loss(agent, *rest)

    monkeypatch.setattr(ppo, "real_transitions", spy_transitions)
    monkeypatch.setattr(ppo, "ppo_loss", spy_loss)
    args = short_args(ppo, env_id="test/ConstantTruncatedBox-v0", num_envs=1, total_timesteps=256, num_steps=256)
    received = []
    make_env = ppo.make_env

    def recording_make_env(*make_args):
        thunk = make_env(*make_args)
        return lambda: received.append(thunk()) or received[-1]

    monkeypatch.setattr(ppo, "make_env", recording_make_env)
    ppo.train(args)

    valid, obs, stored, stored_logprob = captured["rollout"]
    sent = np.array(received[0].unwrapped.received_actions)
    low, high = np.array([-0.4, 0.0]), np.array([0.4, 2.0])
    assert np.all(sent >= low - 1e-6) and np.all(sent <= high + 1e-6)
    real = valid[:, 0] > 0
    np.testing.assert_allclose(sent, np.clip(stored[real, 0], low, high), rtol=1e-6)  # the env got the clipped stored action
    assert np.mean((stored < low) | (stored > high)) > 0.3  # the stored ones are the raw samples
    np.testing.assert_allclose(captured["logprob"], stored_logprob, rtol=1e-5, atol=1e-5)


def test_observation_statistics_are_shared_saved_restored_and_frozen(in_tmp, monkeypatch):
    # Pendulum, 2 sub-envs: one set of statistics, counted once per observation of either sub-env
    path = ppo.train(short_args(ppo))
    checkpoint = torch.load(path, weights_only=True)
    saved = checkpoint["obs_rms"]
    assert saved["count"] == pytest.approx(2 + 1024, abs=1e-3)  # the 2 reset observations, then one per step per env
    assert saved["mean"].shape == (3,)

    resumed = ppo.train(ppo.Args(**{**checkpoint["args"], "total_timesteps": 2048, "resume": path}), checkpoint)
    # one per step per env; the resumed start's reset observations are not counted again (as the run left alone)
    assert torch.load(resumed, weights_only=True)["obs_rms"]["count"] == pytest.approx(saved["count"] + 1024, abs=1e-3)

    used = []
    normalize_obs = ppo.normalize_obs

    def spy(obs, obs_rms, args, update, floats=None):
        assert not update, "evaluation must not change the statistics"
        used.append(obs_rms.mean.copy())
        return normalize_obs(obs, obs_rms, args, update, floats)

    monkeypatch.setattr(ppo, "normalize_obs", spy)
    final = ppo.load_checkpoint(resumed)
    args = ppo.Args(**{**final["args"], "eval_checkpoint": resumed, "eval_episodes": 1})
    ppo.evaluate(args, final)
    assert used and all(np.array_equal(mean, final["obs_rms"]["mean"].numpy()) for mean in used)


def test_running_statistics_match_numpy_over_all_batches():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, size=(n, 4)) for n in (1, 7, 30, 2)]
    rms = ppo.RunningMeanStd(shape=(4,))
    for batch in batches:
        rms.update(batch)
    everything = np.concatenate(batches)
    np.testing.assert_allclose(rms.mean, everything.mean(0), rtol=1e-4)
    np.testing.assert_allclose(rms.var, everything.var(0), rtol=1e-4)


@pytest.mark.parametrize("episode_end", ["terminated", "truncated"])
def test_reward_scaler_restarts_the_discounted_return_at_every_episode_end(episode_end):
    """Sub-env 0's episode ends at step 2 (by termination or truncation: both count); sub-env 1 runs on."""
    gamma = 0.9
    scaler = ppo.RewardScaler(num_envs=2, gamma=gamma, on=True)
    rewards = [np.array([1.0, 1.0]), np.array([2.0, 2.0]), np.array([0.0, 3.0]), np.array([5.0, 4.0])]
    real = [np.array([True, True])] * 2 + [np.array([False, True])] + [np.array([True, True])]  # row 2 of env 0 is an autoreset
    done = [np.array([False, False]), np.array([True, False]), np.array([False, False]), np.array([False, False])]
    scaled = [scaler.scale(r, m, d) for r, m, d in zip(rewards, real, done)]
    # the discounted returns the statistics must have seen: env 0 restarts after its episode end, and skips its autoreset row
    seen = [1.0, 1.0, 1 * gamma + 2, 1 * gamma + 2, (1 * gamma + 2) * gamma + 3, 5.0, ((1 * gamma + 2) * gamma + 3) * gamma + 4]
    assert scaler.return_rms.var == pytest.approx(np.var(seen), rel=1e-3)
    assert scaler.discounted_return[0] == pytest.approx(5.0)
    assert scaled[-1][0] == pytest.approx(5.0 / np.sqrt(np.var(seen) + 1e-8), rel=1e-3)


def test_mujoco_evaluation_records_video_headless(in_tmp, capsys, monkeypatch):
    monkeypatch.delenv("MUJOCO_GL", raising=False)
    monkeypatch.delenv("DISPLAY", raising=False)
    path = ppo.train(ppo.Args(env_id="Hopper-v5", total_timesteps=256, num_envs=1, num_steps=256, num_minibatches=4, update_epochs=1, cuda=False))
    args = ppo.Args(**{**torch.load(path, weights_only=True)["args"], "eval_checkpoint": path, "eval_episodes": 2, "capture_video": True})
    returns = ppo.evaluate(args, ppo.load_checkpoint(path))
    assert len(returns) == 2
    assert glob.glob(str(in_tmp / "videos" / "*-eval" / "*.mp4"))


PENDULUM_STEPS = 40960
# tuned for Pendulum-v1 (benchmarks/results/README.md: PENDULUM), with CleanRL's lambda, initial std and value loss
PENDULUM_SETTINGS = dict(num_envs=4, num_steps=512, gamma=0.9, learning_rate=1e-3, num_minibatches=16, update_epochs=10,
                         gae_lambda=0.95, init_log_std=0.0, clip_vloss=True, vf_coef=0.5)


def test_pendulum_learns(in_tmp):
    # A random policy scores about -1200 to -1400 on Pendulum-v1.
    args = ppo.Args(env_id="Pendulum-v1", total_timesteps=PENDULUM_STEPS, checkpoint_interval=0, cuda=False, **PENDULUM_SETTINGS)
    path = ppo.train(args)
    returns = [value for _, value in scalars(os.path.dirname(path))["charts/episodic_return"]]
    assert np.mean(returns[-20:]) > -900  # seed 1 (this test) reaches -615 here, seed 2 -674



def test_the_readme_own_environment_example_runs_as_written(tmp_path):
    """The README's "Your own environment": its file next to a copy of the script, its command (fewer steps)."""
    section = readme_own_env(tmp_path)
    shutil.copy(os.path.join(ROOT, "ppo_continuous.py"), tmp_path)
    command = re.search(r"^    python (ppo_continuous.py --env-id my_envs:.*)$", section, re.MULTILINE).group(1)
    flags = shlex.split(command.replace("--total-timesteps 50000", "--total-timesteps 2048"))[1:]  # as the shell splits it
    process = start(str(tmp_path / "ppo_continuous.py"), *flags, cwd=tmp_path)
    output = process.communicate(timeout=300)[0]
    assert process.returncode == 0, output
    (run,) = glob.glob(str(tmp_path / "runs" / "my_envs-PointReach-v0__ppo_continuous__1__*"))
    assert ppo.load_checkpoint(os.path.join(run, "checkpoint.pt"))["args"]["env_kwargs"] == '{"size": 2.0}'


def test_the_box_scripts_share_their_defaults_and_name_cleanrls_settings_in_help_and_readme():
    """One set of Box defaults (chosen on the MuJoCo suite) in both Box scripts; CleanRL's settings one paste away."""
    import ppo_vector_sameStep

    own = {"exp_name", "env_id", "env_kwargs", "vectorization_mode", "env_timeout", "checkpoint_interval", "env_backend",
           "env_threads", "action_mask"}  # action_mask: categorical actions, which ppo_continuous.py does not take
    ours, vector = asdict(ppo.Args()), asdict(ppo_vector_sameStep.Args())
    assert {k: v for k, v in ours.items() if k not in own} == {k: v for k, v in vector.items() if k not in own}
    assert not ours["cuda"]  # the CPU is the faster device for these networks: a GPU is opt-in
    readme = open(os.path.join(ROOT, "README.md")).read()
    cleanrl = re.search(r'^    CLEANRL="(.*)"$', readme, re.MULTILINE).group(1)
    assert " ".join(ppo.Args.__doc__.split()).endswith(cleanrl)  # --help ends with the same flags
    cleanrl_args = {"num_envs": 1, "num_steps": 2048, "num_minibatches": 32, "init_log_std": 0.0, "clip_vloss": True,
                    "gae_lambda": 0.95, "vf_coef": 0.5}
    assert asdict(tyro.cli(ppo.Args, args=cleanrl.split())) == {**ours, **cleanrl_args}


def test_a_checkpoint_that_names_the_mean_head_actor_mean_resumes_and_evaluates(in_tmp, capsys):
    """Checkpoints written before the Box scripts shared the name `actor` call the mean head `actor_mean`."""
    path = ppo.train(short_args(ppo, total_timesteps=512))
    saved = torch.load(path, weights_only=True)
    saved["model"] = {re.sub(r"^actor\.", "actor_mean.", key): value for key, value in saved["model"].items()}
    torch.save(saved, path)
    checkpoint = ppo.load_checkpoint(path)
    args = ppo.Args(**{**checkpoint["args"], "eval_checkpoint": path, "eval_episodes": 1})
    assert len(ppo.evaluate(args, checkpoint)) == 1
    resumed = ppo.train(ppo.Args(**{**checkpoint["args"], "total_timesteps": 1024, "resume": path}), checkpoint)
    assert torch.load(resumed, weights_only=True)["global_step"] == 1024

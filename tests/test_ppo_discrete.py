"""What only ppo_discrete.py does; the shared behaviour is tested in test_common.py."""

import glob
import os
import re
import shutil
import sys
from dataclasses import asdict
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch
import tyro
from conftest import ROOT, scalars, short_args, start

import ppo_discrete as ppo


def test_sampled_actions_follow_the_policy_and_report_their_log_probability():
    torch.manual_seed(0)
    spaces = SimpleNamespace(single_observation_space=gym.spaces.Box(-1, 1, (3,)), single_action_space=gym.spaces.Discrete(4))
    agent = ppo.Agent(spaces, ppo.Args())
    with torch.no_grad():
        agent.actor[-1].bias.copy_(torch.tensor([0.0, 1.0, -1.0, 2.0]))  # the output weights are near 0: logits ~ bias
        action, logprob, entropy = agent.policy(torch.zeros(50000, 3))
    probs = torch.softmax(torch.tensor([0.0, 1.0, -1.0, 2.0]), dim=0)
    assert action.shape == (50000, 1)  # one part: the index into Discrete(4)
    action = action[:, 0]
    frequencies = torch.bincount(action, minlength=4).float() / len(action)
    torch.testing.assert_close(frequencies, probs, atol=0.01, rtol=0)
    torch.testing.assert_close(logprob, probs.log()[action], atol=1e-3, rtol=0)
    torch.testing.assert_close(entropy[0], -(probs * probs.log()).sum(), atol=1e-3, rtol=0)


def test_discrete_observations_are_one_hot(in_tmp):
    envs = ppo.make_envs(ppo.Args(env_id="FrozenLake-v1"), 2, None, seed=1)
    obs, _ = envs.reset(seed=0)
    assert obs.shape == (2, 16)
    np.testing.assert_array_equal(obs.sum(axis=1), [1, 1])
    assert obs[0, 0] == 1  # FrozenLake starts in state 0


def test_evaluation_loads_and_reports(in_tmp, capsys):
    path = ppo.train(short_args(ppo))
    capsys.readouterr()
    args = ppo.Args(**{**torch.load(path, weights_only=True)["args"], "eval_checkpoint": path, "eval_episodes": 3, "capture_video": True})
    returns = ppo.evaluate(args, ppo.load_checkpoint(path))
    assert len(returns) == 3 and all(r > 0 for r in returns)
    assert "mean return" in capsys.readouterr().out
    assert glob.glob(str(in_tmp / "videos" / "*-eval" / "*.mp4"))


def test_cartpole_learns_within_50k_steps(in_tmp):
    path = ppo.train(ppo.Args(total_timesteps=50000, checkpoint_interval=0, cuda=False))
    returns = [value for _, value in scalars(os.path.dirname(path))["charts/episodic_return"]]
    best_mean_of_20 = max(np.mean(returns[i : i + 20]) for i in range(len(returns) - 19))
    assert best_mean_of_20 >= 200


def test_a_copied_script_trains_resumes_and_evaluates_under_its_own_name(tmp_path):
    shutil.copy(os.path.join(ROOT, "ppo_discrete.py"), tmp_path / "my_experiment.py")
    copy = str(tmp_path / "my_experiment.py")
    assert start(copy, "--total-timesteps", "512", "--num-envs", "4", cwd=tmp_path).wait(timeout=120) == 0
    (path,) = glob.glob(str(tmp_path / "runs" / "CartPole-v1__my_experiment__1__*" / "checkpoint.pt"))
    assert start(copy, "--resume", path, "--total-timesteps", "1024", cwd=tmp_path).wait(timeout=120) == 0
    evaluation = start(copy, "--eval-checkpoint", path, "--eval-episodes", "2", cwd=tmp_path).communicate(timeout=120)[0]
    assert "CartPole-v1: mean return" in evaluation, evaluation
    checkpoint = torch.load(path, weights_only=True)
    assert checkpoint["script"] == "my_experiment.py" and checkpoint["global_step"] == 1024
    assert checkpoint["kind"] == "ppo_discrete.py"  # the copy keeps its original's kind: the original resumes it too
    assert ppo.load_checkpoint(path)["global_step"] == 1024


def test_help_ends_with_the_flags_that_give_cleanrls_settings():
    """The defaults were tuned (LunarLander-v3 included); CleanRL's ppo.py settings stay one paste away in --help."""
    flags = re.search(r"(--learning-rate .*)$", " ".join(ppo.Args.__doc__.split())).group(1)
    cleanrl = {"learning_rate": 2.5e-4, "num_envs": 4, "num_steps": 128, "gamma": 0.99, "gae_lambda": 0.95,
               "num_minibatches": 4, "update_epochs": 4, "clip_coef": 0.2, "clip_vloss": True, "ent_coef": 0.01,
               "vf_coef": 0.5, "max_grad_norm": 0.5, "anneal_lr": True, "norm_adv": True, "hidden_size": 64}
    assert asdict(tyro.cli(ppo.Args, args=flags.split())) == {**asdict(ppo.Args()), **cleanrl}
    assert {key: value for key, value in asdict(ppo.Args()).items() if key in cleanrl} != cleanrl


def test_memory_on_vectors_takes_reward_scaling_four_minibatches_and_short_sequences_unless_flags_say_otherwise(
        monkeypatch):
    monkeypatch.setattr("sys.argv", ["ppo_discrete.py", "--recurrent", "lstm"])
    args, _ = ppo.parse_args()
    assert (args.norm_reward, args.num_minibatches, args.sequence_length) == (True, 4, 16)
    assert ppo.MEMORY_DEFAULTS == {"norm_reward": True, "num_minibatches": 4, "sequence_length": 16}
    monkeypatch.setattr("sys.argv", ["ppo_discrete.py", "--recurrent", "gru", "--no-norm-reward", "--num-minibatches", "8",
                                     "--sequence-length", "0"])
    args, _ = ppo.parse_args()
    assert (args.recurrent, args.norm_reward, args.num_minibatches, args.sequence_length) == ("gru", False, 8, 0)
    monkeypatch.setattr("sys.argv", ["ppo_discrete.py"])
    assert ppo.parse_args()[0] == ppo.Args()  # without memory: the defaults as they were


def test_reward_scaling_divides_the_rollout_rewards_and_its_statistics_resume(in_tmp, monkeypatch):
    """--norm-reward: CartPole's rewards of 1 reach GAE divided by the running std of the discounted return (an
    autoreset row's 0 stays 0); the statistics are in the checkpoint, and a resumed run goes on from them."""
    seen = []
    compute_advantages = ppo.compute_advantages
    monkeypatch.setattr(ppo, "compute_advantages", lambda rewards, *rest: seen.append(rewards.copy()) or
                        compute_advantages(rewards, *rest))
    path = ppo.train(short_args(ppo, norm_reward=True))
    statistics = ppo.load_checkpoint(path)["return_rms"]
    std = (statistics["var"].item() + 1e-8) ** 0.5
    last_row = seen[-1][-1]  # scaled by the statistics as the run ends
    assert std > 2 and np.allclose(last_row[last_row != 0], 1 / std) and (seen[0] < 1).any()
    monkeypatch.setattr("sys.argv", ["ppo_discrete.py", "--resume", path, "--total-timesteps", "1536"])
    ppo.main()
    (path,) = glob.glob("runs/*/checkpoint.pt")
    resumed = ppo.load_checkpoint(path)["return_rms"]
    assert statistics["count"] + 400 < resumed["count"] <= statistics["count"] + 512  # one more iteration's real rows


def test_observation_normalization_is_off_unless_asked_then_shared_saved_resumed_and_frozen(in_tmp, monkeypatch):
    """--norm-obs (off by default here, on in the Box scripts): the rollout sees CartPole's observations as the env gives
    them; asked, standardized by one set of statistics over all sub-envs, saved, resumed, and frozen in evaluation."""
    seen = []
    real_transitions = ppo.real_transitions
    monkeypatch.setattr(ppo, "real_transitions", lambda valid, **rollout: seen.append(rollout["obs"].copy()) or
                        real_transitions(valid, **rollout))
    plain = ppo.load_checkpoint(ppo.train(short_args(ppo)))["obs_rms"]
    assert plain["count"] < 1 and np.abs(np.concatenate(seen)[:, :, 0]).max() <= 2.4  # the cart's position, as it is
    seen.clear()
    path = ppo.train(short_args(ppo, norm_obs=True))
    saved = ppo.load_checkpoint(path)["obs_rms"]
    assert saved["count"] == pytest.approx(4 + 1024, abs=1e-3)  # the 4 reset observations, then one per step per env
    last = seen[-1].reshape(-1, 4)  # the second rollout: near mean 0 and std 1 per entry, clipped to [-10, 10]
    assert np.abs(last.mean(0)).max() < 0.5 and np.all(np.abs(last.std(0) - 1) < 0.5) and np.abs(last).max() <= 10
    monkeypatch.setattr("sys.argv", ["ppo_discrete.py", "--resume", path, "--total-timesteps", "1536"])
    ppo.main()  # into the same run folder
    final = ppo.load_checkpoint(path)
    assert final["global_step"] == 1536  # went on from the saved statistics:
    assert final["obs_rms"]["count"] == pytest.approx(saved["count"] + 512, abs=1e-3)  # its fresh start not counted
    used, normalize_obs = [], ppo.normalize_obs

    def frozen(obs, obs_rms, args, update, floats=None):
        assert not update, "evaluation must not change the statistics"
        used.append(obs_rms.mean.copy())
        return normalize_obs(obs, obs_rms, args, update, floats)

    monkeypatch.setattr(ppo, "normalize_obs", frozen)
    ppo.evaluate(ppo.Args(**{**final["args"], "eval_checkpoint": path, "eval_episodes": 1}), final)
    assert used and all(np.array_equal(mean, final["obs_rms"]["mean"].numpy()) for mean in used)


def test_grid_defaults_follow_the_observation_whatever_the_env_id(monkeypatch, capsys):
    """GRID_DEFAULTS go by what the env gives, not its id: an image under 36 x 36 (MiniGrid's 7 x 7 view), alone or in
    a Dict, takes CleanRL's entropy bonus; floats or an image too small for a CNN do not; a memory takes MEMORY_DEFAULTS
    instead."""
    view = gym.spaces.Box(0, 10, (7, 7, 3), np.uint8)
    as_it_comes = gym.spaces.Dict({"image": view, "direction": gym.spaces.Discrete(4)})
    monkeypatch.setattr(sys, "argv", ["ppo_discrete.py", "--env-id", "my_grids:Anything-v0"])
    for space in (view, as_it_comes):
        assert ppo.env_defaults(tyro.cli(ppo.Args), space) == ppo.Args(env_id="my_grids:Anything-v0", ent_coef=0.01)
        assert capsys.readouterr().out == "defaults: GRID_DEFAULTS sets ent_coef=0.01\n"
    for space in (gym.spaces.Box(-1, 1, (7, 7, 3)), gym.spaces.Box(0, 10, (6, 6, 3), np.uint8)):  # floats; too small
        args = tyro.cli(ppo.Args)
        assert ppo.env_defaults(args, space) is args and capsys.readouterr().out == ""
    monkeypatch.setattr(sys, "argv", ["ppo_discrete.py", "--env-id", "my_grids:Anything-v0", "--recurrent", "gru"])
    assert ppo.env_defaults(tyro.cli(ppo.Args), as_it_comes).ent_coef == ppo.Args.ent_coef
    assert capsys.readouterr().out.startswith("defaults: MEMORY_DEFAULTS sets")


def test_env_defaults_match_the_env_id_whatever_module_registers_it(monkeypatch, capsys):
    """ENV_DEFAULTS is keyed by gymnasium's id, over GRID_DEFAULTS: MiniGrid as typed
    (minigrid:MiniGrid-RedBlueDoors-6x6-v0) and an own module's import of it take the entry; other ids the grid's."""
    view = gym.spaces.Box(0, 10, (7, 7, 3), np.uint8)
    for env_id in ("minigrid:MiniGrid-RedBlueDoors-6x6-v0", "my_grids:MiniGrid-RedBlueDoors-6x6-v0"):
        monkeypatch.setattr(sys, "argv", ["ppo_discrete.py", "--env-id", env_id])
        assert ppo.env_defaults(tyro.cli(ppo.Args), view) == ppo.Args(env_id=env_id, norm_adv=False, ent_coef=2.7e-5)
        both = f"GRID_DEFAULTS + ENV_DEFAULTS['{env_id.split(':')[1]}']"
        assert capsys.readouterr().out == f"defaults: {both} sets ent_coef=2.7e-05, norm_adv=False\n"
    for env_id in ("minigrid:MiniGrid-DoorKey-5x5-v0", "minigrid:MiniGrid-RedBlueDoors-6x6-v1"):
        monkeypatch.setattr(sys, "argv", ["ppo_discrete.py", "--env-id", env_id])
        assert ppo.env_defaults(tyro.cli(ppo.Args), view) == ppo.Args(env_id=env_id, ent_coef=0.01)
        assert capsys.readouterr().out == "defaults: GRID_DEFAULTS sets ent_coef=0.01\n"


def test_gymnasiums_envs_of_env_defaults_take_their_entry_say_so_and_yield_to_flags(in_tmp, monkeypatch, capsys):
    """The entries measured on gymnasium's envs (issue 89) apply to their ids only, the first line names them, and a flag
    given wins; CartPole-v1 keeps the script's defaults without a word; a resumed run keeps its checkpoint's."""
    entries = {"LunarLander-v3": {"total_timesteps": 1_000_000},
               "MountainCar-v0": {"norm_obs": True, "total_timesteps": 2_000_000}, "FrozenLake8x8-v1": {"gae_lambda": 0.9},
               "CliffWalkingSlippery-v1": {"gae_lambda": 0.5}}
    for env_id, entry in entries.items():
        monkeypatch.setattr(sys, "argv", ["ppo_discrete.py", "--env-id", env_id])
        assert ppo.parse_args()[0] == ppo.Args(env_id=env_id, **entry)
        said = ", ".join(f"{name}={value}" for name, value in entry.items())
        assert capsys.readouterr().out == f"defaults: ENV_DEFAULTS['{env_id}'] sets {said}\n"
    monkeypatch.setattr(sys, "argv", ["ppo_discrete.py", "--env-id", "MountainCar-v0", "--total-timesteps", "2048"])
    assert ppo.parse_args()[0] == ppo.Args(env_id="MountainCar-v0", norm_obs=True, total_timesteps=2048)
    assert capsys.readouterr().out == "defaults: ENV_DEFAULTS['MountainCar-v0'] sets norm_obs=True\n"
    monkeypatch.setattr(sys, "argv", ["ppo_discrete.py", "--env-id", "CartPole-v1"])
    assert ppo.parse_args()[0] == ppo.Args(env_id="CartPole-v1") and capsys.readouterr().out == ""
    path = ppo.train(short_args(ppo, env_id="MountainCar-v0", total_timesteps=512))  # as trained before the table
    monkeypatch.setattr(sys, "argv", ["ppo_discrete.py", "--resume", path, "--total-timesteps", "1024"])
    args = ppo.parse_args()[0]
    assert not args.norm_obs and args.total_timesteps == 1024 and "defaults:" not in capsys.readouterr().out


def test_a_memory_on_an_env_of_env_defaults_takes_both_tables_the_env_entry_over_the_memory(monkeypatch, capsys):
    """--recurrent on an env id of ENV_DEFAULTS: MEMORY_DEFAULTS and then the env's entry, said in the first line;
    a flag given still wins over both."""
    view = gym.spaces.Box(0, 10, (7, 7, 3), np.uint8)
    command = ["ppo_discrete.py", "--env-id", "minigrid:MiniGrid-RedBlueDoors-6x6-v0", "--recurrent", "lstm"]
    monkeypatch.setattr(sys, "argv", command)
    args = ppo.env_defaults(tyro.cli(ppo.Args), view)
    assert args == ppo.Args(env_id=command[2], recurrent="lstm", **ppo.MEMORY_DEFAULTS, norm_adv=False)  # no grid rule
    both = "defaults: MEMORY_DEFAULTS + ENV_DEFAULTS['MiniGrid-RedBlueDoors-6x6-v0'] sets norm_reward=True, "
    assert capsys.readouterr().out == both + "num_minibatches=4, sequence_length=16, norm_adv=False, ent_coef=2.7e-05\n"
    monkeypatch.setattr(sys, "argv", [*command, "--norm-adv", "--num-minibatches", "2"])
    args = ppo.env_defaults(tyro.cli(ppo.Args), view)
    assert args.norm_adv and args.num_minibatches == 2 and args.norm_reward and args.sequence_length == 16

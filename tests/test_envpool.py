"""The EnvPool engine (--env-backend envpool) of ppo_discrete.py and ppo_continuous.py. The tests that step EnvPool's
envs skip themselves where it is not installed (.ci/run installs it: pip install envpool==1.2.5)."""

import importlib.util
import json
import sys

import numpy as np
import pytest
import torch
from conftest import short_args

import ppo_continuous
import ppo_discrete

needs_envpool = pytest.mark.skipif(importlib.util.find_spec("envpool") is None, reason="needs envpool==1.2.5")


@pytest.fixture(params=[ppo_discrete, ppo_continuous], ids=lambda module: module.__name__)
def ppo(request):
    return request.param


def spy_rollouts(ppo, monkeypatch):
    """Every rollout's (valid, rewards, terminations, dones), as train() hands them to GAE and the update,
    and the sub-envs that train() made."""
    seen = {"rollouts": [], "envs": []}
    compute_advantages, make_envs = ppo.compute_advantages, ppo.make_envs

    def spy_advantages(rewards, values, next_values, terminations, dones, *rest):
        seen["rollouts"].append((rewards.copy(), terminations.copy(), dones.copy()))
        return compute_advantages(rewards, values, next_values, terminations, dones, *rest)

    def spy_make_envs(*args, **kwargs):
        seen["envs"].append(make_envs(*args, **kwargs))
        return seen["envs"][-1]

    monkeypatch.setattr(ppo, "compute_advantages", spy_advantages)
    monkeypatch.setattr(ppo, "make_envs", spy_make_envs)
    return seen


@needs_envpool
def test_envpool_trains_resumes_and_evaluates_and_the_run_keeps_its_engine(ppo, in_tmp, monkeypatch):
    seen = spy_rollouts(ppo, monkeypatch)
    path = ppo.train(short_args(ppo, total_timesteps=512, env_backend="envpool", env_threads=2))
    assert "EnvPool" in type(seen["envs"][0].unwrapped).__name__  # EnvPool's envs, not gymnasium's
    saved = torch.load(path, weights_only=True)["args"]
    assert (saved["env_backend"], saved["env_threads"]) == ("envpool", 2)
    monkeypatch.setattr(sys, "argv", ["ppo", "--resume", path, "--total-timesteps", "1024"])
    args, checkpoint = ppo.parse_args()  # the engine comes from the checkpoint
    assert args.env_backend == "envpool"
    ppo.train(args, checkpoint)
    assert "EnvPool" in type(seen["envs"][1].unwrapped).__name__
    checkpoint = ppo.load_checkpoint(path)
    assert checkpoint["global_step"] == 1024
    returns = ppo.evaluate(ppo.Args(**{**checkpoint["args"], "eval_checkpoint": path, "eval_episodes": 1}), checkpoint)
    assert len(returns) == 1 and "EnvPool" in type(seen["envs"][2].unwrapped).__name__


@needs_envpool
@pytest.mark.parametrize("ppo, env_id", [(ppo_discrete, "CartPole-v1"), (ppo_continuous, "Hopper-v5")],
                         ids=["ppo_discrete", "ppo_continuous"])
def test_envpool_autoreset_rows_are_those_the_scripts_drop(ppo, env_id, in_tmp, monkeypatch):
    """EnvPool autoresets NEXT_STEP, as gymnasium: the step after an episode end is a reset with reward 0, the row
    that the scripts mark invalid (valid = 1 - the previous step's done) and drop from the update."""
    seen = spy_rollouts(ppo, monkeypatch)
    extra = {} if ppo is ppo_discrete else {"norm_reward": False}  # raw rewards: an autoreset row's is exactly 0
    real_transitions, rows = ppo.real_transitions, []
    monkeypatch.setattr(ppo, "real_transitions", lambda valid, *rollout: rows.append(valid.copy()) or
                        real_transitions(valid, *rollout))
    ppo.train(short_args(ppo, env_id=env_id, total_timesteps=1024, env_backend="envpool", **extra))
    for (rewards, _, dones), valid in zip(seen["rollouts"], rows):
        after_an_end = np.zeros_like(dones, dtype=bool)
        after_an_end[1:] = dones[:-1] > 0
        np.testing.assert_array_equal(valid[1:], 1.0 - dones[:-1])
        assert np.all(rewards[after_an_end] == 0.0)
    assert sum(int(dones.sum()) for _, _, dones in seen["rollouts"]) >= 4  # episodes did end, so rows were dropped


@needs_envpool
def test_envpool_time_limit_is_a_truncation_so_gae_bootstraps_it(in_tmp, monkeypatch):
    """Pendulum-v1 never terminates; its episodes end at the 200-step time limit: done, but not terminated."""
    seen = spy_rollouts(ppo_continuous, monkeypatch)
    ppo_continuous.train(short_args(ppo_continuous, total_timesteps=1024, env_backend="envpool"))
    dones = np.concatenate([d for _, _, d in seen["rollouts"]])
    terminations = np.concatenate([t for _, t, _ in seen["rollouts"]])
    assert dones.sum() == 2 * 2  # 2 sub-envs x 512 steps: each ends an episode at its 200th and 401st step
    assert terminations.sum() == 0


@needs_envpool
def test_envpool_same_seed_same_run_with_two_threads(ppo, in_tmp):
    models = [torch.load(ppo.train(short_args(ppo, env_backend="envpool", env_threads=2)), weights_only=True)["model"]
              for _ in range(2)]
    assert all(torch.equal(models[0][key], models[1][key]) for key in models[0])


def test_envpool_not_installed_gets_the_command_to_install_it(ppo, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "envpool" else find_spec(name, *a))
    with pytest.raises(SystemExit, match=r"^error: --env-backend envpool needs EnvPool: pip install envpool==1\.2\.5$"):
        ppo.check_env(short_args(ppo, env_backend="envpool"), {})


@needs_envpool
@pytest.mark.parametrize("flags, refused", [({"env_id": "my_envs:PointReach-v0"}, "--env-id my_envs:PointReach-v0"),
                                            ({"env_kwargs": '{"max_episode_steps": 100}'}, "--env-kwargs"),
                                            ({"capture_video": True}, "--capture-video")])
def test_envpool_refuses_what_it_cannot_do_naming_the_flag(ppo, flags, refused):
    args = short_args(ppo, env_backend="envpool", **flags)
    with pytest.raises(SystemExit, match=f"^error: EnvPool cannot take {refused}: drop it, or use --env-backend gymnasium$"):
        ppo.check_env(args, json.loads(args.env_kwargs))

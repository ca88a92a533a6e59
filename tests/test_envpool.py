"""The EnvPool engine (--env-backend envpool) of ppo_discrete.py and ppo_continuous.py. The tests that step EnvPool's
envs skip themselves where it is not installed (.ci/run installs it: pip install envpool==1.2.5)."""

import importlib.util
import json
import re
import sys

import numpy as np
import pytest
import torch
from conftest import short_args

import ppo_continuous
import ppo_discrete
import ppo_vector_sameStep

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
def test_envpool_dmc_tasks_take_the_family_defaults_flags_win_and_other_envpool_ids_keep_the_scripts(monkeypatch,
                                                                                                    capsys):
    """ENV_DEFAULTS['dm_control'] gives every DeepMind Control Suite task on EnvPool --init-log-std -0.5 (said in the
    run's first line, a flag given wins); EnvPool's ids of gymnasium's envs take gymnasium's entries (Hopper-v5's,
    measured on EnvPool too: results, "Edges a review found (issue 88)"); its other ids keep the defaults."""
    engine = ["--env-backend", "envpool"]
    for task in ("CheetahRun-v1", "FingerSpin-v1"):
        monkeypatch.setattr(sys, "argv", ["ppo_continuous.py", "--env-id", task, *engine])
        assert ppo_continuous.parse_args()[0] == ppo_continuous.Args(env_id=task, env_backend="envpool",
                                                                     init_log_std=-0.5)
        assert "defaults: ENV_DEFAULTS['dm_control'] sets init_log_std=-0.5" in capsys.readouterr().out
    flag = ["--init-log-std", "-1"]
    monkeypatch.setattr(sys, "argv", ["ppo_continuous.py", "--env-id", "CheetahRun-v1", *engine, *flag])
    assert ppo_continuous.parse_args()[0].init_log_std == -1.0
    assert "defaults: ENV_DEFAULTS['dm_control'] overridden by the flags given" in capsys.readouterr().out
    monkeypatch.setattr(sys, "argv", ["ppo_continuous.py", "--env-id", "Hopper-v5", *engine])
    assert ppo_continuous.parse_args()[0].init_log_std == ppo_continuous.ENV_DEFAULTS["Hopper-v5"]["init_log_std"]
    assert "defaults: ENV_DEFAULTS['Hopper-v5'] sets init_log_std=-0.5" in capsys.readouterr().out
    for env_id in ("HalfCheetah-v4", "Pendulum-v1"):
        monkeypatch.setattr(sys, "argv", ["ppo_continuous.py", "--env-id", env_id, *engine])
        assert ppo_continuous.parse_args()[0] == ppo_continuous.Args(env_id=env_id, env_backend="envpool")
        assert "defaults:" not in capsys.readouterr().out


@needs_envpool
def test_grids_take_the_grid_defaults_red_blue_doors_its_entry_flags_win_and_a_resume_keeps_its_own(
        in_tmp, monkeypatch, capsys):
    """MiniGrid's grids take GRID_DEFAULTS, RedBlueDoors-6x6 its ENV_DEFAULTS entry over them (said in the run's first
    line; a flag given wins); a checkpoint resumes with the settings it trained with. (EnvPool's ports of MiniGrid:
    the tests' machines have EnvPool, not minigrid.)"""
    engine = ["--env-backend", "envpool"]
    monkeypatch.setattr(sys, "argv", ["ppo_discrete.py", "--env-id", "MiniGrid-RedBlueDoors-6x6-v0", *engine])
    assert ppo_discrete.parse_args()[0] == ppo_discrete.Args(env_id="MiniGrid-RedBlueDoors-6x6-v0",
                                                             env_backend="envpool", norm_adv=False, ent_coef=2.7e-5)
    both = "GRID_DEFAULTS + ENV_DEFAULTS['MiniGrid-RedBlueDoors-6x6-v0']"
    assert f"defaults: {both} sets ent_coef=2.7e-05, norm_adv=False" in capsys.readouterr().out
    monkeypatch.setattr(sys, "argv", ["ppo_discrete.py", "--env-id", "MiniGrid-RedBlueDoors-6x6-v0", *engine,
                                      "--norm-adv", "--ent-coef", "0.001"])
    assert ppo_discrete.parse_args()[0].norm_adv
    assert f"defaults: {both} overridden by the flags given" in capsys.readouterr().out
    for env_id in ("MiniGrid-DoorKey-5x5-v0", "MiniGrid-RedBlueDoors-8x8-v0"):
        monkeypatch.setattr(sys, "argv", ["ppo_discrete.py", "--env-id", env_id, *engine])
        assert ppo_discrete.parse_args()[0] == ppo_discrete.Args(env_id=env_id, env_backend="envpool", ent_coef=0.01)
        assert "defaults: GRID_DEFAULTS sets ent_coef=0.01" in capsys.readouterr().out
    path = ppo_discrete.train(short_args(ppo_discrete, env_id="MiniGrid-DoorKey-5x5-v0", env_backend="envpool",
                                         total_timesteps=512))  # trained as before the tables
    monkeypatch.setattr(sys, "argv", ["ppo_discrete.py", "--resume", path, "--total-timesteps", "1024"])
    args, _ = ppo_discrete.parse_args()
    assert args.ent_coef == ppo_discrete.Args.ent_coef and "defaults:" not in capsys.readouterr().out


@needs_envpool
@pytest.mark.parametrize("ppo, env_id", [(ppo_discrete, "CartPole-v1"), (ppo_continuous, "Hopper-v5")],
                         ids=["ppo_discrete", "ppo_continuous"])
def test_envpool_autoreset_rows_are_those_the_scripts_drop(ppo, env_id, in_tmp, monkeypatch):
    """EnvPool autoresets NEXT_STEP, as gymnasium: the step after an episode end is a reset with reward 0, the row
    that the scripts mark invalid (valid = 1 - the previous step's done) and drop from the update."""
    seen = spy_rollouts(ppo, monkeypatch)
    extra = {} if ppo is ppo_discrete else {"norm_reward": False}  # raw rewards: an autoreset row's is exactly 0
    real_transitions, rows = ppo.real_transitions, []
    monkeypatch.setattr(ppo, "real_transitions", lambda valid, **rollout: rows.append(valid.copy()) or
                        real_transitions(valid, **rollout))
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


@needs_envpool
@pytest.mark.parametrize("ppo, env_id, keys", [(ppo_continuous, "CheetahRun-v1", ("position", "velocity")),
                                               (ppo_discrete, "Game2048-v1", ("board", "action_mask"))],
                         ids=["ppo_continuous", "ppo_discrete"])
def test_envpool_dict_observations_are_one_vector_in_key_order_through_training_resume_and_evaluation(
        ppo, env_id, keys, in_tmp, monkeypatch):
    """Ids that only EnvPool has train from the engine's spaces: its Dict observations (DMC's position and velocity;
    Jumanji's board and action mask, not in the names' order) become one vector, entry by entry in the space's order."""
    import envpool

    args = short_args(ppo, env_id=env_id, env_backend="envpool", env_threads=1)
    envs = ppo.make_envs(args, 2, None, 3)
    raw = envpool.make_gymnasium(env_id, num_envs=2, seed=3, num_threads=1)
    assert tuple(raw.single_observation_space.keys()) == keys
    actions = np.stack([envs.single_action_space.sample() for _ in range(2)])
    for observations, raw_observations in [(envs.reset()[0], raw.reset()[0]), (envs.step(actions)[0], raw.step(actions)[0])]:
        np.testing.assert_array_equal(observations, np.concatenate([raw_observations[key].reshape(2, -1) for key in keys], 1))
    envs.close()
    path = ppo.train(args)
    monkeypatch.setattr(sys, "argv", ["ppo", "--resume", path, "--total-timesteps", "2048"])
    ppo.train(*ppo.parse_args())
    checkpoint = ppo.load_checkpoint(path)
    assert checkpoint["global_step"] == 2048
    returns = ppo.evaluate(ppo.Args(**{**checkpoint["args"], "eval_checkpoint": path, "eval_episodes": 2,
                                       "eval_max_steps": 50}), checkpoint)
    assert len(returns) == 2


@needs_envpool
def test_envpool_frozenlake_trains_on_one_hot_observations(in_tmp):
    """EnvPool's FrozenLake-v1 gives the state as an integer (a Discrete space): the scripts see it one-hot."""
    import envpool

    args = short_args(ppo_discrete, env_id="FrozenLake-v1", env_backend="envpool", env_threads=1)
    envs = ppo_discrete.make_envs(args, 4, None, 5)
    raw = envpool.make_gymnasium("FrozenLake-v1", num_envs=4, seed=5, num_threads=1)
    np.testing.assert_array_equal(envs.reset()[0], np.eye(16)[raw.reset()[0]])
    for _ in range(20):
        actions = np.random.default_rng(0).integers(0, 4, 4)
        np.testing.assert_array_equal(envs.step(actions)[0], np.eye(16)[raw.step(actions)[0]])
    envs.close()
    assert ppo_discrete.load_checkpoint(ppo_discrete.train(args))["global_step"] == 1024


@needs_envpool
@pytest.mark.parametrize("ppo, env_id, message", [
    (ppo_discrete, "TicTacToe-v1", r"TicTacToe-v1 is a game of several players; ppo_discrete.py trains one agent"),
    (ppo_discrete, "CheetahRun-v1", r"CheetahRun-v1 has a Box action space; ppo_discrete.py takes Discrete, MultiDiscrete "
                                   r"and MultiBinary \(use ppo_continuous.py\)"),
    (ppo_continuous, "BigfishEasy-v0", r"(cannot make env 'BigfishEasy-v0': ImportError: EnvPool Procgen requires .*|"
                                       r"BigfishEasy-v0 has a Discrete action space; .*)"),  # with or without Qt 5
])
def test_envpool_ids_the_script_cannot_train_get_one_line(ppo, env_id, message):
    with pytest.raises(SystemExit) as refusal:
        ppo.check_env(short_args(ppo, env_id=env_id, env_backend="envpool"), {})
    assert re.match(f"error: {message}", str(refusal.value)) and "\n" not in str(refusal.value), refusal.value


@needs_envpool
@pytest.mark.parametrize("ppo", [ppo_discrete, ppo_continuous, ppo_vector_sameStep], ids=lambda module: module.__name__)
def test_an_id_only_envpool_has_gets_one_line_naming_the_engine(ppo):
    with pytest.raises(SystemExit, match=r"^error: cannot make env 'CheetahRun-v1': NameNotFound: .*; it is (one of "
                                         r"EnvPool's envs: add --env-backend envpool|EnvPool's: ppo_continuous.py and "
                                         r"ppo_discrete.py train it with --env-backend envpool)$"):
        ppo.check_env(short_args(ppo, env_id="CheetahRun-v1"), {})

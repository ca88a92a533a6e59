"""Edges a review found (issue 88): an Atari id typed with its module, one key rule for the defaults tables, masks
that are ignored are not checked, an env that renders for its observations, the memory's one-row step."""

import importlib.util
import os
import subprocess
import sys

import gymnasium as gym
import pytest
import torch
from conftest import ROOT, run_main

import ppo_continuous
import ppo_discrete
import ppo_vector_sameStep

ALL = [ppo_discrete, ppo_continuous, ppo_vector_sameStep]
CATEGORICAL = [ppo_discrete, ppo_vector_sameStep]


def wrappers(env):
    """The classes of an env's wrappers, outermost first, down to the env itself."""
    kinds = []
    while env is not None:
        kinds.append(type(env).__name__)
        env = getattr(env, "env", None)
    return kinds


@pytest.mark.skipif(not (importlib.util.find_spec("ale_py") and importlib.util.find_spec("cv2")), reason="needs ale-py")
@pytest.mark.parametrize("ppo", CATEGORICAL, ids=lambda module: module.__name__)
def test_an_atari_id_typed_with_its_module_gets_every_atari_detail(ppo, in_tmp):
    """`ale_py:ALE/Pong-v5` is ALE/Pong-v5: 84 x 84 gray frames, 4 stacked, a lost life ends a training episode."""
    args = ppo.Args(env_id="ale_py:ALE/Pong-v5", num_envs=1)
    envs = ppo.make_envs(args, 1, None, 1 if ppo is ppo_discrete else "sync")
    assert envs.single_observation_space.shape == (4, 84, 84)
    assert "AtariTraining" in wrappers(envs)
    envs.close()


@pytest.mark.parametrize("ppo", [ppo_continuous, ppo_vector_sameStep], ids=lambda module: module.__name__)
def test_an_env_id_typed_with_its_module_takes_its_defaults_entry(ppo, monkeypatch, capsys):
    """One key rule for every defaults table in the three scripts: gymnasium's id, without the module."""
    monkeypatch.setattr(sys, "argv", ["script"])
    args = ppo.Args(env_id="gymnasium.envs.mujoco:Hopper-v5")
    space = gym.spaces.Box(-1, 1, (11,))
    chosen = (ppo.env_defaults(args, space) if ppo is ppo_continuous else
              ppo.env_defaults(args, space, gym.spaces.Box(-1, 1, (3,))))
    assert chosen.init_log_std == ppo.ENV_DEFAULTS["Hopper-v5"]["init_log_std"] != ppo.Args.init_log_std
    assert "defaults: ENV_DEFAULTS['Hopper-v5'] sets init_log_std=-0.5" in capsys.readouterr().out


def test_the_discrete_script_keys_its_defaults_by_the_same_rule(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["script"])
    args = ppo_discrete.Args(env_id="minigrid:MiniGrid-RedBlueDoors-6x6-v0")
    assert ppo_discrete.env_defaults(args, gym.spaces.Box(0, 1, (4,))).norm_adv is False
    assert ppo_discrete.registered_id(args.env_id) in ppo_discrete.ENV_DEFAULTS


@pytest.mark.parametrize("ppo", CATEGORICAL, ids=lambda module: module.__name__)
def test_masks_that_are_ignored_are_not_checked_either(ppo, in_tmp, monkeypatch, capsys):
    """--no-action-mask: an env whose mask leaves no valid action (from step 300) trains on, as it would without."""
    flags = ["--env-id", "test/EmptyMaskLoose-v0", "--total-timesteps", "2048", "--num-envs", "4", "--num-steps", "128",
             "--num-minibatches", "4", "--update-epochs", "1", "--no-action-mask", "--checkpoint-interval", "0"]
    flags += ["--vectorization-mode", "sync"] if ppo is ppo_vector_sameStep else []
    assert run_main(ppo, flags, monkeypatch) == 0
    assert "ignored (--no-action-mask)" in capsys.readouterr().out


RENDERED = '''import gymnasium as gym
import numpy as np


def rendered(kind):
    """An env whose observations are its own rendered frames (pygame draws them), every 8th pixel of each 8th row."""
    env = gym.wrappers.AddRenderObservation(gym.make(kind, render_mode="rgb_array"))
    height, width, channels = env.observation_space.shape
    space = gym.spaces.Box(0, 255, ((height + 7) // 8, (width + 7) // 8, channels), np.uint8)
    return gym.wrappers.TransformObservation(env, lambda frame: frame[::8, ::8], space)


gym.register("RenderedCartPole-v0", entry_point=lambda: rendered("CartPole-v1"))
gym.register("RenderedPendulum-v0", entry_point=lambda: rendered("Pendulum-v1"))
'''


@pytest.mark.parametrize("ppo", ALL, ids=lambda module: module.__name__)
def test_an_env_that_renders_for_its_observations_prints_no_stray_error_line(ppo, tmp_path):
    """pygame says "error: XDG_RUNTIME_DIR is invalid or not set" where the variable is unset: it reads like ours."""
    (tmp_path / "rendered_envs.py").write_text(RENDERED)
    env_id = "rendered_envs:RenderedCartPole-v0" if ppo is ppo_discrete else "rendered_envs:RenderedPendulum-v0"
    flags = ["--env-id", env_id, "--total-timesteps", "256", "--num-envs", "2", "--num-steps", "128",
             "--num-minibatches", "2", "--update-epochs", "1", "--checkpoint-interval", "0"]
    flags += ["--vectorization-mode", "sync"] if ppo is ppo_vector_sameStep else []
    environment = {key: value for key, value in os.environ.items() if key != "XDG_RUNTIME_DIR"}
    done = subprocess.run([sys.executable, os.path.join(ROOT, f"{ppo.__name__}.py"), *flags], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300,
                          env={**environment, "PYTHONPATH": str(tmp_path)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "XDG_RUNTIME_DIR" not in done.stdout + done.stderr
    # the defaults follow the space the env's own wrappers give (an image of 50 x 75 or more), in every script
    assert done.stdout.startswith("defaults: IMAGE_DEFAULTS sets"), done.stdout


class TextBesideAnImage(gym.Env):
    """MiniGrid's kind of observation: an image beside a mission text."""

    observation_space = gym.spaces.Dict({"image": gym.spaces.Box(0, 255, (7, 7, 3), "uint8"),
                                         "mission": gym.spaces.Text(20)})
    action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, True, {}


class ImageOnly(gym.ObservationWrapper):
    """The env's own wrapper that keeps the image alone (as MiniGrid's ImgObsWrapper)."""

    def __init__(self, env):
        super().__init__(env)
        self.observation_space = env.observation_space["image"]

    def observation(self, observation):
        return observation["image"]


gym.register("test/ImageOnly-v0", entry_point=lambda: ImageOnly(TextBesideAnImage()))


@pytest.mark.parametrize("ppo", CATEGORICAL, ids=lambda module: module.__name__)
def test_what_the_env_s_own_wrappers_take_out_is_not_said_to_be_left_out(ppo, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["script", "--env-id", "test/ImageOnly-v0"])
    ppo.parse_args()  # a 7 x 7 image: the text was taken out by the env's own wrapper, not by the script
    assert "left out" not in capsys.readouterr().out


@pytest.mark.parametrize("layer", [torch.nn.LSTM, torch.nn.GRU], ids=["lstm", "gru"])
def test_the_memory_s_one_row_step_is_the_first_row_of_the_packed_replay(layer):
    """A rollout step (one row a sub-env) takes a path of its own: the same features and state as the packed replay."""
    torch.manual_seed(0)
    memory, rows = layer(5, 7), torch.randn(3, 4, 5)
    state = torch.randn(4, 14 if layer is torch.nn.LSTM else 7)
    keep = torch.tensor([[1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 1.0]])
    with torch.no_grad():
        for script in ALL:
            one, after_one = script.replay(memory, rows[:1], state, keep[:1])
            packed, _ = script.replay(memory, rows, state, keep)
            torch.testing.assert_close(one, packed[:4], rtol=0, atol=1e-6)
            two, after_two = script.replay(memory, rows[1:2], after_one, keep[1:2])  # on from the carried state
            torch.testing.assert_close(two, packed[4:8], rtol=0, atol=1e-6)
            assert (after_one[1] == 0).all() and (after_one[0] != 0).all()  # zeroed where the episode ended

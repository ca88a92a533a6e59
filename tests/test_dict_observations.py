"""Dict observations with images in all three scripts (an image beside a vector, MiniGrid's view beside its direction
and text mission): each entry reaches the networks exactly, in its own dtype; the text is left out and said; each
script learns a task that needs both the image and the vector; runs resume and evaluate; a small image alone takes the
grid CNN; the defaults follow the image's size. EnvPool's MiniGrid ids where EnvPool is installed."""

import importlib.util
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import short_args

import ppo_continuous
import ppo_discrete
import ppo_vector_sameStep

ALL = (ppo_discrete, ppo_continuous, ppo_vector_sameStep)
needs_envpool = pytest.mark.skipif(importlib.util.find_spec("envpool") is None, reason="needs envpool==1.2.5")


class AgreeEnv(gym.Env):
    """A small grid (7 x 7, one channel, channels last) whose left or right half holds 1s, beside a `sign` of -1 or 1
    and a text mission, drawn anew each step. Reward 1 when the action says whether the bright half is the right one
    exactly when the sign is 1 (Discrete: 1 agrees; Box: an action above 0). Blind to either entry: 4 of 8 a time."""

    def __init__(self, box_actions=False, size=7):
        self.observation_space = gym.spaces.Dict({
            "grid": gym.spaces.Box(0, 255, (size, size, 1), np.uint8),
            "sign": gym.spaces.Box(-1.0, 1.0, (1,), np.float32),
            "mission": gym.spaces.Text(32)})
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32) if box_actions else gym.spaces.Discrete(2)
        self.size, self.steps, self.agree = size, 0, 0

    def observation(self):
        right, positive = self.np_random.integers(2, size=2)
        self.agree = int(right == positive)
        grid = np.zeros((self.size, self.size, 1), np.uint8)
        (grid[:, self.size // 2:] if right else grid[:, : self.size // 2])[...] = 1
        return {"grid": grid, "sign": np.array([1.0 if positive else -1.0], np.float32), "mission": "agree"}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return self.observation(), {}

    def step(self, action):
        chosen = int(np.asarray(action).reshape(-1)[0] > 0) if isinstance(self.action_space, gym.spaces.Box) else action
        reward = float(chosen == self.agree)
        self.steps += 1
        return self.observation(), reward, False, self.steps >= 8, {}


class KnownEnv(gym.Env):
    """The same Dict observation every step, of known values in several dtypes, and a text entry."""

    CAMERA = np.arange(112, dtype=np.uint8).reshape(7, 8, 2)
    JOINTS = np.array([0.1, -2.5, 3e6], np.float32)

    def __init__(self, box_actions=False):
        self.observation_space = gym.spaces.Dict({
            "camera": gym.spaces.Box(0, 255, (7, 8, 2), np.uint8),
            "joints": gym.spaces.Box(-np.inf, np.inf, (3,), np.float32),
            "mode": gym.spaces.Discrete(3, start=1),
            "mission": gym.spaces.Text(16)})
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32) if box_actions else gym.spaces.Discrete(2)

    def observation(self):
        return {"camera": self.CAMERA, "joints": self.JOINTS, "mode": 2, "mission": "go"}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation(), {}

    def step(self, action):
        return self.observation(), 0.0, False, False, {}


for suffix, box in (("", False), ("Box", True)):
    gym.register(f"test/Agree{suffix}-v0", entry_point=AgreeEnv, kwargs={"box_actions": box})
    gym.register(f"test/Known{suffix}-v0", entry_point=KnownEnv, kwargs={"box_actions": box})
gym.register("test/AgreeLarge-v0", entry_point=AgreeEnv, kwargs={"size": 36})


def env_id(ppo, name):
    return f"test/{name}Box-v0" if ppo is ppo_continuous else f"test/{name}-v0"


def make_envs(ppo, args, num_envs):
    return ppo.make_envs(args, num_envs, None, "sync" if ppo is ppo_vector_sameStep else args.seed)


@pytest.mark.parametrize("ppo", ALL, ids=lambda module: module.__name__)
def test_each_entry_reaches_the_encoder_exactly_in_its_own_dtype_and_the_text_is_left_out(ppo, capsys):
    args = short_args(ppo, env_id=env_id(ppo, "Known"))
    ppo.check_args(args)
    assert "observations: mission left out (text" in capsys.readouterr().out
    envs = make_envs(ppo, args, 2)
    rows = envs.reset(seed=1)[0]
    assert rows.dtype == np.uint8 and rows.shape == (2, 4 * (3 + 3) + 112)  # joints, mode one-hot, then the camera
    agent = ppo.Agent(envs, ppo.Args())
    seen = []
    agent.encoder.cnns[0].register_forward_pre_hook(lambda module, inputs: seen.append(inputs[0]))
    with torch.no_grad():
        features = agent.encode(torch.from_numpy(rows))
    floats = np.concatenate([KnownEnv.JOINTS, np.float32([0.0, 1.0, 0.0])])  # mode 2 of {1, 2, 3}: one-hot
    np.testing.assert_array_equal(features[:, :6].numpy(), np.stack([floats] * 2))  # float32, bit for bit
    assert seen[0].dtype == torch.uint8
    np.testing.assert_array_equal(seen[0].numpy(), np.stack([KnownEnv.CAMERA] * 2))  # the camera's own bytes
    assert features.shape == (2, 6 + 64)  # the grid CNN: 7 x 8, 6 x 7, pooled 3 x 3, 2 x 2, 1 x 1 of 64 channels
    envs.close()


@pytest.mark.parametrize("ppo", ALL, ids=lambda module: module.__name__)
def test_observation_normalization_takes_the_float_entries_only(ppo, in_tmp):
    path = ppo.train(short_args(ppo, env_id=env_id(ppo, "Known"), norm_obs=True))  # ppo_discrete.py's is off unless asked
    obs_rms = ppo.load_checkpoint(path)["obs_rms"]
    assert obs_rms["mean"].shape == (6,)  # joints and mode, never the camera's bytes
    np.testing.assert_allclose(obs_rms["mean"].numpy(), [0.1, -2.5, 3e6, 0.0, 1.0, 0.0], rtol=1e-5)


@pytest.mark.parametrize("ppo", ALL, ids=lambda module: module.__name__)
def test_a_task_that_needs_the_image_and_the_vector_is_learned_resumes_and_evaluates(ppo, in_tmp, monkeypatch):
    seen = set()
    encode = ppo.Agent.encode  # every observation the networks see: rollout, values, update
    monkeypatch.setattr(ppo.Agent, "encode", lambda agent, x: seen.add(x.dtype) or encode(agent, x))
    path = ppo.train(short_args(ppo, env_id=env_id(ppo, "Agree"), total_timesteps=3072, num_envs=4, num_steps=64,
                                num_minibatches=4, update_epochs=8, learning_rate=3e-3, checkpoint_interval=0,
                                ent_coef=0.0))
    assert seen == {torch.uint8}  # the buffer's rows, never a float copy
    checkpoint = ppo.load_checkpoint(path)
    args = ppo.Args(**{**checkpoint["args"], "eval_checkpoint": path, "eval_episodes": 10})
    assert np.mean(ppo.evaluate(args, checkpoint)) >= 7.0  # of 8; blind to the grid or to the sign: 4
    assert np.mean(ppo.evaluate(ppo.Args(**{**vars(args), "eval_sample": True}), checkpoint)) >= 6.0
    monkeypatch.setattr(sys, "argv", [ppo.SCRIPT, "--resume", path, "--total-timesteps", "3328"])
    ppo.train(*ppo.parse_args())
    resumed = ppo.load_checkpoint(path)
    assert resumed["global_step"] == 3328
    resumed["model"]["encoder.cnns.0.5.weight"][0, 0, 0, 0] = float("nan")
    torch.save(resumed, "nan.pt")
    with pytest.raises(SystemExit, match="nan.pt holds non-finite weights"):
        ppo.load_checkpoint("nan.pt")


@pytest.mark.parametrize("ppo", ALL, ids=lambda module: module.__name__)
def test_a_small_image_alone_trains_through_the_grid_cnn_and_a_tiny_one_as_a_vector(ppo, in_tmp):
    model = ppo.load_checkpoint(ppo.train(short_args(ppo, env_id=env_id(ppo, "ImageObservations"))))["model"]
    assert model["encoder.0.weight"].shape == (16, 3, 2, 2) and "encoder.7.weight" not in model  # no Nature CNN
    model = ppo.load_checkpoint(ppo.train(short_args(ppo, env_id=env_id(ppo, "DictOnlyImage"))))["model"]
    assert model["encoder.cnns.0.0.weight"].shape == (16, 3, 2, 2)  # a Dict of one image: no float entries beside
    model = ppo.load_checkpoint(ppo.train(short_args(ppo, env_id=env_id(ppo, "TinyImageObservations"))))["model"]
    assert not any(name.startswith("encoder.") for name in model)  # 3 x 3: flattened into the MLP


@pytest.mark.parametrize("ppo", ALL, ids=lambda module: module.__name__)
def test_the_defaults_follow_the_image_size_small_grids_take_the_vector_ones_or_the_grid_rule(ppo, monkeypatch):
    monkeypatch.setattr(sys, "argv", [ppo.SCRIPT, "--env-id", env_id(ppo, "Agree")])
    grid_rule = ppo.GRID_DEFAULTS if ppo is ppo_discrete else {}  # measured on MiniGrid with ppo_discrete.py only
    assert ppo.parse_args()[0] == ppo.Args(env_id=env_id(ppo, "Agree"), **grid_rule)
    if ppo is not ppo_continuous:  # a Nature CNN's run takes IMAGE_DEFAULTS
        monkeypatch.setattr(sys, "argv", [ppo.SCRIPT, "--env-id", "test/AgreeLarge-v0"])
        assert ppo.parse_args()[0].learning_rate == ppo.IMAGE_DEFAULTS["learning_rate"]


@needs_envpool
@pytest.mark.parametrize("ppo", [ppo_discrete], ids=lambda module: module.__name__)
def test_envpool_minigrid_trains_with_its_mission_left_out(ppo, in_tmp, capsys):
    args = short_args(ppo, env_id="MiniGrid-Empty-5x5-v0", env_backend="envpool", env_threads=1)
    ppo.check_args(args)
    assert "observations: mission left out" in capsys.readouterr().out
    envs = ppo.make_envs(args, 2, None, 1)
    assert envs.single_observation_space.floats == 4 and [image.shape for image in envs.single_observation_space.images] == [(7, 7, 3)]
    envs.close()
    assert ppo.load_checkpoint(ppo.train(args))["global_step"] == 1024

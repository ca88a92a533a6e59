"""Image observations in all three scripts: the Nature CNN path learns a tiny image task, frames stay uint8 from the
rollout to the loss, images take their own defaults, runs resume, and Atari's training-only rules (a lost life ends
the episode, rewards clipped to their sign) leave the logged scores whole. Tests that need EnvPool or ale-py skip
themselves where it is not installed (.ci/run installs both)."""

import importlib.util
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import BOX2, SpacesEnv, short_args

import ppo_continuous
import ppo_discrete
import ppo_vector_sameStep

ALL = (ppo_discrete, ppo_continuous, ppo_vector_sameStep)
needs_envpool = pytest.mark.skipif(importlib.util.find_spec("envpool") is None, reason="needs envpool==1.2.5")
needs_ale = pytest.mark.skipif(not (importlib.util.find_spec("ale_py") and importlib.util.find_spec("cv2")),
                               reason="needs ale-py and opencv-python-headless")


class SideEnv(gym.Env):
    """A 36 x 36 color image (channels last) whose left or right half is bright, drawn anew each step; reward 1 when
    the action names the bright side (Discrete: 0 left, 1 right; Box: the sign of the action). 8-step episodes."""

    def __init__(self, box_actions=False, shape=(36, 36, 3)):
        self.observation_space = gym.spaces.Box(0, 255, shape, np.uint8)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32) if box_actions else gym.spaces.Discrete(2)
        self.shape, self.steps, self.side = shape, 0, 0

    def observation(self):
        self.side = int(self.np_random.integers(2))
        image = np.zeros(self.shape, np.uint8)
        width_axis = 1 if self.shape[-1] <= 4 else 2  # (H, W, C) or (C, H, W)
        half = [slice(None)] * 3
        half[width_axis] = slice(18, None) if self.side else slice(0, 18)
        image[tuple(half)] = 255
        return image

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return self.observation(), {}

    def step(self, action):
        chosen = int(np.asarray(action).reshape(-1)[0] > 0) if isinstance(self.action_space, gym.spaces.Box) else action
        reward = float(chosen == self.side)
        self.steps += 1
        return self.observation(), reward, False, self.steps >= 8, {}


class LivesEnv(gym.Env):
    """Atari's shape of a game without ROMs: 3 lives, one lost every 4 steps, the game over with the last one; a raw
    reward of 5 a step; `lives` in every info. A TimeLimit may cut the game (a truncation)."""

    def __init__(self):
        self.observation_space = gym.spaces.Box(0, 255, (36, 36), np.uint8)
        self.action_space = gym.spaces.Discrete(2)
        self.steps = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return np.zeros((36, 36), np.uint8), {"lives": 3}

    def step(self, action):
        self.steps += 1
        lives = 3 - self.steps // 4
        return np.zeros((36, 36), np.uint8), 5.0, lives == 0, False, {"lives": lives}


for suffix, box in (("", False), ("Box", True)):
    gym.register(f"test/Side{suffix}-v0", entry_point=SideEnv, kwargs={"box_actions": box})
    gym.register(f"test/SideGrid{suffix}-v0", entry_point=SideEnv, kwargs={"box_actions": box, "shape": (8, 8, 3)})
gym.register("test/SideChannelsFirst-v0", entry_point=SideEnv, kwargs={"shape": (3, 36, 36)})
gym.register("test/Lives-v0", entry_point=LivesEnv)
gym.register("test/LivesCut-v0", entry_point=LivesEnv, max_episode_steps=6)
gym.register("test/Uint8Vector-v0", entry_point=SpacesEnv,
             kwargs={"observation_space": gym.spaces.Box(0, 255, (4,), np.uint8), "action_space": BOX2})


def side_args(ppo, **overrides):
    env_id = "test/SideBox-v0" if ppo is ppo_continuous else "test/Side-v0"
    return ppo.Args(**{"env_id": env_id, "num_envs": 4, "num_steps": 32, "num_minibatches": 2, "update_epochs": 4,
                       "learning_rate": 1e-3, "total_timesteps": 1024, "checkpoint_interval": 0, "cuda": False,
                       **({"vectorization_mode": "sync"} if ppo is ppo_vector_sameStep else {}), **overrides})


@pytest.mark.parametrize("ppo", ALL, ids=lambda module: module.__name__)
def test_a_tiny_image_task_is_learned_through_the_cnn_with_uint8_frames_from_rollout_to_loss(ppo, in_tmp, monkeypatch):
    seen = set()
    encode = ppo.Agent.encode  # every observation the networks see: rollout, values, update
    monkeypatch.setattr(ppo.Agent, "encode", lambda agent, x: seen.add(x.dtype) or encode(agent, x))
    path = ppo.train(side_args(ppo))
    assert seen == {torch.uint8}  # the buffer's frames, never a float copy; the CNN scales them
    checkpoint = ppo.load_checkpoint(path)
    assert any(name.startswith("encoder.") for name in checkpoint["model"])
    args = ppo.Args(**{**checkpoint["args"], "eval_checkpoint": path, "eval_episodes": 10})
    returns = ppo.evaluate(args, checkpoint)
    assert np.mean(returns) >= 7.5  # of 8; a policy blind to the image scores 4


@pytest.mark.parametrize("env_id, shape", [("test/Side-v0", (3, 36, 36)), ("test/SideChannelsFirst-v0", (3, 36, 36)),
                                           ("test/Lives-v0", (1, 36, 36))])
def test_images_are_recognized_channels_last_first_or_gray(env_id, shape):
    space = gym.make(env_id).observation_space
    assert ppo_discrete.image_shape(space) == shape
    agent = ppo_discrete.Agent(gym.vector.SyncVectorEnv([lambda: gym.make(env_id)]), ppo_discrete.Args())
    assert agent.encode(torch.from_numpy(np.stack([space.sample()] * 2))).shape == (2, 512)
    assert ppo_discrete.image_shape(gym.spaces.Box(0.0, 1.0, (3, 36, 36), np.float32)) is None  # floats: not an image


@pytest.mark.parametrize("ppo", [ppo_continuous, ppo_vector_sameStep], ids=lambda module: module.__name__)
def test_a_uint8_vector_is_no_image_and_trains_unnormalized_as_floats(ppo, in_tmp):
    path = ppo.train(short_args(ppo, env_id="test/Uint8Vector-v0", norm_obs=False, total_timesteps=512))
    assert "encoder.0.weight" not in ppo.load_checkpoint(path)["model"]  # the MLP, not the CNN


@pytest.mark.parametrize("ppo", ALL, ids=lambda module: module.__name__)
def test_images_take_the_image_defaults_and_flags_given_still_win(ppo, monkeypatch):
    continuous = ppo is ppo_continuous
    image_env, vector_env = ("test/SideBox-v0", "Pendulum-v1") if continuous else ("test/Side-v0", "CartPole-v1")
    monkeypatch.setattr(sys, "argv", [ppo.SCRIPT, "--env-id", image_env, "--update-epochs", "2"])
    args, _ = ppo.parse_args()
    assert (args.learning_rate, args.num_minibatches, args.update_epochs, args.ent_coef) == (2.5e-4, 4, 2, 0.01)
    assert args.eval_sample  # issue 69: a deterministic image policy can repeat one failing play
    assert args.total_timesteps == ppo.IMAGE_DEFAULTS.get("total_timesteps", ppo.Args.total_timesteps)
    monkeypatch.setattr(sys, "argv", [ppo.SCRIPT, "--env-id", vector_env])
    assert ppo.parse_args()[0] == ppo.Args(env_id=vector_env)  # vectors: the defaults as they were
    # checked as they will train (issue 69): a batch of 100 splits into the image default's 4 minibatches, not 8 or 32
    monkeypatch.setattr(sys, "argv", [ppo.SCRIPT, "--env-id", image_env, "--num-envs", "1", "--num-steps", "100"])
    assert ppo.parse_args()[0].num_minibatches == 4


@pytest.mark.parametrize("ppo", ALL, ids=lambda module: module.__name__)
def test_only_the_nature_cnn_takes_every_core(ppo, in_tmp, monkeypatch):
    """A grid CNN (MiniGrid's 7 x 7) gains nothing from a second thread and on a busy machine runs ~8x slower."""
    threads = []
    monkeypatch.setattr(ppo.os, "sched_getaffinity", lambda pid: {0, 1, 2})
    monkeypatch.setattr(torch, "set_num_threads", threads.append)
    nature = side_args(ppo).env_id
    vector = "CartPole-v1" if ppo is ppo_discrete else "Pendulum-v1"
    for env_id, expected in ((nature.replace("Side", "SideGrid"), 1), (nature, 3), (vector, 1)):
        ppo.train(side_args(ppo, env_id=env_id, total_timesteps=128))
        assert threads[-1] == expected, env_id


@pytest.mark.parametrize("ppo", ALL, ids=lambda module: module.__name__)
def test_an_atari_sized_agent_draws_the_first_weights_of_its_nature_cnn_alone(ppo):
    """The seed gives the Nature CNN the same first weights as a Nature CNN built alone: no other encoder is built
    (and thrown away) before it, which shifted Atari's random draws and so its results from the same seed."""
    space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    actions = gym.spaces.Discrete(6) if ppo is ppo_discrete else gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    envs = gym.vector.SyncVectorEnv([lambda: SpacesEnv(space, actions)])
    torch.manual_seed(3)
    encoder = ppo.Agent(envs, ppo.Args()).encoder
    torch.manual_seed(3)
    alone = ppo.NatureCNN(4, 84, 84)
    assert isinstance(encoder, ppo.NatureCNN)
    for name, weight in alone.state_dict().items():
        assert torch.equal(encoder.state_dict()[name], weight), name


@pytest.mark.parametrize("ppo", ALL, ids=lambda module: module.__name__)
def test_an_image_run_resumes_to_its_end_and_non_finite_conv_weights_are_refused(ppo, in_tmp, monkeypatch):
    path = ppo.train(side_args(ppo, total_timesteps=128, checkpoint_interval=1))
    monkeypatch.setattr(sys, "argv", [ppo.SCRIPT, "--resume", path, "--total-timesteps", "256"])
    args, checkpoint = ppo.parse_args()
    assert args.learning_rate == 1e-3  # the checkpoint's settings, not the image defaults
    ppo.train(args, checkpoint)
    resumed = ppo.load_checkpoint(path)
    assert resumed["global_step"] == 256 and resumed["model"]["encoder.0.weight"].shape[1] == 3
    resumed["model"]["encoder.0.weight"][0, 0, 0, 0] = float("nan")
    torch.save(resumed, "nan.pt")
    with pytest.raises(SystemExit, match="nan.pt holds non-finite weights"):
        ppo.load_checkpoint("nan.pt")


def atari_envs(ppo, env_id, num_envs=2):
    """The constructed game through the same wrappers, in the same order, as an Atari id in make_envs."""
    envs = gym.vector.SyncVectorEnv([lambda: gym.make(env_id)] * num_envs)
    return ppo.AtariTraining(gym.wrappers.vector.RecordEpisodeStatistics(envs))


@pytest.mark.parametrize("ppo", [ppo_discrete, ppo_vector_sameStep], ids=lambda module: module.__name__)
def test_atari_training_ends_episodes_at_a_lost_life_and_clips_rewards_but_logs_whole_games(ppo):
    envs = atari_envs(ppo, "test/Lives-v0")
    envs.reset(seed=1)
    terminated_at, episodes = [], []
    for step in range(1, 14):
        _, rewards, terminated, truncated, infos = envs.step(np.zeros(2, np.int64))
        if step < 13:  # the 13th is gymnasium's NEXT_STEP autoreset of the ended game
            assert np.all(rewards == 1.0)  # 5 clipped to its sign
        if terminated[0]:
            terminated_at.append(step)
        if "episode" in infos and infos["_episode"][0]:
            episodes.append((infos["episode"]["r"][0], infos["episode"]["l"][0]))
    assert terminated_at == [4, 8, 12]  # each lost life, the last one the game's end
    assert episodes == [(60.0, 12)]  # one whole game, its raw score


@pytest.mark.parametrize("ppo", [ppo_discrete, ppo_vector_sameStep], ids=lambda module: module.__name__)
def test_the_row_after_a_lost_life_is_trained_and_memory_goes_on_through_it(ppo, in_tmp, monkeypatch):
    """Issue 69: a lost life ends a training episode (GAE stops there, no bootstrap) but the engine does not reset, so
    the next row is the new life's first step, a real one. Only a game's end resets: NEXT_STEP drops the autoreset row
    after it, and memory starts from zeros at each game's first row, and only there."""
    same_step = ppo is ppo_vector_sameStep
    make_envs = ppo.make_envs

    def atari_make_envs(args, num_envs, *rest, training=True):  # the script's wrappers, AtariTraining as for Atari
        envs = make_envs(args, num_envs, *rest, training=False)
        envs.env = ppo.AtariTraining(envs.env) if training else envs.env
        return envs

    monkeypatch.setattr(ppo, "make_envs", atari_make_envs)
    rows, zero = [], []
    compute_advantages = ppo.compute_advantages
    monkeypatch.setattr(ppo, "compute_advantages", lambda rewards, values, next_values, terminations, dones, *rest:
                        rows.append(dones.copy()) or
                        compute_advantages(rewards, values, next_values, terminations, dones, *rest))
    if not same_step:
        real_transitions = ppo.real_transitions
        monkeypatch.setattr(ppo, "real_transitions", lambda valid, **rollout: rows.append(valid.copy()) or
                            real_transitions(valid, **rollout))
    remember = ppo.Agent.remember

    def spy(agent, x, state, keep=None):
        if x.shape[0] == 1:  # a row of the rollout (or next_obs): is the state entering it zero?
            zero.append(bool((state == 0).all()))
        return remember(agent, x, state, keep)

    monkeypatch.setattr(ppo.Agent, "remember", spy)
    ppo.train(side_args(ppo, env_id="test/Lives-v0", num_envs=1, num_steps=52, total_timesteps=52, recurrent="lstm"))
    game = 12 if same_step else 13  # a game: 12 steps, 3 lives lost at steps 4, 8 and 12; NEXT_STEP's autoreset row
    np.testing.assert_array_equal(rows[0][:, 0], [float(row % game in (3, 7, 11)) for row in range(52)])
    if not same_step:
        np.testing.assert_array_equal(rows[1][:, 0], [float(row % game != 12) for row in range(52)])
    assert zero[:52] == [row % game == 0 for row in range(52)]  # the rollout's rows (then next_obs)


def test_atari_statistics_restart_at_a_truncation():
    """CleanRL's EnvPool scripts carried a game's statistics across a time limit (their issue #454); here the
    truncated game is logged as one episode and the next one starts from zero."""
    envs = atari_envs(ppo_discrete, "test/LivesCut-v0", num_envs=1)
    envs.reset(seed=1)
    episodes = []
    for _ in range(14):
        _, _, terminated, truncated, infos = envs.step(np.zeros(1, np.int64))
        if "episode" in infos and infos["_episode"][0]:
            episodes.append((infos["episode"]["r"][0], infos["episode"]["l"][0], bool(truncated[0])))
    assert episodes == [(30.0, 6, True), (30.0, 6, True)]  # one life lost in each, neither carried over


@pytest.mark.parametrize("ppo", [ppo_discrete, ppo_vector_sameStep], ids=lambda module: module.__name__)
def test_ale_ids_without_ale_py_get_the_install_command(ppo, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *rest: None if name == "ale_py" else
                        find_spec(name, *rest))
    with pytest.raises(SystemExit, match=r"^error: ALE/Pong-v5 needs ale-py and OpenCV: pip install ale-py==0.12.1 "
                                         r"opencv-python-headless==[\d.]+$"):
        ppo.check_env(ppo.Args(env_id="ALE/Pong-v5"), {})


@needs_ale
@pytest.mark.parametrize("ppo", [ppo_discrete, ppo_vector_sameStep], ids=lambda module: module.__name__)
def test_ale_ids_get_the_standard_preprocessing_and_the_training_rules(ppo, in_tmp):
    args = ppo.Args(env_id="ALE/Breakout-v5", **({"vectorization_mode": "sync"} if ppo is ppo_vector_sameStep else {}))
    mode = "sync" if ppo is ppo_vector_sameStep else 1  # the vector script's fourth argument; the others' seed
    envs = ppo.make_envs(args, 2, None, mode)
    assert envs.single_observation_space == gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    assert isinstance(envs.env, ppo.AtariTraining)
    envs.close()
    evaluation = ppo.make_envs(args, 1, None, mode, training=False)
    assert not isinstance(evaluation.env, ppo.AtariTraining)  # evaluation plays whole games with raw scores
    evaluation.close()


@needs_ale
@pytest.mark.parametrize("ppo", [ppo_discrete, ppo_vector_sameStep], ids=lambda module: module.__name__)
def test_an_ale_game_trains_through_lost_lives(ppo, in_tmp, monkeypatch):
    ends = []
    compute_advantages = ppo.compute_advantages
    monkeypatch.setattr(ppo, "compute_advantages", lambda rewards, values, next_values, terminations, dones, *rest:
                        ends.append(int(terminations.sum())) or
                        compute_advantages(rewards, values, next_values, terminations, dones, *rest))
    extra = {"vectorization_mode": "sync"} if ppo is ppo_vector_sameStep else {}
    ppo.train(ppo.Args(env_id="ALE/Breakout-v5", num_envs=2, num_steps=128, num_minibatches=4, update_epochs=1,
                       total_timesteps=256, cuda=False, **extra))
    assert sum(ends) >= 2  # lives were lost, and training went on through them


@needs_envpool
def test_envpool_atari_drops_the_row_after_a_game_over_only_and_logs_whole_games_with_raw_scores(in_tmp, monkeypatch):
    """CleanRL's EnvPool scripts let the dummy step after an autoreset into GAE and the loss (their issues #475 and
    #562). Here the row after a game over (EnvPool resets there) is dropped from the update; the row after a lost
    life, a real step of the game that goes on (issue 69), is trained."""
    rows, returns, lives = [], [], []
    real_transitions = ppo_discrete.real_transitions
    monkeypatch.setattr(ppo_discrete, "real_transitions", lambda valid, **rollout: rows.append(valid.copy()) or
                        real_transitions(valid, **rollout))
    compute_advantages = ppo_discrete.compute_advantages
    monkeypatch.setattr(ppo_discrete, "compute_advantages", lambda rewards, values, next_values, terminations, dones,
                        *rest: rows.append((rewards.copy(), dones.copy())) or
                        compute_advantages(rewards, values, next_values, terminations, dones, *rest))
    log_episodes = ppo_discrete.Run.log_episodes
    monkeypatch.setattr(ppo_discrete.Run, "log_episodes", lambda run, infos, step: returns.extend(
        infos["episode"]["r"][infos["_episode"]].tolist() if "episode" in infos else []) or log_episodes(run, infos, step))
    step = ppo_discrete.AtariTraining.step
    monkeypatch.setattr(ppo_discrete.AtariTraining, "step", lambda envs, actions: (lambda result: lives.append(
        np.array(result[-1]["lives"])) or result)(step(envs, actions)))  # the engine's lives after each step
    ppo_discrete.train(ppo_discrete.Args(env_id="Breakout-v5", env_backend="envpool", num_envs=4, num_steps=256,
                                         num_minibatches=4, update_epochs=1, total_timesteps=1024, cuda=False))
    game_over = np.reshape(lives, (-1, 256, 4)) == 0  # [iteration, step, sub-env]: the engine resets after these
    lives_lost = 0
    for (rewards, dones), valid, over in zip(rows[0::2], rows[1::2], game_over):
        np.testing.assert_array_equal(valid[1:], 1.0 - over[:-1])
        assert set(np.unique(rewards)) <= {0.0, 1.0}  # clipped to their sign for training
        assert np.all(dones[over] == 1.0)
        lives_lost += int(dones[~over].sum())
    assert returns and lives_lost > len(returns)  # lives lost while the game went on: more than whole games logged

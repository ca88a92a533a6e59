"""Shared helpers: small constructed environments, short-run settings, and ways to run a script."""

import os
import re
import subprocess
import sys
import tempfile
import time

import gymnasium as gym
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import ppo_continuous  # noqa: E402
import ppo_discrete  # noqa: E402
import ppo_vector_sameStep  # noqa: E402


class ConstantRewardEnv(gym.Env):
    """Reward 1 every step and the same observation every step; terminates after `terminate_after` steps
    if that is set, else runs until a TimeLimit wrapper truncates it. Optionally emits one bad reward.
    Discrete(2) actions, or with box_actions=True a Box with bounds that differ per dimension; the actions
    it receives are kept in `received_actions`. count_steps=True: the observation is the step count in
    the episode instead. crash_at / exit_at / hang_at: raise / call sys.exit() / stop answering at that step of the env's life;
    hang_in_reset: stop answering in reset().
    final_shape: the last observation of an episode has this shape instead. close_fails: close() raises once it has stepped."""

    def __init__(self, terminate_after=None, bad_reward_at=None, bad_reward=float("nan"), box_actions=False,
                 count_steps=False, crash_at=None, hang_at=None, final_shape=None, close_fails=False, exit_at=None,
                 hang_in_reset=False):
        self.observation_space = gym.spaces.Box(-1.0, 1000.0, (1,), np.float32)
        if box_actions:
            self.action_space = gym.spaces.Box(np.array([-0.4, 0.0], np.float32), np.array([0.4, 2.0], np.float32))
        else:
            self.action_space = gym.spaces.Discrete(2)
        self.terminate_after = terminate_after
        self.bad_reward_at = bad_reward_at
        self.bad_reward = bad_reward
        self.count_steps, self.crash_at, self.hang_at, self.final_shape = count_steps, crash_at, hang_at, final_shape
        self.close_fails, self.exit_at, self.hang_in_reset = close_fails, exit_at, hang_in_reset
        self.steps = 0
        self.total_steps = 0
        self.received_actions = []

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if self.hang_in_reset:
            time.sleep(600)
        self.steps = 0
        return self.observation(), {}

    def observation(self):
        return np.array([self.steps if self.count_steps else 0.0], np.float32)

    def step(self, action):
        self.received_actions.append(np.array(action))
        self.steps += 1
        self.total_steps += 1
        if self.total_steps == self.crash_at:
            raise RuntimeError("the simulator fell over")
        if self.total_steps == self.exit_at:  # as simulator bindings do when their connection dies
            sys.exit("lost the connection to the simulator")
        if self.total_steps == self.hang_at:
            time.sleep(600)
        reward = self.bad_reward if self.total_steps == self.bad_reward_at else 1.0
        terminated = self.terminate_after is not None and self.steps >= self.terminate_after
        observation = np.zeros(self.final_shape, np.float32) if terminated and self.final_shape else self.observation()
        return observation, reward, terminated, False, {}

    def close(self):
        if self.close_fails and self.total_steps:
            raise RuntimeError("the simulator would not shut down")



class RenderFailsEnv(ConstantRewardEnv):
    """ConstantRewardEnv whose render() raises (with --capture-video, env 0 is filmed from its first reset)."""
    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(self, render_mode=None, **kwargs):
        super().__init__(**kwargs)
        self.render_mode = render_mode

    def render(self):
        raise RuntimeError("the renderer lost its context")


class SpacesEnv(gym.Env):
    """Reward 1 a step and 20-step episodes, with any observation and action spaces; observations are samples."""

    def __init__(self, observation_space, action_space):
        self.observation_space, self.action_space = observation_space, action_space
        self.steps = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.observation_space.seed(seed)
        self.steps = 0
        return self.observation_space.sample(), {}

    def step(self, action):
        assert self.action_space.contains(np.asarray(action, self.action_space.dtype)), action
        self.steps += 1
        return self.observation_space.sample(), 1.0, False, self.steps >= 20, {}


BOX2 = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
IMAGE = gym.spaces.Box(0, 255, (8, 8, 3), np.uint8)  # an image too small for the Nature CNN: the grid CNN's
TINY_IMAGE = gym.spaces.Box(0, 255, (3, 3), np.uint8)  # too small for the grid CNN: flattened into the vector
KEY_ORDER = gym.spaces.Dict([("position", BOX2), ("mode", gym.spaces.Discrete(3))])  # pairs: kept in this order
for name, observations, actions in (
    ("DictObservations", gym.spaces.Dict({"position": BOX2, "mode": gym.spaces.Discrete(3)}), BOX2),
    ("TupleObservations", gym.spaces.Tuple((BOX2, gym.spaces.Discrete(3))), BOX2),
    ("TextObservations", gym.spaces.Text(5), BOX2),
    ("MatrixActions", BOX2, gym.spaces.Box(-1.0, 1.0, (2, 2), np.float32)),
    ("MultiBinaryActions", BOX2, gym.spaces.MultiBinary(3)),
    ("SequenceObservations", gym.spaces.Sequence(BOX2), gym.spaces.Discrete(2)),  # cannot be flattened into one vector
    ("SequenceObservationsBox", gym.spaces.Sequence(BOX2), BOX2),
    ("DiscreteFromOne", BOX2, gym.spaces.Discrete(3, start=1)),  # actions the scripts do not send
    ("KeyOrder", KEY_ORDER, gym.spaces.Discrete(2)),
    ("KeyOrderBox", KEY_ORDER, BOX2),
    ("ImageObservations", IMAGE, gym.spaces.Discrete(2)),
    ("ImageObservationsBox", IMAGE, BOX2),
    ("DictImageObservations", gym.spaces.Dict({"position": BOX2, "camera": IMAGE}), gym.spaces.Discrete(2)),
    ("DictImageObservationsBox", gym.spaces.Dict({"position": BOX2, "camera": IMAGE}), BOX2),
    ("DictOnlyImage", gym.spaces.Dict({"camera": IMAGE}), gym.spaces.Discrete(2)),  # no float entry at all
    ("DictOnlyImageBox", gym.spaces.Dict({"camera": IMAGE}), BOX2),
    ("TinyImageObservations", TINY_IMAGE, gym.spaces.Discrete(2)),
    ("TinyImageObservationsBox", TINY_IMAGE, BOX2),
    ("DiscreteFromOneBox", BOX2, gym.spaces.Box(-2, 2, (2,), np.int64)),
    # a space of its own that does not say whether it flattens (MiniGrid's text mission): it raises NotImplementedError
    ("MissionObservations", gym.spaces.Dict({"position": BOX2, "mission": gym.spaces.Space()}), gym.spaces.Discrete(2)),
    ("MissionObservationsBox", gym.spaces.Dict({"position": BOX2, "mission": gym.spaces.Space()}), BOX2),
):
    gym.register(f"test/{name}-v0", entry_point=SpacesEnv, kwargs={"observation_space": observations, "action_space": actions})


class MaskedEnv(gym.Env):
    """One valid value in each action part, which changes every step: part k's valid index is (steps + k) % its size,
    steps counted in the episode (5 steps, then truncated: the next episode's first mask differs from the last one).
    The mask comes in `convention`: "info" (Taxi-v4's), "observation" (a Dict entry beside "observation", PettingZoo's)
    or "method" (action_masks(), sb3-contrib's); the observation is the one-hot step count. An invalid action raises
    (strict) or is counted in `invalid_actions`. empty_at: from that step of the env's life, the mask has no valid value
    in its last part; mask_size: a mask of that many entries instead."""

    def __init__(self, action_space=gym.spaces.Discrete(3), convention="info", strict=True, empty_at=None,
                 mask_size=None):
        self.action_space, self.convention, self.strict = action_space, convention, strict
        self.empty_at, self.mask_size, self.total_steps, self.invalid_actions = empty_at, mask_size, 0, 0
        self.parts = np.array(ppo_discrete.action_parts(action_space))
        vector = gym.spaces.Box(0.0, 1.0, (3,), np.float32)
        mask_space = gym.spaces.Box(0, 1, (int(self.parts.sum()),), np.int8)
        self.observation_space = (gym.spaces.Dict({"observation": vector, "action_mask": mask_space})
                                  if convention == "observation" else vector)

    def valid_index(self):
        return (self.steps + np.arange(len(self.parts))) % self.parts

    def mask(self):
        mask = np.concatenate([np.arange(n) == i for n, i in zip(self.parts, self.valid_index())]).astype(np.int8)
        if self.empty_at is not None and self.total_steps >= self.empty_at:
            mask[-self.parts[-1]:] = 0
        return mask if self.mask_size is None else np.ones(self.mask_size, np.int8)

    def observe(self):
        vector = np.eye(3, dtype=np.float32)[self.steps % 3]
        if self.convention == "observation":
            return {"observation": vector, "action_mask": self.mask()}, {}
        return vector, {"action_mask": self.mask()} if self.convention == "info" else {}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return self.observe()

    def step(self, action):
        start = self.action_space.start if isinstance(self.action_space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)) else 0
        chosen = (np.asarray(action) - start).reshape(-1)
        if not np.array_equal(chosen, self.valid_index()):
            assert not self.strict, f"action {action} is masked at step {self.steps}"
            self.invalid_actions += 1
        self.steps += 1
        self.total_steps += 1
        obs, info = self.observe()
        return obs, 1.0, False, self.steps >= 5, info


class MaskMethodEnv(MaskedEnv):
    """MaskedEnv that gives its mask through a method, as sb3-contrib's MaskablePPO takes it."""

    def action_masks(self):
        return self.mask()


class ContextEnv(gym.Env):
    """A one-step task for multi-part actions: the observation is a random bit vector of 3 entries, and the reward is
    the number of action parts that match it: MultiBinary(3) matches the bits, MultiDiscrete([3, 4], start=[-1, 0])
    matches bits[0] - 1 and 2 * bits[1] + bits[2]. A random policy earns 1.5 and 7/12; the best, 3 and 2."""

    def __init__(self, action_space):
        self.action_space, self.observation_space = action_space, gym.spaces.Box(0.0, 1.0, (3,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.bits = self.np_random.integers(0, 2, 3)
        return self.bits.astype(np.float32), {}

    def step(self, action):
        assert self.action_space.contains(np.asarray(action, self.action_space.dtype)), action
        if isinstance(self.action_space, gym.spaces.MultiBinary):
            reward = float((np.asarray(action) == self.bits).sum())
        else:
            reward = float(action[0] == self.bits[0] - 1) + float(action[1] == 2 * self.bits[1] + self.bits[2])
        return self.bits.astype(np.float32), reward, True, False, {}


MULTI_DISCRETE = gym.spaces.MultiDiscrete([3, 4], start=[-1, 0])
gym.register("test/ContextMultiDiscrete-v0", entry_point=ContextEnv, kwargs={"action_space": MULTI_DISCRETE})
gym.register("test/ContextMultiBinary-v0", entry_point=ContextEnv, kwargs={"action_space": gym.spaces.MultiBinary(3)})
MASKED_SPACES = {"Discrete": gym.spaces.Discrete(3), "MultiDiscrete": gym.spaces.MultiDiscrete([3, 2], start=[-1, 0]),
                 "MultiBinary": gym.spaces.MultiBinary(2)}
for convention in ("info", "observation", "method"):
    for name, space in MASKED_SPACES.items():
        gym.register(f"test/Masked{name}-{convention}-v0", entry_point=MaskMethodEnv if convention == "method" else MaskedEnv,
                     kwargs={"action_space": space, "convention": convention})
gym.register("test/MaskedMultiDiscrete34-v0", entry_point=MaskedEnv, kwargs={"action_space": MULTI_DISCRETE})
gym.register("test/MaskedLoose-v0", entry_point=MaskedEnv, kwargs={"strict": False})
gym.register("test/EmptyMask-v0", entry_point=MaskedEnv, kwargs={"empty_at": 300})
gym.register("test/EmptyMaskMultiDiscrete-v0", entry_point=MaskedEnv, kwargs={"empty_at": 300, "action_space": MULTI_DISCRETE})
gym.register("test/WrongMaskSize-v0", entry_point=MaskedEnv, kwargs={"mask_size": 5})
gym.register("test/TupleActions-v0", entry_point=SpacesEnv,
             kwargs={"observation_space": BOX2, "action_space": gym.spaces.Tuple((gym.spaces.Discrete(2), BOX2))})

BAD_REWARD_AT = 300  # the real step of each sub-env whose reward is NaN
for suffix, box in (("", False), ("Box", True)):
    gym.register(f"test/ConstantTruncated{suffix}-v0", entry_point=ConstantRewardEnv, max_episode_steps=20, kwargs={"box_actions": box})
    gym.register(f"test/ConstantTerminated{suffix}-v0", entry_point=ConstantRewardEnv, kwargs={"terminate_after": 20, "box_actions": box})
    gym.register(f"test/Endless{suffix}-v0", entry_point=ConstantRewardEnv, kwargs={"box_actions": box})  # no time limit
    gym.register(f"test/NanReward{suffix}-v0", entry_point=ConstantRewardEnv, max_episode_steps=20,
                 kwargs={"bad_reward_at": BAD_REWARD_AT, "box_actions": box})
    gym.register(f"test/FailingClose{suffix}-v0", entry_point=ConstantRewardEnv, max_episode_steps=20,
                 kwargs={"close_fails": True, "box_actions": box})
    gym.register(f"test/HugeReward{suffix}-v0", entry_point=ConstantRewardEnv, max_episode_steps=20,
                 kwargs={"bad_reward_at": 1, "bad_reward": 1e30, "box_actions": box})
gym.register("test/CountingTruncated-v0", entry_point=ConstantRewardEnv, max_episode_steps=20, kwargs={"count_steps": True})
gym.register("test/Crashing-v0", entry_point=ConstantRewardEnv, max_episode_steps=20, kwargs={"crash_at": 300})
gym.register("test/HangingReset-v0", entry_point=ConstantRewardEnv, max_episode_steps=20, kwargs={"hang_in_reset": True})
gym.register("test/EmptyMaskLoose-v0", entry_point=MaskedEnv, kwargs={"empty_at": 300, "strict": False})
for suffix, box in (("", False), ("Box", True)):
    gym.register(f"test/Exiting{suffix}-v0", entry_point=ConstantRewardEnv, max_episode_steps=20,
                 kwargs={"exit_at": 300, "box_actions": box})
gym.register("test/CrashingBox-v0", entry_point=ConstantRewardEnv, max_episode_steps=20, kwargs={"crash_at": 300, "box_actions": True})
for suffix, box in (("", False), ("Box", True)):
    gym.register(f"test/Hanging{suffix}-v0", entry_point=ConstantRewardEnv, max_episode_steps=20,
                 kwargs={"hang_at": 300, "box_actions": box})
    gym.register(f"test/ShapeShifting{suffix}-v0", entry_point=ConstantRewardEnv,
                 kwargs={"terminate_after": 20, "final_shape": (2,), "box_actions": box})
    gym.register(f"test/RenderFails{suffix}-v0", entry_point=RenderFailsEnv, max_episode_steps=20,
                 kwargs={"box_actions": box})


def broken_renderer():
    """What `import mujoco` raises with MUJOCO_GL=egl on a machine without libEGL."""
    raise AttributeError("'NoneType' object has no attribute 'eglQueryString'")


gym.register("test/BrokenRenderer-v0", entry_point=broken_renderer)


def failing_assertion():
    """An env whose own code fails an assertion while it is made, with no message (FetchReach-v4 under MuJoCo 4)."""
    raise AssertionError


gym.register("test/FailingAssertion-v0", entry_point=failing_assertion)


def constructed_env_id(ppo, name):
    """The constructed env `name` with the action space that script `ppo` takes."""
    return f"test/{name}{'Box' if ppo.__name__ == 'ppo_continuous' else ''}-v0"


SHORT_RUNS = {
    "ppo_discrete": dict(env_id="CartPole-v1", num_envs=4, num_steps=128, num_minibatches=4, update_epochs=4),
    "ppo_continuous": dict(env_id="Pendulum-v1", num_envs=2, num_steps=256, num_minibatches=8, update_epochs=2),
    "ppo_vector_sameStep": dict(env_id="Pendulum-v1", num_envs=2, num_steps=256, num_minibatches=8, update_epochs=2, vectorization_mode="sync"),
}


def short_args(ppo, **overrides):
    """Settings for a run of 1024 steps in two iterations, with a checkpoint after each."""
    return ppo.Args(**{"total_timesteps": 1024, "checkpoint_interval": 1, "cuda": False, **SHORT_RUNS[ppo.__name__], **overrides})


def short_flags(ppo):
    """A run of 1024 steps in two iterations with a checkpoint after each (as short_args), as a command line."""
    flags = ["--total-timesteps", "1024", "--checkpoint-interval", "1", "--no-cuda"]
    for name, value in SHORT_RUNS[ppo.__name__].items():
        flags += [f"--{name.replace('_', '-')}", str(value)]
    return flags


@pytest.fixture(scope="session")
def checkpoints_of_each_script(tmp_path_factory):
    """{script module name: the checkpoint of a 512-step run of that script}, made once for all tests."""
    folder = tmp_path_factory.mktemp("checkpoints")
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        return {ppo.__name__: os.path.abspath(ppo.train(short_args(ppo, total_timesteps=512)))
                for ppo in (ppo_discrete, ppo_continuous, ppo_vector_sameStep)}
    finally:
        os.chdir(cwd)


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Run inside an empty folder, so runs/ and videos/ land there."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def start(path, *flags, cwd, **popen):
    """Start one of the project's scripts or tools (its path in the repository) in its own process, as a user would;
    its output comes back as text, stderr into stdout unless `stderr` is given."""
    popen = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True, **popen}
    return subprocess.Popen([sys.executable, os.path.join(ROOT, path), *flags], cwd=cwd, **popen)


def readme_own_env(folder):
    """Write the README's "Your own environment" file, my_envs.py, into folder; return that README section."""
    section = open(os.path.join(ROOT, "README.md")).read().split("## Your own environment")[1].split("\n## ")[0]
    with open(os.path.join(folder, "my_envs.py"), "w") as file:
        file.write(re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1))
    return section


def run_main(ppo, argv, monkeypatch):
    """main() as `python <script> <argv>` runs it: the exit code or message of its SystemExit (0 if it returns)."""
    monkeypatch.setattr(sys, "argv", [f"{ppo.__name__}.py", *argv])
    try:
        ppo.main()
    except SystemExit as e:
        return e.code
    return 0


def wait_for(condition, timeout=120, interval=0.1):
    """Poll until condition() holds; the test fails after `timeout` seconds."""
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, "timed out"
        time.sleep(interval)


def scalars(run_dir):
    """All TensorBoard scalars of a run folder, as TensorBoard shows them: {tag: [(step, value), ...]}.

    TensorBoard reads a folder's event files in the order their names sort, and a resumed run's file drops what an
    earlier file logged after its purge step. A name ends in the writer's count within its process: a test process
    that passes the 10th or the 100th writer within one second names a later file "...10" and an earlier "...9",
    which sort the wrong way. So the files are read through links named by their second and that count as numbers."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with tempfile.TemporaryDirectory() as in_order:
        for name in os.listdir(run_dir):
            if name.startswith("events.out.tfevents."):
                parts = name.split(".")  # events.out.tfevents.<second>.<host, which may hold dots>.<pid>.<count>
                in_time = f"{int(parts[3]):012d}.{int(parts[-1]):09d}.{parts[-2]}"  # the pid keeps two processes apart
                os.symlink(os.path.abspath(os.path.join(run_dir, name)),
                           os.path.join(in_order, f"events.out.tfevents.{in_time}"))
        events = EventAccumulator(in_order, size_guidance={"scalars": 0, "tensors": 0})
        events.Reload()
        return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def record_fsync_and_replace(monkeypatch):
    """os.fsync and os.replace go on working and are recorded, in order: ("fsync", path) and ("replace", source,
    target), every path absolute (an fsync's from /proc/self/fd)."""
    calls, real_fsync, real_replace = [], os.fsync, os.replace

    def fsync(descriptor):
        calls.append(("fsync", os.readlink(f"/proc/self/fd/{descriptor}")))
        real_fsync(descriptor)

    def replace(source, target):
        calls.append(("replace", os.path.abspath(source), os.path.abspath(target)))
        real_replace(source, target)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return calls

"""Shared helpers: small constructed environments and a way to run a script in-process or as a process."""

import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


class ConstantRewardEnv(gym.Env):
    """Reward 1 every step and the same observation every step; terminates after `terminate_after` steps
    if that is set, else runs until a TimeLimit wrapper truncates it. Optionally emits a bad reward."""

    def __init__(self, terminate_after=None, bad_reward_at=None, bad_reward=float("nan")):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.terminate_after = terminate_after
        self.bad_reward_at = bad_reward_at
        self.bad_reward = bad_reward
        self.steps = 0
        self.total_steps = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.steps += 1
        self.total_steps += 1
        reward = self.bad_reward if self.total_steps == self.bad_reward_at else 1.0
        terminated = self.terminate_after is not None and self.steps >= self.terminate_after
        return np.zeros(1, np.float32), reward, terminated, False, {}


gym.register("test/ConstantTruncated-v0", entry_point=ConstantRewardEnv, max_episode_steps=20)
gym.register("test/ConstantTerminated-v0", entry_point=ConstantRewardEnv, kwargs={"terminate_after": 20})
gym.register("test/NanReward-v0", entry_point=ConstantRewardEnv, max_episode_steps=20, kwargs={"bad_reward_at": 200})
gym.register("test/HugeReward-v0", entry_point=ConstantRewardEnv, max_episode_steps=20, kwargs={"bad_reward_at": 1, "bad_reward": 1e30})


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Run inside an empty folder, so runs/ and videos/ land there."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run_script(script, *flags, cwd, timeout=120):
    """Run one of the project's scripts as a user would, in its own process."""
    return subprocess.run([sys.executable, os.path.join(ROOT, script), *flags], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def scalars(run_dir):
    """All TensorBoard scalars of a run folder: {tag: [(step, value), ...]}."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}

"""Fingerprints of training: a hash of what each script has learned after 8,192 steps, at its defaults and in each
capability (masks, multi-part actions, a Dict with an image, memory with and without sequences, images, categorical
actions in ppo_vector_sameStep.py). Run it before and after a change that must not change what PPO computes: equal
hashes on the same machine mean bit-identical weights, optimizer state, normalization statistics and random state.

    python benchmarks/fingerprint.py            # every case whose packages are installed (MiniGrid, ale-py: skipped)
    python benchmarks/fingerprint.py --only taxi-masks pong

A case's hash covers the model's tensors in their order (not their names), the optimizer, the observation statistics
of a run that normalizes them, the return statistics of a run that scales rewards, and the random state.
"""

import argparse
import contextlib
import hashlib
import importlib.util
import io
import os
import sys
import tempfile

import gymnasium as gym
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT  # noqa: E402

sys.path.insert(0, ROOT)
import ppo_continuous  # noqa: E402
import ppo_discrete  # noqa: E402
import ppo_vector_sameStep  # noqa: E402


class MultiDiscreteCartPole(gym.ActionWrapper):
    """CartPole-v1 with a MultiDiscrete([2, 3]) action (parts of different sizes): the first part pushes the cart."""

    def __init__(self, env):
        super().__init__(env)
        self.action_space = gym.spaces.MultiDiscrete([2, 3])

    def action(self, action):
        return int(action[0])


gym.register("MultiDiscreteCartPole-v1", entry_point=lambda **kwargs: MultiDiscreteCartPole(gym.make("CartPole-v1")))

NOVEL_CARTPOLE, NOVEL_PENDULUM = "benchmarks.novel:CartPoleNoVel-v1", "benchmarks.novel:PendulumNoVel-v1"
SYNC = {"vectorization_mode": "sync"}
# name: (script, settings, the package it needs)
CASES = {
    "discrete": (ppo_discrete, {}, None),
    "continuous": (ppo_continuous, {}, None),
    "continuous-humanoid": (ppo_continuous, {"env_id": "Humanoid-v5"}, None),
    "sameStep": (ppo_vector_sameStep, {}, None),
    "sameStep-humanoid": (ppo_vector_sameStep, {"env_id": "Humanoid-v5", **SYNC}, None),
    "taxi-masks": (ppo_discrete, {"env_id": "Taxi-v4"}, None),
    "multidiscrete": (ppo_discrete, {"env_id": "MultiDiscreteCartPole-v1"}, None),
    "discrete-norm-obs": (ppo_discrete, {"env_id": "MountainCar-v0", "norm_obs": True}, None),
    "minigrid-dict": (ppo_discrete, {"env_id": "minigrid:MiniGrid-Empty-5x5-v0"}, "minigrid"),
    "lstm": (ppo_discrete, {"env_id": NOVEL_CARTPOLE, "recurrent": "lstm", "norm_reward": True}, None),
    "gru-sequences": (ppo_discrete, {"env_id": NOVEL_CARTPOLE, "recurrent": "gru", "norm_reward": True,
                                     "num_minibatches": 4, "sequence_length": 16}, None),
    "continuous-lstm-sequences": (ppo_continuous, {"env_id": NOVEL_PENDULUM, "recurrent": "lstm",
                                                   "sequence_length": 16}, None),
    "continuous-gru": (ppo_continuous, {"env_id": NOVEL_PENDULUM, "recurrent": "gru"}, None),
    "pong": (ppo_discrete, {**ppo_discrete.IMAGE_DEFAULTS, "env_id": "ALE/Pong-v5"}, "ale_py"),
    "carracing": (ppo_continuous, {**ppo_continuous.IMAGE_DEFAULTS, "env_id": "CarRacing-v3"}, None),
    "sameStep-cartpole": (ppo_vector_sameStep, {"env_id": "CartPole-v1", **SYNC}, None),
    "sameStep-taxi-masks": (ppo_vector_sameStep, {"env_id": "Taxi-v4", **SYNC}, None),
    "sameStep-lstm-sequences": (ppo_vector_sameStep, {"env_id": NOVEL_PENDULUM, "recurrent": "lstm",
                                                      "sequence_length": 16, **SYNC}, None),
}


def fingerprint(ppo, settings):
    with contextlib.redirect_stdout(io.StringIO()):
        path = ppo.train(ppo.Args(**{**settings, "total_timesteps": 8192, "cuda": False}))
    checkpoint, digest = torch.load(path, weights_only=True), hashlib.sha256()
    args = checkpoint["args"]
    parts = [list(checkpoint["model"].values()), checkpoint["optimizer"],
             checkpoint["obs_rms"] if args["norm_obs"] else None,  # the statistics only where they are used
             checkpoint["return_rms"] if args["norm_reward"] else None, checkpoint["rng_state"]]
    for part in parts:
        if part is not None:
            buffer = io.BytesIO()
            torch.save(part, buffer)
            digest.update(buffer.getvalue())
    return digest.hexdigest()[:16]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=sorted(CASES), help="these cases only")
    names = parser.parse_args().only or list(CASES)
    os.chdir(tempfile.mkdtemp())
    for name in names:
        ppo, settings, package = CASES[name]
        if package and not importlib.util.find_spec(package):
            print(f"{name}: skipped (pip install {package})", flush=True)
            continue
        print(f"{name} ({ppo.__name__}.py): {fingerprint(ppo, settings)}", flush=True)

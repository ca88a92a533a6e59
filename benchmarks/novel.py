"""rl-baselines3-zoo's "NoVel" envs (issue 68): classic-control and Box2D envs with their velocities zeroed, so that a
policy must infer them from what it saw before (a memory, `--recurrent lstm`). The zeroed entries are the zoo's
(MaskVelocityWrapper): CartPole 1 and 3, Pendulum 2, LunarLander 2, 3 and 5, MountainCar 1. Registered as
`<Name>NoVel-v<version>`:

    python ppo_discrete.py --env-id benchmarks.novel:CartPoleNoVel-v1 --recurrent lstm --total-timesteps 200000
    python ppo_continuous.py --env-id benchmarks.novel:PendulumNoVel-v1 --recurrent lstm --total-timesteps 300000
"""

import gymnasium as gym
import numpy as np

VELOCITIES = {"CartPole-v1": [1, 3], "Pendulum-v1": [2], "LunarLander-v3": [2, 3, 5],
              "LunarLanderContinuous-v3": [2, 3, 5], "MountainCar-v0": [1], "MountainCarContinuous-v0": [1]}


class NoVelocity(gym.ObservationWrapper):
    """The observation with its velocity entries set to 0 (the space unchanged, as the zoo's wrapper leaves it)."""

    def __init__(self, env, indices):
        super().__init__(env)
        self.keep = np.ones(env.observation_space.shape, np.float32)
        self.keep[indices] = 0.0

    def observation(self, observation):
        return (observation * self.keep).astype(observation.dtype)


for env_id, indices in VELOCITIES.items():
    name, version = env_id.split("-v")
    gym.register(f"{name}NoVel-v{version}", entry_point=lambda env_id=env_id, indices=indices, **kwargs: NoVelocity(
        gym.make(env_id, **kwargs), indices))

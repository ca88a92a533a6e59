"""MiniGrid's envs as one flat vector (minigrid.wrappers.FlatObsWrapper: the 7 x 7 x 3 view and the mission's characters
one-hot, as rl-baselines3-zoo trains them), for the scripts as they are today (`pip install minigrid==3.2.0`):

    python ppo_discrete.py --env-id benchmarks.minigrid_flat:FlatDoorKey-5x5-v0 --total-timesteps 100000
"""

import gymnasium as gym
import minigrid  # noqa: F401  registers MiniGrid's envs
from minigrid.wrappers import FlatObsWrapper

for name in ("DoorKey-5x5", "Empty-Random-5x5", "KeyCorridorS3R1", "RedBlueDoors-6x6"):
    gym.register(f"Flat{name}-v0", entry_point=lambda name=name, **kwargs: FlatObsWrapper(
        gym.make(f"MiniGrid-{name}-v0", **kwargs)))

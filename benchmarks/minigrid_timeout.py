"""Screen (issue 80): MiniGrid's time limit reported as the end of the task (terminated, no bootstrap) instead of a
truncation. MiniGrid's reward, 1 - 0.9 * steps / max_steps, is a function of the limit, so the limit is part of the task.

    python ppo_discrete.py --env-id benchmarks.minigrid_timeout:TimeoutRedBlueDoors-6x6-v0
"""

import gymnasium as gym
import minigrid  # noqa: F401  registers MiniGrid's envs


class TimeLimitEndsTask(gym.Wrapper):
    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated or truncated, False, info


for name in ("DoorKey-5x5", "Empty-Random-5x5", "KeyCorridorS3R1", "RedBlueDoors-6x6"):
    gym.register(f"Timeout{name}-v0", entry_point=lambda name=name, **kwargs: TimeLimitEndsTask(
        gym.make(f"MiniGrid-{name}-v0", **kwargs)))

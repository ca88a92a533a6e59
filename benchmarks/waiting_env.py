"""An environment that waits about 1 ms in every step, like a simulator behind a socket.

The scripts reach it as `--env-id benchmarks.waiting_env:WaitingPendulum-v0` (gymnasium imports the
module, which registers the env) when the repository root is on PYTHONPATH.
"""

import time

import gymnasium as gym


class Waiting(gym.Wrapper):
    def __init__(self, env, seconds=0.001):
        super().__init__(env)
        self.seconds = seconds

    def step(self, action):
        time.sleep(self.seconds)  # waiting on I/O holds no CPU: separate processes can wait at the same time
        return self.env.step(action)


gym.register("WaitingPendulum-v0", entry_point=lambda **kwargs: Waiting(gym.make("Pendulum-v1", **kwargs)))  # Pendulum truncates at 200

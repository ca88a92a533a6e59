"""sb3-contrib's MaskablePPO at its defaults, the peer of ppo_discrete.py's action masks (issue 67's Taxi-v4 target).
The env's mask reaches it through sb3-contrib's ActionMasker, read from the info the env last gave (gymnasium's
`info["action_mask"]` convention, as ppo_discrete.py reads it). Prints the mean return of the last 100 episodes at the
given step counts.

    pip install -r requirements.txt -r benchmarks/requirements.txt
    python benchmarks/maskable_ppo.py --env-id Taxi-v4 --total-timesteps 200000 --seed 1
"""

import argparse
import time

import gymnasium as gym
import numpy as np
from sb3_contrib import MaskablePPO
from sb3_contrib.common.wrappers import ActionMasker
from stable_baselines3.common.monitor import Monitor


class LastInfoMask(gym.Wrapper):
    """Keeps the `action_mask` of the last info (reset or step), for ActionMasker to hand to MaskablePPO."""

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self.mask = info["action_mask"]
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.mask = info["action_mask"]
        return obs, reward, terminated, truncated, info


def last_100_at(lengths, returns, steps):
    """The mean return of the last 100 episodes that ended by `steps` environment steps."""
    ended = np.cumsum(lengths) <= steps
    return float(np.mean(np.asarray(returns)[ended][-100:])) if ended.any() else float("nan")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--env-id", default="Taxi-v4")
    parser.add_argument("--total-timesteps", type=int, default=200000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--n-steps", type=int, default=2048, help="steps per rollout (sb3's default, 2048)")
    parser.add_argument("--report-at", type=int, nargs="*", default=[50000, 100000, 200000])
    cli = parser.parse_args()
    start = time.time()

    env = ActionMasker(Monitor(LastInfoMask(gym.make(cli.env_id))), lambda env: env.get_wrapper_attr("mask"))
    model = MaskablePPO("MlpPolicy", env, n_steps=cli.n_steps, seed=cli.seed, device="cpu")
    model.learn(total_timesteps=cli.total_timesteps)
    monitor = env.env
    lengths, returns = monitor.get_episode_lengths(), monitor.get_episode_rewards()
    print(f"{cli.env_id} MaskablePPO seed {cli.seed}: last-100 mean " +
          ", ".join(f"{last_100_at(lengths, returns, s):.2f} at {s:,}" for s in cli.report_at))
    print(f"episodes {len(returns)}, {time.time() - start:.0f} s")

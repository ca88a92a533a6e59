"""A floor for trained many-agent policies: the return of uniformly random actions in a PettingZoo game, per role.

    python benchmarks/random_policy.py mpe2.simple_tag_v3 --episodes 100
    python benchmarks/random_policy.py mpe2.simple_speaker_listener_v4 --env-kwargs '{"continuous_actions": true}'

Each agent takes, at each step, a uniformly random action among its own (Discrete and MultiDiscrete: of those its mask
allows; Box: uniform within its bounds), in the game as ppo_discrete.py (ppo_continuous.py for Box actions) makes it.
Prints each role's mean episodic return per agent (a role: an agent's name up to its last "_") and the pooled one,
the numbers charts/episodic_return/<role> and charts/episodic_return log for a trained run.
"""

import argparse
import os
import sys

import gymnasium as gym
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import ppo_continuous  # noqa: E402
import ppo_discrete  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("env_id", help="a module with parallel_env(), e.g. mpe2.simple_tag_v3")
    parser.add_argument("--env-kwargs", default="{}", help="JSON keyword arguments of parallel_env()")
    parser.add_argument("--episodes", type=int, default=100, help="games to play (default 100)")
    parser.add_argument("--seed", type=int, default=1)
    options = parser.parse_args()
    rng = np.random.default_rng(options.seed)
    ppo = ppo_discrete
    game = ppo_discrete.make_game(ppo_discrete.Args(env_id=options.env_id, env_kwargs=options.env_kwargs))
    if isinstance(game.action_space(game.possible_agents[0]), gym.spaces.Box):
        ppo = ppo_continuous
    game.close()
    envs = ppo.ManyAgents(ppo.Args(env_id=options.env_id, env_kwargs=options.env_kwargs), 1)
    _, infos = envs.reset(seed=options.seed)
    returns, games = {}, 0
    while games < options.episodes:
        space = envs.single_action_space
        if isinstance(space, gym.spaces.Box):
            actions = rng.uniform(space.low, space.high, (envs.num_envs,) + space.shape).astype(np.float32)
        else:
            parts = ppo_discrete.action_parts(space)
            masks = infos.get("action_mask", np.ones((envs.num_envs, sum(parts)), dtype=bool)).astype(bool)
            starts = np.cumsum(parts) - parts
            actions = np.array([[rng.choice(np.flatnonzero(mask[start:start + n])) for start, n in zip(starts, parts)]
                                for mask in masks])
            actions = actions[:, 0] if isinstance(space, gym.spaces.Discrete) else actions
        _, _, _, _, infos = envs.step(actions)
        roles = infos.get("role", np.array(["all"] * envs.num_envs))
        for column in np.flatnonzero(infos.get("_episode", [])):
            returns.setdefault(roles[column], []).append(infos["episode"]["r"][column])
        games += int(infos.get("_team_episode", np.zeros(1, bool)).any())
    envs.close()
    pooled = [r for role_returns in returns.values() for r in role_returns]
    print(f"{options.env_id}, random actions, {games} games (seed {options.seed}): return per agent "
          f"{np.mean(pooled):.2f} ± {np.std(pooled):.2f}")
    for role, role_returns in returns.items():
        print(f"  {role}: {np.mean(role_returns):.2f} ± {np.std(role_returns):.2f} ({len(role_returns)} episodes)")


if __name__ == "__main__":
    main()

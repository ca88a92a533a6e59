"""RedBlueDoors-6x6 (issue 80): what a trained ppo_discrete.py run does at the doors. Plays the run's final checkpoint
(sampled actions, as in training) and reports, for the steps where the agent faces a door, the mean probability of
the toggle action, by the door's colour and whether the red door is open; and how the episodes ended.

    python benchmarks/door_policy.py benchmark_runs/rbd_defaults_1m/ppo_discrete__minigrid-MiniGrid-RedBlueDoors-6x6-v0__13 --episodes 60
"""

import argparse
import collections
import glob
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import ppo_discrete  # noqa: E402

TOGGLE = 5  # MiniGrid's actions: left, right, forward, pickup, drop, toggle, done

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("run_folder", help="a folder holding the run's checkpoint.pt (searched below it)")
    parser.add_argument("--episodes", type=int, default=60)
    parser.add_argument("--seed", type=int, default=5, help="seed of the env's first reset")
    cli = parser.parse_args()
    checkpoint_path = glob.glob(os.path.join(cli.run_folder, "**", "checkpoint.pt"), recursive=True)[0]
    sys.argv = ["ppo_discrete.py", "--eval-checkpoint", checkpoint_path, "--eval-sample",
                "--env-id", "minigrid:MiniGrid-RedBlueDoors-6x6-v0"]
    args, checkpoint = ppo_discrete.parse_args()
    torch.manual_seed(cli.seed)  # the sampled actions: same seed, same report
    envs = ppo_discrete.make_envs(args, 1, os.devnull, args.seed, film_first=0, training=False)
    agent = ppo_discrete.Agent(envs, args)
    ppo_discrete.restore(checkpoint, {"model": agent}, args.env_id)
    wrapped = envs
    while not hasattr(wrapped, "envs"):  # down to gymnasium's vector env, then its one MiniGrid env
        wrapped = wrapped.env
    grid_env = wrapped.envs[0].unwrapped
    toggle_probs, endings = collections.defaultdict(list), collections.Counter()
    next_obs, _ = envs.reset(seed=cli.seed)
    dtype = ppo_discrete.buffer_dtype(envs.single_observation_space)
    while sum(endings.values()) < cli.episodes:
        with torch.no_grad():
            hidden, _ = agent.remember(torch.from_numpy(next_obs[None].astype(dtype)), agent.initial_state(1))
            logits = agent.actor(hidden)
            probs = torch.softmax(logits.reshape(-1), 0).numpy()
            action = agent.policy(hidden)[0]
        front = grid_env.grid.get(*grid_env.front_pos)
        if front is not None and front.type == "door":
            red = "open" if grid_env.red_door.is_open else "closed"
            toggle_probs[f"facing the {front.color} door, red {red}"].append(probs[TOGGLE])
        next_obs, reward, terminated, truncated, _ = envs.step(ppo_discrete.env_actions(envs, action.numpy()))
        if terminated[0] or truncated[0]:
            endings["win" if reward[0] > 0 else "blue first" if terminated[0] else "time out"] += 1
            next_obs, _ = envs.reset()
    print(f"{cli.run_folder}: {dict(endings)}")
    for where, probs in sorted(toggle_probs.items()):
        print(f"  {where}: P(toggle) {np.mean(probs):.3f} over {len(probs)} steps")

"""The every-env table (issue 89): each env gymnasium ships, trained by the bare command of the script that takes it.

    python benchmarks/every_env.py benchmark_runs/every_env_discrete benchmark_runs/every_env_box

Reads the runs that benchmarks/run.py wrote under the folders given (their result.json: the mean return of each run's
last 100 training episodes) and prints, per env, the mean and spread over its seeds, how many runs end below the line,
and the reference. The line is three quarters of the reference, or for a negative reference (a cost) 4/3 of it: a
run below it falls short. A reference is the best published PPO number (its source, steps
and metric beside it) or, for the tabular envs, the optimum, computed here by value iteration over the env's own
transition table within its time limit (10,000 steps where it has none; Blackjack-v1 by dynamic programming over
its infinite deck).
    python benchmarks/every_env.py --optimum FrozenLake-v1 FrozenLake8x8-v1 CliffWalking-v1 Taxi-v4 Blackjack-v1

The run folders are not committed, and a table that takes several sessions outlives them: --record keeps every run
counted in a CSV (env id, script, seed, final return, source: the folder and the day, or the results section a row
was copied from by hand) that the next call reads back before the folders, a folder's run taking the place of the
record's for its env and seed (the same seed trained again on newer code).
    python benchmarks/every_env.py benchmark_runs/every_env_box --record benchmarks/results/every_env/runs.csv

An env of EVALUATED counts another return: its runs' last 100 training episodes are too few for its line, so each
run's checkpoint plays that many episodes (the script's --eval-checkpoint, deterministic) and their mean counts.
"""

import argparse
import csv
import datetime
import glob
import json
import os
import subprocess
import sys
from functools import lru_cache

import numpy as np

# env id: (the script whose bare command trains it, the reference return or None for the optimum, where it comes from)
# Tianshou's MuJoCo numbers: the highest point over its first 1M steps of its 10 seeds' mean test return (a test every
# 30,720 steps of 10 episodes, actions sampled: its PPO had no deterministic evaluation before April 2021)
ENVS = {
    "CartPole-v1": ("ppo_discrete.py", 500.0, "the optimum (the time limit)"),
    "Acrobot-v1": ("ppo_discrete.py", -73.5, "rl-baselines3-zoo, 1M, deterministic evaluation"),
    "MountainCar-v0": ("ppo_discrete.py", -110.4, "rl-baselines3-zoo, 1M, deterministic evaluation"),
    "MountainCarContinuous-v0": ("ppo_continuous.py", 88.3, "rl-baselines3-zoo (gSDE), 20k, deterministic"),
    "Pendulum-v1": ("ppo_continuous.py", -172.2, "rl-baselines3-zoo (gSDE), 100k, deterministic"),
    "LunarLander-v3": ("ppo_discrete.py", 242.1, "rl-baselines3-zoo (v2), 1M, deterministic"),
    "LunarLanderContinuous-v3": ("ppo_continuous.py", 270.9, "rl-baselines3-zoo (v2), 1M, deterministic"),
    "BipedalWalker-v3": ("ppo_continuous.py", 287.9, "rl-baselines3-zoo, 5M, deterministic"),
    "BipedalWalkerHardcore-v3": ("ppo_continuous.py", 122.4, "rl-baselines3-zoo, 100M (none at 1M)"),
    "CarRacing-v3": ("ppo_continuous.py", 153.9, "rl-baselines3-zoo (v0), 4M, deterministic"),
    "Blackjack-v1": ("ppo_discrete.py", None, "the optimum (basic strategy)"),
    "CliffWalking-v1": ("ppo_discrete.py", None, "the optimum"),
    "CliffWalkingSlippery-v1": ("ppo_discrete.py", None, "the optimum"),
    "FrozenLake-v1": ("ppo_discrete.py", None, "the optimum within 100 steps"),
    "FrozenLake8x8-v1": ("ppo_discrete.py", None, "the optimum within 200 steps"),
    "Taxi-v4": ("ppo_discrete.py", None, "the optimum (mean over the starts)"),
    "Ant-v5": ("ppo_continuous.py", 3258.4, "Tianshou (v3), 1M, best test return over training, sampled"),
    "HalfCheetah-v5": ("ppo_continuous.py", 5819.1, "rl-baselines3-zoo (v3), 1M, deterministic"),
    "Hopper-v5": ("ppo_continuous.py", 2609.3, "Tianshou (v3), 1M, best test return over training, sampled"),
    "Humanoid-v5": ("ppo_continuous.py", 787.1, "Tianshou (v3), 1M, best test return over training, sampled"),
    "HumanoidStandup-v5": ("ppo_continuous.py", 109325.9, "CleanRL (v4), 8M (none at 1M), last 100 episodes"),
    "InvertedDoublePendulum-v5": ("ppo_continuous.py", 9231.3,
                                  "Tianshou (v3), 1M, best test return over training, sampled"),
    "InvertedPendulum-v5": ("ppo_continuous.py", 1000.0, "the optimum (the time limit)"),
    "Pusher-v5": ("ppo_continuous.py", -40.4, "CleanRL (v4), 1M, last 100 episodes"),
    "Reacher-v5": ("ppo_continuous.py", -4.1, "Tianshou (v3), 1M, best test return over training, sampled"),
    "Swimmer-v5": ("ppo_continuous.py", 281.6, "rl-baselines3-zoo (v3, gamma 0.9999), 1M, deterministic"),
    "Walker2d-v5": ("ppo_continuous.py", 3588.5, "Tianshou (v3), 1M, best test return over training, sampled"),
}
# envs whose reference no peer's PPO reaches at 1M steps (issue 89: said so with their numbers, not tuned); not
# HumanoidStandup-v5, whose bare runs here pass CleanRL's 8M number at 1M
OUT_OF_REACH = {"BipedalWalkerHardcore-v3"}
# env id: the episodes each run's checkpoint plays (a Blackjack hand's return has a std near 0.95: 100 episodes give a
# standard error of 0.095 against a line 0.015 below the optimum, 10,000 one of 0.0095)
EVALUATED = {"Blackjack-v1": 10_000}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINE = 0.75  # a run below three quarters of a positive reference falls short, or beyond 4/3 of a negative one's cost


def tabular_optimum(env_id, horizon_without_limit=10_000):
    """The best expected return from the env's start states within its time limit, by value iteration over its
    transition table (env.unwrapped.P: state -> action -> [(probability, next state, reward, terminated)])."""
    import gymnasium as gym

    env = gym.make(env_id)
    table, starts = env.unwrapped.P, env.unwrapped.initial_state_distrib
    horizon = env.spec.max_episode_steps or horizon_without_limit
    num_states, num_actions = len(table), len(table[0])
    rewards = np.zeros((num_states, num_actions))  # the expected reward of each (state, action)
    going_on = np.zeros((num_states, num_actions, num_states))  # the probability of each next state that goes on
    for state, actions in table.items():
        for action, outcomes in actions.items():
            for probability, next_state, reward, terminated in outcomes:
                rewards[state, action] += probability * reward
                going_on[state, action, next_state] += 0.0 if terminated else probability
    values = np.zeros(num_states)  # the best return with the steps left so far
    for _ in range(horizon):
        values = (rewards + going_on @ values).max(axis=1)
    return float(np.dot(starts, values))


def blackjack_optimum():
    """Blackjack-v1 as gymnasium deals it (cards drawn with replacement, the dealer stands from 17, a natural pays as
    a win): the expected return of the best hit-or-stick policy, by dynamic programming over the player's hand."""
    cards = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 10, 10, 10]

    def score(total, ace):
        return total + 10 if ace and total + 10 <= 21 else total

    @lru_cache(maxsize=None)
    def dealer(total, ace):  # {final score (22 = bust): probability}, the dealer drawing from (total, ace)
        if score(total, ace) >= 17:
            return {score(total, ace) if total <= 21 else 22: 1.0}
        outcome = {}
        for card in cards:
            for final, p in dealer(total + card, ace or card == 1).items():
                outcome[final] = outcome.get(final, 0.0) + p / len(cards)
        return outcome

    def stick(player, up):
        outcome = dealer(up, up == 1)
        return sum(p * (1.0 if final == 22 or player > final else 0.0 if player == final else -1.0)
                   for final, p in outcome.items())

    @lru_cache(maxsize=None)
    def best(total, ace, up):  # the best expected return holding (total, ace) against the dealer's up card
        if total > 21:
            return -1.0
        hit = sum(best(total + card, ace or card == 1, up) for card in cards) / len(cards)
        return max(stick(score(total, ace), up), hit)

    expected = 0.0
    for a in cards:
        for b in cards:
            for up in cards:
                expected += best(a + b, a == 1 or b == 1, up) / len(cards) ** 3
    return expected


def optimum(env_id):
    return blackjack_optimum() if env_id == "Blackjack-v1" else tabular_optimum(env_id)


def evaluated_return(run_folder, script, episodes):
    """The mean return of a run's checkpoint over `episodes` episodes of the script's evaluation (most probable
    actions), read from its line per episode ("episode 7: return -1.00, 2 steps")."""
    checkpoints = glob.glob(os.path.join(run_folder, "runs", "*", "checkpoint.pt"))
    if len(checkpoints) != 1:
        sys.exit(f"error: {run_folder} holds {len(checkpoints)} checkpoints under runs/: one is evaluated")
    checkpoint = os.path.abspath(checkpoints[0])  # the evaluation runs in the run's folder
    command = [sys.executable, os.path.join(ROOT, script), "--eval-checkpoint", checkpoint, "--eval-episodes",
               str(episodes)]
    played = subprocess.run(command, cwd=run_folder, capture_output=True, text=True)
    if played.returncode != 0:
        sys.exit(f"error: evaluating {checkpoint} failed:\n{played.stdout[-2000:]}{played.stderr[-2000:]}")
    returns = [float(line.split(" return ")[1].split(",")[0]) for line in played.stdout.splitlines()
               if line.startswith("episode ")]
    return float(np.mean(returns))


def read_record(path):
    """The runs of a --record CSV: env id -> {seed: (final return, source)}."""
    runs = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            runs.setdefault(row["env_id"], {})[int(row["seed"])] = (float(row["final_return"]), row["source"])
    return runs


def write_record(path, runs):
    """Every run counted, an env's rows in the table's order and its seeds in order."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["env_id", "script", "seed", "final_return", "source"])
        for env_id in ENVS:
            for seed, (final, source) in sorted(runs.get(env_id, {}).items()):
                out.writerow([env_id, ENVS[env_id][0], seed, round(final, 4), source])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folders", nargs="*", help="folders of benchmarks/run.py's runs")
    parser.add_argument("--optimum", nargs="+", metavar="ENV_ID", help="print the optimum of these tabular envs")
    parser.add_argument("--record", metavar="CSV", help="a CSV of the runs counted so far: read first, then rewritten")
    parser.add_argument("--eval-episodes", type=int, metavar="N", help="the episodes of EVALUATED's checkpoints "
                        f"(default: each env's, {EVALUATED})")
    cli = parser.parse_args()
    if cli.optimum:
        for env_id in cli.optimum:
            print(f"{env_id}: optimum {optimum(env_id):.4f}")
        return
    runs = read_record(cli.record) if cli.record and os.path.exists(cli.record) else {}  # env id -> {seed: ...}
    found_in = {}  # (env id, seed) -> the folder it was found in
    for folder in cli.folders:
        for path in glob.glob(os.path.join(folder, "*", "result.json")):
            result = json.load(open(path))
            key = (result["env_id"], result["seed"])
            if result["status"] != "finished" or result["script"] != ENVS.get(key[0], ("",))[0]:
                continue
            if key in found_in:  # two commands' runs of one seed (a screen's flags beside the bare command's)
                sys.exit(f"error: {key[0]} seed {key[1]} is in {found_in[key]} and in {folder}: "
                         "give one command's runs")
            found_in[key] = folder
            final = result["final_return"]
            if key[0] in EVALUATED:
                episodes = cli.eval_episodes or EVALUATED[key[0]]
                final = evaluated_return(os.path.dirname(path), result["script"], episodes)
            runs.setdefault(key[0], {})[key[1]] = (final, f"{folder} {datetime.date.today()}")
    if cli.record:
        write_record(cli.record, runs)
    print("| env | script | seeds | mean ± std | below the line | the line | reference |")
    print("|---|---|---|---|---|---|---|")
    for env_id, (script, reference, source) in ENVS.items():
        if env_id not in runs:
            continue
        reference = optimum(env_id) if reference is None else reference
        seeds = sorted(runs[env_id])
        returns = np.array([runs[env_id][seed][0] for seed in seeds])
        line = LINE * reference if reference > 0 else reference / LINE
        below = f"{int((returns < line).sum())} of {len(returns)}"
        if env_id in OUT_OF_REACH:
            below += ", out of reach at 1M"
        digits = 3 if abs(reference) < 10 else 1  # FrozenLake's 0.744, Blackjack's -0.047
        if env_id in EVALUATED:
            source += f"; each run's checkpoint over {cli.eval_episodes or EVALUATED[env_id]:,} episodes"
        print(f"| {env_id} | {script} | {','.join(map(str, seeds))} | {returns.mean():.{digits}f} ± "
              f"{returns.std():.{digits}f} | {below} | {line:.{digits}f} | {reference:.{digits}f}: "
              f"{source} |")


if __name__ == "__main__":
    sys.exit(main())

"""Whole-process speed: this project's scripts against Stable-Baselines3 PPO with identical settings.

Each run is a separate process, timed from start to exit (imports, env creation and the whole
training), and the two contenders alternate (A B A B ...) so that drift of a shared machine hits
both alike. Prints steps per second for every run, the medians and the ratio; `--env-alone` also
times the same vector env stepping random actions with no learner, as the ceiling.

    pip install -r requirements.txt -r benchmarks/requirements.txt
    python benchmarks/speed.py --case cartpole --total-timesteps 500000 --repeats 3
    python benchmarks/speed.py --case humanoid --total-timesteps 100000 --repeats 2 --env-alone
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# case -> (env id, our script, extra SB3 flags); both sides use the script's default hyperparameters.
CASES = {
    "cartpole": ("CartPole-v1", "ppo_discrete.py", []),
    "hopper": ("Hopper-v5", "ppo_continuous.py", ["--continuous"]),
    "humanoid": ("Humanoid-v5", "ppo_continuous.py", ["--continuous"]),
}


def timed_run(command, workdir):
    start = time.perf_counter()
    result = subprocess.run([sys.executable] + command, cwd=workdir, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"failed: {' '.join(command)}\n{result.stderr[-2000:]}")
    return time.perf_counter() - start


def env_alone_sps(env_id, total_timesteps, seed):
    """The vector env our scripts build (one sub-env, episode statistics), stepping random actions."""
    import gymnasium as gym

    envs = gym.wrappers.vector.RecordEpisodeStatistics(gym.vector.SyncVectorEnv([lambda: gym.make(env_id)]))
    envs.reset(seed=seed)
    envs.action_space.seed(seed)
    start = time.perf_counter()
    for _ in range(total_timesteps):
        envs.step(envs.action_space.sample())
    return total_timesteps / (time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=sorted(CASES), default="cartpole")
    parser.add_argument("--total-timesteps", type=int, default=500000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--env-alone", action="store_true", help="also time the env alone with random actions")
    cli = parser.parse_args()

    env_id, script, sb3_flags = CASES[cli.case]
    common = ["--env-id", env_id, "--total-timesteps", str(cli.total_timesteps), "--seed", str(cli.seed)]
    commands = {
        "ours": [os.path.join(ROOT, script), "--checkpoint-interval", "0", *common],
        "sb3": [os.path.join(ROOT, "benchmarks", "sb3_ppo.py"), *sb3_flags, *common],
    }
    sps = {name: [] for name in commands}
    with tempfile.TemporaryDirectory() as workdir:  # runs/ of the timed runs go here, not into the repository
        for repeat in range(cli.repeats):
            for name, command in commands.items():
                elapsed = timed_run(command, workdir)
                sps[name].append(cli.total_timesteps / elapsed)
                print(f"{env_id} repeat {repeat + 1} {name}: {elapsed:.1f} s, {sps[name][-1]:,.0f} SPS", flush=True)
    ours, sb3 = statistics.median(sps["ours"]), statistics.median(sps["sb3"])
    print(f"{env_id}: {script} {ours:,.0f} SPS, SB3 {sb3:,.0f} SPS (medians of {cli.repeats}), ratio {ours / sb3:.2f}x, {os.cpu_count()} cores")
    if cli.env_alone:
        alone = env_alone_sps(env_id, min(cli.total_timesteps, 50000), cli.seed)
        print(f"{env_id}: env alone with random actions {alone:,.0f} SPS; {script} runs at {ours / alone:.0%} of it")


if __name__ == "__main__":
    main()

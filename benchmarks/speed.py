"""Whole-process speed: this project's scripts against Stable-Baselines3 PPO with identical settings.

Each run is a separate process, timed from start to exit (imports, env creation and the whole
training), and the two contenders alternate (A B A B ...) so that drift of a shared machine hits
both alike. Prints steps per second for every run, the medians, and the ratio.

    pip install -r requirements.txt -r benchmarks/requirements.txt
    python benchmarks/speed.py --case cartpole --total-timesteps 500000 --repeats 3
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# case -> (env id, command of ours, command of SB3); both get --total-timesteps and --seed appended.
CASES = {
    "cartpole": (
        "CartPole-v1",
        [os.path.join(ROOT, "ppo_discrete.py"), "--env-id", "CartPole-v1", "--checkpoint-interval", "0"],
        [os.path.join(ROOT, "benchmarks", "sb3_ppo.py"), "--env-id", "CartPole-v1"],
    ),
}


def timed_run(command, total_timesteps, seed, workdir):
    command = [sys.executable] + command + ["--total-timesteps", str(total_timesteps), "--seed", str(seed)]
    start = time.perf_counter()
    result = subprocess.run(command, cwd=workdir, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(f"failed: {' '.join(command)}\n{result.stderr[-2000:]}")
    return elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=sorted(CASES), default="cartpole")
    parser.add_argument("--total-timesteps", type=int, default=500000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    cli = parser.parse_args()

    env_id, ours, sb3 = CASES[cli.case]
    sps = {"ours": [], "sb3": []}
    with tempfile.TemporaryDirectory() as workdir:  # runs/ and logs of the timed runs go here, not into the repo
        for repeat in range(cli.repeats):
            for name, command in (("ours", ours), ("sb3", sb3)):
                elapsed = timed_run(command, cli.total_timesteps, cli.seed, workdir)
                sps[name].append(cli.total_timesteps / elapsed)
                print(f"{env_id} repeat {repeat + 1} {name}: {elapsed:.1f} s, {sps[name][-1]:,.0f} SPS", flush=True)
    ours_median, sb3_median = statistics.median(sps["ours"]), statistics.median(sps["sb3"])
    print(f"{env_id}: ours {ours_median:,.0f} SPS, SB3 {sb3_median:,.0f} SPS (medians of {cli.repeats}), ratio {ours_median / sb3_median:.2f}x, {os.cpu_count()} cores")


if __name__ == "__main__":
    main()

"""Learning benchmark: run a script over several seeds and report how fast and how well it learns.

For every seed: the first global step (and wall time since the process started) at which the mean
return of the last `--window` episodes reaches `--threshold`, and the mean return of the last 100
episodes at the end. Runs go one after another so that wall times are not shared between runs.

    python benchmarks/learning.py --script ppo_discrete.py --env-id CartPole-v1 --seeds 1 2 3 --threshold 475
"""

import argparse
import glob
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, read_run  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--script", default="ppo_discrete.py")
    parser.add_argument("--env-id", default="CartPole-v1")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--total-timesteps", type=int, default=None, help="default: the script's own default")
    parser.add_argument("--threshold", type=float, default=None, help="return to reach (mean of the last --window episodes)")
    parser.add_argument("--window", type=int, default=20)
    parser.add_argument("--runs-dir", default="benchmark_runs", help="working folder; the runs' TensorBoard logs stay in its runs/")
    cli, script_flags = parser.parse_known_args()  # anything else is passed on to the script

    os.makedirs(cli.runs_dir, exist_ok=True)
    rows = []
    for seed in cli.seeds:
        exp_name = f"learning_{int(time.time())}"
        command = [sys.executable, os.path.join(ROOT, cli.script), "--env-id", cli.env_id, "--seed", str(seed),
                   "--exp-name", exp_name, "--checkpoint-interval", "0", *script_flags]
        if cli.total_timesteps:
            command += ["--total-timesteps", str(cli.total_timesteps)]
        start = time.time()
        result = subprocess.run(command, cwd=cli.runs_dir, capture_output=True, text=True)
        wall = time.time() - start
        if result.returncode != 0:
            sys.exit(f"seed {seed} failed:\n{result.stderr[-2000:]}")
        run_dir = glob.glob(os.path.join(cli.runs_dir, "runs", f"*__{exp_name}__{seed}__*"))[0]
        logged = read_run(run_dir)
        returns = logged["returns"]
        reached_step, reached_time = None, None
        if cli.threshold is not None:
            for i in range(cli.window - 1, len(returns)):
                if returns[i - cli.window + 1 : i + 1].mean() >= cli.threshold:
                    reached_step, reached_time = logged["steps"][i], logged["wall_times"][i] - start
                    break
        rows.append((seed, reached_step, reached_time, logged["final_return"], logged["steps"][-1], wall))
        reached = f"{reached_step:,} steps, {reached_time:.0f} s" if reached_step else "not reached"
        print(f"seed {seed}: threshold {reached if cli.threshold is not None else 'none'}; last-100 mean {rows[-1][3]:.1f} at {rows[-1][4]:,} steps; run {wall:.0f} s", flush=True)

    finals = np.array([row[3] for row in rows])
    reach_header = f" steps to reach {cli.threshold:g} (last {cli.window}) | wall time to reach |" if cli.threshold is not None else ""
    print(f"\n| seed |{reach_header} last-100 mean at end | steps | run wall time |")
    print("|---|" + ("---|---|" if reach_header else "") + "---|---|---|")
    for seed, step, seconds, final, steps, wall in rows:
        reach = (f" {step:,} | {seconds:.0f} s |" if step else " not reached | - |") if reach_header else ""
        print(f"| {seed} |{reach} {final:.1f} | {steps:,} | {wall:.0f} s |")
    print(f"\n{cli.env_id}, {cli.script}: last-100 mean {finals.mean():.1f} ± {finals.std():.1f} over seeds {cli.seeds}")


if __name__ == "__main__":
    main()

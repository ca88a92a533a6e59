"""Learning benchmark: one script on one env over several seeds, one run at a time, and how fast and how well it learns.

For every seed: the first step, and the minutes from the run's first event, at which the mean return of the
last `--window` episodes reaches `--threshold`, and the mean return of the last 100 episodes at the end.
The runs are benchmarks/run.py's (with --workers 1, so no two share the machine; run the same command again
after Ctrl-C and it resumes); the threshold is found as benchmarks/reach.py finds it. Any other flag goes
to the script.

    python benchmarks/learning.py --script ppo_discrete.py --env-id CartPole-v1 --seeds 1 2 3 --threshold 475
"""

import argparse
import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, read_run  # noqa: E402
from reach import first_reached  # noqa: E402
from run import planned_runs  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--script", default="ppo_discrete.py")
    parser.add_argument("--env-id", default="CartPole-v1")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--threshold", type=float, default=None, help="return to reach (mean of the last --window episodes)")
    parser.add_argument("--window", type=int, default=20)
    parser.add_argument("--out", default=None, help="the runner's folder (default: benchmark_runs/learning__<script>__<env>)")
    cli, script_flags = parser.parse_known_args()  # anything else is passed on to the script
    name = f"learning__{os.path.splitext(os.path.basename(cli.script))[0]}__{cli.env_id.replace('/', '-')}"
    cli.out = cli.out or os.path.join("benchmark_runs", name)

    runner = [sys.executable, os.path.join(ROOT, "benchmarks", "run.py"), "--scripts", cli.script, "--env-ids", cli.env_id,
              "--seeds", *map(str, cli.seeds), "--out", cli.out, "--workers", "1", *script_flags]
    if subprocess.run(runner).returncode != 0:
        sys.exit(f"error: some runs failed; see {os.path.join(cli.out, 'results.md')}")

    reach_header = f" steps to reach {cli.threshold:g} (last {cli.window}) | minutes to reach |" if cli.threshold is not None else ""
    print(f"\n| seed |{reach_header} last-100 mean at end | steps | run wall time |")
    print("|---|" + ("---|---|" if reach_header else "") + "---|---|---|")
    finals = []
    matrix = argparse.Namespace(scripts=[cli.script], env_ids=[cli.env_id], seeds=cli.seeds, out=cli.out)
    for run in planned_runs(matrix, script_flags):
        logged = read_run(run["folder"])
        with open(os.path.join(run["folder"], "result.json")) as f:
            wall_time = json.load(f)["wall_time"]
        finals.append(logged["final_return"])
        reach = ""
        if reach_header:
            reached = first_reached(logged, cli.threshold, cli.window)
            reach = f" {reached[0]:,} | {reached[1]:.1f} |" if reached else " not reached | - |"
        print(f"| {run['seed']} |{reach} {finals[-1]:.1f} | {logged['last_step']:,} | {wall_time:.0f} s |")
    print(f"\n{cli.env_id}, {cli.script}: last-100 mean {np.mean(finals):.1f} ± {np.std(finals):.1f} over seeds {cli.seeds}")


if __name__ == "__main__":
    main()

"""The mean return of the last 100 episodes ended by given step counts, for each of this project's runs found under
the folders given (TensorBoard runs, as the scripts and benchmarks/run.py write them).

    python benchmarks/at_steps.py runs --at 50000 100000 200000
"""

import argparse
import glob
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import FINAL_EPISODES, RunNotReadable, read_run  # noqa: E402

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("folders", nargs="+")
    parser.add_argument("--at", type=int, nargs="+", required=True, help="step counts")
    cli = parser.parse_args()
    runs = sorted({os.path.dirname(path) for folder in cli.folders
                   for path in glob.glob(os.path.join(folder, "**", "events.out.tfevents.*"), recursive=True)})
    print("run | " + " | ".join(f"last {FINAL_EPISODES} at {steps:,}" for steps in cli.at))
    for run in runs:
        try:
            episodes = read_run(run)
        except RunNotReadable as reason:  # no episode finished yet, a truncated events file: a row of dashes
            print(f"{os.path.basename(run)}: {reason}", file=sys.stderr)
            episodes = {"returns": np.zeros(0), "steps": np.zeros(0)}
        means = [episodes["returns"][episodes["steps"] <= steps][-FINAL_EPISODES:] for steps in cli.at]
        print(f"{os.path.basename(run)} | " + " | ".join(f"{np.mean(m):.2f}" if len(m) else "-" for m in means))

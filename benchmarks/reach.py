"""Minutes and steps until a run's return reaches given levels: the wall-clock side of a learning curve.

    python benchmarks/reach.py benchmark_runs/humanoid_1m benchmark_runs/sb3_humanoid_1m --levels 700 1000

Each folder is searched for runs: this project's TensorBoard runs (as benchmarks/run.py writes them),
and Stable-Baselines3 Monitor files (`benchmarks/sb3_ppo.py --monitor-dir`). A level counts as reached
at the first episode where the mean return of the last `--window` episodes is at least the level. Time
runs from the run's first TensorBoard event (this project) or from the creation of its envs (SB3),
so the few seconds of imports before either are not counted.
"""

import argparse
import csv
import glob
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import RunNotReadable, read_run  # noqa: E402


def read_monitor(monitor_folder):
    """The episodes of a folder of SB3 Monitor files, in the order they ended: steps (the lengths of the
    episodes ended so far, summed, so a lower bound of the env steps taken), wall times and returns."""
    episodes, start_time = [], None
    for path in glob.glob(os.path.join(monitor_folder, "*.monitor.csv")):
        with open(path) as f:
            header = json.loads(f.readline()[1:])
            start_time = header["t_start"] if start_time is None else min(start_time, header["t_start"])
            episodes += [(header["t_start"] + float(row["t"]), float(row["r"]), int(row["l"])) for row in csv.DictReader(f)]
    episodes.sort()
    wall_times, returns, lengths = (np.array(column) for column in zip(*episodes))
    return {"steps": np.cumsum(lengths), "wall_times": wall_times, "returns": returns, "start_time": start_time}


def first_reached(run, level, window):
    """(steps, minutes) at the first episode whose last-`window` mean return is at least `level`, or None."""
    means = np.convolve(run["returns"], np.ones(window) / window, mode="valid")
    reached = np.flatnonzero(means >= level)
    if len(reached) == 0:
        return None
    i = reached[0] + window - 1
    return run["steps"][i], (run["wall_times"][i] - run["start_time"]) / 60


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+")
    parser.add_argument("--levels", type=float, nargs="+", required=True)
    parser.add_argument("--window", type=int, default=20)
    cli = parser.parse_args()
    if cli.window < 1:
        parser.error(f"--window must be at least 1, got {cli.window}")
    for folder in cli.folders:
        if not os.path.isdir(folder):
            parser.error(f"no folder {folder}")

    runs = []  # (folder of one run, its reader)
    for folder in cli.folders:
        monitors = sorted({os.path.dirname(p) for p in glob.glob(os.path.join(folder, "**", "*.monitor.csv"), recursive=True)})
        event_files = glob.glob(os.path.join(folder, "**", "events.out.tfevents.*"), recursive=True)
        if not monitors and not event_files:
            sys.exit(f"error: no runs under {folder} (TensorBoard event files or SB3 monitor files)")
        runs += [(m, read_monitor) for m in monitors] + [(os.path.dirname(e), read_run) for e in sorted(event_files)]
    print("| run | " + " | ".join(f"reaches {level:g}: minutes (steps)" for level in cli.levels) + " | last-100 mean | minutes in all |")
    print("|---|" + "---|" * (len(cli.levels) + 2))
    for name, reader in runs:
        try:
            run = reader(name)
        except (RunNotReadable, ValueError) as reason:  # no finished episode, a truncated or empty file
            print(f"| {os.path.relpath(name)} | " + " | ".join(["-"] * len(cli.levels)) + f" | {str(reason) or 'unreadable'} | - |")
            continue
        cells = []
        for level in cli.levels:
            reached = first_reached(run, level, cli.window)
            cells.append(f"{reached[1]:.1f} ({reached[0]:,})" if reached else "not reached")
        total = (run["wall_times"][-1] - run["start_time"]) / 60
        print(f"| {os.path.relpath(name)} | " + " | ".join(cells) + f" | {run['returns'][-100:].mean():.1f} | {total:.1f} |")


if __name__ == "__main__":
    main()

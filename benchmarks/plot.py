"""Learning-curve plots from the runner's folders, following rliable's recommendations for few seeds.

    python benchmarks/plot.py benchmark_runs/bench --out benchmark_runs/bench/plots
    python benchmarks/plot.py benchmark_runs/humanoid_1m benchmark_runs/humanoid_defaults_1m --labels HUMANOID defaults
    python benchmarks/plot.py benchmark_runs/ma_walker --tag charts/team_episodic_return   # a game's return, many agents

Writes three PNGs:
- curves_steps.png: one panel per env, one line per script: the mean over seeds of the episodic return
  (each seed smoothed over its last 10 episodes), with a 95% bootstrap confidence band across seeds;
- curves_time.png: the same against wall-clock time since each run started;
- aggregate.png: per script, the interquartile mean (IQM) of the normalized final scores over all its
  envs and seeds, with a 95% stratified bootstrap confidence interval (seeds resampled within each env).
  Normalized: 0 = random policy, 1 = reference return (see benchmarks/common.py; DMC: return / CleanRL's RPO at 8M,
  whose PPO and RPO also stand as dashed and dotted lines in the DMC panels of the curves); envs without a
  score range are left out of the aggregate (the console says which). When no env has one, aggregate.png
  shows the raw final return of every run instead, one panel per env.
The TensorBoard event files are read with TensorBoard's own EventAccumulator, the bootstrap is SciPy's.
"""

import argparse
import glob
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from scipy import stats  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import CLEANRL_DMC, RETURN_TAG, SCORE_RANGES, RunNotReadable, normalized_score, read_run  # noqa: E402

SMOOTHING_EPISODES = 10
GRID_POINTS = 200
BOOTSTRAP_RESAMPLES = 2000


def finished_runs(folders, labels=None, tag=RETURN_TAG):
    """{(label, env_id): [read_run(...) of each finished seed]} for every finished run under the runner folders.
    A folder's label names its lines (e.g. its settings); without labels, the script does."""
    runs = {}
    for folder, label in zip(folders, labels or [None] * len(folders)):
        for path in sorted(glob.glob(os.path.join(folder, "*", "result.json"))):
            try:
                with open(path) as f:
                    result = json.load(f)
                if result["status"] == "finished":
                    runs.setdefault((label or result["script"], result["env_id"]), []).append(read_run(os.path.dirname(path), tag))
            except (ValueError, KeyError, TypeError, RunNotReadable) as reason:  # a damaged result, a truncated events file
                print(f"left out: {os.path.dirname(path)} ({type(reason).__name__}: {reason})")
    return runs


def confidence_band(values, axis=0):
    """95% percentile-bootstrap interval of the mean over `axis` (the seeds)."""
    if values.shape[axis] < 2:
        return values.mean(axis), values.mean(axis)
    interval = stats.bootstrap((values,), np.mean, axis=axis, confidence_level=0.95, method="percentile",
                               n_resamples=BOOTSTRAP_RESAMPLES, rng=np.random.default_rng(0)).confidence_interval
    return interval.low, interval.high


def curve_on_grid(x, returns, grid):
    """Each grid point gets the mean return of the last SMOOTHING_EPISODES episodes ended by then."""
    cumulative = np.concatenate([[0.0], np.cumsum(returns)])
    ended = np.searchsorted(x, grid, side="right")  # episodes ended by each grid point
    first = np.maximum(ended - SMOOTHING_EPISODES, 0)
    with np.errstate(invalid="ignore"):
        return np.where(ended > 0, (cumulative[ended] - cumulative[first]) / np.maximum(ended - first, 1), np.nan)


def plot_curves(runs, x_of, x_label, path):
    env_ids = sorted({env_id for _, env_id in runs})
    columns = min(3, len(env_ids))
    rows = -(-len(env_ids) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(5 * columns, 3.6 * rows), squeeze=False)
    for panel, env_id in zip(axes.flat, env_ids):
        for (script, run_env), seeds in sorted(runs.items()):
            if run_env != env_id:
                continue
            xs = [x_of(run) for run in seeds]
            grid = np.linspace(0, min(x[-1] for x in xs), GRID_POINTS)
            curves = np.array([curve_on_grid(x, run["returns"], grid) for x, run in zip(xs, seeds)])
            defined = ~np.isnan(curves).any(axis=0)  # from the first point where every seed has an episode
            low, high = confidence_band(curves[:, defined])
            line, = panel.plot(grid[defined], curves[:, defined].mean(axis=0), label=f"{script} ({len(seeds)} seeds)")
            panel.fill_between(grid[defined], low, high, color=line.get_color(), alpha=0.25)
        for score, style, name in zip(CLEANRL_DMC.get(env_id, ()), ("--", ":"), ("PPO", "RPO")):
            panel.axhline(score, color="gray", linestyle=style, linewidth=1, label=f"CleanRL {name} at 8M steps")
        panel.set_title(env_id)
        panel.set_xlabel(x_label)
        panel.set_ylabel("episodic return")
        panel.legend(fontsize="small")
    for panel in axes.flat[len(env_ids):]:
        panel.set_visible(False)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return env_ids


def interquartile_mean(*scores_per_env, axis=-1):
    """IQM of all scores pooled: the mean of the middle 50% (25% trimmed from each end)."""
    return stats.trim_mean(np.concatenate(scores_per_env, axis=axis), 0.25, axis=axis)


def plot_final_returns(runs, path):
    """The raw final return of every run (dots) and their mean (a bar) per script, one panel per env."""
    envs = sorted({env_id for _, env_id in runs})
    figure, panels = plt.subplots(1, len(envs), figsize=(1.5 + 3.5 * len(envs), 3.5), squeeze=False)
    for panel, env_id in zip(panels[0], envs):
        scripts = sorted(script for script, env in runs if env == env_id)
        for position, script in enumerate(scripts):
            finals = [run["final_return"] for run in runs[(script, env_id)]]
            panel.scatter([position] * len(finals), finals, alpha=0.6)
            panel.scatter([position], [np.mean(finals)], color="black", marker="_", s=600)
        panel.set_xticks(range(len(scripts)), scripts, fontsize="small")
        panel.set_title(env_id)
        panel.set_ylabel("final return (raw, last 100 episodes)")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def plot_aggregate(runs, path):
    """IQM of normalized scores per script, over the envs that have a score range; {label: IQM}. Without any such
    env, the raw final returns (plot_final_returns) and {}."""
    if not any(env_id in SCORE_RANGES for _, env_id in runs):
        plot_final_returns(runs, path)
        return {}
    scripts = sorted({script for script, _ in runs})
    labels, iqms, lows, highs = [], [], [], []
    for script in scripts:
        per_env = {env_id: np.array([normalized_score(env_id, run["final_return"]) for run in seeds])
                   for (run_script, env_id), seeds in sorted(runs.items()) if run_script == script and env_id in SCORE_RANGES}
        if not per_env:
            continue
        samples = tuple(per_env.values())
        if min(len(sample) for sample in samples) < 2:  # a bootstrap needs 2 seeds per env
            low = high = interquartile_mean(*samples)
        else:
            interval = stats.bootstrap(samples, interquartile_mean, confidence_level=0.95, method="percentile",
                                       n_resamples=BOOTSTRAP_RESAMPLES, rng=np.random.default_rng(0)).confidence_interval
            low, high = interval.low, interval.high
        labels.append(f"{script}\n{', '.join(per_env)}")
        iqms.append(interquartile_mean(*samples))
        lows.append(low)
        highs.append(high)
    figure, panel = plt.subplots(figsize=(7, 1.0 + 0.8 * len(labels)))
    positions = np.arange(len(labels))
    panel.barh(positions, np.array(highs) - np.array(lows), left=lows, height=0.5, alpha=0.4)
    panel.scatter(iqms, positions, color="black", zorder=3)
    for reference in (0.0, 1.0):
        panel.axvline(reference, color="gray", linestyle=":", linewidth=1)
    panel.set_yticks(positions, labels, fontsize="small")
    panel.set_xlabel("IQM of normalized score (0 = random policy, 1 = reference), 95% CI")
    panel.set_title("Aggregate over envs and seeds")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return dict(zip(labels, iqms))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", help="output folders of benchmarks/run.py")
    parser.add_argument("--out", default=None, help="where to write the PNGs (default: <first folder>/plots)")
    parser.add_argument("--labels", nargs="+", default=None, help="one label per folder for its lines (default: the script's name)")
    parser.add_argument("--tag", default=RETURN_TAG, help="the return plotted (charts/team_episodic_return: a game's, with many agents)")
    cli = parser.parse_args()
    if cli.labels and len(cli.labels) != len(cli.folders):
        parser.error(f"--labels needs one label per folder ({len(cli.folders)}), got {len(cli.labels)}")
    out = cli.out or os.path.join(cli.folders[0], "plots")
    if os.path.exists(out) and not os.path.isdir(out):
        parser.error(f"--out {out} is a file, not a folder")
    runs = finished_runs(cli.folders, cli.labels, cli.tag)
    if not runs:
        sys.exit(f"error: no finished runs under {', '.join(cli.folders)}")
    os.makedirs(out, exist_ok=True)
    plot_curves(runs, lambda run: run["steps"] / 1000, "env steps (thousands)", os.path.join(out, "curves_steps.png"))
    plot_curves(runs, lambda run: (run["wall_times"] - run["start_time"]) / 60, "wall-clock time (min)", os.path.join(out, "curves_time.png"))
    envs = sorted({env_id for _, env_id in runs})
    unscored = [env_id for env_id in envs if env_id not in SCORE_RANGES]
    print(f"curves_steps.png: the return against env steps, one panel per env ({', '.join(envs)})")
    print("curves_time.png: the same against wall-clock time")
    iqms = plot_aggregate(runs, os.path.join(out, "aggregate.png"))
    if not iqms:
        print("aggregate.png: the raw final return of every run, one panel per env (no env has a reference score)")
    for label, iqm in iqms.items():
        print(f"aggregate.png: IQM {iqm:.2f} of the normalized scores of {label.replace(chr(10), ' on ')}")
    if unscored and iqms:
        print(f"left out of aggregate.png: {', '.join(unscored)} (no reference score in benchmarks/common.py)")
    print(f"written to {out}")


if __name__ == "__main__":
    main()

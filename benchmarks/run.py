"""Benchmark runner: every script x env id x seed as its own process, N at a time, then a results table.

    python benchmarks/run.py --scripts ppo_discrete.py --env-ids CartPole-v1 Acrobot-v1 --seeds 1 2 3 --out benchmark_runs/bench

Flags the runner does not know go to every run (e.g. `--total-timesteps 100000`). Each run works in
its own folder <out>/<script>__<env id>__<seed>/: run.json (its command), log.txt (its console output),
runs/ (its TensorBoard run and checkpoint) and, once it has ended, result.json. Started again with the
same command, the runner skips the runs that ended (finished or failed) and resumes interrupted ones
from their last checkpoint. Ctrl-C stops every run cleanly, each saving a checkpoint first.
At the end it writes <out>/results.md and <out>/results.csv, over every ended run in <out>.
"""

import argparse
import csv
import fcntl
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (ROOT, RunNotReadable, last_log_line, raise_keyboard_interrupt, read_run,  # noqa: E402
                    script_environment, stop_with_parent)

PROGRESS_LINE = re.compile(r"([\d,]+)/([\d,]+) steps")


def write_json(path, data):
    with open(path + ".tmp", "w") as f:
        json.dump(data, f, indent=1)
    os.replace(path + ".tmp", path)


def read_json(path):
    with open(path) as f:
        return json.load(f)


def ended(folder):
    """The run's result.json, or None while it has not ended; a damaged one counts as not ended (the run goes again,
    or if it had finished, start() reads its logs again)."""
    try:
        result = read_json(os.path.join(folder, "result.json"))
        return result if {"script", "env_id", "status"} <= result.keys() else None
    except (OSError, ValueError, AttributeError):
        return None


def planned_runs(cli, script_flags):
    runs = []
    for script in cli.scripts:
        for env_id in cli.env_ids:
            for seed in cli.seeds:
                name = run_folder_name(script, env_id, seed)
                command = [script, "--env-id", env_id, "--seed", str(seed), "--exp-name", "benchmark", *script_flags]
                runs.append({"script": script, "env_id": env_id, "seed": seed, "command": command,
                             "folder": os.path.join(cli.out, name)})
    return runs


def script_path(script):
    """A script as given (any path, a copy of one of the scripts too), else one of the repository's."""
    return os.path.abspath(script if os.path.isfile(script) else os.path.join(ROOT, script))


def run_folder_name(script, env_id, seed):
    return re.sub(r"[^A-Za-z0-9_.-]", "-", f"{os.path.splitext(os.path.basename(script))[0]}__{env_id}__{seed}")


def start(run):
    state = read_json(os.path.join(run["folder"], "run.json"))
    run["started"], run["elapsed_before"] = time.time(), state["elapsed"]
    command = [sys.executable, script_path(run["script"]), *run["command"][1:]]
    checkpoints = glob.glob(os.path.join(run["folder"], "runs", "*", "checkpoint.pt"))
    log_path = os.path.join(run["folder"], "log.txt")
    if checkpoints and os.path.exists(log_path) and last_log_line(log_path).startswith("done:"):
        # it finished but its result.json is damaged: a process that ends at once lets finish() read the logs again
        run["process"] = subprocess.Popen([sys.executable, "-c", ""])
        return
    if checkpoints:  # an interrupted run continues from its last checkpoint
        command += ["--resume", os.path.abspath(checkpoints[0])]  # the run works in its own folder
    else:  # one stopped before its first checkpoint starts over, without the logs of that attempt
        shutil.rmtree(os.path.join(run["folder"], "runs"), ignore_errors=True)
    log = open(log_path, "a")
    log.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')}: {' '.join(command)}\n")
    log.flush()
    run["process"] = subprocess.Popen(command, cwd=run["folder"], stdout=log, stderr=subprocess.STDOUT, env=script_environment(),
                                      start_new_session=True,  # the runner alone decides when its runs stop
                                      preexec_fn=stop_with_parent)
    log.close()


def account_time(run):
    """Add this attempt's wall time to the run's total in run.json; return the total."""
    state = read_json(os.path.join(run["folder"], "run.json"))
    state["elapsed"] = run["elapsed_before"] + time.time() - run["started"]
    write_json(os.path.join(run["folder"], "run.json"), state)
    return state["elapsed"]


def finish(run):
    """Write result.json for a run whose process has ended on its own."""
    wall_time = account_time(run)
    returncode = run["process"].returncode
    result = {"script": run["script"], "env_id": run["env_id"], "seed": run["seed"], "wall_time": wall_time,
              "last_attempt": [run["started"], time.time()], "status": "failed", "reason": None}
    log_path = os.path.join(run["folder"], "log.txt")
    try:
        if returncode != 0:
            raise RunNotReadable(f"exit code {returncode}: {last_log_line(log_path)} (log: {log_path})")
        logged = read_run(run["folder"])
        result.update(status="finished", final_return=logged["final_return"],
                      episodes=int(logged["returns"].size), steps=int(logged["last_step"]),
                      sps=logged["last_step"] / wall_time)
    except RunNotReadable as reason:
        result["reason"] = str(reason)
    write_json(os.path.join(run["folder"], "result.json"), result)
    return result


def run_progress(run):
    """'120,000/500,000' from the last progress line the run printed, or '' before its first."""
    with open(os.path.join(run["folder"], "log.txt"), "rb") as f:
        f.seek(max(0, os.path.getsize(f.name) - 2000))
        matches = PROGRESS_LINE.findall(f.read().decode(errors="replace"))
    return f"{matches[-1][0]}/{matches[-1][1]}" if matches else ""


def print_status(runs, running, interactive):
    results = [result for result in map(ended, (run["folder"] for run in runs)) if result]
    failed = sum(result["status"] == "failed" for result in results)
    active = ", ".join(f"{os.path.basename(run['folder'])} {run_progress(run)}".strip() for run in running)
    line = f"{len(results)}/{len(runs)} ended ({failed} failed) | running: {active or '-'}"
    print(f"\r{line[:200]:<200}" if interactive else line, end="" if interactive else "\n", flush=True)


def over_seeds(statistic, results, key):
    return float(statistic([r[key] for r in results])) if results else float("nan")


def summarize(out):
    """results.md and results.csv: per script and env, the final return over seeds, steps, wall time, SPS."""
    groups = {}
    for result in filter(None, map(ended, sorted(glob.glob(os.path.join(out, "*", ""))))):
        groups.setdefault((result["script"], result["env_id"]), []).append(result)
    header = ["script", "env_id", "seeds", "failed", "final_return_mean", "final_return_std", "steps", "wall_time_s", "sps"]
    rows = []
    for (script, env_id), results in groups.items():
        ok = [r for r in results if r["status"] == "finished"]
        rows.append([script, env_id, len(ok), len(results) - len(ok), over_seeds(np.mean, ok, "final_return"),
                     over_seeds(np.std, ok, "final_return"), over_seeds(np.mean, ok, "steps"),
                     over_seeds(np.mean, ok, "wall_time"), over_seeds(np.mean, ok, "sps")])
    with open(os.path.join(out, "results.csv"), "w", newline="") as f:
        csv.writer(f).writerows([header, *[[round(x, 3) if isinstance(x, float) else x for x in row] for row in rows]])
    lines = ["| script | env | final return (last 100 episodes, mean ± std over seeds) | seeds | steps | wall time | SPS |",
             "|---|---|---|---|---|---|---|"]
    for script, env_id, n_ok, n_failed, mean, std, steps, wall_time, sps in rows:
        seeds = f"{n_ok}" + (f" ({n_failed} failed)" if n_failed else "")
        if n_ok:
            lines.append(f"| {script} | {env_id} | {mean:.1f} ± {std:.1f} | {seeds} | {steps:,.0f} | {wall_time / 60:.1f} min | {sps:,.0f} |")
        else:
            lines.append(f"| {script} | {env_id} | - | {seeds} | - | - | - |")
    table = "\n".join(lines) + "\n"
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(table)
    return table


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     epilog="Flags the runner does not know go to every run unchanged, e.g. --total-timesteps 100000.")
    parser.add_argument("--scripts", nargs="+", required=True, help="script paths, or names of this repository's, e.g. "
                        "ppo_discrete.py (required)")
    parser.add_argument("--env-ids", nargs="+", required=True, help="gymnasium env ids, e.g. CartPole-v1 (required)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="the seeds of every script and env (default: 1 2 3)")
    parser.add_argument("--workers", type=int, default=os.cpu_count(), help=f"runs at a time (default: the machine's cores, {os.cpu_count()} here)")
    parser.add_argument("--out", default="benchmark_runs/bench", help="folder for the runs and the results table (default: benchmark_runs/bench)")
    cli, script_flags = parser.parse_known_args()
    for script in cli.scripts:
        if not os.path.isfile(script_path(script)):
            parser.error(f"no script {script} (here or in {ROOT})")
    if cli.workers < 1:
        parser.error("--workers must be at least 1")
    names = [run_folder_name(script, env_id, seed) for script in cli.scripts for env_id in cli.env_ids for seed in cli.seeds]
    for flag, values in (("--scripts", [script_path(s) for s in cli.scripts]), ("--env-ids", cli.env_ids), ("--seeds", cli.seeds),
                         ("the matrix", names)):  # two spellings of one script, or two env ids of one folder name
        if len(set(values)) < len(values):
            parser.error(f"{flag} names {', '.join(sorted({str(v) for v in values if values.count(v) > 1}))} more than once")
    if os.path.exists(cli.out) and not os.path.isdir(cli.out):
        parser.error(f"--out {cli.out} is a file, not a folder")

    os.makedirs(cli.out, exist_ok=True)
    lock = open(os.path.join(cli.out, "runner.lock"), "w")  # released when the process ends, however it ends
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        sys.exit(f"error: another runner is working in {cli.out}; wait for it, or use another --out")
    runs = planned_runs(cli, script_flags)
    for run in runs:
        state_path = os.path.join(run["folder"], "run.json")
        if os.path.exists(state_path) and read_json(state_path)["command"] != run["command"]:
            sys.exit(f"error: {run['folder']} holds a run of another command ({' '.join(read_json(state_path)['command'])}); "
                     "use another --out")
    for run in runs:
        os.makedirs(run["folder"], exist_ok=True)
        if not os.path.exists(os.path.join(run["folder"], "run.json")):
            write_json(os.path.join(run["folder"], "run.json"), {"command": run["command"], "elapsed": 0.0})
    pending = [run for run in runs if not ended(run["folder"])]
    print(f"{len(runs)} runs, {len(runs) - len(pending)} already ended, {cli.workers} at a time; logs in {cli.out}/*/log.txt", flush=True)

    signal.signal(signal.SIGTERM, raise_keyboard_interrupt)
    interactive = sys.stdout.isatty()
    running, last_status = [], 0.0
    try:
        while pending or running:
            while pending and len(running) < cli.workers:
                running.append(pending.pop(0))
                start(running[-1])
                last_status = 0.0
            for run in [run for run in running if run["process"].poll() is not None]:
                running.remove(run)
                result = finish(run)
                if result["status"] == "failed":
                    print(("\n" if interactive else "") + f"failed: {os.path.basename(run['folder'])}: {result['reason']}", flush=True)
                last_status = 0.0
            if time.time() - last_status > (1.0 if interactive else 30.0):
                print_status(runs, running, interactive)
                last_status = time.time()
            time.sleep(0.2)
    except KeyboardInterrupt:
        print(f"\nstopping {len(running)} runs (each saves a checkpoint) ...", flush=True)
        for run in running:
            run["process"].send_signal(signal.SIGTERM)
        for run in running:
            try:
                run["process"].wait(timeout=300)
            except subprocess.TimeoutExpired:
                run["process"].kill()
                run["process"].wait()
            account_time(run)
        print("stopped; run the same command again to finish the rest", flush=True)
        sys.exit(130)
    print(("\n" if interactive else "") + summarize(cli.out), end="")
    print(f"written: {os.path.join(cli.out, 'results.md')} and results.csv", flush=True)
    failed = [run for run in runs if ended(run["folder"])["status"] == "failed"]
    if failed:  # a matrix with failed runs is not a success, for scripts and CI that check the exit code
        sys.exit(f"error: {len(failed)} of {len(runs)} runs failed; see their reasons above and in <run>/result.json")


if __name__ == "__main__":
    main()

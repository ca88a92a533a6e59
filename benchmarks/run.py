"""Benchmark runner: every script x env id x seed as its own process, N at a time, then a results table.

    python benchmarks/run.py --scripts ppo_discrete.py --env-ids CartPole-v1 Acrobot-v1 --seeds 1 2 3 --out benchmark_runs/bench

Flags the runner does not know go to every run (e.g. `--total-timesteps 100000`). The runs share the cores: each is
held to an equal part of them (N runs on C cores: C // N each, at least one), and a script's threads (an image run's
CNN, EnvPool's) follow from its part, so that runs at a time do not fight over the same cores. Each run works in
its own folder <out>/<script>__<env id>__<seed>/: run.json (its command), log.txt (its console output),
runs/ (its TensorBoard run and checkpoint) and, once it has ended, result.json. Started again with the
same command, the runner skips the runs that ended (finished or failed) and resumes interrupted ones
from their last checkpoint; a run whose checkpoint holds its last step has finished, whatever its log or exit
status says (a stop while it exited), and its result is read, never trained again. Ctrl-C stops every run
cleanly, each saving a checkpoint first.
At the end it writes <out>/results.md and <out>/results.csv, over every ended run in <out>.

On a SLURM cluster, add --slurm (and the cluster's own sbatch options, e.g. --sbatch-args="--partition=cpu
--time=2:00:00"): the grid goes as one job array, a task per run, each running the same command in the same
folder. The same command again collects the results, or says which runs are still pending, running or failed.
A task is warned 120 s before its time limit (SLURM_WARNING): its run saves and the task queues itself again; a
requeued or preempted task resumes its run from the checkpoint. A run that fails for its own reason is not
submitted again.
"""

import argparse
import contextlib
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
import shlex
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (ROOT, RunNotReadable, last_log_line, raise_keyboard_interrupt, read_run,  # noqa: E402
                    script_environment, stop_with_parent, stops_held)

PROGRESS_LINE = re.compile(r"([\d,]+)/([\d,]+) steps")
SLURM_WARNING = 120  # seconds before a task's time limit at which SLURM signals it (USR1) to save and queue again
SLURM_SUBMISSIONS = 3  # a run whose task ended this many times without a result (and not by a stop) is given up


def write_json(path, data):
    """Atomically and durably (as the scripts write checkpoints): a power cut leaves the old file or the new one."""
    with open(path + ".tmp", "w") as f:
        json.dump(data, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)
    folder = os.open(os.path.dirname(path) or ".", os.O_RDONLY)  # the rename reaches the disk too
    os.fsync(folder)
    os.close(folder)


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


def finished_step(folder):
    """The step of the run's checkpoint when it holds the run's last step: the run finished, whatever its log's last
    line or its exit status says (a stop signal while it exited). None while it has not finished."""
    import torch  # here only: the runner's own start stays quick

    for path in glob.glob(os.path.join(glob.escape(folder), "runs", "*", "checkpoint.pt")):
        with contextlib.suppress(Exception):  # unreadable: not finished, and resuming it gives the script's message
            checkpoint = torch.load(path, map_location="cpu", weights_only=True)
            args = checkpoint["args"]
            batch = args["num_envs"] * args["num_steps"]
            if checkpoint["global_step"] >= args["total_timesteps"] // batch * batch:  # as the script rounds it
                return int(checkpoint["global_step"])
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


def cores_for(slot, workers):
    """The cores of the run in `slot` (0 to workers - 1) when `workers` runs share this process's cores: an equal part
    each (one core each where there are more runs than cores)."""
    cores = sorted(os.sched_getaffinity(0))
    share = max(1, len(cores) // workers)
    first = slot * share % len(cores)
    return set(cores[first:first + share])


def script_path(script):
    """A script as given (any path, a copy of one of the scripts too), else one of the repository's."""
    return os.path.abspath(script if os.path.isfile(script) else os.path.join(ROOT, script))


def run_folder_name(script, env_id, seed):
    return re.sub(r"[^A-Za-z0-9_.-]", "-", f"{os.path.splitext(os.path.basename(script))[0]}__{env_id}__{seed}")


def start(run, new_session=True, cores=None):
    """Start the run's process (resumed from its checkpoint if it has one), held to `cores` if given."""
    state = read_json(os.path.join(run["folder"], "run.json"))
    run["started"], run["elapsed_before"] = time.time(), state["elapsed"]
    command = [sys.executable, script_path(run["script"]), *run["command"][1:]]
    checkpoints = glob.glob(os.path.join(run["folder"], "runs", "*", "checkpoint.pt"))
    log_path = os.path.join(run["folder"], "log.txt")
    if finished_step(run["folder"]) is not None:
        # it finished but has no result.json (damaged, or its process was stopped while it exited; a task requeued after
        # the end): no work, a process that ends at once lets finish() read its logs and checkpoint
        with stops_held():
            run["process"] = subprocess.Popen([sys.executable, "-c", ""], preexec_fn=stop_with_parent)
        return
    if checkpoints:  # an interrupted run continues from its last checkpoint
        command += ["--resume", os.path.abspath(checkpoints[0])]  # the run works in its own folder
    else:  # one stopped before its first checkpoint starts over, without the logs of that attempt
        shutil.rmtree(os.path.join(run["folder"], "runs"), ignore_errors=True)
    log = open(log_path, "a")
    log.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')}: {' '.join(command)}\n")
    log.flush()
    with log, stops_held():  # a Ctrl-C during the fork comes once the run has its process, which it then stops
        run["process"] = subprocess.Popen(command, cwd=run["folder"], stdout=log, stderr=subprocess.STDOUT,
                                          env=script_environment(), preexec_fn=lambda: held_to(cores),
                                          start_new_session=new_session)  # the runner alone decides when its runs stop


def held_to(cores):
    """In the child before it runs the script: its stop signals (stop_with_parent) and its cores."""
    stop_with_parent()
    if cores:
        os.sched_setaffinity(0, cores)


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
        step = finished_step(run["folder"])
        if returncode != 0 and step is None:  # a run whose checkpoint holds its last step finished, whatever its exit
            raise RunNotReadable(f"exit code {returncode}: {last_log_line(log_path)} (log: {log_path})")
        logged = read_run(run["folder"])
        result.update(status="finished", final_return=logged["final_return"],
                      episodes=int(logged["returns"].size), steps=step or int(logged["last_step"]),
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


def slurm_queue(job):
    """{array index: state} of the job's tasks still in SLURM's queue (PENDING, RUNNING, ...); {} when none is."""
    result = subprocess.run(["squeue", "-h", "-r", "-j", str(job), "-o", "%K %T"], capture_output=True, text=True)
    pairs = (line.split() for line in result.stdout.splitlines())
    return {int(index): state for index, state in pairs if index.isdigit()} if result.returncode == 0 else {}


def slurm_submit(cli, runs):
    """Submit runs as one job array; <out>/slurm-job-<job>.json records which run each array index is."""
    plan = {"runs": [{key: run[key] for key in ("script", "env_id", "seed", "command", "folder")} for run in runs]}
    job_script = os.path.join(cli.out, "slurm_job.sh")
    with open(job_script, "w") as f:
        f.write("#!/bin/bash\n"
                f"#SBATCH --job-name=run.py --array=0-{len(runs) - 1} --cpus-per-task=1 --requeue\n"
                f"#SBATCH --signal=B:USR1@{SLURM_WARNING} --open-mode=append --output={os.path.abspath(cli.out)}/slurm-%A_%a.out\n"
                f"exec {shlex.quote(sys.executable)} {shlex.quote(os.path.abspath(__file__))} --slurm-task "
                f"$SLURM_ARRAY_TASK_ID --out {shlex.quote(os.path.abspath(cli.out))}\n")
    write_json(os.path.join(cli.out, "slurm-job-next.json"), plan)  # a task may start before sbatch answers
    try:
        result = subprocess.run(["sbatch", "--parsable", *shlex.split(cli.sbatch_args), job_script], capture_output=True,
                                text=True)
    except ValueError as e:
        sys.exit(f"error: --sbatch-args is not a command line: {e}")
    if result.returncode != 0:
        os.remove(os.path.join(cli.out, "slurm-job-next.json"))
        sys.exit(f"error: sbatch refused the job: {(result.stderr.strip().splitlines() or ['(no message)'])[-1]}")
    plan["job"] = result.stdout.strip().split(";")[0]
    write_json(os.path.join(cli.out, f"slurm-job-{plan['job']}.json"), plan)
    os.remove(os.path.join(cli.out, "slurm-job-next.json"))
    print(f"submitted SLURM job {plan['job']}: {len(runs)} task{'s' * (len(runs) > 1)}, a run each (logs: {cli.out}/*/log.txt). "
          "Run this command again to collect the results.", flush=True)


def slurm_task(out, index):
    """One array task: its run, resumed from its checkpoint if it has one. SLURM's warning (USR1) before the time limit:
    the run saves, the task queues itself again. SIGTERM (preemption, scancel, requeue): the run saves and stops."""
    job, plan = os.environ.get("SLURM_ARRAY_JOB_ID"), None
    for attempt in range(60):  # a task may start before the submitting call has recorded the job's number
        for name in (f"slurm-job-{job}.json", "slurm-job-next.json"):  # next: the submission in flight, this one
            with contextlib.suppress(OSError, ValueError):
                plan = plan or read_json(os.path.join(out, name))
                plan = plan if plan.get("job", job) == job else None
        if plan:
            break
        time.sleep(1)
    run = plan["runs"][index]
    stops = []

    def on_signal(signum, frame):
        stops.append(signum)
        if signum == signal.SIGUSR1 and "process" in run:  # sent to this batch shell alone; SIGTERM reaches the run too
            run["process"].send_signal(signal.SIGUSR1)

    for signum in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(signum, on_signal)
    state = read_json(os.path.join(run["folder"], "run.json"))
    write_json(os.path.join(run["folder"], "run.json"), {**state, "slurm": os.environ.get("SLURM_JOB_ID")})
    start(run, new_session=False)  # one process group with this task: SLURM's signals reach the run
    while run["process"].poll() is None:
        time.sleep(0.5)
    if stops and run["process"].returncode != 0 and finished_step(run["folder"]) is None:  # stopped for the scheduler,
        # saved: it goes on when the task runs again (a run that had finished before the stop counts as finished)
        account_time(run)
        if signal.SIGUSR1 in stops:
            task = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
            subprocess.run(["scontrol", "requeue", task])
        return
    finish(run)


def slurm_collect(cli, runs):
    """The second call of a --slurm grid: the results when every run has ended; else what is pending, running or failed
    (with each log), and a new submission of the runs that no task will finish (a job cancelled or lost)."""
    waiting = {}  # folder: the state of the task that will run it, in any of the grid's jobs
    for plan in map(read_json, glob.glob(os.path.join(glob.escape(cli.out), "slurm-job-[0-9]*.json"))):
        for index, state in slurm_queue(plan["job"]).items():
            waiting[plan["runs"][index]["folder"]] = state
    for run in runs:
        result = ended(run["folder"])
        if result and result["status"] == "failed":
            print(f"failed: {os.path.basename(run['folder'])}: {result['reason']}")
        elif run["folder"] in waiting:
            progress = f" {run_progress(run)}" if os.path.exists(os.path.join(run["folder"], "log.txt")) else ""
            print(f"{waiting[run['folder']].lower()}: {os.path.basename(run['folder'])}{progress} (log: {run['folder']}/log.txt)")
    waiting = {folder: state for folder, state in waiting.items() if not ended(folder)}
    unqueued = [run for run in runs if not ended(run["folder"]) and run["folder"] not in waiting]
    for run in [run for run in unqueued if finished_step(run["folder"]) is not None]:  # its task ended before its result
        unqueued.remove(run)
        start(run)
        run["process"].wait()
        finish(run)
    for run in list(unqueued):  # a task that keeps ending without a result (not a stop for the scheduler) is given up
        state = read_json(os.path.join(run["folder"], "run.json"))
        if state.get("slurm_submissions", 0) >= SLURM_SUBMISSIONS:
            unqueued.remove(run)
            reason = (f"its SLURM task ended {SLURM_SUBMISSIONS} times without a result (logs: {run['folder']}/log.txt, "
                      f"{cli.out}/slurm-*.out)")
            write_json(os.path.join(run["folder"], "result.json"), {**{k: run[k] for k in ("script", "env_id", "seed")},
                                                                      "status": "failed", "reason": reason})
            print(f"failed: {os.path.basename(run['folder'])}: {reason}")
        else:
            write_json(os.path.join(run["folder"], "run.json"), {**state, "slurm_submissions": state.get("slurm_submissions", 0) + 1})
    if unqueued:
        slurm_submit(cli, unqueued)
    return not waiting and not unqueued


def main():
    if sys.argv[1:2] == ["--slurm-task"]:  # inside a task of a --slurm job array: --slurm-task INDEX --out OUT
        return slurm_task(sys.argv[4], int(sys.argv[2]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     epilog="Flags the runner does not know go to every run unchanged, e.g. --total-timesteps "
                                     "100000 (each run is held to an equal part of the cores). "
                                     + " ".join(__doc__.split("\n\n")[-1].split()))  # and the SLURM paragraph
    parser.add_argument("--scripts", nargs="+", required=True, help="script paths, or names of this repository's, e.g. "
                        "ppo_discrete.py (required)")
    parser.add_argument("--env-ids", nargs="+", required=True, help="gymnasium env ids, e.g. CartPole-v1 (required)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="the seeds of every script and env (default: 1 2 3)")
    parser.add_argument("--workers", type=int, default=os.cpu_count(), help=f"runs at a time (default: the machine's cores, {os.cpu_count()} here)")
    parser.add_argument("--out", default="benchmark_runs/bench", help="folder for the runs and the results table (default: benchmark_runs/bench)")
    parser.add_argument("--slurm", action="store_true", help="submit the grid to SLURM as one job array; the same command "
                        "again collects the results or says what is still pending, running or failed")
    parser.add_argument("--sbatch-args", default="", help='the cluster\'s own sbatch options, with "=": --sbatch-args="--partition=cpu '
                        '--time=2:00:00 --account=lab" (with --slurm)')
    cli, script_flags = parser.parse_known_args()
    if cli.slurm and not shutil.which("sbatch"):
        sys.exit("error: --slurm needs SLURM's sbatch on PATH: run it where jobs are submitted (a login node)")
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
    jobs = [read_json(path)["job"] for path in glob.glob(os.path.join(glob.escape(cli.out), "slurm-job-[0-9]*.json"))]
    queued = [job for job in jobs if shutil.which("squeue") and slurm_queue(job)]
    if queued and not cli.slurm:
        sys.exit(f"error: {cli.out} holds SLURM job {queued[0]}, still queued or running; collect it with --slurm, "
                 "or use another --out")
    for run in runs:
        state_path = os.path.join(run["folder"], "run.json")
        if os.path.exists(state_path) and read_json(state_path)["command"] != run["command"]:
            sys.exit(f"error: {run['folder']} holds a run of another command ({' '.join(read_json(state_path)['command'])}); "
                     "use another --out")
    for run in runs:
        os.makedirs(run["folder"], exist_ok=True)
        if not os.path.exists(os.path.join(run["folder"], "run.json")):
            write_json(os.path.join(run["folder"], "run.json"), {"command": run["command"], "elapsed": 0.0})
    if cli.slurm and not slurm_collect(cli, runs):  # submitted, or still pending or running: said, nothing to sum up
        return
    pending = [] if cli.slurm else [run for run in runs if not ended(run["folder"])]
    if not cli.slurm:
        print(f"{len(runs)} runs, {len(runs) - len(pending)} already ended, {cli.workers} at a time; logs in {cli.out}/*/log.txt",
              flush=True)

    signal.signal(signal.SIGTERM, raise_keyboard_interrupt)
    interactive = sys.stdout.isatty()
    running, last_status = [], 0.0
    try:
        while pending or running:
            while pending and len(running) < cli.workers:
                running.append(pending.pop(0))
                running[-1]["slot"] = min(set(range(cli.workers)) - {run["slot"] for run in running[:-1]})
                start(running[-1], cores=cores_for(running[-1]["slot"], cli.workers))
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

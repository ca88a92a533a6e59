"""Hyperparameter sweep with Optuna: one study, shared by every process that runs the same command.

    python benchmarks/tune.py --script ppo_discrete.py --env-ids CartPole-v1 Acrobot-v1 --num-trials 50 --num-seeds 2 --total-timesteps 100000

A trial runs the script once per env and seed with the sampled flags and scores it by the normalized return
(0 = random policy, 1 = reference; benchmarks/common.py or --score-range) of each run's last 100 episodes (a
sweep of one env without a score range: the return itself): the mean over envs and seeds, or with
`--objective min` the worst env's mean over seeds (a setting that must work everywhere). After each run the
trial reports its score so far, and the median rule prunes a trial that trails the earlier trials at the
same point. --num-trials counts the trials of the whole study, whichever process ran them. The script is
any path (a copy of one of the scripts too); the search space follows the first env's action space (categorical:
Discrete, MultiDiscrete, MultiBinary; or Box). A study is defined by the script, the envs, the budget, the seeds, the objective and the extra
flags: its default name holds all of them, so trials of other settings are never ranked together.

Storage: by default a journal file (<work-dir>/<study-name>.journal), which the processes of one machine
can share: start the command several times to run trials side by side. With a database URL, e.g.
`--storage postgresql://user:password@host/dbname`, every machine that runs the same command joins the
same study. Ctrl-C stops a process; its unfinished trial is queued again, with the same parameters, for
the next start (SIGTERM does the same). Flags the tuner does not know go to every run unchanged, and a
setting they fix (`--num-envs 1`) is left out of the search.
"""

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import optuna
from optuna.trial import TrialState

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (ROOT, SCORE_RANGES, RunNotReadable, last_log_line, normalized_score, raise_keyboard_interrupt,  # noqa: E402
                    read_run, script_environment, stop_with_parent, stops_held)


# Each setting the sweep searches: how a trial samples it. A flag given on the command line fixes its setting
# for the whole study instead: that setting is not searched (and the printed command names it once).
COMMON_SPACE = {
    "learning-rate": lambda trial, name: trial.suggest_float(name, 1e-5, 3e-3, log=True),
    "gamma": lambda trial, name: trial.suggest_categorical(name, [0.9, 0.95, 0.98, 0.99, 0.995, 0.999]),
    "gae-lambda": lambda trial, name: trial.suggest_categorical(name, [0.8, 0.9, 0.95, 0.98, 0.99]),
    "clip-coef": lambda trial, name: trial.suggest_categorical(name, [0.1, 0.2, 0.3]),
    "update-epochs": lambda trial, name: trial.suggest_int(name, 1, 10),
    "vf-coef": lambda trial, name: trial.suggest_float(name, 0.1, 1.0),
    "max-grad-norm": lambda trial, name: trial.suggest_categorical(name, [0.3, 0.5, 1.0, 5.0]),
}
# The rollout's shape, (num-envs choices, num-steps choices); search_space() cuts them to batches that fit the budget.
BATCHES = {"discrete": ([4, 8, 16], [32, 64, 128, 256, 512]), "box": ([1, 4, 8, 16], [256, 512, 1024, 2048, 4096])}
DISCRETE_SPACE = {
    **COMMON_SPACE,
    "num-minibatches": lambda trial, name: trial.suggest_categorical(name, [1, 2, 4, 8]),
    "ent-coef": lambda trial, name: trial.suggest_float(name, 1e-5, 0.1, log=True),
}
CONTINUOUS_SPACE = {
    **COMMON_SPACE,
    "num-minibatches": lambda trial, name: trial.suggest_categorical(name, [4, 8, 16, 32, 64]),
    "ent-coef": lambda trial, name: trial.suggest_categorical(name, [0.0, 1e-4, 1e-3, 1e-2]),
    "init-log-std": lambda trial, name: trial.suggest_categorical(name, [-1.5, -1.0, -0.5, 0.0]),
    "hidden-size": lambda trial, name: trial.suggest_categorical(name, [64, 128, 256]),
}


def search_space(env_id, script_flags, budget):
    """The settings to search, by the env's action space (categorical or Box), less those script_flags fix; the rollout's
    shape only where its batch (num-envs x num-steps) fits the budget, so that no trial is sampled to fail."""
    import gymnasium as gym

    try:
        env = gym.make(env_id)
    except Exception as e:  # an unknown id, a module that is not found
        sys.exit(f"error: cannot make env {env_id}: {type(e).__name__}: {str(e).strip().splitlines()[0][:300]}")
    discrete = not isinstance(env.action_space, gym.spaces.Box)  # Discrete, MultiDiscrete, MultiBinary: categorical
    env.close()
    words = [word for flag in script_flags for word in flag.split("=", 1)]  # --num-envs=8 as --num-envs 8
    given = {flag[2:].replace("_", "-"): value for flag, value in zip(words, words[1:] + [""]) if flag.startswith("--")}
    space = {name: sample for name, sample in (DISCRETE_SPACE if discrete else CONTINUOUS_SPACE).items()
             if name not in given}
    shape = {name: [int(given[name])] if given.get(name, "").isdigit() else [] if name in given else list(choices)
             for name, choices in zip(("num-envs", "num-steps"), BATCHES["discrete" if discrete else "box"])}
    envs, steps = shape["num-envs"], shape["num-steps"]
    cut = False
    while budget and envs and steps and max(envs) * max(steps) > budget:  # the largest choices go first
        cut = True
        if max(envs) * min(steps) > budget or len(steps) == 1:
            envs.pop()
        else:
            steps.pop()
    if budget and not (envs and steps):
        sys.exit(f"error: --total-timesteps {budget} is smaller than every batch (num-envs x num-steps) the search "
                 f"would try; give a larger budget, or --num-envs and --num-steps that fit it")
    if cut:
        print(f"note: the search keeps to batches within --total-timesteps {budget}: "
              f"--num-envs in {envs}, --num-steps in {steps}", flush=True)
    for name, choices in shape.items():
        if name not in given:
            space[name] = lambda trial, name, choices=choices: trial.suggest_categorical(name, choices)
    return space


class TrialFailed(Exception):
    pass


def as_flags(params):
    """["--learning-rate", "0.000123", ...]: the trial's runs and the printed command use the same strings."""
    return [item for name, value in params.items() for item in (f"--{name}", f"{value:.6g}" if isinstance(value, float) else str(value))]


def run_once(trial, params, env_id, seed, cli, script_flags):
    """Run the script once; return its final return (mean of its last 100 episodes)."""
    folder = os.path.join(cli.work_dir, cli.study_name, f"trial_{trial.number}", re.sub(r"[^A-Za-z0-9_.-]", "-", f"{env_id}__{seed}"))
    shutil.rmtree(folder, ignore_errors=True)  # a trial queued again after Ctrl-C starts clean
    os.makedirs(folder)
    command = [sys.executable, cli.script_path, "--env-id", env_id, "--seed", str(seed),
               "--exp-name", f"trial_{trial.number}", "--checkpoint-interval", "0", *as_flags(params), *script_flags]
    if cli.total_timesteps:
        command += ["--total-timesteps", str(cli.total_timesteps)]
    log_path = os.path.join(folder, "log.txt")
    child = None
    try:
        with open(log_path, "w") as log, stops_held():  # a Ctrl-C during the fork comes once the child exists
            child = subprocess.Popen(command, cwd=folder, stdout=log, stderr=subprocess.STDOUT, env=script_environment(),
                                     start_new_session=True, preexec_fn=stop_with_parent)
        returncode = child.wait()
    finally:
        if child is not None and child.poll() is None:  # interrupted: the run ends with its trial
            child.kill()
            child.wait()
    if returncode != 0:
        raise TrialFailed(f"{env_id} seed {seed}: exit code {returncode}: {last_log_line(log_path)} (log: {log_path})")
    try:
        return read_run(folder)["final_return"]
    except RunNotReadable as reason:
        raise TrialFailed(f"{env_id} seed {seed}: {reason} (log: {log_path})") from None


def run_trial(study, trial, cli, script_flags):
    """Score the trial's flags on every env and seed; tell the study the result, pruned or failed."""
    params = {name: sample(trial, name) for name, sample in cli.search_space.items()}
    runs = [(env_id, seed) for seed in range(1, cli.num_seeds + 1) for env_id in cli.env_ids]
    scores = {}
    try:
        for step, (env_id, seed) in enumerate(runs):
            final_return = run_once(trial, params, env_id, seed, cli, script_flags)
            scores.setdefault(env_id, []).append(normalized_score(env_id, final_return, cli.score_ranges))
            trial.report(score(scores, cli.objective), step)
            if step + 1 < len(runs) and trial.should_prune():
                study.tell(trial, state=TrialState.PRUNED)
                print(f"trial {trial.number}: pruned after {step + 1} runs at {score(scores, cli.objective):.3f}", flush=True)
                return
    except TrialFailed as failure:
        trial.set_user_attr("failure", str(failure))
        study.tell(trial, state=TrialState.FAIL)
        print(f"trial {trial.number}: failed: {failure}", flush=True)
        return
    study.tell(trial, score(scores, cli.objective))
    print(f"trial {trial.number}: {score(scores, cli.objective):.3f} {' '.join(as_flags(params))}", flush=True)


def score(scores, objective):
    """{env: [normalized score of each seed]} -> the mean over all runs, or the lowest of the envs' means."""
    if objective == "min":
        return float(min(np.mean(env_scores) for env_scores in scores.values()))
    return float(np.mean([s for env_scores in scores.values() for s in env_scores]))


def used_trials(study, before=None):
    """Trials (numbered below `before`, if given) that count toward --num-trials: not surplus, not interrupted, not
    waiting (an interrupted trial queued again waits for the next ask)."""
    return sum(1 for t in study.get_trials(deepcopy=False) if (before is None or t.number < before) and t.state != TrialState.WAITING
               and not t.user_attrs.get("surplus") and not t.user_attrs.get("interrupted"))


def open_study(cli):
    storage = cli.storage or os.path.join(cli.work_dir, f"{cli.study_name}.journal")
    if "://" not in storage:  # a file: Optuna's journal storage, safe for several processes of one machine
        os.makedirs(os.path.dirname(os.path.abspath(storage)), exist_ok=True)
        storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(storage))
    for attempt in range(5):  # processes starting together may race to create the study or its tables
        try:
            return optuna.create_study(study_name=cli.study_name, storage=storage, direction="maximize", load_if_exists=True,
                                       pruner=optuna.pruners.MedianPruner(n_startup_trials=5))
        except Exception as e:  # a race ends in one of these; an unreachable server or a wrong password at once
            race = type(e).__name__ == "IntegrityError" or "already exists" in str(e) or "is locked" in str(e)
            if attempt == 4 or not race:  # and so does a path that cannot be written
                sys.exit(f"error: cannot open the study in {cli.storage or storage}: {str(e).strip().splitlines()[0][:300]}")
            time.sleep(1 + attempt)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--script", default="ppo_discrete.py", help="a path, or the name of one of the scripts")
    parser.add_argument("--env-ids", nargs="+", default=["CartPole-v1"])
    parser.add_argument("--num-trials", type=int, default=50, help="trials in the whole study, over all processes")
    parser.add_argument("--num-seeds", type=int, default=2, help="seeds 1..N per env in every trial")
    parser.add_argument("--total-timesteps", type=int, default=None, help="per run (default: the script's own)")
    parser.add_argument("--objective", choices=["mean", "min"], default="mean", help="over envs: the mean, or the worst env")
    parser.add_argument("--study-name", default=None, help="default: made of every setting that defines the study")
    parser.add_argument("--storage", default=None, help="a database URL, or a journal file (default: <work-dir>/<study-name>.journal)")
    parser.add_argument("--work-dir", default="benchmark_runs/tune", help="the runs' folders and logs")
    parser.add_argument("--score-range", nargs=3, action="append", default=[], metavar=("ENV_ID", "RANDOM", "REFERENCE"),
                        help="an env's returns of a random policy and of a good one (its normalized scores 0 and 1), for "
                             "an env that benchmarks/common.py does not know; a sweep of one env alone needs none")
    cli, script_flags = parser.parse_known_args()
    try:
        cli.score_ranges = {**SCORE_RANGES, **{env_id: (float(low), float(high)) for env_id, low, high in cli.score_range}}
    except ValueError as e:
        parser.error(f"--score-range takes an env id and two numbers: {e}")
    if any(low == high for low, high in cli.score_ranges.values()):
        parser.error("--score-range needs two different returns: the random policy's and the reference's")
    for env_id in cli.env_ids:
        if env_id not in cli.score_ranges and len(cli.env_ids) > 1:  # one env alone is scored by its raw return
            parser.error(f"no score range for {env_id}: give --score-range {env_id} RANDOM REFERENCE (the returns of a "
                         "random policy and of a good one), or add it to SCORE_RANGES in benchmarks/common.py")
    if cli.num_trials < 1 or cli.num_seeds < 1:
        parser.error("--num-trials and --num-seeds must be at least 1")
    if cli.total_timesteps is not None and cli.total_timesteps < 1:
        parser.error(f"--total-timesteps must be positive, got {cli.total_timesteps}")
    cli.script_path = cli.script if os.path.isfile(cli.script) else os.path.join(ROOT, cli.script)
    if not os.path.isfile(cli.script_path):
        parser.error(f"no script {cli.script} (here or in {ROOT})")
    cli.script_path = os.path.abspath(cli.script_path)
    sys.path += [os.getcwd(), os.path.dirname(cli.script_path)]  # where the runs find a module named in `my_envs:Env-v0`
    cli.search_space = search_space(cli.env_ids[0], script_flags, cli.total_timesteps)
    defined_by = [os.path.splitext(os.path.basename(cli.script))[0], "_".join(cli.env_ids), f"{cli.total_timesteps or 'default'}steps",
                  f"{cli.num_seeds}seeds", cli.objective, *script_flags, *[item for triple in cli.score_range for item in triple]]
    cli.study_name = cli.study_name or re.sub(r"[^A-Za-z0-9_.=-]+", "-", "__".join(defined_by)).strip("-")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = open_study(cli)
    signal.signal(signal.SIGTERM, raise_keyboard_interrupt)  # stopped by SIGTERM as by Ctrl-C: the trial is queued again

    trial = None
    try:
        while used_trials(study) < cli.num_trials:
            trial = study.ask()
            if used_trials(study, before=trial.number) >= cli.num_trials:  # another process took the last trial meanwhile
                trial.set_user_attr("surplus", True)
                study.tell(trial, state=TrialState.FAIL)
                break
            run_trial(study, trial, cli, script_flags)
            trial = None
    except KeyboardInterrupt:
        if trial is None:
            sys.exit("\ninterrupted between trials; run the same command to go on")
        trial.set_user_attr("interrupted", True)
        study.tell(trial, state=TrialState.FAIL)
        study.enqueue_trial(trial.params)
        sys.exit(f"\ninterrupted: trial {trial.number} is queued again; run the same command to go on")

    finished = study.get_trials(deepcopy=False, states=[TrialState.COMPLETE])
    if not finished:
        sys.exit("error: no trial finished; see the failures in the logs under " + os.path.join(cli.work_dir, cli.study_name))
    best = study.best_trial
    kind = "normalized score" if cli.env_ids[0] in cli.score_ranges else "score (the mean final return: no score range)"
    print(f"best: trial {best.number}, {kind} {best.value:.3f} ({len(finished)} trials finished)")
    budget = f" --total-timesteps {cli.total_timesteps}" if cli.total_timesteps else ""
    for env_id in cli.env_ids:
        print(f"python {cli.script} --env-id {env_id}{budget} {' '.join(as_flags(best.params))} {' '.join(script_flags)}".rstrip())
    print(f"(study {cli.study_name}: {cli.objective} over envs, {cli.num_seeds} seeds a trial)")


if __name__ == "__main__":
    main()

"""The experiment tooling under benchmarks/: runner, plots and sweeps, on real (tiny) runs of the scripts."""

import csv
import datetime
import fcntl
import glob
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
import pytest
from torch.utils.tensorboard import SummaryWriter

from conftest import ROOT, readme_own_env, record_fsync_and_replace, start, wait_for

for package in ("optuna", "matplotlib", "scipy"):  # the tools' own requirements
    pytest.importorskip(package, reason="the tools need: pip install -r benchmarks/requirements.txt")
import optuna  # noqa: E402
from optuna.trial import TrialState  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import common  # noqa: E402
import every_env  # noqa: E402
import plot  # noqa: E402
import reach  # noqa: E402
import run as runner  # noqa: E402
import speed  # noqa: E402

import ppo_continuous  # noqa: E402

TINY = ["--total-timesteps", "2048", "--num-envs", "4", "--checkpoint-interval", "1"]  # Acrobot ends an episode in 512 steps


def tool(name, *args, cwd, **popen):
    return start(os.path.join("benchmarks", name), *args, cwd=cwd, **popen)


@pytest.fixture(scope="module")
def bench_runs(tmp_path_factory):
    """One runner call: 2 envs x 2 seeds that finish and one env id that does not exist, 2 at a time."""
    out = tmp_path_factory.mktemp("bench") / "out"
    process = tool("run.py", "--scripts", "ppo_discrete.py", "--env-ids", "CartPole-v1", "Acrobot-v1", "NoSuchEnv-v0",
                   "--seeds", "1", "2", "--workers", "2", "--out", str(out), *TINY, cwd=out.parent)
    output, _ = process.communicate(timeout=300)
    return out, process.returncode, output


def test_runner_runs_the_matrix_in_parallel_and_writes_the_table(bench_runs):
    out, returncode, output = bench_runs
    assert returncode == 1 and output.rstrip().endswith("error: 2 of 6 runs failed; see their reasons above and in <run>/result.json"), output
    with open(out / "results.csv") as f:
        rows = {(row[0], row[1]): row for row in (line.strip().split(",") for line in f.readlines()[1:])}
    assert set(rows) == {("ppo_discrete.py", env) for env in ("CartPole-v1", "Acrobot-v1", "NoSuchEnv-v0")}
    for env in ("CartPole-v1", "Acrobot-v1"):
        row = rows["ppo_discrete.py", env]  # script, env_id, seeds, failed, final_return_mean, ...
        seeds, failed, mean = int(row[2]), int(row[3]), float(row[4])
        finals = [json.load(open(out / f"ppo_discrete__{env}__{seed}" / "result.json"))["final_return"] for seed in (1, 2)]
        assert (seeds, failed) == (2, 0) and mean == pytest.approx(np.mean(finals), abs=1e-3)
        assert f"| ppo_discrete.py | {env} | {np.mean(finals):.1f} ± {np.std(finals):.1f} | 2 |" in (out / "results.md").read_text()
    # the two runs that went first overlapped in time
    (start1, end1), (start2, end2) = (json.load(open(out / f"ppo_discrete__CartPole-v1__{seed}" / "result.json"))["last_attempt"]
                                      for seed in (1, 2))
    assert start1 < end2 and start2 < end1


def test_runner_records_a_crashed_run_as_failed_with_its_log(bench_runs):
    out, _, output = bench_runs
    result = json.load(open(out / "ppo_discrete__NoSuchEnv-v0__1" / "result.json"))
    assert result["status"] == "failed" and "NoSuchEnv-v0" in result["reason"] and "log.txt" in result["reason"]
    assert "NoSuchEnv" in (out / "ppo_discrete__NoSuchEnv-v0__1" / "log.txt").read_text()
    assert "| ppo_discrete.py | NoSuchEnv-v0 | - | 0 (2 failed) |" in (out / "results.md").read_text()


def test_runner_gives_the_message_inside_tyros_error_box_as_the_reason(tmp_path):
    log = tmp_path / "log.txt"
    log.write_text(start("ppo_discrete.py", "--no-such-flag", cwd=tmp_path).communicate(timeout=60)[0])
    assert "╰" in log.read_text()  # tyro drew its box
    assert common.last_log_line(str(log)) == "Unrecognized options: --no-such-flag"


@pytest.mark.parametrize("args, message", [
    (["--seeds", "1"], "the following arguments are required: --scripts, --env-ids"),
    (["--scripts", "ppo_discrete.py", "--env-ids", "CartPole-v1", "--seeds", "1", "1"], "--seeds names 1 more than once"),
    (["--scripts", "ppo_discrete.py", "--env-ids", "CartPole-v1", "--out", "a_file"], "--out a_file is a file, not a folder"),
    (["--scripts", "ppo_discrete.py", "./ppo_discrete.py", "--env-ids", "CartPole-v1"], "ppo_discrete.py more than once"),
    (["--scripts", "ppo_discrete.py", "--env-ids", "a/B-v0", "a-B-v0", "--seeds", "1"],
     "the matrix names ppo_discrete__a-B-v0__1 more than once"),
])
def test_runner_refuses_bad_input_in_one_line(tmp_path, args, message):
    (tmp_path / "a_file").write_text("")
    output, _ = tool("run.py", *args, cwd=tmp_path).communicate(timeout=60)
    assert output.strip().splitlines()[-1].endswith(message) and "Traceback" not in output, output


def test_a_second_runner_on_the_same_folder_is_refused(tmp_path):
    (tmp_path / "out").mkdir()
    with open(tmp_path / "out" / "runner.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a first runner holds it
        output, _ = tool("run.py", "--scripts", "ppo_discrete.py", "--env-ids", "CartPole-v1", "--out", "out",
                         cwd=tmp_path).communicate(timeout=60)
    assert output.strip().splitlines()[-1] == "error: another runner is working in out; wait for it, or use another --out", output
    assert os.listdir(tmp_path / "out") == ["runner.lock"]


def test_runner_help_shows_defaults_and_where_unknown_flags_go(tmp_path):
    output, _ = tool("run.py", "--help", cwd=tmp_path).communicate(timeout=60)
    assert "(default: 1 2 3)" in " ".join(output.split()) and "Flags the runner does not know go to every run" in output, output


@pytest.mark.parametrize("cores, workers, parts", [
    ([0, 1], 2, [{0}, {1}]),  # two image runs on 2 cores: one core (one CNN thread, one EnvPool thread) each
    ([0, 1], 1, [{0, 1}]),  # alone: every core
    (list(range(16)), 2, [set(range(8)), set(range(8, 16))]),
    (list(range(16)), 3, [set(range(5)), set(range(5, 10)), set(range(10, 15))]),
    ([0, 1], 3, [{0}, {1}, {0}]),  # more runs than cores: one core each, shared in turn
    ([4, 6], 2, [{4}, {6}]),  # the runner's own cores, whichever they are
])
def test_runner_gives_each_run_an_equal_part_of_its_cores(monkeypatch, cores, workers, parts):
    monkeypatch.setattr(runner.os, "sched_getaffinity", lambda pid: set(cores))
    assert [runner.cores_for(slot, workers) for slot in range(workers)] == parts


def test_runs_at_a_time_are_held_to_their_own_cores(tmp_path):
    (tmp_path / "cores.py").write_text("import os\nprint('held to', sorted(os.sched_getaffinity(0)))\n")
    tool("run.py", "--scripts", str(tmp_path / "cores.py"), "--env-ids", "CartPole-v1", "--seeds", "1", "2",
         "--workers", "2", "--out", "out", cwd=tmp_path).communicate(timeout=120)
    held = [re.search(r"held to (\[.*\])", (tmp_path / "out" / f"cores__CartPole-v1__{seed}" / "log.txt").read_text())[1]
            for seed in (1, 2)]
    assert held == [str(sorted(runner.cores_for(slot, 2))) for slot in (0, 1)]  # [0] and [1] on 2 cores


def test_runner_records_non_finite_returns_as_failed(tmp_path):
    folder = tmp_path / "ppo_discrete__CartPole-v1__1"
    writer = SummaryWriter(str(folder / "runs" / "r"))
    for step, value in enumerate([10.0, float("nan"), 12.0]):
        writer.add_scalar("charts/episodic_return", value, 100 * step)
    writer.close()
    runner.write_json(str(folder / "run.json"), {"command": [], "elapsed": 1.0})
    finished = subprocess.run(["true"])
    run = {"script": "ppo_discrete.py", "env_id": "CartPole-v1", "seed": 1, "folder": str(folder),
           "process": finished, "started": time.time(), "elapsed_before": 1.0}
    result = runner.finish(run)
    assert result["status"] == "failed" and "non-finite" in result["reason"] and "step 100" in result["reason"]


def test_runner_killed_and_restarted_skips_finished_runs_and_resumes_the_interrupted_one(tmp_path):
    out = tmp_path / "out"
    command = ["--scripts", "ppo_discrete.py", "--env-ids", "CartPole-v1", "--seeds", "1", "2", "--workers", "1",
               "--out", "out", "--total-timesteps", "16384", "--checkpoint-interval", "1"]  # relative, as users write it
    first_result, second = out / "ppo_discrete__CartPole-v1__1" / "result.json", out / "ppo_discrete__CartPole-v1__2"
    process = tool("run.py", *command, cwd=tmp_path)
    wait_for(lambda: first_result.exists() and list(second.glob("runs/*/checkpoint.pt")))
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 130 and "run the same command again" in output, output
    assert not (second / "result.json").exists()
    finished_before = first_result.read_text(), first_result.stat().st_mtime_ns

    process = tool("run.py", *command, cwd=tmp_path)
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output
    assert "2 runs, 1 already ended" in output
    assert (first_result.read_text(), first_result.stat().st_mtime_ns) == finished_before
    assert "--resume" in (second / "log.txt").read_text().split("===")[-1].splitlines()[0]
    result = json.load(open(second / "result.json"))
    assert result["status"] == "finished" and result["steps"] == 16384


def test_runner_restarts_a_run_stopped_before_its_first_checkpoint_from_scratch(tmp_path):
    out = tmp_path / "out"
    command = ["--scripts", "ppo_discrete.py", "--env-ids", "CartPole-v1", "--seeds", "1", "--out", str(out), "--total-timesteps", "1024"]
    stale = out / "ppo_discrete__CartPole-v1__1" / "runs" / "CartPole-v1__benchmark__1__1"
    stale.mkdir(parents=True)  # what a run killed before its first checkpoint leaves: a TensorBoard run, no checkpoint
    SummaryWriter(str(stale)).close()
    process = tool("run.py", *command, cwd=tmp_path)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 0, output
    assert not stale.exists() and len(list((out / "ppo_discrete__CartPole-v1__1" / "runs").iterdir())) == 1


def test_runner_refuses_a_folder_holding_another_command(bench_runs):
    out, _, _ = bench_runs
    process = tool("run.py", "--scripts", "ppo_discrete.py", "--env-ids", "CartPole-v1", "--seeds", "1", "--out", str(out),
                   "--total-timesteps", "4096", cwd=out.parent)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 1 and output.startswith("error:") and "another command" in output and "Traceback" not in output


def test_plots_have_one_panel_per_env_from_real_runs(bench_runs, tmp_path):
    out, _, _ = bench_runs
    process = tool("plot.py", str(out), "--out", str(tmp_path), cwd=tmp_path)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 0, output
    for name in ("curves_steps.png", "curves_time.png", "aggregate.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    runs = plot.finished_runs([str(out)])
    assert plot.plot_curves(runs, lambda run: run["steps"], "env steps", str(tmp_path / "check.png")) == ["Acrobot-v1", "CartPole-v1"]
    iqms = plot.plot_aggregate(runs, str(tmp_path / "check_aggregate.png"))
    assert list(iqms) == ["ppo_discrete.py\nAcrobot-v1, CartPole-v1"]
    # one label per folder names its lines, so two settings of one script stay apart
    labelled = plot.finished_runs([str(out), str(out)], ["tuned", "defaults"])
    assert sorted(labelled) == [(label, env) for label in ("defaults", "tuned") for env in ("Acrobot-v1", "CartPole-v1")]


def test_the_plots_read_another_return_when_asked_as_a_games_team_return(tmp_path):
    run = tmp_path / "runs" / "a"
    with SummaryWriter(str(run)) as writer:
        for step, (agent, team) in enumerate([(-3.0, -9.0), (-2.0, -6.0)], start=1):
            writer.add_scalar("charts/episodic_return", agent, step)
            writer.add_scalar("charts/team_episodic_return", team, step)
    assert common.read_run(str(tmp_path))["final_return"] == -2.5
    assert common.read_run(str(tmp_path), "charts/team_episodic_return")["final_return"] == -7.5


def test_the_aggregate_of_envs_without_a_reference_score_shows_raw_returns(tmp_path, monkeypatch):
    runs = {(script, env_id): [{"final_return": value} for value in (1.0, 2.0, 4.0)]
            for script in ("a.py", "b.py") for env_id in ("MyEnv-v0", "OtherEnv-v0")}
    saved = []  # the panels of each figure written, by their titles
    monkeypatch.setattr(plot.plt.Figure, "savefig", lambda figure, *args, **kwargs: saved.append([a.get_title() for a in figure.axes]))
    assert plot.plot_aggregate(runs, str(tmp_path / "aggregate.png")) == {}
    assert saved == [["MyEnv-v0", "OtherEnv-v0"]]  # one panel per env, not an empty aggregate


def test_smoothed_curve_and_iqm_match_brute_force():
    rng = np.random.default_rng(0)
    steps, returns = np.sort(rng.choice(10_000, 50, replace=False)), rng.normal(size=50)
    grid = np.linspace(0, 10_000, 37)
    for point, value in zip(grid, plot.curve_on_grid(steps, returns, grid)):
        ended = returns[steps <= point]
        assert np.isnan(value) if ended.size == 0 else value == pytest.approx(ended[-plot.SMOOTHING_EPISODES:].mean())
    per_env = (rng.normal(size=3), rng.normal(size=3), rng.normal(size=2))
    pooled = np.sort(np.concatenate(per_env))  # 8 scores: the IQM is the mean of the middle 4
    assert plot.interquartile_mean(*per_env) == pytest.approx(pooled[2:6].mean())


def sweep_with_two_processes(tmp_path, storage):
    study_name = f"test_{uuid.uuid4().hex[:8]}"
    command = ["--script", "ppo_discrete.py", "--env-ids", "CartPole-v1", "--num-trials", "4", "--num-seeds", "1",
               "--total-timesteps", "512", "--num-envs", "1", "--study-name", study_name, "--storage", storage,
               "--work-dir", str(tmp_path / "work")]
    workers = [tool("tune.py", *command, cwd=tmp_path) for _ in range(2)]
    outputs = [worker.communicate(timeout=300)[0] for worker in workers]
    for worker, output in zip(workers, outputs):
        assert worker.returncode == 0, output
        assert "python ppo_discrete.py --env-id CartPole-v1 --total-timesteps 512 --learning-rate" in output
    study = optuna.load_study(study_name=study_name, storage=storage if "://" in storage else
                              optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(storage)))
    counted = [t for t in study.trials if not t.user_attrs.get("surplus")]
    assert len(counted) == 4 and all(t.state == TrialState.COMPLETE for t in counted)
    assert sorted(t.number for t in study.trials) == list(range(len(study.trials)))  # no number twice
    ran = {t.number for t in counted}
    assert all(f"trial {number}:" in "".join(outputs) for number in ran)  # each trial ran in one of the workers
    return study


def test_reach_finds_the_first_episode_whose_window_mean_reaches_the_level(tmp_path):
    """SB3 Monitor files of two envs, merged in time order, against a brute-force scan."""
    rng = np.random.default_rng(0)
    for env in range(2):
        with open(tmp_path / f"{env}.monitor.csv", "w") as f:
            f.write("#" + json.dumps({"t_start": 1000.0 + env, "env_id": "x"}) + "\nr,l,t\n")
            for t in np.sort(rng.uniform(0, 600, 50)):
                f.write(f"{rng.normal(t, 50):.3f},{rng.integers(10, 100)},{t:.3f}\n")
    run = reach.read_monitor(str(tmp_path))
    assert len(run["returns"]) == 100 and np.all(np.diff(run["wall_times"]) >= 0) and run["start_time"] == 1000.0
    for level in (100.0, 300.0, 10_000.0):
        expected = next((i for i in range(4, 100) if run["returns"][i - 4 : i + 1].mean() >= level), None)
        found = reach.first_reached(run, level, window=5)
        if expected is None:
            assert found is None
        else:
            assert found == (run["steps"][expected], (run["wall_times"][expected] - 1000.0) / 60)


def test_sweep_two_processes_share_a_journal_file(tmp_path):
    sweep_with_two_processes(tmp_path, str(tmp_path / "study.journal"))


def test_sweep_two_processes_share_a_postgresql_study(tmp_path):
    url = os.environ.get("PPO_TEST_POSTGRES_URL")
    if not url:
        pytest.skip("set PPO_TEST_POSTGRES_URL to a PostgreSQL database (.ci/run starts one)")
    study = sweep_with_two_processes(tmp_path, url)
    optuna.delete_study(study_name=study.study_name, storage=url)


def test_tuner_asks_for_the_score_range_of_an_unknown_env_among_several(tmp_path):
    process = tool("tune.py", "--env-ids", "MountainCar-v0", "CartPole-v1", "--work-dir", str(tmp_path), cwd=tmp_path)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 2 and "Traceback" not in output, output
    assert "no score range for MountainCar-v0: give --score-range MountainCar-v0 RANDOM REFERENCE" in output, output


def test_a_sweep_of_the_readme_own_env_alone_runs_first_time_and_scores_raw_returns(tmp_path):
    """my_envs.py where the user works, the repository's script: its runs (in folders of their own) import it."""
    readme_own_env(tmp_path)
    output = tool("tune.py", "--script", "ppo_continuous.py", "--env-ids", "my_envs:PointReach-v0", "--num-trials", "1",
                  "--num-seeds", "1", "--total-timesteps", "1024", "--num-envs", "1", "--num-steps", "512",
                  "--num-minibatches", "4", "--work-dir", "work", cwd=tmp_path).communicate(timeout=300)[0]
    assert "best: trial 0, score (the mean final return: no score range) -" in output, output
    assert "python ppo_continuous.py --env-id my_envs:PointReach-v0 --total-timesteps 1024 --learning-rate" in output


def test_the_readme_quick_sweep_of_ones_own_env_finishes_its_trials_in_folders_safe_for_paths(tmp_path):
    """A budget below the search's largest batch: the search keeps to the batches that fit it, says so once, and
    every trial finishes (before, each trial that drew a larger batch failed)."""
    section = readme_own_env(tmp_path)
    command = re.search(r"^    python benchmarks/tune.py (.*--total-timesteps 2048.*)$", section, re.MULTILINE).group(1)
    output = tool("tune.py", *command.split(), "--work-dir", "work", cwd=tmp_path).communicate(timeout=300)[0]
    assert output.count("note: the search keeps to batches within --total-timesteps 2048") == 1, output
    assert "best: trial" in output and "(3 trials finished)" in output, output
    assert glob.glob(str(tmp_path / "work" / "*" / "trial_0" / "my_envs-PointReach-v0__1" / "log.txt"))


@pytest.mark.parametrize("args, message, code", [
    (["--total-timesteps", "0"], "--total-timesteps must be positive, got 0", 2),
    (["--storage", "postgresql://nobody:none@127.0.0.1:9/none"], "error: cannot open the study in postgresql://nobody:none@127.0.0.1:9/none", 1),
])
def test_tuner_refuses_bad_input_in_one_line(tmp_path, args, message, code):
    process = tool("tune.py", "--num-trials", "1", *args, cwd=tmp_path)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == code and message in output.strip().splitlines()[-1] and "Traceback" not in output, output


def test_sweep_interrupted_queues_its_trial_again_and_the_next_start_runs_it(tmp_path):
    storage = str(tmp_path / "study.journal")
    command = ["--env-ids", "CartPole-v1", "--num-trials", "1", "--num-seeds", "1", "--total-timesteps", "8192",
               "--study-name", "s", "--storage", storage, "--work-dir", str(tmp_path / "work")]
    # Ctrl-C as at a terminal, also when the tests run as a background job (whose processes start with SIGINT ignored)
    process = tool("tune.py", *command, cwd=tmp_path, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    wait_for(lambda: (tmp_path / "work" / "s" / "trial_0" / "CartPole-v1__1" / "log.txt").exists())
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 1 and "trial 0 is queued again" in output and "Traceback" not in output, output

    process = tool("tune.py", *command, cwd=tmp_path)
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output
    interrupted, rerun = optuna.load_study(study_name="s", storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(storage))).trials
    assert interrupted.user_attrs["interrupted"] and interrupted.state == TrialState.FAIL
    assert rerun.state == TrialState.COMPLETE and rerun.params == interrupted.params


def test_a_stop_that_lands_while_a_tool_starts_a_run_is_held_not_lost():
    """Python drops a KeyboardInterrupt raised in fork's hooks, so the tools hold Ctrl-C and SIGTERM while a child
    starts (the sweep test above once lost its Ctrl-C so); the child takes both again."""
    previous, reached = signal.signal(signal.SIGINT, signal.default_int_handler), False
    try:
        with pytest.raises(KeyboardInterrupt):
            with common.stops_held():
                signal.pthread_kill(threading.get_ident(), signal.SIGINT)  # as if it landed during the fork
                child = subprocess.Popen([sys.executable, "-c", "print(open('/proc/self/status').read())"],
                                         stdout=subprocess.PIPE, text=True, preexec_fn=common.stop_with_parent)
                reached = True
    finally:
        signal.signal(signal.SIGINT, previous)
    assert reached, "the stop was not held while the child started"
    blocked = int(re.search(r"SigBlk:\s*([0-9a-f]+)", child.communicate(timeout=60)[0]).group(1), 16)
    assert not blocked & (1 << signal.SIGINT - 1 | 1 << signal.SIGTERM - 1), hex(blocked)


def test_sweep_prunes_a_trial_that_trails_the_earlier_ones(tmp_path):
    storage = str(tmp_path / "study.journal")
    study = optuna.create_study(study_name="s", direction="maximize", storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(storage)))
    for _ in range(5):  # five earlier trials that scored as well as the reference after their first run
        trial = study.ask()
        trial.report(1.0, 0)
        study.tell(trial, 1.0)
    process = tool("tune.py", "--env-ids", "CartPole-v1", "--num-trials", "6", "--num-seeds", "2", "--total-timesteps", "512",
                   "--num-envs", "1", "--study-name", "s", "--storage", storage, "--work-dir", str(tmp_path / "work"), cwd=tmp_path)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 0 and "trial 5: pruned after 1 runs" in output, output
    assert not (tmp_path / "work" / "s" / "trial_5" / "CartPole-v1__2").exists()  # its second seed never ran


@pytest.mark.parametrize("script", ["ppo_discrete.py", "ppo_continuous.py", "ppo_vector_sameStep.py", "my_experiment.py"])
def test_breakdown_splits_the_whole_run_into_its_phases(script, tmp_path):
    if script == "my_experiment.py":  # a copy of a script, profiled under its own name
        shutil.copy(os.path.join(ROOT, "ppo_discrete.py"), tmp_path / script)
    output = tool("breakdown.py", script, "--total-timesteps", "512", "--num-envs", "2", "--num-steps", "64", cwd=tmp_path).communicate(timeout=300)[0]
    assert "4 iterations under cProfile" in output, output
    rows = {line[:40].strip(): line[40:].split() for line in output.splitlines() if line.endswith("%")}
    assert list(rows) == ["startup: imports, env, network", "env steps", "policy in the rollout", "normalization and reward scaling",
                          "values and GAE", "update", "logging, state copy and checkpoints", "the rest of the loop"]
    for phase in ("env steps", "policy in the rollout", "values and GAE", "update"):
        assert float(rows[phase][0]) > 0, phase  # found where train() calls it
    assert abs(sum(float(row[-1].rstrip("%")) for row in rows.values()) - 100) < 0.5


def test_speed_alternates_the_contenders_and_times_the_env_alone_in_every_repeat(tmp_path):
    output = tool("speed.py", "--case", "humanoid-cleanrl", "--total-timesteps", "2048", "--repeats", "2", "--env-alone", cwd=tmp_path).communicate(timeout=300)[0]
    timed = [line.split(":")[0] for line in output.splitlines() if " repeat " in line]
    assert timed == [f"Humanoid-v5 repeat {r} {name}" for r in (1, 2) for name in ("defaults", "CLEANRL", "env alone")], output
    shares = [int(line.rsplit(" at ", 1)[1].split("%")[0]) for line in output.splitlines() if " env alone:" in line]
    summary = output.splitlines()[-1]
    assert f"(per repeat: {min(shares)}% to {max(shares)}%)" in summary and "defaults runs at" in summary, output
    assert "env alone (8 sub-envs, one process)" in summary, output  # as many as the defaults step
    assert not os.listdir(tmp_path)  # the timed runs write their runs/ elsewhere


def test_speed_times_one_script_path_as_both_contenders_under_the_cases_two_flag_sets(tmp_path):
    script = os.path.join(ROOT, "ppo_discrete.py")  # e.g. a copy's memory against none: both sides the same path
    output = tool("speed.py", "--case", "cartpole-lstm", "--script", script, "--script-b", script, "--total-timesteps",
                  "1024", "--repeats", "1", cwd=tmp_path).communicate(timeout=300)[0]
    timed = [line.split(": ")[0] for line in output.splitlines() if " repeat " in line]
    assert timed == [f"CartPole-v1 repeat 1 {script} ({name})" for name in ("none", "lstm")], output
    assert f"{script} (none)" in output.splitlines()[-1] and "ratio" in output.splitlines()[-1], output


@pytest.mark.skipif(importlib.util.find_spec("envpool") is None, reason="needs envpool==1.2.5")
def test_speed_times_a_dmc_task_and_its_envpool_env_alone(tmp_path, monkeypatch):
    output = tool("speed.py", "--case", "dmc-envpool", "--env-id", "WalkerWalk-v1", "--total-timesteps", "2048",
                  "--repeats", "1", "--env-alone", cwd=tmp_path).communicate(timeout=300)[0]
    timed = [line.split(":")[0] for line in output.splitlines() if " repeat " in line]
    assert timed == [f"WalkerWalk-v1 repeat 1 {name}" for name in ("1 thread", "a thread per core", "env alone")], output
    made = []  # the env alone is the one the script builds: EnvPool's, its Dict observations flattened
    make_envs = ppo_continuous.make_envs
    monkeypatch.setattr(ppo_continuous, "make_envs", lambda args, *rest: made.append(args) or make_envs(args, *rest))
    assert speed.env_alone_sps("WalkerWalk-v1", 2, 64, 1, envpool_threads=1) > 0
    assert [(args.env_backend, args.env_threads) for args in made] == [("envpool", 1)]


@pytest.mark.skipif(importlib.util.find_spec("envpool") is None, reason="needs envpool==1.2.5")
def test_envpool_ids_surveys_each_id_with_both_scripts_and_resumes(tmp_path):
    out = tmp_path / "ids.jsonl"
    ids = ["CheetahRun-v1", "FrozenLake-v1", "Pong-v5"]
    output = tool("envpool_ids.py", "--out", str(out), "--ids", *ids, cwd=tmp_path).communicate(timeout=300)[0]
    outcomes = {(r["script"], r["id"]): r["outcome"] for r in map(json.loads, out.read_text().splitlines())}
    assert outcomes == {("ppo_continuous", "CheetahRun-v1"): "trains", ("ppo_discrete", "FrozenLake-v1"): "trains",
                        ("ppo_discrete", "Pong-v5"): "trains",  # an image, through the CNN
                        **{(script, env_id): "refused" for script, env_id in [("ppo_discrete", "CheetahRun-v1"),
                           ("ppo_continuous", "FrozenLake-v1"), ("ppo_continuous", "Pong-v5")]}}
    assert "ppo_discrete.py: refused 1, trains 2" in output and "ppo_continuous.py: refused 2, trains 1" in output, output
    tool("envpool_ids.py", "--out", str(out), "--ids", *ids, cwd=tmp_path).communicate(timeout=300)
    assert len(out.read_text().splitlines()) == 6  # surveyed once: the second start found every pair done


def test_learning_runs_seeds_through_the_runner_and_finds_the_threshold(tmp_path):
    output = tool("learning.py", "--script", "ppo_discrete.py", "--env-id", "CartPole-v1", "--seeds", "1", "2", "--threshold", "5",
                  "--total-timesteps", "1024", "--out", str(tmp_path / "out"), cwd=tmp_path).communicate(timeout=300)[0]
    rows = [line.split("|") for line in output.splitlines() if line.startswith("| 1 ") or line.startswith("| 2 ")]
    assert len(rows) == 2 and all(int(row[2].replace(",", "")) > 0 for row in rows), output  # a random policy lasts 5 steps
    assert sorted(os.listdir(tmp_path / "out")) == ["ppo_discrete__CartPole-v1__1", "ppo_discrete__CartPole-v1__2", "results.csv",
                                                    "results.md", "runner.lock"]
    assert "CartPole-v1, ppo_discrete.py: last-100 mean" in output


def test_a_sweep_takes_a_copied_script_and_keys_its_study_by_every_setting(tmp_path):
    shutil.copy(os.path.join(ROOT, "ppo_discrete.py"), tmp_path / "my_experiment.py")
    names = []
    for steps in ("512", "1024"):
        output = tool("tune.py", "--script", "my_experiment.py", "--env-ids", "CartPole-v1", "--num-trials", "1", "--num-seeds", "1",
                      "--total-timesteps", steps, "--num-envs", "1", "--work-dir", str(tmp_path / "work"), cwd=tmp_path).communicate(timeout=300)[0]
        assert f"python my_experiment.py --env-id CartPole-v1 --total-timesteps {steps} --learning-rate" in output, output
        best = next(line for line in output.splitlines() if line.startswith("python my_experiment.py"))
        assert best.count("--num-envs") == 1 and best.endswith("--num-envs 1"), best  # a flag given fixes it: not searched
        names.append(re.search(r"\(study (\S+): mean over envs, 1 seeds a trial\)", output).group(1))
    assert names == ["my_experiment__CartPole-v1__512steps__1seeds__mean__--num-envs__1",
                     "my_experiment__CartPole-v1__1024steps__1seeds__mean__--num-envs__1"]  # two studies, not one


def test_reach_says_what_is_wrong_with_its_input_in_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "no_episode" / "runs" / "a").mkdir(parents=True)
    SummaryWriter(str(tmp_path / "no_episode" / "runs" / "a")).close()  # an events file without any episode
    for args, last_line in ((["nowhere"], "error: no folder nowhere"), (["empty", "--window", "0"], "--window must be at least 1, got 0"),
                            (["empty"], "error: no runs under empty (TensorBoard event files or SB3 monitor files)")):
        output = tool("reach.py", *args, "--levels", "10", cwd=tmp_path).communicate(timeout=60)[0]
        assert output.strip().splitlines()[-1].endswith(last_line) and "Traceback" not in output, output
    output = tool("reach.py", "no_episode", "--levels", "10", cwd=tmp_path).communicate(timeout=60)[0]
    assert "| no_episode/runs/a | - | no charts/episodic_return logged" in output and "Traceback" not in output, output


def test_a_damaged_result_is_read_again_from_the_logs_and_left_out_of_the_plots(tmp_path):
    command = ["--scripts", "ppo_discrete.py", "--env-ids", "CartPole-v1", "--seeds", "1", "--out", "out", "--total-timesteps", "1024"]
    assert tool("run.py", *command, cwd=tmp_path).wait(timeout=120) == 0
    (tmp_path / "out" / "ppo_discrete__CartPole-v1__1" / "result.json").write_text('{"status": "fin')  # cut off mid-write
    output = tool("plot.py", "out", "--out", "plots", cwd=tmp_path).communicate(timeout=120)[0]
    assert "left out: out/ppo_discrete__CartPole-v1__1 (JSONDecodeError" in output and "Traceback" not in output, output
    log = (tmp_path / "out" / "ppo_discrete__CartPole-v1__1" / "log.txt").read_text()
    output = tool("run.py", *command, cwd=tmp_path).communicate(timeout=120)[0]  # not ended, but it had finished
    assert "1 runs, 0 already ended" in output and "Traceback" not in output, output
    result = json.loads((tmp_path / "out" / "ppo_discrete__CartPole-v1__1" / "result.json").read_text())
    assert result["status"] == "finished" and result["steps"] == 1024, result  # read from its logs, not trained again
    assert (tmp_path / "out" / "ppo_discrete__CartPole-v1__1" / "log.txt").read_text() == log
    (tmp_path / "a_file").write_text("")
    output = tool("plot.py", "out", "--out", "a_file", cwd=tmp_path).communicate(timeout=120)[0]
    assert output.strip().splitlines()[-1].endswith("--out a_file is a file, not a folder"), output


def test_a_finished_run_without_its_result_counts_as_finished_by_its_checkpoint_locally_and_in_a_requeued_task(tmp_path):
    """A run stopped while it exited after its end (no result.json, a log whose last line is not `done:`): its
    checkpoint holds its last step, so the runner, and a SLURM task requeued after the end, read its result from its
    logs and checkpoint and do no work (a resume would be refused, and the run reported failed)."""
    command = ["--scripts", "ppo_discrete.py", "--env-ids", "CartPole-v1", "--seeds", "1", "--out", "out", "--total-timesteps", "1024"]
    assert tool("run.py", *command, cwd=tmp_path).wait(timeout=120) == 0
    folder = tmp_path / "out" / "ppo_discrete__CartPole-v1__1"
    first = json.loads((folder / "result.json").read_text())
    plan = {"job": "7", "runs": [{"script": "ppo_discrete.py", "env_id": "CartPole-v1", "seed": 1, "folder": "out/" + folder.name,
                                  "command": json.loads((folder / "run.json").read_text())["command"]}]}
    (tmp_path / "out" / "slurm-job-7.json").write_text(json.dumps(plan))
    for how in ("local", "requeued SLURM task"):
        (folder / "result.json").unlink()
        with open(folder / "log.txt", "a") as log:
            log.write("KeyboardInterrupt\n")
        log = (folder / "log.txt").read_text()
        if how == "local":
            process = tool("run.py", *command, cwd=tmp_path)
        else:  # as SLURM starts the task again (no squeue here: the grid is not collected)
            task = {"SLURM_ARRAY_JOB_ID": "7", "SLURM_ARRAY_TASK_ID": "0", "SLURM_JOB_ID": "8"}
            process = tool("run.py", "--slurm-task", "0", "--out", "out", cwd=tmp_path, env={**os.environ, **task})
        output = process.communicate(timeout=120)[0]
        assert process.returncode == 0 and "failed:" not in output and "Traceback" not in output, output
        result = json.loads((folder / "result.json").read_text())
        assert (result["status"], result["steps"], result["final_return"]) == ("finished", 1024, first["final_return"]), how
        assert (folder / "log.txt").read_text() == log, how  # not started again


def test_the_runner_writes_its_files_durably(tmp_path, monkeypatch):
    """run.json and result.json: the file reaches the disk before the rename, and the rename after it."""
    calls = record_fsync_and_replace(monkeypatch)
    path = str(tmp_path / "run.json")
    runner.write_json(path, {"elapsed": 1.0})
    assert calls == [("fsync", path + ".tmp"), ("replace", path + ".tmp", path), ("fsync", str(tmp_path))]
    assert runner.read_json(path) == {"elapsed": 1.0}


def test_checkpoint_write_times_both_ways_of_writing(tmp_path, monkeypatch, capsys):
    import checkpoint_write

    monkeypatch.chdir(tmp_path)  # it writes in a temporary folder of the current one, on the disk the runs use
    checkpoint_write.main(repeats=2)
    assert list(tmp_path.iterdir()) == []  # and leaves nothing behind
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("checkpoint of ") and "2 writes each way" in lines[0], lines
    assert [line.split(":")[0].strip() for line in lines[1:]] == ["atomic only", "atomic and durable"], lines


def test_sb3_ppo_runs_the_scripts_defaults():
    """The speed comparisons are fair only if Stable-Baselines3 trains with the settings our scripts default to."""
    sb3_ppo = pytest.importorskip("sb3_ppo", reason="needs stable-baselines3")
    import ppo_continuous
    import ppo_discrete

    for config, args in ((sb3_ppo.DISCRETE, ppo_discrete.Args()), (sb3_ppo.CONTINUOUS, ppo_continuous.Args())):
        ours = dict(num_envs=args.num_envs, n_steps=args.num_steps, num_minibatches=args.num_minibatches,
                    n_epochs=args.update_epochs, learning_rate=args.learning_rate, ent_coef=args.ent_coef,
                    gae_lambda=args.gae_lambda, clip_range=args.clip_coef, vf_coef=args.vf_coef,
                    clip_range_vf=args.clip_coef if args.clip_vloss else None, max_grad_norm=args.max_grad_norm,
                    log_std_init=getattr(args, "init_log_std", 0.0))
        assert config == ours


def slurm_is_running():
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def slurm_task_state(task):
    """(state, restarts) of one array task, e.g. ("PENDING", 1); (None, 0) once it has left the queue."""
    shown = subprocess.run(["scontrol", "show", "job", task], capture_output=True, text=True).stdout
    state, restarts = re.search(r"JobState=(\w+)", shown), re.search(r"Restarts=(\d+)", shown)
    return (state.group(1) if state else None), int(restarts.group(1)) if restarts else 0


@pytest.mark.skipif(not slurm_is_running(), reason="no SLURM cluster here (CI starts a one-node one: .ci/slurm_cluster.sh)")
def test_a_grid_on_slurm_survives_a_time_limit_warning_and_a_requeue_and_matches_the_local_grid(tmp_path):
    """Three runs as a job array on a real (one-node) cluster: run 1 gets the warning SLURM sends before a time limit
    (USR1 to the task's batch shell), run 2 is requeued as preemption does it. Both save, are queued again and resume
    from their checkpoints to the full step count; run 3, untouched, has the numbers of the same run made locally."""
    grid = ["--scripts", "ppo_discrete.py", "--env-ids", "CartPole-v1", "--total-timesteps", "30720", "--checkpoint-interval", "1"]
    collect = ["run.py", *grid, "--seeds", "1", "2", "3", "--out", "slurm", "--slurm"]
    assert "submitted SLURM job" in tool(*collect, cwd=tmp_path).communicate(timeout=120)[0]
    (plan,) = glob.glob(str(tmp_path / "slurm" / "slurm-job-*.json"))
    job = json.load(open(plan))["job"]
    try:
        checkpoints = {seed: str(tmp_path / "slurm" / f"ppo_discrete__CartPole-v1__{seed}" / "runs" / "*" / "checkpoint.pt")
                       for seed in (1, 2)}
        wait_for(lambda: all(glob.glob(path) for path in checkpoints.values()), timeout=180)
        subprocess.run(["scancel", "--batch", "--signal=USR1", f"{job}_0"], check=True)  # the warning of a time limit
        subprocess.run(["scontrol", "requeue", f"{job}_1"], check=True)  # preemption with requeue
        for task in (f"{job}_0", f"{job}_1"):
            wait_for(lambda: slurm_task_state(task)[1] >= 1 and slurm_task_state(task)[0] == "PENDING", timeout=120)
            subprocess.run(["scontrol", "update", f"JobId={task}", "StartTime=now"], check=True)  # else held for 2 min
        deadline, output = time.time() + 300, ""
        while "written:" not in output and time.time() < deadline:
            time.sleep(5)
            output = tool(*collect, cwd=tmp_path).communicate(timeout=120)[0]
        assert "written:" in output and "| ppo_discrete.py | CartPole-v1 |" in output and "| 3 | 30,720 |" in output, output
    finally:
        subprocess.run(["scancel", job])
    for seed in (1, 2):  # stopped once, then resumed: two attempts, the second from the checkpoint
        attempts = re.findall(r"^=== .*", open(tmp_path / "slurm" / f"ppo_discrete__CartPole-v1__{seed}" / "log.txt").read(), re.M)
        assert len(attempts) == 2 and "--resume" not in attempts[0] and "--resume" in attempts[1], attempts
    local = tool("run.py", *grid, "--seeds", "3", "--out", "local", cwd=tmp_path).communicate(timeout=300)[0]
    results = [json.load(open(tmp_path / out / "ppo_discrete__CartPole-v1__3" / "result.json")) for out in ("slurm", "local")]
    assert [(r["final_return"], r["steps"]) for r in results] == [(results[1]["final_return"], 30720)] * 2, local


@pytest.mark.parametrize("case", ["no sbatch", "rejected", "local grid in progress"])
def test_a_slurm_grid_that_cannot_go_gets_one_line(case, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text("#!/bin/sh\necho 'sbatch: error: invalid partition specified: nosuch' >&2\nexit 1\n")
    (bin_dir / "sbatch").chmod(0o755)
    path = os.path.dirname(sys.executable) + os.pathsep + ("/nonexistent" if case == "no sbatch" else str(bin_dir))
    (tmp_path / "out").mkdir()
    lock = open(tmp_path / "out" / "runner.lock", "w")
    if case == "local grid in progress":
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as the local runner working in this folder holds it
    process = tool("run.py", "--scripts", "ppo_discrete.py", "--env-ids", "CartPole-v1", "--out", "out", "--slurm",
                   "--sbatch-args=--partition=nosuch", cwd=tmp_path, env={**os.environ, "PATH": path})
    output = process.communicate(timeout=60)[0]
    message = {"no sbatch": "error: --slurm needs SLURM's sbatch on PATH: run it where jobs are submitted (a login node)",
               "rejected": "error: sbatch refused the job: sbatch: error: invalid partition specified: nosuch",
               "local grid in progress": "error: another runner is working in out; wait for it, or use another --out"}[case]
    assert (process.returncode, output.strip()) == (1, message)
    assert "Traceback" not in output and not glob.glob(str(tmp_path / "out" / "slurm-job-*"))


CANDIDATES = sorted(glob.glob(os.path.join(ROOT, "benchmarks", "candidates", "*.patch")))


@pytest.mark.skipif(shutil.which("patch") is None, reason="needs the patch tool")
@pytest.mark.parametrize("candidate", CANDIDATES, ids=os.path.basename)
def test_each_screened_candidate_is_made_by_its_documented_command_and_runs(candidate, tmp_path):
    """benchmarks/results/README.md makes each candidate's copy with `patch -o`: it must still apply and train."""
    name = os.path.basename(candidate)[: -len(".patch")]
    results = open(os.path.join(ROOT, "benchmarks", "results", "README.md")).read()
    assert f"    patch -o {name}.py ppo_continuous.py benchmarks/candidates/{name}.patch\n" in results
    made = subprocess.run(["patch", "--fuzz=0", "-o", str(tmp_path / f"{name}.py"), "ppo_continuous.py", candidate],
                          cwd=ROOT, capture_output=True, text=True)
    assert made.returncode == 0, made.stdout + made.stderr
    trained = subprocess.run([sys.executable, f"{name}.py", "--env-id", "Pendulum-v1", "--total-timesteps", "1024",
                              "--num-envs", "2"], cwd=tmp_path, capture_output=True, text=True)
    assert trained.returncode == 0 and "done: 1,024 steps" in trained.stdout, trained.stdout + trained.stderr


def test_no_signal_bodies_have_no_reward_and_the_bare_command_trains_on_them(tmp_path):
    """benchmarks/no_signal.py's bodies end their episodes as the real ones do, with every reward 0; the script
    reaches them as its docstring says (`--env-id benchmarks.no_signal:NoSignal-Hopper-v5`, from the repository)."""
    import gymnasium as gym
    import no_signal  # noqa: F401 (registers the bodies)

    env, real = gym.make("NoSignal-Hopper-v5"), gym.make("Hopper-v5")
    env.reset(seed=0), real.reset(seed=0)
    for _ in range(50):
        action = real.action_space.sample()
        (obs, reward, terminated, _, _), (real_obs, _, real_terminated, _, _) = env.step(action), real.step(action)
        assert reward == 0.0 and terminated == real_terminated and np.array_equal(obs, real_obs)
        if terminated:
            break
    # the script's folder, the repository, is on the import path: benchmarks.no_signal is found from any folder
    trained = subprocess.run([sys.executable, os.path.join(ROOT, "ppo_continuous.py"), "--env-id",
                              "benchmarks.no_signal:NoSignal-Hopper-v5", "--total-timesteps", "512", "--num-envs", "2"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert trained.returncode == 0 and "done: 512 steps" in trained.stdout, trained.stdout + trained.stderr


@pytest.mark.parametrize("experiment, moves", [("baseline", True), ("std-frozen", False), ("decoupled", True),
                                               ("held-out", True), ("held-out-envs", True)])
def test_the_no_signal_test_bed_records_the_log_std_each_experiment_leaves(experiment, moves, tmp_path):
    """A short run of each kind: the result line and the CSV row give the log std's start, end and drift; an
    experiment that freezes the std leaves it exactly where it started, one that trains it moves it."""
    csv_path = tmp_path / "drift.csv"
    process = tool("no_signal.py", "--experiment", experiment, "--env-id", "NoSignal-Hopper-v5", "--total-timesteps",
                   "1024", "--num-envs", "2", "--init-log-std", "-0.5", "--csv", str(csv_path), cwd=tmp_path,
                   stderr=subprocess.DEVNULL)
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output
    (row,) = list(csv.DictReader(open(csv_path)))
    assert (row["experiment"], row["env_id"], row["steps"], float(row["start"])) == (
        experiment, "NoSignal-Hopper-v5", "1024", -0.5)
    assert float(row["drift"]) == pytest.approx(float(row["end"]) - float(row["start"]), abs=1e-4)
    assert (float(row["drift"]) != 0.0) == moves
    assert f"experiment {experiment}, env_id NoSignal-Hopper-v5" in output


def test_the_no_signal_test_bed_refuses_an_unknown_experiment_in_one_line(tmp_path):
    output, _ = tool("no_signal.py", "--experiment", "nosuch", cwd=tmp_path).communicate(timeout=120)
    assert output.strip().splitlines()[-1].startswith("error: --experiment must be one of baseline, shuffled,")


def test_maskable_ppo_and_at_steps_report_the_last_100_episodes_at_given_steps(tmp_path):
    """The Taxi-v4 comparison's two tools: sb3-contrib's MaskablePPO with the env's info mask, and our runs' returns."""
    pytest.importorskip("sb3_contrib", reason="needs sb3-contrib")
    output = tool("maskable_ppo.py", "--total-timesteps", "512", "--n-steps", "256", "--report-at", "300", "512",
                  cwd=tmp_path)
    lines = output.communicate(timeout=300)[0].splitlines()
    assert re.fullmatch(r"Taxi-v4 MaskablePPO seed 1: last-100 mean -?\d+\.\d\d at 300, -?\d+\.\d\d at 512", lines[-2])
    run = start("ppo_discrete.py", "--env-id", "Taxi-v4", "--total-timesteps", "2048", cwd=tmp_path)
    assert run.communicate(timeout=300)[0].startswith("action masks: from the info's 'action_mask'\n")
    (tmp_path / "runs" / "started").mkdir()
    (tmp_path / "runs" / "started" / "events.out.tfevents.0").write_bytes(b"")  # a run that has logged no episode
    table, why = tool("at_steps.py", "runs", "--at", "100", "2048", cwd=tmp_path, stderr=subprocess.PIPE).communicate(
        timeout=120)
    table = table.splitlines()
    assert table[0] == "run | last 100 at 100 | last 100 at 2,048"
    assert re.fullmatch(r"Taxi-v4__ppo_discrete__1__\d+ \| - \| -?\d+\.\d\d", table[1])  # no episode ends by step 100
    assert table[2] == "started | - | -"  # and stderr says why
    assert why == "started: no charts/episodic_return logged under runs/started (no episode finished?)\n"


def test_every_env_table_counts_the_runs_below_the_line_against_each_envs_reference(tmp_path):
    """The every-env table: each env's runs (result.json as run.py writes it), how many end below three quarters of
    the reference (4/3 of a negative one), and the tabular envs' optimums computed from their own tables."""
    assert every_env.optimum("CliffWalking-v1") == pytest.approx(-13.0)  # the shortest path along the cliff
    assert every_env.optimum("FrozenLake-v1") == pytest.approx(0.744, abs=1e-3)  # slippery, within its 100 steps
    assert every_env.optimum("Blackjack-v1") == pytest.approx(-0.047, abs=1e-3)  # basic strategy, no doubling
    for seed, final in [(1, 500.0), (2, 300.0), (3, 9.0)]:
        folder = tmp_path / "out" / f"ppo_discrete__CartPole-v1__{seed}"
        folder.mkdir(parents=True)
        status = "failed" if seed == 3 else "finished"
        (folder / "result.json").write_text(json.dumps({"script": "ppo_discrete.py", "env_id": "CartPole-v1",
                                                        "seed": seed, "status": status, "final_return": final}))
    hardcore = tmp_path / "out" / "ppo_continuous__BipedalWalkerHardcore-v3__1"
    hardcore.mkdir()
    (hardcore / "result.json").write_text(json.dumps({"script": "ppo_continuous.py", "seed": 1, "status": "finished",
                                                      "env_id": "BipedalWalkerHardcore-v3", "final_return": -20.0}))
    output = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "every_env.py"), str(tmp_path / "out")],
                            capture_output=True, text=True, timeout=120).stdout
    assert "| CartPole-v1 | ppo_discrete.py | 1,2 | 400.0 ± 100.0 | 1 of 2 | 375.0 | 500.0: " in output, output
    assert "| -20.0 ± 0.0 | 1 of 1, out of reach at 1M | 91.8 | 122.4: " in output, output  # said so, not counted
    shutil.rmtree(hardcore)
    shutil.copytree(tmp_path / "out", tmp_path / "screen")  # the same seeds under another command: refused
    both = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "every_env.py"), str(tmp_path / "out"),
                           str(tmp_path / "screen")], capture_output=True, text=True, timeout=120)
    assert both.returncode == 1 and both.stderr.startswith("error: CartPole-v1 seed 1 is in "), both.stderr
    # --record keeps the runs counted (the folders do not outlive a session); a folder's run replaces its seed's row
    table = [sys.executable, os.path.join(ROOT, "benchmarks", "every_env.py")]
    record = tmp_path / "record" / "runs.csv"
    subprocess.run([*table, str(tmp_path / "out"), "--record", str(record)], check=True, timeout=120)
    header, *rows = record.read_text().splitlines()
    today = f"{tmp_path / 'out'} {datetime.date.today()}"  # where each run was found, and when
    assert header == "env_id,script,seed,final_return,source"
    assert rows == [f"CartPole-v1,ppo_discrete.py,1,500.0,{today}", f"CartPole-v1,ppo_discrete.py,2,300.0,{today}"]
    shutil.rmtree(tmp_path / "out" / "ppo_discrete__CartPole-v1__1")
    (tmp_path / "out" / "ppo_discrete__CartPole-v1__2" / "result.json").write_text(json.dumps(
        {"script": "ppo_discrete.py", "env_id": "CartPole-v1", "seed": 2, "status": "finished", "final_return": 400.0}))
    again = subprocess.run([*table, str(tmp_path / "out"), "--record", str(record)], capture_output=True, text=True,
                           timeout=120).stdout
    assert "| CartPole-v1 | ppo_discrete.py | 1,2 | 450.0 ± 50.0 | 0 of 2 | 375.0 | 500.0: " in again, again
    rows = record.read_text().splitlines()[1:]
    assert rows == [f"CartPole-v1,ppo_discrete.py,1,500.0,{today}", f"CartPole-v1,ppo_discrete.py,2,400.0,{today}"]


def test_every_env_table_counts_blackjack_by_its_checkpoints_evaluated_not_its_last_100_episodes(tmp_path):
    """Blackjack-v1's last 100 training hands are too few for its line: each run's checkpoint plays the episodes asked
    (the script's evaluation) and their mean is the run's return in the table and the record."""
    folder = tmp_path / "out" / "ppo_discrete__Blackjack-v1__1"
    folder.mkdir(parents=True)
    subprocess.run([sys.executable, os.path.join(ROOT, "ppo_discrete.py"), "--env-id", "Blackjack-v1",
                    "--total-timesteps", "1024"], cwd=folder, check=True, capture_output=True, timeout=300)
    (folder / "result.json").write_text(json.dumps({"script": "ppo_discrete.py", "env_id": "Blackjack-v1", "seed": 1,
                                                    "status": "finished", "final_return": 5.0}))  # not a hand's
    record = tmp_path / "runs.csv"
    table = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "every_env.py"), "out",  # as documented
                            "--eval-episodes", "300", "--record", str(record)], cwd=tmp_path, capture_output=True,
                           text=True, timeout=300).stdout
    evaluated = float(record.read_text().splitlines()[1].split(",")[3])
    checkpoint = glob.glob(str(folder / "runs" / "*" / "checkpoint.pt"))[0]
    played = subprocess.run([sys.executable, os.path.join(ROOT, "ppo_discrete.py"), "--eval-checkpoint", checkpoint,
                             "--eval-episodes", "300"], cwd=folder, capture_output=True, text=True, timeout=300).stdout
    assert f"Blackjack-v1: mean return {evaluated:.2f} ± " in played  # the script's own mean of the same 300 hands
    assert f"| Blackjack-v1 | ppo_discrete.py | 1 | {evaluated:.3f} ± 0.000 | " in table, table
    assert "; each run's checkpoint over 300 episodes |" in table

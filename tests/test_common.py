"""Behaviour that every script shares, tested on each script (the code is duplicated on purpose, so each copy is checked)."""

import glob
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import gymnasium as gym
import imageio_ffmpeg
import numpy as np
import pytest
import torch
from conftest import ROOT, constructed_env_id, record_fsync_and_replace, scalars, short_args, short_flags, start, wait_for

import ppo_continuous
import ppo_discrete
import ppo_vector_sameStep

GAMMA, LAM = 0.9, 0.8


@pytest.fixture(params=[ppo_discrete, ppo_continuous, ppo_vector_sameStep], ids=lambda module: module.__name__)
def ppo(request):
    return request.param


@pytest.fixture(params=[ppo_discrete, ppo_continuous], ids=lambda module: module.__name__)
def next_step_ppo(request):
    """The scripts with NEXT_STEP autoreset (ppo_vector_sameStep.py's GAE is tested in its own file)."""
    return request.param


def next_step_rollout(rng, num_steps=60, num_envs=3):
    """Random rollout data with the NEXT_STEP structure: the row after every episode end is an autoreset row.
    next_values[t] = values[t + 1], and V of the observation after the rollout for the last row."""
    rewards = rng.normal(size=(num_steps, num_envs)).astype(np.float32)
    values = rng.normal(size=(num_steps, num_envs)).astype(np.float32)
    next_value = np.concatenate([values[1:], rng.normal(size=(1, num_envs)).astype(np.float32)])
    terminations = np.zeros((num_steps, num_envs), np.float32)
    truncations = np.zeros((num_steps, num_envs), np.float32)
    valid = np.ones((num_steps, num_envs), np.float32)
    for env in range(num_envs):
        for t in range(num_steps):
            if t > 0 and (terminations[t - 1, env] or truncations[t - 1, env]):
                valid[t, env], rewards[t, env] = 0.0, 0.0  # autoreset row: reward 0, no episode end
            elif rng.random() < 0.1:
                terminations[t, env] = 1.0
            elif rng.random() < 0.1:
                truncations[t, env] = 1.0
    dones = np.maximum(terminations, truncations)
    return rewards, values, next_value, terminations, truncations, dones, valid


def test_gae_matches_brute_force_reference(ppo):
    """GAE straight from its definition, A_t = sum_l (gamma*lam)^l delta_{t+l}, summed until the episode ends,
    on random data where next_values[t] (the bootstrap of row t) is unrelated to values[t + 1] at episode ends."""
    rng = np.random.default_rng(0)
    rewards, values, next_values = (rng.normal(size=(60, 3)).astype(np.float32) for _ in range(3))
    terminations = (rng.random((60, 3)) < 0.1).astype(np.float32)
    dones = np.maximum(terminations, (rng.random((60, 3)) < 0.1).astype(np.float32))
    expected = np.zeros_like(rewards)
    for env in range(3):
        for t in range(60):
            for k in range(t, 60):
                delta = rewards[k, env] + GAMMA * next_values[k, env] * (1 - terminations[k, env]) - values[k, env]
                expected[t, env] += (GAMMA * LAM) ** (k - t) * delta
                if dones[k, env]:
                    break
    actual = ppo.compute_advantages(rewards, values, next_values, terminations, dones, GAMMA, LAM)
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


def test_returns_with_lambda_one_are_discounted_rewards_bootstrapped_only_on_truncation(next_step_ppo):
    ppo = next_step_ppo
    """With lambda = 1, advantage + value is the discounted sum of the episode's remaining rewards, plus
    gamma^n V(true final observation) after a truncation (or at the rollout's end), and nothing after a termination."""
    rng = np.random.default_rng(1)
    rewards, values, next_value, terminations, truncations, dones, valid = next_step_rollout(rng)
    returns = ppo.compute_advantages(rewards, values, next_value, terminations, dones, GAMMA, 1.0) + values
    num_steps, num_envs = rewards.shape
    checked = {"terminated": 0, "truncated": 0}
    for env in range(num_envs):
        for t in np.flatnonzero(valid[:, env]):
            end = next((k for k in range(t, num_steps) if dones[k, env]), num_steps - 1)
            discounted = sum(GAMMA ** (k - t) * rewards[k, env] for k in range(t, end + 1))
            final_value = next_value[end, env]  # V(observation after the episode's last step, or the rollout's)
            if terminations[end, env]:
                expected = discounted
                checked["terminated"] += 1
            else:
                expected = discounted + GAMMA ** (end - t + 1) * final_value
                checked["truncated"] += truncations[end, env] > 0
            assert returns[t, env] == pytest.approx(expected, rel=1e-4, abs=1e-4)
    assert checked["terminated"] > 10 and checked["truncated"] > 10


def test_dropped_autoreset_rows_never_leave_a_minibatch_of_one_row(next_step_ppo, in_tmp):
    """One-step episodes: every other row is an autoreset row, so 8 rows leave 4 real ones for --num-minibatches 4;
    a minibatch of one row has no standard deviation to normalize its advantage by."""
    ppo = next_step_ppo
    path = ppo.train(short_args(ppo, env_id=constructed_env_id(ppo, "ConstantTerminated"), env_kwargs='{"terminate_after": 1}',
                                num_envs=1, num_steps=8, num_minibatches=4, total_timesteps=64))
    assert torch.load(path, weights_only=True)["global_step"] == 64


def test_autoreset_rows_carry_no_weight(next_step_ppo):
    ppo = next_step_ppo
    """Whatever the autoreset rows hold, the real rows' advantages and the training batch are the same."""
    rng = np.random.default_rng(2)
    rewards, values, next_value, terminations, _, dones, valid = next_step_rollout(rng)
    obs = rng.normal(size=rewards.shape + (4,)).astype(np.float32)
    actions = rng.normal(size=rewards.shape + (2,)).astype(np.float32)
    advantages = ppo.compute_advantages(rewards, values, next_value, terminations, dones, GAMMA, LAM)
    batch = ppo.real_transitions(valid, obs=obs, actions=actions, advantages=advantages)

    fake = valid == 0
    garbage_rewards, garbage_obs, garbage_actions = rewards.copy(), obs.copy(), actions.copy()
    garbage_rewards[fake], garbage_obs[fake], garbage_actions[fake] = 1e6, -1e6, 1e6
    garbage_advantages = ppo.compute_advantages(garbage_rewards, values, next_value, terminations, dones, GAMMA, LAM)
    garbage_batch = ppo.real_transitions(valid, obs=garbage_obs, actions=garbage_actions, advantages=garbage_advantages)

    assert len(batch["obs"]) == int(valid.sum()) < valid.size
    for name in ("obs", "actions", "advantages"):
        torch.testing.assert_close(batch[name], garbage_batch[name])


def critic_value_after_training(ppo, env_id):
    settings = dict(env_id=env_id, total_timesteps=8192, num_envs=4, num_steps=64, num_minibatches=4, update_epochs=4,
                    learning_rate=3e-3, gamma=GAMMA, clip_vloss=False, ent_coef=0.0, checkpoint_interval=0, cuda=False)
    if ppo is not ppo_discrete:
        settings.update(norm_reward=False)  # the value must be in units of the raw reward here
    if ppo is ppo_vector_sameStep:
        settings.update(vectorization_mode="sync")
    args = ppo.Args(**settings)
    checkpoint = torch.load(ppo.train(args), weights_only=True)
    envs = ppo.make_envs(args, 1, None, "sync") if ppo is ppo_vector_sameStep else ppo.make_envs(args, 1, None, seed=1)
    agent = ppo.Agent(envs, ppo.Args())
    agent.load_state_dict(checkpoint["model"])
    with torch.no_grad():
        return agent.critic(agent.encode(torch.zeros(1, 1))).item()


def test_truncation_is_bootstrapped_and_termination_is_not(ppo, in_tmp):
    # Reward 1 per step, constant observation, episodes of 20 steps. If the time limit is not a real end,
    # the value is 1 / (1 - gamma) = 10. If the episode really ends, the value averages
    # (1 - gamma^k) / (1 - gamma) over k = 1..20 steps left: about 6.05.
    truncated = critic_value_after_training(ppo, constructed_env_id(ppo, "ConstantTruncated"))
    terminated = critic_value_after_training(ppo, constructed_env_id(ppo, "ConstantTerminated"))
    assert truncated == pytest.approx(10.0, abs=0.7)
    assert terminated == pytest.approx(6.05, abs=0.7)


def test_short_run_writes_every_tag_and_a_complete_checkpoint(ppo, in_tmp):
    path = ppo.train(short_args(ppo))
    checkpoint = torch.load(path, weights_only=True)
    state = {"model", "optimizer", "obs_rms", "return_rms"}  # the same in every script
    assert set(checkpoint) == set(ppo.CHECKPOINT_SCHEMA) | state | {"script", "kind", "cuda_rng_state"}
    assert checkpoint["script"] == checkpoint["kind"] == f"{ppo.__name__}.py"
    assert checkpoint["global_step"] == 1024 and checkpoint["iteration"] == 2
    tags = scalars(os.path.dirname(path))
    expected = {"charts/episodic_return", "charts/episodic_length", "charts/learning_rate", "charts/SPS",
                "charts/clip_coef", "charts/ent_coef", "charts/vf_coef",
                "losses/value_loss", "losses/policy_loss", "losses/entropy", "losses/old_approx_kl",
                "losses/approx_kl", "losses/clipfrac", "losses/explained_variance"}
    assert expected <= set(tags)
    assert [step for step, _ in tags["losses/value_loss"]] == [512, 1024]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(os.path.dirname(path))
    events.Reload()
    assert "hyperparameters/text_summary" in events.Tags()["tensors"]


def test_resume_continues_the_same_run(ppo, in_tmp):
    first = ppo.train(short_args(ppo))
    optimizer_steps = torch.load(first, weights_only=True)["optimizer"]["state"][0]["step"].item()
    checkpoint = ppo.load_checkpoint(first)
    resumed_args = ppo.Args(**{**checkpoint["args"], "total_timesteps": 2048, "resume": first})
    second = ppo.train(resumed_args, checkpoint)

    assert second == first  # same run folder, same checkpoint file
    resumed = torch.load(second, weights_only=True)
    assert resumed["global_step"] == 2048 and resumed["iteration"] == 4
    assert resumed["optimizer"]["state"][0]["step"].item() == 2 * optimizer_steps  # Adam's moments carried on
    learning_rates = dict(scalars(os.path.dirname(first))["charts/learning_rate"])
    # the schedule of the longer run, 4 iterations: iteration 3 runs at (1 - 2/4) of the rate, the last at 1/4 of it
    assert sorted(learning_rates) == [512, 1024, 1536, 2048]
    assert learning_rates[1536] == pytest.approx(0.5 * checkpoint["args"]["learning_rate"])
    assert learning_rates[2048] == pytest.approx(0.25 * checkpoint["args"]["learning_rate"])


def test_reward_scaling_turned_on_at_resume_starts_its_statistics_there_and_older_checkpoints_resume(ppo, in_tmp):
    """Every checkpoint holds the return statistics, untouched in a run without --norm-reward: turned on at resume,
    scaling starts from them. An older checkpoint of ppo_discrete.py without them resumes as well (fresh statistics)."""
    first = ppo.train(short_args(ppo, norm_reward=False))
    checkpoint = ppo.load_checkpoint(first)
    assert checkpoint["return_rms"]["count"] == pytest.approx(1e-4)  # saved, never updated
    older = {key: value for key, value in torch.load(first, weights_only=True).items() if key != "return_rms"}
    os.makedirs("runs/older")
    torch.save(older, "runs/older/checkpoint.pt")
    for path in (first, "runs/older/checkpoint.pt") if ppo is ppo_discrete else (first,):
        checkpoint = ppo.load_checkpoint(path)
        resumed = ppo.train(ppo.Args(**{**checkpoint["args"], "norm_reward": True, "total_timesteps": 2048,
                                        "resume": path}), checkpoint)
        saved = torch.load(resumed, weights_only=True)
        assert saved["global_step"] == 2048 and saved["return_rms"]["count"] > 500  # scaled from the resume on


def test_an_extension_says_the_learning_rate_it_starts_at_and_a_plain_resume_says_nothing(ppo, in_tmp, capsys):
    """Extending a run follows the longer run's schedule: one line gives the rate it starts at, the rate logged there."""
    first = ppo.train(short_args(ppo))  # 2 iterations of 512 steps
    checkpoint = ppo.load_checkpoint(first)
    interrupted = {**checkpoint, "args": {**checkpoint["args"], "total_timesteps": 2048}}  # as if stopped half-way
    torch.save(interrupted, first)
    capsys.readouterr()
    ppo.train(ppo.Args(**{**interrupted["args"], "resume": first}), interrupted)  # to 2048 steps: not an extension
    assert "extending" not in capsys.readouterr().out
    checkpoint = ppo.load_checkpoint(first)
    ppo.train(ppo.Args(**{**checkpoint["args"], "total_timesteps": 4096, "resume": first}), checkpoint)
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("extending")]
    rate = float(re.fullmatch(r"extending the run to 4,096 steps: its schedule follows that longer run's, from here "
                              r"learning_rate (\S+)", line).group(1))  # the entries of coefficients() it changes
    learning_rates = dict(scalars(os.path.dirname(first))["charts/learning_rate"])
    assert learning_rates[2048] == pytest.approx(0.25 * checkpoint["args"]["learning_rate"])  # 4th of 4 iterations
    assert rate == pytest.approx(learning_rates[2560], rel=1e-3) == 0.5 * checkpoint["args"]["learning_rate"]


def test_scalars_reads_a_resumed_runs_files_in_the_order_they_were_made(tmp_path, monkeypatch):
    """The tests' reader of TensorBoard (conftest.scalars) sees what TensorBoard shows, even where a test process made
    the 9th and the 10th writer within one second: their names then sort the wrong way. (Once a flaky CI failure.)"""
    from torch.utils.tensorboard import SummaryWriter
    from tensorboard.summary.writer import event_file_writer

    monkeypatch.setattr(event_file_writer, "_global_uid", event_file_writer.AtomicCounter(9))
    monkeypatch.setattr(event_file_writer.time, "time", lambda: 1_800_000_000.0)  # both files in one second
    for purge_step, value in [(None, 1.0), (2, 2.0)]:  # a run, then its resume from step 1
        writer = SummaryWriter(str(tmp_path), purge_step=purge_step)
        for step in range(purge_step or 1, 4):
            writer.add_scalar("charts/x", value, step)
        writer.close()
    assert sorted(name[-2:] for name in os.listdir(tmp_path)) == [".9", "10"]
    assert scalars(tmp_path)["charts/x"] == [(1, 1.0), (2, 2.0), (3, 2.0)]


def test_an_oserror_in_another_thread_still_reaches_the_user(ppo, in_tmp, monkeypatch):
    """Only TensorBoard's writer thread has its failed writes said by the fault rule; a thread of the researcher's own
    (here one the env starts, a data loader say) that raises OSError goes to the excepthook as before training."""
    seen = []
    monkeypatch.setattr(threading, "excepthook", seen.append)

    def loader():
        raise OSError("the loader's disk is gone")

    real_reset = gym.vector.SyncVectorEnv.reset

    def reset(self, **kwargs):
        thread = threading.Thread(target=loader)
        thread.start()
        thread.join()
        return real_reset(self, **kwargs)

    monkeypatch.setattr(gym.vector.SyncVectorEnv, "reset", reset)
    ppo.train(short_args(ppo, total_timesteps=512))
    assert [str(hook.exc_value) for hook in seen] == ["the loader's disk is gone"]
    assert threading.excepthook == seen.append  # restored after the run


@pytest.mark.parametrize("script", ["ppo_discrete.py", "ppo_continuous.py", "ppo_vector_sameStep.py"])
def test_on_windows_the_scripts_say_in_one_line_that_they_need_linux_or_macos(script, tmp_path):
    """fcntl and the POSIX stop signals do not exist on Windows: one line, not an ImportError traceback."""
    # the standard library imports on Windows; under a pretended platform multiprocessing would look for _winapi
    code = (f"import multiprocessing, runpy, sys; sys.platform = 'win32'; "
            f"runpy.run_path({os.path.join(ROOT, script)!r}, run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert (result.returncode, result.stdout, result.stderr) == (
        1, "", f"error: {script} runs on Linux and macOS, not on Windows (there, use WSL)\n")


@pytest.mark.parametrize("box_ppo", [ppo_continuous, ppo_vector_sameStep], ids=lambda module: module.__name__)
def test_network_width_and_initial_std_carry_into_resume_and_evaluation(box_ppo, in_tmp):
    """--hidden-size and --init-log-std shape the agent; a resumed run and an evaluation rebuild it from the checkpoint."""
    path = box_ppo.train(short_args(box_ppo, total_timesteps=512, hidden_size=16, init_log_std=-1.0))
    model = torch.load(path, weights_only=True)["model"]
    assert model["critic.0.weight"].shape == (16, 3)  # Pendulum-v1: 3 observations, 1 action
    # one iteration of updates moves the log std only a little away from where it started
    assert model["actor_logstd"].item() == pytest.approx(-1.0, abs=0.05)
    checkpoint = box_ppo.load_checkpoint(path)
    box_ppo.train(box_ppo.Args(**{**checkpoint["args"], "total_timesteps": 1024, "resume": path}), checkpoint)
    checkpoint = box_ppo.load_checkpoint(path)
    assert checkpoint["global_step"] == 1024
    returns = box_ppo.evaluate(box_ppo.Args(**{**checkpoint["args"], "eval_checkpoint": path, "eval_episodes": 1}), checkpoint)
    assert len(returns) == 1


@pytest.mark.parametrize("box_ppo", [ppo_continuous, ppo_vector_sameStep], ids=lambda module: module.__name__)
def test_gae_lambda_left_out_falls_with_the_action_dimensions_and_the_checkpoint_keeps_it(box_ppo, in_tmp):
    """Without --gae-lambda, lambda = 1 - dims / 80 within [0.8, 0.95]: Humanoid-v5's 17 dims keep the 0.8 tuned for
    it. A run's checkpoint holds the lambda it trained with, so a resumed run keeps it; --gae-lambda sets it."""
    lambdas = [box_ppo.gae_lambda_for(gym.spaces.Box(-1, 1, (dims,)), None) for dims in (1, 3, 4, 6, 8, 12, 16, 17, 30)]
    assert lambdas == pytest.approx([0.95, 0.95, 0.95, 0.925, 0.9, 0.85, 0.8, 0.8, 0.8])
    assert box_ppo.Args().gae_lambda is None
    path = box_ppo.train(short_args(box_ppo, total_timesteps=512))  # Pendulum-v1: 1 dimension
    assert torch.load(path, weights_only=True)["args"]["gae_lambda"] == 0.95
    path = box_ppo.train(short_args(box_ppo, total_timesteps=512, gae_lambda=0.7))
    assert torch.load(path, weights_only=True)["args"]["gae_lambda"] == 0.7


class OneSecondClock:
    """time.time() that moves on by 0.1 ms per call, so that everything a short test does happens in one second."""

    def __init__(self):
        self.now = 1_800_000_000.0

    def time(self):
        self.now += 1e-4
        return self.now

    def __getattr__(self, name):
        return getattr(time, name)


def test_runs_started_in_the_same_second_get_their_own_folders(ppo, in_tmp, monkeypatch):
    monkeypatch.setattr(ppo, "time", OneSecondClock())
    first, second = ppo.train(short_args(ppo, total_timesteps=512)), ppo.train(short_args(ppo, total_timesteps=512))
    assert first != second
    for path in (first, second):  # each checkpoint names its own folder, so resume and evaluation find the right run
        assert torch.load(path, weights_only=True)["run_name"] == os.path.basename(os.path.dirname(path))


def test_a_run_being_trained_cannot_be_resumed_by_a_second_process(ppo, in_tmp):
    path = ppo.train(short_args(ppo))
    checkpoint = ppo.load_checkpoint(path)
    with ppo.open_run_folder(ppo.Args(**{**checkpoint["args"], "resume": path}), checkpoint)[2]:  # as its trainer holds it
        with pytest.raises(SystemExit, match="another process is training"):
            ppo.train(ppo.Args(**{**checkpoint["args"], "total_timesteps": 2048, "resume": path}), checkpoint)
    assert torch.load(path, weights_only=True)["global_step"] == 1024


def test_a_fault_part_way_through_an_update_keeps_exactly_the_last_complete_iteration(ppo, in_tmp, monkeypatch):
    """A NaN loss in the third minibatch of the second update: the earlier minibatches of that update have changed
    the weights and the optimizer; the checkpoint must hold the state after the first iteration, bit for bit."""
    settings = dict(anneal_lr=False, checkpoint_interval=0)  # the fault path alone writes the faulty run's checkpoint
    reference = torch.load(ppo.train(short_args(ppo, total_timesteps=512, **settings)), weights_only=True)
    real_loss, calls = ppo.ppo_loss, []

    def nan_in_the_second_update(*args):
        loss, stats = real_loss(*args)
        calls.append(1)
        return (loss * float("nan") if len(calls) == 16 + 3 else loss), stats  # 16 minibatches an update here

    monkeypatch.setattr(ppo, "ppo_loss", nan_in_the_second_update)
    with pytest.raises(SystemExit, match=r"non-finite loss in the iteration after step 512; checkpoint of the last"):
        ppo.train(short_args(ppo, **settings))
    path = max(glob.glob("runs/*/checkpoint.pt"), key=os.path.getmtime)
    saved = torch.load(path, weights_only=True)
    assert saved["global_step"] == 512 and saved["run_name"] != reference["run_name"]
    for key in ("model", "optimizer", "rng_state"):
        torch.testing.assert_close(saved[key], reference[key], rtol=0, atol=0)


def test_total_timesteps_in_float_notation_and_stale_temporary_files(ppo, in_tmp, monkeypatch):
    """--total-timesteps 1e3 is a number of steps; a resume removes the temporary files that killed processes left."""
    monkeypatch.setattr(sys, "argv", [f"{ppo.__name__}.py", *short_flags(ppo), "--total-timesteps", "1.024e3"])
    args, _ = ppo.parse_args()
    assert args.total_timesteps == 1024
    path = ppo.train(args)
    open(f"{path}.12345.tmp", "w").close()
    ppo.train(ppo.Args(**{**vars(args), "total_timesteps": 2048, "resume": path}), ppo.load_checkpoint(path))
    assert not glob.glob(f"{path}.*.tmp")


def test_an_exp_name_that_is_a_path_keeps_the_run_inside_runs(ppo, in_tmp):
    path = ppo.train(short_args(ppo, exp_name="/../../escape", total_timesteps=512))
    assert os.path.dirname(os.path.dirname(os.path.abspath(path))) == os.path.abspath("runs")


def test_a_signal_during_the_last_iteration_finishes_the_run(ppo, in_tmp, monkeypatch):
    compute_advantages, calls = ppo.compute_advantages, []

    def interrupted_in_last_iteration(*args):
        calls.append(1)
        if len(calls) == 2:  # the second and last iteration of the short run
            os.kill(os.getpid(), signal.SIGTERM)
        return compute_advantages(*args)

    monkeypatch.setattr(ppo, "compute_advantages", interrupted_in_last_iteration)
    path = ppo.train(short_args(ppo))  # returns (exit 0 from the command line) instead of SystemExit(143)
    assert torch.load(path, weights_only=True)["global_step"] == 1024


STOPS_AFTER_THE_END = """import atexit, os, runpy, signal, sys

script = sys.argv[1]


def hook(frame, event, arg):  # the moment Run.save() returns with the run's last step on the disk
    if event == "return" and frame.f_code.co_name == "save" and frame.f_code.co_filename == script:
        run = frame.f_locals["self"]
        if run.last_complete["global_step"] == run.total_timesteps:
            for sig in (signal.SIGINT, signal.SIGTERM):  # a first stop and a second
                os.kill(os.getpid(), sig)


atexit.register(lambda: [os.kill(os.getpid(), sig) for sig in (signal.SIGINT, signal.SIGTERM)])  # and as Python exits
sys.argv = sys.argv[1:]
sys.setprofile(hook)
runpy.run_path(script, run_name="__main__")
"""


def stopped_after_the_end(ppo, folder, flags, to_the_group=False):
    """The script run to its end with STOPS_AFTER_THE_END's signals, to its own process or to its whole process group."""
    hooks = STOPS_AFTER_THE_END.replace("os.kill(os.getpid(), sig)", "os.killpg(0, sig)" if to_the_group else "os.kill(os.getpid(), sig)")
    (folder / "stops.py").write_text(hooks)
    script = os.path.join(os.path.dirname(ppo.__file__), f"{ppo.__name__}.py")
    return subprocess.run([sys.executable, "stops.py", script, *flags], cwd=folder, capture_output=True, text=True,
                          timeout=300, start_new_session=to_the_group)


def test_stop_signals_after_the_final_save_change_nothing(ppo, tmp_path):
    """Ctrl-C and SIGTERM just after the last checkpoint is written, and again while Python exits (hooks at those
    moments, not a race): the run stays finished, exit status 0, no traceback, and `done:` is still the last line."""
    process = stopped_after_the_end(ppo, tmp_path, short_flags(ppo))
    assert (process.returncode, process.stderr) == (0, ""), process.stdout + process.stderr
    assert process.stdout.splitlines()[-1].startswith("done: 1,024 steps"), process.stdout
    assert torch.load(glob.glob(str(tmp_path / "runs" / "*" / "checkpoint.pt"))[0], weights_only=True)["global_step"] == 1024


def test_a_stop_to_the_whole_group_after_the_final_save_is_no_fault_of_the_async_workers(tmp_path):
    """As SLURM preempts or requeues a task: the signals reach every process of the group, so SIGTERM ends the async
    workers just after the last checkpoint; closing them is no fault of the env's, and the run stays finished."""
    flags = [flag if flag != "sync" else "async" for flag in short_flags(ppo_vector_sameStep)]
    process = stopped_after_the_end(ppo_vector_sameStep, tmp_path, flags, to_the_group=True)
    assert (process.returncode, process.stderr) == (0, ""), process.stdout + process.stderr
    assert process.stdout.splitlines()[-1].startswith("done: 1,024 steps"), process.stdout


def test_a_checkpoint_reaches_the_disk_before_its_rename_and_the_rename_after_it(ppo, in_tmp, monkeypatch):
    """Durable, not only atomic: fsync of the written file, then the rename over checkpoint.pt, then fsync of the run
    folder, at every checkpoint."""
    calls = record_fsync_and_replace(monkeypatch)
    path = os.path.abspath(ppo.train(short_args(ppo)))  # two iterations, a checkpoint after each
    folder, tmp = os.path.dirname(path), f"{path}.{os.getpid()}.tmp"
    ours = [call for call in calls if call[1].startswith(folder)]
    assert ours == [("fsync", tmp), ("replace", tmp, path), ("fsync", folder)] * 2, ours


def test_resume_from_another_folder_continues_in_the_checkpoint_folder(ppo, in_tmp, monkeypatch):
    path = os.path.abspath(ppo.train(short_args(ppo)))
    os.mkdir("elsewhere")
    monkeypatch.chdir("elsewhere")
    checkpoint = ppo.load_checkpoint(path)
    assert ppo.train(ppo.Args(**{**checkpoint["args"], "total_timesteps": 2048, "resume": path}), checkpoint) == path
    assert torch.load(path, weights_only=True)["global_step"] == 2048
    assert not os.path.exists("runs")
    assert sorted(step for step, _ in scalars(os.path.dirname(path))["charts/learning_rate"]) == [512, 1024, 1536, 2048]


def test_evaluation_cuts_episodes_that_never_end(ppo, in_tmp, capsys):
    path = ppo.train(short_args(ppo, env_id=constructed_env_id(ppo, "ConstantTruncated"), total_timesteps=512))
    checkpoint = ppo.load_checkpoint(path)
    args = ppo.Args(**{**checkpoint["args"], "env_id": constructed_env_id(ppo, "Endless"), "eval_checkpoint": path,
                       "eval_episodes": 2, "eval_max_steps": 50})
    assert ppo.evaluate(args, checkpoint) == [50.0, 50.0]  # reward 1 a step, cut after 50 steps
    assert capsys.readouterr().out.count("50 steps (cut at --eval-max-steps 50)\n") == 2  # each said so in its line


def test_an_env_that_fails_in_evaluation_or_when_closed_gets_one_line(ppo, in_tmp, monkeypatch):
    closing = constructed_env_id(ppo, "FailingClose")
    monkeypatch.setattr(sys, "argv", [ppo.SCRIPT, *short_flags(ppo), "--env-id", closing, "--total-timesteps", "512"])
    with pytest.raises(SystemExit, match=re.escape(f"error: {closing} raised RuntimeError: the simulator would not shut "
                                                   "down while closing")):  # after the run: it is saved whole
        ppo.main()
    (path,) = glob.glob("runs/*/checkpoint.pt")
    assert ppo.load_checkpoint(path)["global_step"] == 512
    for name, problem in (("Crashing", "raised RuntimeError: the simulator fell over"), ("NanReward", "returned a non-finite reward"),
                          ("FailingClose", "raised RuntimeError: the simulator would not shut down while closing")):
        env_id = constructed_env_id(ppo, name)  # 20-step episodes; step 300 of the env's life crashes or has a NaN reward
        monkeypatch.setattr(sys, "argv", [ppo.SCRIPT, "--eval-checkpoint", path, "--env-id", env_id, "--eval-episodes", "20"])
        with pytest.raises(SystemExit, match=re.escape(f"error: {env_id} {problem} during evaluation")):
            ppo.main()


def test_evaluation_films_every_episode_takes_no_video_from_training_and_keeps_its_sampling(ppo, in_tmp, capsys, monkeypatch):
    path = ppo.train(short_args(ppo, total_timesteps=512, capture_video=True, eval_sample=True))  # as images train
    assert f"videos of env 0 go to videos/{os.path.basename(os.path.dirname(path))}" in capsys.readouterr().out
    monkeypatch.setattr(sys, "argv", [f"{ppo.__name__}.py", "--eval-checkpoint", path, "--eval-episodes", "3"])
    args, checkpoint = ppo.parse_args()
    assert not args.capture_video and args.eval_sample  # the training run filmed, its evaluation need not; it samples
    monkeypatch.setattr(sys, "argv", [f"{ppo.__name__}.py", "--eval-checkpoint", path, "--no-eval-sample"])
    assert not ppo.parse_args()[0].eval_sample
    monkeypatch.setattr(sys, "argv", [f"{ppo.__name__}.py", "--eval-checkpoint", path, "--eval-episodes", "3", "--capture-video",
                                      "--no-eval-sample"])
    capsys.readouterr()
    ppo.evaluate(*ppo.parse_args())
    output = capsys.readouterr().out
    assert "deterministic policy" in output
    videos = sorted(glob.glob("videos/*-eval/*.mp4"))
    assert len(videos) == 3  # gymnasium's default schedule would keep episodes 0 and 1 only
    shown = re.findall(r"^episode (\d): return -?[\d.]+, \d+ steps, (\S+)$", output, re.MULTILINE)  # one line an episode
    assert [int(number) for number, _ in shown] == [1, 2, 3] and sorted(video for _, video in shown) == videos
    monkeypatch.setattr(sys, "argv", [f"{ppo.__name__}.py", "--eval-checkpoint", path, "--eval-episodes", "1", "--eval-sample"])
    ppo.evaluate(*ppo.parse_args())
    assert "actions sampled from the policy" in capsys.readouterr().out


def test_env_kwargs_reach_the_env_in_training_resume_and_evaluation(ppo, in_tmp):
    # the constructed env truncates at 20 steps; terminate_after=5 ends every episode after 5 steps instead
    args = short_args(ppo, env_id=constructed_env_id(ppo, "ConstantTruncated"), total_timesteps=512, env_kwargs='{"terminate_after": 5}')
    path = ppo.train(args)
    assert {length for _, length in scalars(os.path.dirname(path))["charts/episodic_length"]} == {5.0}
    checkpoint = ppo.load_checkpoint(path)
    ppo.train(ppo.Args(**{**checkpoint["args"], "total_timesteps": 1024, "resume": path}), checkpoint)
    assert {length for _, length in scalars(os.path.dirname(path))["charts/episodic_length"]} == {5.0}
    checkpoint = ppo.load_checkpoint(path)
    assert ppo.evaluate(ppo.Args(**{**checkpoint["args"], "eval_checkpoint": path, "eval_episodes": 2}), checkpoint) == [5.0, 5.0]


def test_total_timesteps_rounded_to_whole_batches_is_said_and_shown(ppo, in_tmp, capsys):
    path = ppo.train(short_args(ppo, total_timesteps=1500))  # batches of 512 steps
    output = capsys.readouterr().out
    assert "--total-timesteps 1,500 is rounded down to whole batches of 512: 1,024 steps" in output
    assert "1,024/1,024 steps" in output and torch.load(path, weights_only=True)["global_step"] == 1024
    for defaults in [{}, getattr(ppo, "IMAGE_DEFAULTS", {})]:  # the bare command (on images too): cut without a word
        args = ppo.Args(**defaults)
        ppo.Run(args, None, 1, args.total_timesteps // (args.num_envs * args.num_steps))
        assert "rounded down" not in capsys.readouterr().out


def test_a_filmed_episode_is_written_while_it_plays_into_the_file_gymnasium_would_write(ppo, tmp_path, monkeypatch):
    """gymnasium's RecordVideo holds an episode's frames in memory until the episode ends (a long Atari game filmed in
    color: gigabytes); the scripts' StreamedVideo sends each frame to the file as it comes, and the file is the same."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    videos = []
    for name, film in (("streamed", ppo.StreamedVideo), ("gymnasium", gym.wrappers.RecordVideo)):
        env = film(gym.make("Pendulum-v1", render_mode="rgb_array"), str(tmp_path / name),
                   episode_trigger=lambda episode: episode == 0, disable_logger=True)
        video = tmp_path / name / "rl-video-episode-0.mp4"
        env.reset(seed=1)
        for step in range(60):  # one episode, 200 steps long, filmed from its reset
            env.step(np.array([np.sin(step)], dtype=np.float32))
        if film is ppo.StreamedVideo:
            assert env.recording and not env.recorded_frames  # 61 frames played, none kept
            wait_for(video.exists, timeout=30)  # the encoder has the file open mid-episode
        env.close()
        videos.append(video.read_bytes())
    assert len(videos[0]) > 1000 and videos[0] == videos[1]


def test_video_capture_prints_no_stray_error_lines(ppo, tmp_path):
    environment = {key: value for key, value in os.environ.items() if key != "XDG_RUNTIME_DIR"}
    flags = ["--env-id", short_args(ppo).env_id, "--total-timesteps", "512", "--num-envs", "2", "--num-steps", "256", "--capture-video"]
    process = start(f"{ppo.__name__}.py", *flags, cwd=tmp_path, stderr=subprocess.PIPE, env=environment)
    stderr = process.communicate(timeout=120)[1]
    assert process.returncode == 0 and "error" not in stderr, stderr
    assert glob.glob(str(tmp_path / "videos" / "*" / "*.mp4"))


def test_command_line_flags_override_the_checkpoint_settings(ppo, in_tmp, monkeypatch):
    path = ppo.train(short_args(ppo, ent_coef=0.05))
    monkeypatch.setattr(sys, "argv", [f"{ppo.__name__}.py", "--resume", path, "--total-timesteps", "4096"])
    args, checkpoint = ppo.parse_args()
    assert args.total_timesteps == 4096 and args.ent_coef == 0.05 and args.num_envs == short_args(ppo).num_envs
    assert checkpoint["global_step"] == 1024


def test_same_seed_gives_identical_losses_and_weights(ppo, in_tmp):
    runs = []
    for exp_name in ("a", "b"):
        path = ppo.train(short_args(ppo, exp_name=exp_name))
        runs.append((scalars(os.path.dirname(path)), torch.load(path, weights_only=True)["model"]))
    (tags_a, model_a), (tags_b, model_b) = runs
    for tag in ("losses/policy_loss", "losses/value_loss", "losses/approx_kl", "charts/episodic_return"):
        assert tags_a[tag] == tags_b[tag]
    for name in model_a:
        assert torch.equal(model_a[name], model_b[name])


def test_a_checkpoint_written_before_scripts_were_recorded_is_still_told_apart(checkpoints_of_each_script, tmp_path):
    """ppo_continuous.py and ppo_vector_sameStep.py save the same keys; without the script's name, the network tells."""
    checkpoint = torch.load(checkpoints_of_each_script["ppo_continuous"], weights_only=True)
    del checkpoint["script"], checkpoint["kind"], checkpoint["args"]["env_backend"], checkpoint["args"]["env_threads"]  # as written then
    checkpoint["model"] = {re.sub(r"^actor\.", "actor_mean.", key): value for key, value in checkpoint["model"].items()}
    torch.save(checkpoint, tmp_path / "old.pt")
    checkpoint = ppo_vector_sameStep.load_checkpoint(str(tmp_path / "old.pt"))
    args = ppo_vector_sameStep.Args(**{**checkpoint["args"], "eval_checkpoint": str(tmp_path / "old.pt")})
    with pytest.raises(SystemExit, match="the checkpoint's model does not fit ppo_vector_sameStep.py's on Pendulum-v1 \\(another script, env or "
                       "network\\): ppo_vector_sameStep.py has actor.0.bias, .*, the checkpoint actor_mean.0.bias, .* instead"):
        ppo_vector_sameStep.evaluate(args, checkpoint)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGHUP], ids=["Ctrl-C", "closed terminal"])
def test_ctrl_c_saves_a_checkpoint_and_says_how_to_resume(ppo, signum, tmp_path):
    flags = ["--env-id", short_args(ppo).env_id, "--total-timesteps", "10000000", "--checkpoint-interval", "0"]
    process = start(f"{ppo.__name__}.py", *flags, cwd=tmp_path, stderr=subprocess.PIPE, start_new_session=True)
    wait_for(lambda: glob.glob(str(tmp_path / "runs" / "*" / "events.*")), timeout=60)
    time.sleep(1.0)  # let it train for a moment
    os.killpg(process.pid, signum)  # as a terminal does: to every process of the group (workers too)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signum
    assert "Traceback" not in stderr
    assert "Resume with: " in stdout and "--resume" in stdout
    checkpoint = torch.load(glob.glob(str(tmp_path / "runs" / "*" / "checkpoint.pt"))[0], weights_only=True)
    assert checkpoint["global_step"] > 0


def test_ctrl_c_while_an_episode_is_filmed_stops_the_run_and_finishes_the_video(ppo, tmp_path):
    """The video encoder (ffmpeg) is a child of the run: a Ctrl-C to the terminal's process group is the run's to act
    on (finish the iteration, save, close the video), not the encoder's, whose closed pipe would end the run as a
    fault of the env."""
    env_id = "MountainCar-v0" if ppo is ppo_discrete else "Pendulum-v1"
    flags = ["--env-id", env_id, "--env-kwargs", '{"max_episode_steps": 1000000}', "--num-envs", "1",  # one episode
             "--num-steps", "1024", "--total-timesteps", "10000000", "--checkpoint-interval", "0", "--capture-video"]
    process = start(f"{ppo.__name__}.py", *flags, cwd=tmp_path, stderr=subprocess.PIPE, start_new_session=True)
    wait_for(lambda: glob.glob(str(tmp_path / "videos" / "*" / "*.mp4")), timeout=60)  # its encoder has started
    time.sleep(1.0)  # in the first rollout: 1,024 steps of a few hundred a second, filmed
    os.killpg(process.pid, signal.SIGINT)  # as a terminal does: to every process of the group
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGINT and "stopped at step" in stdout, stderr
    (video,) = glob.glob(str(tmp_path / "videos" / "*" / "*.mp4"))
    assert imageio_ffmpeg.count_frames_and_secs(video)[0] > 1  # a whole file: the episode up to the stop


OWN_ENVS = '''import gymnasium as gym

gym.register("OwnCartPole-v0", entry_point="gymnasium.envs.classic_control:CartPoleEnv", max_episode_steps=500)
gym.register("OwnPendulum-v0", entry_point="gymnasium.envs.classic_control:PendulumEnv", max_episode_steps=200)
'''


def test_every_command_a_run_prints_runs_as_printed_with_an_env_of_ones_own_module(ppo, tmp_path):
    """A researcher's env from a module: stopped by a signal, the printed resume command, pasted as it stands in the
    same folder, finishes the run; the evaluate command printed at its end runs too. (A checkpoint never imports a
    module on its own, so each command must name it.)"""
    (tmp_path / "own_envs.py").write_text(OWN_ENVS)
    env_id = "own_envs:OwnCartPole-v0" if ppo is ppo_discrete else "own_envs:OwnPendulum-v0"
    flags = [flag for flag in short_flags(ppo) if flag != short_args(ppo).env_id and flag != "--env-id"]
    flags = [*flags[: flags.index("--total-timesteps")], *flags[flags.index("--total-timesteps") + 2:]]
    process = start(f"{ppo.__name__}.py", *flags, "--env-id", env_id, "--total-timesteps", "10240", cwd=tmp_path,
                    env={**os.environ, "PYTHONPATH": str(tmp_path)})  # as `python ppo_x.py` finds it in its folder
    wait_for(lambda: glob.glob(str(tmp_path / "runs" / "*" / "checkpoint.pt")), timeout=60)
    process.send_signal(signal.SIGTERM)
    output = process.communicate(timeout=120)[0]
    assert process.returncode == 128 + signal.SIGTERM, output
    printed = re.search(r"Resume with: (.*)", output).group(1)
    shell = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
             "PYTHONPATH": str(tmp_path)}  # `python` is this interpreter, as in the user's environment
    resumed = subprocess.run(printed, shell=True, cwd=tmp_path, env=shell, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0 and "done: 10,240 steps" in resumed.stdout, resumed.stdout + resumed.stderr
    for line in ("evaluate with", "extend with"):
        assert "--env-id " + env_id in re.search(rf"{line}: (.*)", resumed.stdout).group(1)
    evaluated = subprocess.run(re.search(r"evaluate with: (.*)", resumed.stdout).group(1) + " --eval-episodes 1",
                               shell=True, cwd=tmp_path, env=shell, capture_output=True, text=True, timeout=300)
    assert evaluated.returncode == 0 and "mean return" in evaluated.stdout, evaluated.stdout + evaluated.stderr


def test_capture_video_without_moviepy_gets_the_install_command(ppo, monkeypatch):
    find_spec = importlib.util.find_spec  # gymnasium's RecordVideo would raise at the first env made: a traceback
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *rest: None if name == "moviepy" else
                        find_spec(name, *rest))
    with pytest.raises(SystemExit, match=r"^error: --capture-video needs: pip install moviepy$"):
        ppo.check_args(short_args(ppo, capture_video=True))
    ppo.check_args(short_args(ppo, capture_video=False))  # only the flag needs it


@pytest.mark.parametrize("box_ppo", [ppo_continuous, ppo_vector_sameStep], ids=lambda module: module.__name__)
def test_env_defaults_apply_to_the_named_envs_only_say_so_yield_to_flags_and_a_resume_keeps_its_own(box_ppo, in_tmp,
                                                                                                 monkeypatch, capsys):
    """ENV_DEFAULTS: Hopper-v5 (and the others it names) trains at --init-log-std -0.5 unless a flag says otherwise,
    said in the run's first line; other envs keep the script's defaults; a checkpoint resumes with its own settings."""
    script = f"{box_ppo.__name__}.py"
    named = {"Hopper-v5", "Walker2d-v5", "BipedalWalker-v3", "MountainCarContinuous-v0", "Swimmer-v5"}
    measured = {"dm_control", "Ant-v5"} if box_ppo is ppo_continuous else set()  # on this script alone
    assert set(box_ppo.ENV_DEFAULTS) == named | measured
    monkeypatch.setattr(sys, "argv", [script, "--env-id", "Hopper-v5"])  # a wider network too
    assert box_ppo.parse_args()[0] == box_ppo.Args(env_id="Hopper-v5", init_log_std=-0.5, hidden_size=256)
    assert "defaults: ENV_DEFAULTS['Hopper-v5'] sets init_log_std=-0.5, hidden_size=256\n" in capsys.readouterr().out
    monkeypatch.setattr(sys, "argv", [script, "--env-id", "Hopper-v5", "--init-log-std", "-1.2"])
    assert box_ppo.parse_args()[0].init_log_std == -1.2  # a flag given wins, the entry's other settings stay
    assert "defaults: ENV_DEFAULTS['Hopper-v5'] sets hidden_size=256\n" in capsys.readouterr().out
    monkeypatch.setattr(sys, "argv", [script, "--env-id", "Walker2d-v5", "--init-log-std", "-1.2"])
    assert box_ppo.parse_args()[0].init_log_std == -1.2
    assert "defaults: ENV_DEFAULTS['Walker2d-v5'] overridden by the flags given\n" in capsys.readouterr().out
    monkeypatch.setattr(sys, "argv", [script, "--env-id", "MountainCarContinuous-v0"])  # the std that finds the goal
    assert box_ppo.parse_args()[0] == box_ppo.Args(env_id="MountainCarContinuous-v0", init_log_std=0.0)
    assert "defaults: ENV_DEFAULTS['MountainCarContinuous-v0'] sets init_log_std=0.0" in capsys.readouterr().out
    if box_ppo is ppo_continuous:  # a narrow std (EnvPool's DMC tasks: test_envpool.py)
        monkeypatch.setattr(sys, "argv", [script, "--env-id", "Ant-v5"])
        assert box_ppo.parse_args()[0] == box_ppo.Args(env_id="Ant-v5", init_log_std=-1.5)
        assert "defaults: ENV_DEFAULTS['Ant-v5'] sets init_log_std=-1.5" in capsys.readouterr().out
    monkeypatch.setattr(sys, "argv", [script, "--env-id", "Swimmer-v5"])  # a long horizon, a wide std
    assert box_ppo.parse_args()[0] == box_ppo.Args(env_id="Swimmer-v5", gamma=0.9999, gae_lambda=0.995,
                                                   init_log_std=0.0, num_minibatches=32)
    assert ("defaults: ENV_DEFAULTS['Swimmer-v5'] sets gamma=0.9999, gae_lambda=0.995, init_log_std=0.0, "
            "num_minibatches=32") in capsys.readouterr().out
    for env_id in ("HalfCheetah-v5", "Pendulum-v1"):  # not in the table: the defaults, and no line about them
        monkeypatch.setattr(sys, "argv", [script, "--env-id", env_id])
        assert box_ppo.parse_args()[0] == box_ppo.Args(env_id=env_id)
        assert "defaults:" not in capsys.readouterr().out
    path = box_ppo.train(short_args(box_ppo, env_id="Hopper-v5", total_timesteps=512))  # as trained before the table
    monkeypatch.setattr(sys, "argv", [script, "--resume", path, "--total-timesteps", "1024"])
    args, _ = box_ppo.parse_args()
    assert args.init_log_std == box_ppo.Args.init_log_std == -1.0 and "defaults:" not in capsys.readouterr().out


def test_a_copy_of_a_box_script_takes_the_same_env_defaults(tmp_path):
    shutil.copy(os.path.join(ROOT, "ppo_continuous.py"), tmp_path / "my_experiment.py")
    process = subprocess.run([sys.executable, "my_experiment.py", "--env-id", "Walker2d-v5", "--total-timesteps", "512",
                              "--num-envs", "2", "--num-steps", "256", "--checkpoint-interval", "0"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=300)
    first = process.stdout.splitlines()[0]
    assert process.returncode == 0 and first == "defaults: ENV_DEFAULTS['Walker2d-v5'] sets init_log_std=-0.5"

"""The core is closed: a change to PPO is made above the Run safety banner and Run safety takes it without an edit.
Run safety names no setting of the algorithm; an edited copy trains and resumes its own checkpoint, each changed
setting said in one line; the schedule, the policy's one call and a stop during the start."""

import ast
import dataclasses
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import ROOT, scalars, short_args, short_flags, wait_for

import ppo_continuous
import ppo_discrete
import ppo_vector_sameStep

ALL = [ppo_discrete, ppo_continuous, ppo_vector_sameStep]
BANNER = "# ==================== Run safety:"
# The run's own settings, the only ones Run safety may name: env and engine, seed, steps and batch shape,
# checkpoints, evaluation, logging, device
RUN_OWN = {"exp_name", "seed", "torch_deterministic", "cuda", "track", "wandb_project_name", "wandb_entity",
           "capture_video", "env_id", "env_kwargs", "env_backend", "env_threads", "vectorization_mode", "env_timeout",
           "total_timesteps", "num_envs", "num_steps", "checkpoint_interval", "resume", "eval_checkpoint",
           "eval_episodes", "eval_max_steps", "eval_sample"}
INFO_KEYS = {"action_mask"}  # gymnasium's info key for masks: a string of the env's convention, not the setting


def run_safety_names(path):
    """Every attribute, keyword and string that the code below the Run safety banner names."""
    source = open(path).read()
    banner = source[: source.index(BANNER)].count("\n") + 1
    names = set()
    for node in ast.walk(ast.parse(source)):
        if getattr(node, "lineno", 0) < banner:
            continue
        if isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.keyword) and node.arg:
            names.add(node.arg)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value not in INFO_KEYS:
            names.add(node.value)
    return names


@pytest.mark.parametrize("ppo", ALL, ids=lambda module: module.__name__)
def test_run_safety_names_no_setting_of_the_algorithm(ppo):
    algorithm = {field.name for field in dataclasses.fields(ppo.Args)} - RUN_OWN
    assert {"learning_rate", "num_minibatches", "gamma", "hidden_size"} <= algorithm  # the check sees the settings
    named = run_safety_names(ppo.__file__) & algorithm
    assert not named, f"Run safety names settings of the algorithm: {sorted(named)}"


def rename_setting(source, old, new):
    """A researcher's rename of a setting everywhere above the banner: the field, args.<name>, "<name>", --<name>."""
    core, safety = source[: source.index(BANNER)], source[source.index(BANNER):]
    core = re.sub(rf"^    {old}: ", f"    {new}: ", core, flags=re.M)
    core = re.sub(rf"\bargs\.{old}\b", f"args.{new}", core)
    core = re.sub(rf"\"{old}\"", f'"{new}"', core)
    core = core.replace(f"--{old.replace('_', '-')}", f"--{new.replace('_', '-')}")
    return core + safety


def edited_copy(ppo, text):
    """The script with settings renamed, one added and used as a coefficient, and a rollout statistic logged."""
    for old, new in [("learning_rate", "lr_start"), ("num_minibatches", "n_minibatches"), ("anneal_lr", "decay_lr"),
                     ("sequence_length", "seq_len"), ("target_kl", "kl_stop"), ("gae_lambda", "lam")]:
        text = rename_setting(text, old, new)
    field = '    clip_coef: float = '
    assert text.count(field) == 1
    text = text.replace(field, '    aux_coef: float = 0.25\n    """a new coefficient"""\n' + field)
    schedule = '"vf_coef": args.vf_coef}'
    assert text.count(schedule) == 1
    text = text.replace(schedule, '"vf_coef": args.vf_coef, "aux_coef": args.aux_coef}')
    charts = "charts = dict(coefs, "
    assert text.count(charts) == 1
    return text.replace(charts, 'charts = dict(coefs, mean_value=batch["values"].mean().item(), ')


@pytest.mark.parametrize("ppo", ALL, ids=lambda module: module.__name__)
def test_an_edited_copy_trains_and_resumes_its_own_checkpoint_saying_each_changed_setting(ppo, tmp_path):
    """Settings renamed everywhere above the banner (Run safety's own checks once named some of them), one added as a
    coefficient, a rollout statistic: the copy trains, and resumes the checkpoint it wrote before the edit."""
    script = tmp_path / "my_ppo.py"
    shutil.copy(ppo.__file__, script)
    first = subprocess.run([sys.executable, str(script), *short_flags(ppo)], cwd=tmp_path, capture_output=True, text=True,
                           timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    (checkpoint,) = glob.glob(str(tmp_path / "runs" / "*" / "checkpoint.pt"))
    saved = torch.load(checkpoint, weights_only=True)["args"]
    script.write_text(edited_copy(ppo, script.read_text()))

    resumed = subprocess.run([sys.executable, str(script), "--resume", checkpoint, "--total-timesteps", "2048"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0 and "Traceback" not in resumed.stderr, resumed.stdout + resumed.stderr
    notes = [line for line in resumed.stdout.splitlines() if line.startswith("note: the checkpoint")]
    for old in ("learning_rate", "num_minibatches", "anneal_lr", "sequence_length", "target_kl", "gae_lambda"):
        assert f"note: the checkpoint's setting {old} = {saved[old]!r} is not in my_ppo.py: dropped" in notes
    assert "note: the checkpoint has no setting aux_coef: 0.25 applies" in notes
    assert "note: the checkpoint has no setting lr_start: " in "\n".join(notes)
    assert len(notes) == 13, notes  # six gone, seven new: one line each
    assert "done: 2,048 steps" in resumed.stdout
    tags = scalars(os.path.dirname(checkpoint))
    assert [step for step, _ in tags["charts/aux_coef"]] == [1536, 2048]  # a new coefficient, logged as it applies
    assert len(tags["charts/mean_value"]) == 2 and len(tags["charts/lr_start"]) == 2  # the resumed iterations


@pytest.mark.parametrize("ppo", ALL, ids=lambda module: module.__name__)
def test_an_edited_copy_whose_network_no_longer_fits_is_refused_in_one_line(ppo, tmp_path):
    script = tmp_path / "my_ppo.py"
    shutil.copy(ppo.__file__, script)
    first = subprocess.run([sys.executable, str(script), *short_flags(ppo), "--total-timesteps", "512"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    (checkpoint,) = glob.glob(str(tmp_path / "runs" / "*" / "checkpoint.pt"))
    script.write_text(rename_setting(script.read_text(), "hidden_size", "width").replace(
        "    width: int = 64", "    width: int = 32"))  # renamed, and a narrower default: the weights cannot load
    resumed = subprocess.run([sys.executable, str(script), "--resume", checkpoint, "--total-timesteps", "1024"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 1 and "Traceback" not in resumed.stderr, resumed.stderr
    assert resumed.stderr.splitlines()[-1].startswith("error: the checkpoint's model does not fit"), resumed.stderr
    assert "note: the checkpoint's setting hidden_size = 64 is not in my_ppo.py: dropped" in resumed.stdout


@pytest.mark.parametrize("ppo", ALL, ids=lambda module: module.__name__)
def test_a_changed_schedule_is_the_one_an_extension_reports_and_logs(ppo, in_tmp, capsys, monkeypatch):
    """Run safety reads the schedule from coefficients(), as train() does: a warm-up written there alone is what the
    extension's line says and what TensorBoard shows."""
    def warm_up(args, iteration, num_iterations):
        return {"learning_rate": 1e-4 * iteration / num_iterations, "clip_coef": 0.2, "ent_coef": 0.0, "vf_coef": 0.5}

    monkeypatch.setattr(ppo, "coefficients", warm_up)
    first = ppo.train(short_args(ppo))  # 2 iterations of 512 steps
    checkpoint = ppo.load_checkpoint(first)
    capsys.readouterr()
    ppo.train(ppo.Args(**{**checkpoint["args"], "total_timesteps": 4096, "resume": first}), checkpoint)
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("extending")]
    assert line.endswith("from here learning_rate 3.75e-05")  # iteration 3 of 8 (it was 3 of 2)
    logged = dict(scalars(os.path.dirname(first))["charts/learning_rate"])
    assert logged[1536] == pytest.approx(3.75e-05) and logged[4096] == pytest.approx(1e-4)


@pytest.mark.parametrize("ppo", ALL, ids=lambda module: module.__name__)
def test_the_actor_is_read_only_through_the_policy_in_rollout_loss_and_evaluation(ppo, in_tmp, monkeypatch):
    """One policy call from the actor's features: a new head or a state-dependent std is a change to Agent alone."""
    inside, calls, policy, init = [False], {"policy": 0, "actor": 0}, ppo.Agent.policy, ppo.Agent.__init__

    def spy_policy(agent, *args, **kwargs):
        inside[0] = True
        calls["policy"] += 1
        try:
            return policy(agent, *args, **kwargs)
        finally:
            inside[0] = False

    def spy_init(agent, *args, **kwargs):
        init(agent, *args, **kwargs)

        def hook(module, inputs):
            assert inside[0], "the actor was read outside Agent.policy"
            calls["actor"] += 1
        agent.actor.register_forward_pre_hook(hook)

    monkeypatch.setattr(ppo.Agent, "policy", spy_policy)
    monkeypatch.setattr(ppo.Agent, "__init__", spy_init)
    path = ppo.train(short_args(ppo, total_timesteps=512))
    checkpoint = ppo.load_checkpoint(path)
    for sample in (False, True):
        ppo.evaluate(ppo.Args(**{**checkpoint["args"], "eval_checkpoint": path, "eval_episodes": 1,
                                 "eval_sample": sample}), checkpoint)
    assert calls["actor"] == calls["policy"] > 512 // short_args(ppo).num_envs  # rollout steps, minibatches, episodes


@pytest.mark.parametrize("ppo", ALL, ids=lambda module: module.__name__)
def test_train_names_each_thing_once_and_the_contract_is_at_the_banner(ppo):
    """`state` is what checkpoints hold and nothing else; the banner says what Run safety does with each change."""
    source = open(ppo.__file__).read()
    train = next(node for node in ast.parse(source).body if isinstance(node, ast.FunctionDef) and node.name == "train")
    bound = [target.id for node in ast.walk(train) if isinstance(node, ast.Assign) for target in node.targets
             if isinstance(target, ast.Name)]
    bound += [element.id for node in ast.walk(train) if isinstance(node, ast.Assign) for target in node.targets
              if isinstance(target, ast.Tuple) for element in target.elts if isinstance(element, ast.Name)]
    assert bound.count("state") == 1 and "charts" in bound
    contract = source[source.index(BANNER):].split("\n\n")[0]
    for promise in ("Args field", "`state`", "`charts`", "statistics", "Resuming", "check_settings"):
        assert promise in contract, promise
    assert "its banner" in ppo.__doc__ and "a rollout statistic" in ppo.__doc__


SLOW_ENVS = '''import time

import gymnasium as gym


class SlowStart(gym.Env):
    """CartPole or Pendulum whose making takes a second: the start of a run lasts long enough to be stopped."""

    def __init__(self, kind="CartPole-v1"):
        time.sleep(1.0)
        self.inner = gym.make(kind).unwrapped
        self.observation_space, self.action_space = self.inner.observation_space, self.inner.action_space

    def reset(self, seed=None, options=None):
        return self.inner.reset(seed=seed)

    def step(self, action):
        return self.inner.step(action)


gym.register("SlowStart-v0", entry_point=SlowStart, max_episode_steps=200)
'''


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
@pytest.mark.parametrize("ppo", ALL, ids=lambda module: module.__name__)
def test_a_stop_during_the_start_ends_it_in_one_line_and_leaves_no_run_folder(ppo, signum, tmp_path):
    """Stopped while the sub-envs are made, after the run folder was opened: one line, status 1, no empty folder."""
    (tmp_path / "slow_envs.py").write_text(SLOW_ENVS)
    kind = "CartPole-v1" if ppo is ppo_discrete else "Pendulum-v1"
    flags = [*short_flags(ppo), "--env-id", "slow_envs:SlowStart-v0", "--env-kwargs", f'{{"kind": "{kind}"}}',
             "--num-envs", "4"]
    process = subprocess.Popen([sys.executable, os.path.join(ROOT, f"{ppo.__name__}.py"), *flags], cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": str(tmp_path)})
    wait_for(lambda: glob.glob(str(tmp_path / "runs" / "*")), timeout=120, interval=0.02)
    time.sleep(0.3)  # in the making of the training's sub-envs (4 seconds)
    process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=120)
    assert (stderr, process.returncode) == ("interrupted\n", 1), stdout + stderr
    assert os.listdir(tmp_path / "runs") == [], "the run folder was left behind"


def test_a_stop_during_the_start_with_worker_processes_leaves_no_folder_and_no_worker(tmp_path):
    """The workers are forked from the main process while the start goes on: they take the fatal default for SIGTERM
    (how they are stopped), not the run's handler; the main process ends the start in one line."""
    (tmp_path / "slow_envs.py").write_text(SLOW_ENVS)
    flags = ["--env-id", "slow_envs:SlowStart-v0", "--env-kwargs", '{"kind": "Pendulum-v1"}', "--num-envs", "4",
             "--vectorization-mode", "async", "--total-timesteps", "2048"]
    process = subprocess.Popen([sys.executable, os.path.join(ROOT, "ppo_vector_sameStep.py"), *flags], cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                               env={**os.environ, "PYTHONPATH": str(tmp_path)})
    wait_for(lambda: glob.glob(str(tmp_path / "runs" / "*")), timeout=120, interval=0.02)
    time.sleep(0.5)  # the workers are making their sub-envs
    os.killpg(process.pid, signal.SIGTERM)  # as a scheduler does: to every process of the group
    stdout, stderr = process.communicate(timeout=120)
    assert (stderr, process.returncode) == ("interrupted\n", 1), stdout + stderr
    assert os.listdir(tmp_path / "runs") == []
    time.sleep(1.0)
    left = subprocess.run(["pgrep", "-s", str(process.pid)], capture_output=True, text=True).stdout
    assert left == "", f"worker processes left behind: {left}"


@pytest.mark.parametrize("ppo", ALL, ids=lambda module: module.__name__)
def test_the_loss_statistics_are_detached_so_a_coefficient_may_learn_from_them(ppo, in_tmp, monkeypatch):
    """Each statistic ppo_loss returns is a value, not the graph's tensor: a change that trains a coefficient on
    stats["entropy"] (a second backward) cannot reach through the loss's graph."""
    seen, ppo_loss = [], ppo.ppo_loss

    def spy(*args):
        loss, stats = ppo_loss(*args)
        seen.append(stats)
        return loss, stats

    monkeypatch.setattr(ppo, "ppo_loss", spy)
    ppo.train(short_args(ppo, total_timesteps=512))
    assert seen and {"policy_loss", "value_loss", "entropy", "approx_kl"} <= set(seen[0])
    assert not [name for stats in seen for name, value in stats.items() if value.requires_grad or value.grad_fn]


@pytest.mark.parametrize("ppo", ALL, ids=lambda module: module.__name__)
def test_a_head_added_to_the_agent_starts_fresh_on_an_older_checkpoint_and_a_renamed_one_is_refused(
        ppo, in_tmp, capsys, monkeypatch):
    """A reward head added to Agent: the checkpoint's weights load, the head starts fresh (one note), and so does the
    optimizer (its moments belong to the old parameters). The critic renamed: refused in one line that says so."""
    first = ppo.train(short_args(ppo, total_timesteps=512))
    checkpoint = ppo.load_checkpoint(first)
    init, restore, restored = ppo.Agent.__init__, ppo.restore, []

    def with_head(agent, envs, args):
        init(agent, envs, args)
        agent.reward_head = torch.nn.Linear(3, 1)

    def spy(saved, state, env_id):
        restore(saved, state, env_id)
        loaded = state["model"].state_dict()
        restored.append(all(torch.equal(loaded[key], value) for key, value in saved["model"].items()))

    monkeypatch.setattr(ppo.Agent, "__init__", with_head)
    monkeypatch.setattr(ppo, "restore", spy)
    capsys.readouterr()
    path = ppo.train(ppo.Args(**{**checkpoint["args"], "total_timesteps": 1024, "resume": first}), checkpoint)
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
    assert notes == [f"note: {ppo.SCRIPT}'s model has new reward_head.bias, reward_head.weight: they start fresh",
                     "note: the checkpoint's optimizer holds moments of other parameters: it starts fresh"], notes
    assert restored == [True] and "reward_head.weight" in ppo.load_checkpoint(path)["model"]

    def renamed(agent, envs, args):
        init(agent, envs, args)
        agent.value = agent._modules.pop("critic")

    monkeypatch.setattr(ppo.Agent, "__init__", renamed)
    checkpoint = ppo.load_checkpoint(path)
    with pytest.raises(SystemExit) as stop:
        ppo.train(ppo.Args(**{**checkpoint["args"], "total_timesteps": 1536, "resume": path}), checkpoint)
    assert re.match(rf"error: the checkpoint's model does not fit {ppo.SCRIPT}'s on \S+ \(another script, env or "
                    rf"network\): {ppo.SCRIPT} has value\.\S+, .* the checkpoint critic\.\S+, .* instead$", str(stop.value))


def test_a_state_entry_a_checkpoint_cannot_hold_is_refused_in_one_line(tmp_path):
    """`state` takes tensors and objects with state_dict(): a plain number there (a counter) gets one line, not a
    checkpoint that silently lacks it."""
    script = tmp_path / "my_ppo.py"
    rows = "    rows = (args.num_steps, num_envs)"
    text = open(ppo_discrete.__file__).read()
    assert text.count(rows) == 1
    script.write_text(text.replace(rows, '    state["updates"] = 0\n' + rows))
    done = subprocess.run([sys.executable, str(script), *short_flags(ppo_discrete), "--total-timesteps", "512"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines()[-1] == ("error: train()'s state['updates'] is of type int: a checkpoint holds tensors "
                                            "(changed in place) and objects with state_dict() and load_state_dict()")

"""The fault matrix: every bad input and every fault, run against every script it applies to.

Each case runs a script's main() with a command line, in this process (a new process per case would
take minutes), and must end as the README promises: SystemExit with a one-line message that names the
problem (Python prints it to stderr and exits with status 1; test_a_real_process_... checks that), no
traceback, no temporary file left, and either every checkpoint on disk untouched or, where the run had
learned something, a checkpoint that loads, holds finite weights and resumes to the end of the run.
"""

import errno
import glob
import multiprocessing
import os
import pathlib
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import pytest
import torch
from conftest import ROOT, constructed_env_id, run_main, short_args, short_flags, start, wait_for
from tensorboard.summary.writer.record_writer import RecordWriter
from torch.utils.tensorboard import SummaryWriter

import ppo_continuous
import ppo_discrete
import ppo_vector_sameStep

ALL = (ppo_discrete, ppo_continuous, ppo_vector_sameStep)
BOX = (ppo_continuous, ppo_vector_sameStep)
WRONG_ACTIONS = {"ppo_discrete": "Pendulum-v1", "ppo_continuous": "test/MultiBinaryActions-v0", "ppo_vector_sameStep": "test/TupleActions-v0"}
OTHER_ENV = {"ppo_discrete": "Acrobot-v1", "ppo_continuous": "MountainCarContinuous-v0", "ppo_vector_sameStep": "MountainCarContinuous-v0"}


def failing_checkpoint_write(error):
    """The second torch.save writes half a file, then raises `error` (a real full disk raises RuntimeError there)."""
    def put_in_place(monkeypatch):
        real_save, calls = torch.save, []

        def save(obj, path, *args, **kwargs):
            calls.append(path)
            if len(calls) == 2:
                with open(path, "wb") as f:
                    f.write(b"partial")
                raise error
            return real_save(obj, path, *args, **kwargs)

        monkeypatch.setattr(torch, "save", save)
    return put_in_place


def tensorboard_disk_full_after_first_checkpoint(monkeypatch):
    """Every TensorBoard write (in its writer thread) fails once the run has flushed its events at its first checkpoint."""
    real_flush, real_write, flushed = SummaryWriter.flush, RecordWriter.write, []

    def flush(self):
        real_flush(self)
        flushed.append(True)

    def write(self, data):
        if flushed:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_write(self, data)

    monkeypatch.setattr(SummaryWriter, "flush", flush)
    monkeypatch.setattr(RecordWriter, "write", write)


def nan_loss_in_the_second_update(monkeypatch):
    """The loss of the third minibatch of the second update is NaN (16 minibatches an update in the short runs)."""
    for ppo in ALL:
        real_loss, calls = ppo.ppo_loss, []

        def loss(*args, real_loss=real_loss, calls=calls):
            value, stats = real_loss(*args)
            calls.append(1)
            return (value * float("nan") if len(calls) == 16 + 3 else value), stats

        monkeypatch.setattr(ppo, "ppo_loss", loss)


def two_signals_while_the_env_hangs(monkeypatch):
    """Ctrl-C twice, 2 and 2.5 s after the start: the first finds the env hanging, the second stops the run."""
    for delay in (2.0, 2.5):
        timer = threading.Timer(delay, os.kill, (os.getpid(), signal.SIGINT))
        timer.daemon = True
        timer.start()


def run_folder_deleted_after_the_first_checkpoint(monkeypatch):
    real_save, calls = torch.save, []

    def save(obj, path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 2:
            shutil.rmtree(os.path.dirname(path))
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)


def runs_is_a_file(monkeypatch):
    with open("runs", "w") as f:
        f.write("a file where the folder should be")


def mujoco_gl_egl(monkeypatch):
    """MUJOCO_GL=egl in the environment (headless MuJoCo rendering)."""
    monkeypatch.setenv("MUJOCO_GL", "egl")


def run_folder_not_writable(monkeypatch):
    os.mkdir("runs/own/train.lock")  # the lock file cannot be opened for writing


@dataclass
class Fault:
    name: str
    message: str  # a regular expression the one-line message must match; {script}: the script's file name
    flags: tuple = ()  # after the script's short-run flags ({env:Name}: constructed env Name with the script's actions)
    scripts: tuple = ALL
    checkpoint: Optional[tuple] = None  # run with --resume and with --eval-checkpoint of this file instead of a new run
    only_resume: bool = False
    fault: Optional[Callable] = None  # puts a failing disk or folder in place, given pytest's monkeypatch
    progress: bool = False  # the run learned something: a checkpoint must be left that loads and resumes
    resume_env: Optional[str] = None  # the constructed env it resumes on (one that does not fail), else its own
    shown: tuple = ()  # also printed: the env's own frames and error


FAULTS = [
    # bad flags
    Fault("NaN learning rate", r"--learning-rate must be a finite number, got nan", ("--learning-rate", "nan")),
    Fault("infinite gamma", r"--gamma must be a finite number, got inf", ("--gamma", "inf")),
    Fault("infinite lambda", r"--gae-lambda must be a finite number", ("--gae-lambda", "-inf")),
    Fault("NaN clip coefficient", r"--clip-coef must be a finite number", ("--clip-coef", "nan")),
    Fault("NaN entropy coefficient", r"--ent-coef must be a finite number", ("--ent-coef", "nan")),
    Fault("infinite max grad norm", r"--max-grad-norm must be a finite number", ("--max-grad-norm", "inf")),
    Fault("NaN target KL", r"--target-kl must be a finite number", ("--target-kl", "nan")),
    Fault("NaN env timeout", r"--env-timeout must be", ("--env-timeout", "nan"), scripts=(ppo_vector_sameStep,)),
    Fault("zero env timeout", r"--env-timeout must be", ("--env-timeout", "0"), scripts=(ppo_vector_sameStep,)),
    Fault("negative seed", r"--seed must lie in \[0, 2\*\*63\), got -1", ("--seed", "-1")),
    Fault("seed of 2**63", r"--seed must lie in \[0, 2\*\*63\)", ("--seed", str(2**63))),
    Fault("no sub-environments", r"--num-envs must be positive, got 0", ("--num-envs", "0")),
    Fault("zero total steps", r"--total-timesteps must be positive", ("--total-timesteps", "0")),
    Fault("minibatches that do not divide the batch", r"must divide into --num-minibatches 7", ("--num-minibatches", "7")),
    Fault("sequences that do not divide the rollout", r"--sequence-length 7 must divide --num-steps (128|256) \(0: whole rollouts\)",
          ("--recurrent", "lstm", "--sequence-length", "7")),
    Fault("fewer steps than one batch", r"--total-timesteps 100 is smaller than one batch", ("--total-timesteps", "100")),
    Fault("minibatches of one row", r"must divide into --num-minibatches 256 of 2 rows or more", ("--num-envs", "1", "--num-steps", "256", "--num-minibatches", "256")),
    Fault("gamma above 1", r"--gamma and --gae-lambda must lie in \[0, 1\]", ("--gamma", "1.5")),
    Fault("zero learning rate", r"--learning-rate must be positive, got 0.0", ("--learning-rate", "0")),
    Fault("zero max grad norm", r"--max-grad-norm must be positive", ("--max-grad-norm", "0")),
    Fault("negative value coefficient", r"--vf-coef must not be negative", ("--vf-coef", "-0.5")),
    Fault("negative checkpoint interval", r"--checkpoint-interval( and --env-threads)? must not be negative",
          ("--checkpoint-interval", "-1")),
    Fault("negative target KL", r"--target-kl must be positive", ("--target-kl", "-0.01")),
    Fault("a network too big for memory", r"--hidden-size 1000000 would not fit in memory: at most 8192", ("--hidden-size", "1000000")),
    Fault("no evaluation episodes", r"--eval-episodes must be positive", ("--eval-episodes", "0")),
    Fault("env kwargs that are not JSON", r"--env-kwargs is not valid JSON", ("--env-kwargs", "{bad")),
    Fault("env kwargs that are not an object", r"--env-kwargs must be a JSON object", ("--env-kwargs", "[1]")),
    Fault("env kwargs the env does not take", r"cannot make env '.*' with --env-kwargs .*unexpected keyword argument 'no_such_option'",
          ("--env-kwargs", '{"no_such_option": 1}')),
    # unknown envs and spaces a script cannot train, named before any complaint about sizes
    Fault("unknown env", r"cannot make env 'NoSuchEnv-v0'", ("--env-id", "NoSuchEnv-v0")),
    Fault("env whose renderer does not load", r"cannot make env 'test/BrokenRenderer-v0': AttributeError: .*eglQueryString' "
          r"\(raised at .*conftest.py, line \d+\); MUJOCO_GL=egl is set: can this machine render that way\?",
          ("--env-id", "test/BrokenRenderer-v0"), fault=mujoco_gl_egl),
    Fault("env whose own code fails while it is made, MUJOCO_GL set", r"cannot make env 'test/FailingAssertion-v0': "
          r"AssertionError \(raised at .*conftest.py, line \d+\)$", ("--env-id", "test/FailingAssertion-v0"),
          fault=mujoco_gl_egl),  # where the env raised, and no rendering hint
    Fault("unknown env, MUJOCO_GL set", r"cannot make env 'NoSuchEnv-v0': NameNotFound: [^;]*; for an env of your own file, "
          r"name its module: --env-id my_module:MyEnv-v0$", ("--env-id", "NoSuchEnv-v0"), fault=mujoco_gl_egl),  # no rendering hint
    Fault("module of an env id that does not import", r"cannot make env 'no_such_module:Env-v0': ModuleNotFoundError: .*; "
          r"is no_such_module.py in .* or on PYTHONPATH\?", ("--env-id", "no_such_module:Env-v0")),
    Fault("unknown env and bad sizes", r"cannot make env 'NoSuchEnv-v0'", ("--env-id", "NoSuchEnv-v0", "--num-minibatches", "7")),
    # many agents: a module named alone is PettingZoo's (or one of yours with parallel_env())
    Fault("module of many agents that is not installed", r"cannot make env 'no_such_package.games': NameNotFound: .*; no module "
          r"no_such_package.games to import \(PettingZoo: pip install", ("--env-id", "no_such_package.games")),
    Fault("module without parallel_env()", r"json has no parallel_env\(\): for an AEC env, write a module whose parallel_env\(\) "
          r"returns pettingzoo.utils.conversions.aec_to_parallel\(env\(\)\), and name it", ("--env-id", "json")),
    # a refusal names a script that takes the space, or says that none does
    Fault("wrong action space", r"has a (Box|MultiBinary|Tuple) action space(; ppo_discrete.py takes Discrete, MultiDiscrete and "
          r"MultiBinary \(use ppo_continuous.py\)|; ppo_continuous.py needs Box \(use ppo_discrete.py\)|, which none of these "
          r"scripts takes: map it to a MultiDiscrete \(ppo_discrete.py\) or a Box \(ppo_continuous.py\) in a wrapper)",
          ("--env-id", "{wrong-actions}")),
    Fault("Tuple actions", r"test/TupleActions-v0 has a Tuple action space, which none of these scripts takes",
          ("--env-id", "test/TupleActions-v0")),
    Fault("wrong action space and bad sizes", r"action space[;,] ", ("--env-id", "{wrong-actions}", "--num-minibatches", "7")),
    Fault("matrix actions", r"has Box actions of shape \(2, 2\); .* takes one-dimensional ones", ("--env-id", "test/MatrixActions-v0"), scripts=BOX),
    Fault("actions the script does not send", r"has actions Box\(-2, 2, \(2,\), int64\) that {script} does not send: its Box "
          r"actions are floats", ("--env-id", "test/DiscreteFromOneBox-v0"), scripts=BOX),
    Fault("observations that do not flatten", r"has a Sequence observation space; .* needs one that flattens into a vector",
          ("--env-id", "{env:SequenceObservations}")),
    Fault("observations with an entry that cannot say whether it flattens (MiniGrid's mission) and no image",
          r"has a Dict observation space; {script} needs one that flattens into a vector, or a Dict with an image "
          r"\(make one in a wrapper\)$", ("--env-id", "{env:MissionObservations}")),
    # bad checkpoints
    Fault("missing checkpoint", r"checkpoint not found: nowhere.pt", checkpoint=("missing",)),
    Fault("empty checkpoint", r"cannot read checkpoint .*empty.pt: .", checkpoint=("empty",)),
    Fault("checkpoint of random bytes", r"cannot read checkpoint .*garbage.pt: .", checkpoint=("garbage",)),
    Fault("checkpoint that is a list", r"list.pt is not a checkpoint of {script}", checkpoint=("list",)),
    Fault("checkpoint with other keys", r"foreign.pt is not a checkpoint of {script} \(expected keys", checkpoint=("foreign",)),
    *[Fault(f"checkpoint of {writer.__name__}.py", rf"is a checkpoint of {writer.__name__}.py, not of {{script}}: use {writer.__name__}.py",
            scripts=tuple(ppo for ppo in ALL if ppo is not writer), checkpoint=("of", writer)) for writer in ALL],
    Fault("checkpoint of another env", r"the checkpoint's model does not fit {script}'s on {other-env} \(another env, setting or network\): size mismatch",
          ("--env-id", "{other-env}", "--total-timesteps", "2048"), checkpoint=("own",)),
    *[Fault(f"damaged checkpoint: {key} = {value!r}", rf"damaged.pt is damaged: wrong type of {key}", checkpoint=("damaged", part, key, value))
      for part, key, value in [("args", "num_envs", "four"), ("args", "learning_rate", "fast"), ("args", "norm_adv", 1),
                               (None, "global_step", 1.5), (None, "rng_state", [1, 2, 3]), (None, "model", "weights")]],
    Fault("damaged checkpoint: a run name that is a path", r"damaged.pt is damaged: its run name or step counters are not those of a run",
          checkpoint=("damaged", None, "run_name", "../../../escape")),
    *[Fault(f"damaged checkpoint: {key} = {value}", r"damaged.pt is damaged: its run name or step counters",
            checkpoint=("damaged", None, key, value)) for key, value in (("iteration", 7), ("iteration", -1), ("global_step", -512))],
    Fault("damaged checkpoint: normalization statistics of another shape", r"the checkpoint's obs_rms does not fit .*: "
          r"statistics of the wrong shape", ("--total-timesteps", "4096"),
          checkpoint=("damaged", "obs_rms", "mean", torch.zeros(5, dtype=torch.float64)), scripts=BOX),
    Fault("damaged checkpoint: an optimizer moment of another shape", r"the checkpoint's optimizer does not fit .*: statistics "
          r"of the wrong shape", ("--total-timesteps", "4096"),
          checkpoint=("damaged", ("optimizer", "state", 0), "exp_avg", torch.zeros(7)), only_resume=True),
    Fault("checkpoint with non-finite weights", r"damaged.pt holds non-finite weights", checkpoint=("nan weights",)),
    Fault("checkpoint whose env id imports a module", r"the checkpoint's env json:Env-v0 imports a module: allow it by naming it, "
          r"--env-id json:Env-v0", checkpoint=("damaged", "args", "env_id", "json:Env-v0")),
    Fault("checkpoint whose env id is a module of many agents", r"the checkpoint's env json imports a module: allow it by "
          r"naming it, --env-id json", checkpoint=("damaged", "args", "env_id", "json")),
    Fault("resume of an older copy of the folder's checkpoint", r"runs/own/checkpoint.pt is at step 1024, not at the step 512 of "
          r"runs/own/backup.pt: resume runs/own/checkpoint.pt, or give runs/own/backup.pt a folder of its own",
          ("--total-timesteps", "4096"), checkpoint=("older copy",), only_resume=True),
    Fault("resume with another batch", r"a resumed run keeps its batch", ("--num-envs", "3", "--total-timesteps", "4096"), checkpoint=("own",), only_resume=True),
    Fault("resume of a finished run", r"the checkpoint is at step 512: pass a --total-timesteps beyond it", checkpoint=("own",), only_resume=True),
    # failing envs
    Fault("env raises", r"raised RuntimeError: the simulator fell over in the iteration after step \d+; checkpoint of the last complete iteration "
          r"\(step \d+\) saved. "
          r"Resume with",
          ("--env-id", "{env:Crashing}", "--total-timesteps", "4096", "--checkpoint-interval", "0"),
          progress=True, resume_env="ConstantTruncated", shown=('conftest.py", line', "RuntimeError: the simulator fell over")),
    Fault("action mask with no valid action", r"test/EmptyMask-v0 gave an action mask with no valid action in the iteration "
          r"after step \d+; checkpoint of the last complete iteration \(step \d+\) saved. Resume with",
          ("--env-id", "test/EmptyMask-v0", "--total-timesteps", "4096", "--checkpoint-interval", "0"),
          scripts=(ppo_discrete, ppo_vector_sameStep), progress=True, resume_env="MaskedDiscrete-info"),
    Fault("action mask with no valid action in one part", r"test/EmptyMaskMultiDiscrete-v0 gave an action mask with no valid "
          r"action in part 1 of its MultiDiscrete\(\[3 4\], start=\[-1  0\]\) in the iteration after step \d+",
          ("--env-id", "test/EmptyMaskMultiDiscrete-v0", "--total-timesteps", "4096", "--checkpoint-interval", "0"),
          scripts=(ppo_discrete, ppo_vector_sameStep), progress=True, resume_env="MaskedMultiDiscrete34"),
    Fault("action mask of the wrong size", r"test/WrongMaskSize-v0 gave an action mask of 5 entries; its Discrete\(3\) takes 3 "
          r"\(1 = valid, for each value of each part in turn\) in the iteration after step 0; nothing new to save",
          ("--env-id", "test/WrongMaskSize-v0"), scripts=(ppo_discrete, ppo_vector_sameStep)),
    Fault("env calls sys.exit()", r"raised SystemExit: lost the connection to the simulator in the iteration after step \d+; "
          r"checkpoint of the last complete iteration \(step \d+\) saved. Resume with",
          ("--env-id", "{env:Exiting}", "--total-timesteps", "4096", "--checkpoint-interval", "0"),
          progress=True, resume_env="ConstantTruncated"),
    *[Fault(f"sub-env {problem} ({mode})", rf"test/{env}-v0 {problem} in the iteration after step 512; checkpoint of the last "
            r"complete iteration \(step 512\) saved",
            ("--env-id", f"test/{env}-v0", "--vectorization-mode", mode, "--env-timeout", "2", "--total-timesteps", "4096", "--checkpoint-interval", "0"),
            scripts=(ppo_vector_sameStep,), progress=True, resume_env="ConstantTruncated")
      for env, problem, mode in [("Crashing", "raised RuntimeError: the simulator fell over", "sync"),
                                 ("Crashing", "raised RuntimeError: the simulator fell over", "async"),
                                 ("Exiting", "raised SystemExit: lost the connection to the simulator", "sync"),
                                 ("Exiting", r"lost a worker process, which exited with status 1", "async"),
                                 *[("Hanging", r"did not answer a step within 2.0 s \(a sub-environment hangs\?\)", mode)
                                   for mode in ("sync", "async")]]],
    *[Fault(f"sub-env whose first reset hangs ({mode})", r"test/HangingReset-v0 did not answer a reset within 2.0 s \(a "
            r"sub-environment hangs\?\) in the iteration after step 0; nothing new to save",
            ("--env-id", "test/HangingReset-v0", "--vectorization-mode", mode, "--env-timeout", "2"),
            scripts=(ppo_vector_sameStep,)) for mode in ("sync", "async")],
    *[Fault(f"NaN reward, checkpoints every {interval or 'never'}",
            r"non-finite reward in the iteration after step \d+; checkpoint of the last complete iteration \(step \d+\) saved",
            ("--env-id", "{env:NanReward}", "--total-timesteps", "4096", "--checkpoint-interval", interval),
            progress=True, resume_env="ConstantTruncated") for interval in ("1", "0")],
    Fault("NaN loss in the first iteration", r"non-finite loss in the iteration after step 0; nothing new to save",
          ("--env-id", "test/HugeReward-v0"), scripts=(ppo_discrete,)),
    Fault("NaN loss in the first iteration", r"non-finite loss in the iteration after step 0; nothing new to save",
          ("--env-id", "{env:HugeReward}", "--no-norm-reward"), scripts=BOX),  # reward scaling would tame the huge reward
    Fault("env that hangs, stopped by a second Ctrl-C", r"stopped by a second signal in the iteration after step \d+; checkpoint of "
          r"the last complete iteration \(step \d+\) saved", ("--env-id", "{env:Hanging}", "--total-timesteps", "4096",
          "--checkpoint-interval", "0"), fault=two_signals_while_the_env_hangs, progress=True, resume_env="ConstantTruncated"),
    Fault("env whose render() raises", r"test/RenderFails(Box)?-v0 raised RuntimeError: the renderer lost its context in the "
          r"iteration after step 0; nothing new to save", ("--env-id", "{env:RenderFails}", "--capture-video")),
    Fault("final observation of another shape", r"test/ShapeShifting(Box)?-v0 (raised ValueError: .*|returned a final observation of a "
          r"shape other than \(1,\)) in the iteration after step 0; nothing new to save", ("--env-id", "{env:ShapeShifting}")),
    Fault("NaN loss part-way through an update", r"non-finite loss in the iteration after step 512; checkpoint of the last "
          r"complete iteration \(step 512\) saved", ("--checkpoint-interval", "0"), fault=nan_loss_in_the_second_update,
          progress=True),
    # folders and disks
    Fault("run folder deleted mid-run", r"cannot write checkpoint .*checkpoint.pt: the run folder is gone",
          fault=run_folder_deleted_after_the_first_checkpoint),
    Fault("runs/ cannot be made", r"cannot create the run folder runs/.*: Not a directory", fault=runs_is_a_file),
    Fault("run folder cannot be written", r"cannot write in the run folder runs/own: Is a directory",
          ("--total-timesteps", "2048"), checkpoint=("own",), only_resume=True, fault=run_folder_not_writable),
    Fault("checkpoint write fails (OSError)", r"cannot write checkpoint .*checkpoint.pt: No space left on device; the previous one, if any, is intact",
          fault=failing_checkpoint_write(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))), progress=True),
    Fault("checkpoint write fails (RuntimeError)", r"cannot write checkpoint .*checkpoint.pt: the write failed \(is the disk full\?\); the previous one",
          fault=failing_checkpoint_write(RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 102528 vs 102416")), progress=True),
    Fault("TensorBoard write fails", r"cannot write the TensorBoard events in runs/.*: No space left on device; checkpoint of the last complete "
          r"iteration \(step \d+\) saved", ("--total-timesteps", "2048"), fault=tensorboard_disk_full_after_first_checkpoint, progress=True),
]


def fill_in(text, ppo):
    if text.startswith("{env:"):
        return constructed_env_id(ppo, text[5:-1])
    return text.replace("{wrong-actions}", WRONG_ACTIONS[ppo.__name__]).replace("{other-env}", OTHER_ENV[ppo.__name__])


def checkpoint_file(kind, ppo, checkpoints_of_each_script):
    """The file a checkpoint case passes, made in the current folder."""
    name = kind[0]
    if name == "missing":
        return "nowhere.pt"
    if name in ("empty", "garbage"):
        with open(f"{name}.pt", "wb") as f:
            f.write(b"" if name == "empty" else b"this is not a checkpoint")
        return f"{name}.pt"
    if name in ("list", "foreign"):
        torch.save([1, 2, 3] if name == "list" else {"model": {}}, f"{name}.pt")
        return f"{name}.pt"
    if name in ("damaged", "nan weights"):
        checkpoint = torch.load(checkpoints_of_each_script[ppo.__name__], weights_only=True)
        if name == "nan weights":
            next(iter(checkpoint["model"].values())).fill_(float("nan"))
        else:
            _, part, key, value = kind
            entry = checkpoint
            for name in (part,) if isinstance(part, str) else part or ():  # the path to the entry: a name or names
                entry = entry[name]
            entry[key] = value
        torch.save(checkpoint, "damaged.pt")
        return "damaged.pt"
    source = checkpoints_of_each_script[kind[1].__name__ if name == "of" else ppo.__name__]
    os.makedirs("runs/own")  # a copy in a run folder of this test's own: resuming writes there
    shutil.copy(source, "runs/own/checkpoint.pt")
    if name == "older copy":  # backup.pt at step 512; the run went on, its checkpoint.pt is at step 1024
        shutil.copy(source, "runs/own/backup.pt")
        checkpoint = torch.load(source, weights_only=True)
        checkpoint.update(global_step=1024, iteration=2 * checkpoint["iteration"])
        torch.save(checkpoint, "runs/own/checkpoint.pt")
        return "runs/own/backup.pt"
    return "runs/own/checkpoint.pt"


def checkpoints_on_disk():
    return {path: open(path, "rb").read() for path in glob.glob("**/*.pt", recursive=True)}


CASES = [(ppo, fault, flag) for fault in FAULTS for ppo in fault.scripts
         for flag in ((("--resume",) if fault.only_resume else ("--resume", "--eval-checkpoint")) if fault.checkpoint else (None,))]


@pytest.mark.parametrize("ppo, fault, checkpoint_flag", CASES,
                         ids=[f"{ppo.__name__}: {fault.name}{' ' + flag if flag else ''}" for ppo, fault, flag in CASES])
def test_fault(ppo, fault, checkpoint_flag, checkpoints_of_each_script, in_tmp, monkeypatch, capsys):
    flags = [fill_in(flag, ppo) for flag in fault.flags]
    if fault.checkpoint:
        argv = [checkpoint_flag, checkpoint_file(fault.checkpoint, ppo, checkpoints_of_each_script), *flags]
    else:
        argv = short_flags(ppo) + flags
    before = checkpoints_on_disk()
    with monkeypatch.context() as patch:
        if fault.fault:
            fault.fault(patch)
        code = run_main(ppo, argv, patch)
    output = "".join(capsys.readouterr())

    # one line that names the problem; exit status 1; no traceback
    assert isinstance(code, str) and code.startswith("error: ") and "\n" not in code, code
    assert re.search(fault.message.replace("{script}", f"{ppo.__name__}.py").replace("{other-env}", OTHER_ENV[ppo.__name__]), code), code
    assert "Traceback" not in output and not re.search(r'File ".*(ppo_\w+\.py|gymnasium)', output), output
    assert all(text in output for text in fault.shown), output
    assert not glob.glob("**/*.tmp", recursive=True) and multiprocessing.active_children() == []  # no worker left behind

    if not fault.progress:  # nothing learned, nothing written: every checkpoint as it was
        assert checkpoints_on_disk() == before
        return
    # something learned: a checkpoint that loads, holds finite weights and resumes to the end of the run
    path = glob.glob("runs/*/checkpoint.pt")[0]
    checkpoint = ppo.load_checkpoint(path)
    assert checkpoint["global_step"] > 0 and all(torch.isfinite(weights).all() for weights in checkpoint["model"].values())
    saved = re.search(r"step (\d+)\)? saved", code)
    if saved:  # the message says which step was saved: the checkpoint holds that step, a whole number of iterations
        args = checkpoint["args"]
        assert checkpoint["global_step"] == int(saved.group(1)) == checkpoint["iteration"] * args["num_envs"] * args["num_steps"]
    resume_env = ["--env-id", constructed_env_id(ppo, fault.resume_env)] if fault.resume_env else []
    assert run_main(ppo, ["--resume", path, *resume_env], monkeypatch) == 0
    batch = checkpoint["args"]["num_envs"] * checkpoint["args"]["num_steps"]
    assert ppo.load_checkpoint(path)["global_step"] == checkpoint["args"]["total_timesteps"] // batch * batch


@pytest.mark.parametrize("ppo", ALL, ids=lambda module: module.__name__)
def test_a_real_process_exits_1_with_the_message_as_its_last_line(ppo, tmp_path):
    process = start(f"{ppo.__name__}.py", "--env-id", WRONG_ACTIONS[ppo.__name__], "--num-minibatches", "7", cwd=tmp_path,
                    stderr=subprocess.PIPE)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 1 and stdout == ""
    assert stderr.splitlines()[-1].startswith("error: ") and len(stderr.splitlines()) == 1, stderr


@pytest.mark.parametrize("ppo", ALL, ids=lambda module: module.__name__)
def test_ctrl_c_pressed_again_and_again_while_the_script_starts_gets_one_line(ppo, tmp_path):
    """Ctrl-C while torch is being imported (the first seconds of every start), sent until the process is gone: one
    line, status 1. (A handler that raised again while Python printed the line cut it or printed tracebacks.)"""
    process = start(f"{ppo.__name__}.py", *short_flags(ppo), cwd=tmp_path, stderr=subprocess.PIPE,
                    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as at a terminal
    maps = f"/proc/{process.pid}/maps"  # the libraries the process has mapped: torch's, once it loads
    wait_for(lambda: "/torch/lib/libtorch" in pathlib.Path(maps).read_text(), timeout=60)
    deadline = time.monotonic() + 30
    while process.poll() is None and time.monotonic() < deadline:
        process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=60)
    # status 1, or killed by the second signal while Python exits (its handlers are gone by then): no traceback either way
    assert (stdout, stderr) == ("", "interrupted\n") and process.returncode in (1, -signal.SIGINT)


@pytest.mark.parametrize("ppo", ALL, ids=lambda module: module.__name__)
def test_ctrl_c_that_lands_in_a_callback_python_ignores_still_ends_the_start(ppo):
    """Ctrl-C while torch loads can land in a weakref callback (importlib's module locks have one), where Python prints
    an exception from the handler as ignored and goes on (seen in the suite: a traceback, and the start went on)."""
    code = (f"import signal, weakref, {ppo.__name__} as ppo\n"
            "class Lock: pass\n"
            "lock = Lock()\n"
            "ref = weakref.ref(lock, lambda _: ppo.exit_interrupted(signal.SIGINT, None))  # the signal lands here\n"
            "del lock\n"
            "print('the start went on')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (done.stdout, done.stderr, done.returncode) == ("", "interrupted\n", 1)


@pytest.mark.parametrize("ppo", ALL, ids=lambda module: module.__name__)
def test_a_closed_output_pipe_ends_help_quietly_and_lets_training_finish(ppo, tmp_path):
    """`python <script> --help | head` and `python <script> | head`: the reader of stdout goes away. Help ends with
    status 1 and no traceback; a run trains on without its progress lines and saves its checkpoint."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # from now on every write to the pipe fails with EPIPE (BrokenPipeError in Python)
    help_run = start(f"{ppo.__name__}.py", "--help", cwd=tmp_path, stdout=write_end, stderr=subprocess.PIPE)
    help_stderr = help_run.communicate(timeout=60)[1]
    training = start(f"{ppo.__name__}.py", *short_flags(ppo), cwd=tmp_path, stdout=write_end, stderr=subprocess.PIPE)
    training_stderr = training.communicate(timeout=120)[1]
    os.close(write_end)
    assert (help_run.returncode, help_stderr) == (1, "")
    assert (training.returncode, training_stderr) == (0, "")
    assert ppo.load_checkpoint(glob.glob(str(tmp_path / "runs" / "*" / "checkpoint.pt"))[0])["global_step"] == 1024


# Spaces that are not one flat Box but flatten into one: these train.
FLATTENED = ["test/DictObservations-v0", "test/TupleObservations-v0", "test/TextObservations-v0"]


@pytest.mark.parametrize("env_id", FLATTENED)
@pytest.mark.parametrize("ppo", BOX, ids=lambda module: module.__name__)
def test_observations_that_flatten_into_a_vector_train(ppo, env_id, in_tmp, monkeypatch):
    assert run_main(ppo, short_flags(ppo) + ["--env-id", env_id, "--total-timesteps", "512"], monkeypatch) == 0
    assert ppo.load_checkpoint(glob.glob("runs/*/checkpoint.pt")[0])["global_step"] == 512


@pytest.mark.parametrize("ppo", ALL, ids=lambda module: module.__name__)
def test_dict_observations_are_one_vector_in_key_order_through_training_resume_and_evaluation(ppo, in_tmp, monkeypatch):
    """Dict({"position": Box(2), "mode": Discrete(3)}): the vector is position, then mode one-hot (the space's order,
    not the names' alphabetical one); a run trains, resumes and evaluates on it."""
    env_id = constructed_env_id(ppo, "KeyOrder")
    envs = ppo.make_envs(short_args(ppo, env_id=env_id), 2, None, "sync" if ppo is ppo_vector_sameStep else 1)
    observations = envs.reset(seed=1)[0]
    envs.close()
    assert observations.shape == (2, 5) and np.all(np.abs(observations[:, :2]) <= 1)
    assert np.all(np.sort(observations[:, 2:], axis=1) == [0, 0, 1])  # the last three: mode, one-hot
    assert run_main(ppo, short_flags(ppo) + ["--env-id", env_id, "--total-timesteps", "512"], monkeypatch) == 0
    path = glob.glob("runs/*/checkpoint.pt")[0]
    assert run_main(ppo, ["--resume", path, "--total-timesteps", "1024", "--env-id", env_id], monkeypatch) == 0
    assert ppo.load_checkpoint(path)["global_step"] == 1024
    assert run_main(ppo, ["--eval-checkpoint", path, "--eval-episodes", "2"], monkeypatch) == 0


def test_a_run_killed_at_random_moments_always_leaves_a_loadable_checkpoint(tmp_path):
    """SIGKILL gives no chance to clean up: the atomic write (temporary file, then rename) alone must keep the checkpoint whole."""
    rng = random.Random(0)
    flags = ["--total-timesteps", "100000000", "--num-envs", "1", "--num-steps", "8", "--num-minibatches", "2",
             "--update-epochs", "1", "--checkpoint-interval", "1"]
    steps = []
    for attempt in range(4):
        checkpoints = glob.glob(str(tmp_path / "runs" / "*" / "checkpoint.pt"))
        resume = ["--resume", checkpoints[0]] if checkpoints else []
        process = start("ppo_discrete.py", *flags, *resume, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def written_since_start():  # this process has written at least one checkpoint
            paths = glob.glob(str(tmp_path / "runs" / "*" / "checkpoint.pt"))
            return paths and (not checkpoints or os.path.getmtime(paths[0]) > started)

        started = time.time()
        wait_for(written_since_start, timeout=60, interval=0.05)
        time.sleep(rng.uniform(0.0, 1.0))  # a checkpoint every 8 steps: writing is a good part of the time
        process.kill()
        process.wait()
        checkpoint = ppo_discrete.load_checkpoint(glob.glob(str(tmp_path / "runs" / "*" / "checkpoint.pt"))[0])
        assert all(torch.isfinite(weights).all() for weights in checkpoint["model"].values())
        steps.append(checkpoint["global_step"])
    assert steps == sorted(steps) and steps[-1] > steps[0]  # each start resumed the same run and went on

"""Faults and unusual spaces, as a table: each case against every script it applies to, with what must happen."""

import errno
import glob
import os
import random
import re
import subprocess
import sys
import time

import pytest
import torch
from conftest import ROOT, short_args

import ppo_continuous
import ppo_discrete
import ppo_vector_sameStep

ALL_SCRIPTS = [ppo_discrete, ppo_continuous, ppo_vector_sameStep]
BOX_SCRIPTS = [ppo_continuous, ppo_vector_sameStep]

# (env id, None if the run must train, else the phrase of its one-line refusal)
SPACES = [
    ("test/DictObservations-v0", None),  # flattened into one vector
    ("test/TupleObservations-v0", None),
    ("test/TextObservations-v0", None),  # flattened into character indices
    ("test/MatrixActions-v0", "has Box actions of shape (2, 2)"),
]


@pytest.mark.parametrize("env_id, refusal", SPACES, ids=[case[0] for case in SPACES])
@pytest.mark.parametrize("ppo", BOX_SCRIPTS, ids=lambda module: module.__name__)
def test_observation_and_action_spaces_train_or_get_one_line(ppo, env_id, refusal, in_tmp):
    args = short_args(ppo, env_id=env_id, total_timesteps=512)
    if refusal is None:
        checkpoint = torch.load(ppo.train(args), weights_only=True)
        assert checkpoint["global_step"] == 512
    else:
        with pytest.raises(SystemExit, match=re.escape(refusal)):
            ppo.train(args)
        assert not glob.glob("runs/*")  # a refused run leaves no folder behind


@pytest.mark.parametrize("ppo", ALL_SCRIPTS, ids=lambda module: module.__name__)
def test_a_runs_folder_that_cannot_be_made_gets_one_line(ppo, in_tmp):
    (in_tmp / "runs").write_text("a file where the folder should be")
    with pytest.raises(SystemExit, match="cannot create the folder runs/ for this run"):
        ppo.train(short_args(ppo))


@pytest.mark.parametrize("ppo", ALL_SCRIPTS, ids=lambda module: module.__name__)
def test_a_checkpoint_that_cannot_be_written_keeps_the_previous_one(ppo, in_tmp, monkeypatch):
    real_save, calls = torch.save, []

    def full_disk_on_second_save(obj, path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 2:
            with open(path, "wb") as f:  # half a file, then the disk is full
                f.write(b"partial")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", full_disk_on_second_save)
    with pytest.raises(SystemExit, match="cannot write checkpoint .*checkpoint.pt: No space left on device; the previous checkpoint, if any, is intact"):
        ppo.train(short_args(ppo))  # checkpoints after iterations 1 and 2
    monkeypatch.setattr(torch, "save", real_save)
    assert ppo.load_checkpoint(glob.glob("runs/*/checkpoint.pt")[0])["global_step"] == 512
    assert not glob.glob("runs/*/*.tmp")


DAMAGES = [("args", "num_envs", "four"), ("args", "learning_rate", "fast"), ("args", "norm_adv", 1), (None, "global_step", 1.5),
           (None, "rng_state", [1, 2, 3]), (None, "model", "weights")]


@pytest.mark.parametrize("part, key, value", DAMAGES, ids=[f"{key}={value!r}" for _, key, value in DAMAGES])
@pytest.mark.parametrize("ppo", ALL_SCRIPTS, ids=lambda module: module.__name__)
def test_a_checkpoint_with_values_of_the_wrong_type_is_called_damaged(ppo, part, key, value, in_tmp):
    checkpoint = torch.load(ppo.train(short_args(ppo, total_timesteps=512)), weights_only=True)
    (checkpoint[part] if part else checkpoint)[key] = value
    torch.save(checkpoint, "damaged.pt")
    with pytest.raises(SystemExit, match=f"damaged.pt is damaged: wrong type of {key}"):
        ppo.load_checkpoint("damaged.pt")


def test_a_run_killed_at_random_moments_always_leaves_a_loadable_checkpoint(tmp_path):
    """SIGKILL gives no chance to clean up: the atomic write (temporary file, then rename) alone must keep the checkpoint whole."""
    rng = random.Random(0)
    flags = ["--total-timesteps", "100000000", "--num-envs", "1", "--num-steps", "8", "--num-minibatches", "2",
             "--update-epochs", "1", "--checkpoint-interval", "1"]
    steps = []
    for attempt in range(6):
        checkpoints = glob.glob(str(tmp_path / "runs" / "*" / "checkpoint.pt"))
        resume = ["--resume", checkpoints[0]] if checkpoints else []
        process = subprocess.Popen([sys.executable, os.path.join(ROOT, "ppo_discrete.py"), *flags, *resume], cwd=tmp_path,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        def written_since_start():  # this process has written at least one checkpoint
            paths = glob.glob(str(tmp_path / "runs" / "*" / "checkpoint.pt"))
            return paths and (not checkpoints or os.path.getmtime(paths[0]) > started)

        started, deadline = time.time(), time.time() + 60
        while not written_since_start() and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 1.0))  # a checkpoint every 8 steps: writing is a good part of the time
        process.kill()
        process.wait()
        checkpoint = ppo_discrete.load_checkpoint(glob.glob(str(tmp_path / "runs" / "*" / "checkpoint.pt"))[0])
        assert all(torch.isfinite(weights).all() for weights in checkpoint["model"].values())
        steps.append(checkpoint["global_step"])
    assert steps == sorted(steps) and steps[-1] > steps[0]  # each start resumed the same run and went on

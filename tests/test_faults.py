"""Faults and unusual spaces, as a table: each case against every script it applies to, with what must happen."""

import errno
import glob
import os
import re

import pytest
import torch
from conftest import short_args

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

"""Faults and unusual spaces, as a table: each case against every script it applies to, with what must happen."""

import glob
import re

import pytest
import torch
from conftest import short_args

import ppo_continuous
import ppo_vector_sameStep

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

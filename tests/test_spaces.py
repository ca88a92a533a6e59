"""Multi-part actions (MultiDiscrete, MultiBinary) and invalid-action masks, in the scripts that take them."""

import glob
import itertools
import os
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import MASKED_SPACES, run_main, scalars

import ppo_discrete
import ppo_vector_sameStep

CATEGORICAL = (ppo_discrete, ppo_vector_sameStep)  # the scripts whose policy is categorical per action part
CONVENTION_SOURCES = {"info": "the info's 'action_mask'", "observation": "the observation's 'action_mask' entry",
                      "method": "the env's action_masks() method"}


def agent_for(ppo, action_space):
    torch.manual_seed(0)
    spaces = SimpleNamespace(single_observation_space=gym.spaces.Box(-1, 1, (3,)), single_action_space=action_space)
    return ppo.Agent(spaces, ppo.Args())


def random_mask(parts, rows, generator):
    """A mask of rows x parts.sum() entries that leaves each part at least one valid value."""
    mask = torch.rand(rows, int(parts.sum()), generator=generator) < 0.5
    for row, (start, size) in itertools.product(range(rows), zip(np.cumsum(parts) - parts, parts)):
        mask[row, start + torch.randint(size, (), generator=generator)] = True
    return mask


def run_flags(ppo, env_id, steps=512):
    flags = ["--env-id", env_id, "--total-timesteps", str(steps), "--num-envs", "4", "--num-steps", "128",
             "--num-minibatches", "4", "--update-epochs", "2", "--no-cuda"]
    return flags + (["--vectorization-mode", "sync"] if ppo.__name__ == "ppo_vector_sameStep" else [])


SPACES = [gym.spaces.Discrete(4, start=2), gym.spaces.MultiDiscrete([3, 4, 2], start=[-1, 0, 5]),
          gym.spaces.MultiBinary(3), gym.spaces.MultiDiscrete([[2, 3], [3, 2]])]


@pytest.mark.parametrize("space", SPACES, ids=str)
@pytest.mark.parametrize("ppo", CATEGORICAL, ids=lambda module: module.__name__)
def test_log_probability_and_entropy_are_those_of_the_product_of_categoricals_under_any_mask(ppo, space):
    """Brute force: every joint action's probability is the product of each part's softmax over its valid values."""
    agent, generator = agent_for(ppo, space), torch.Generator().manual_seed(1)
    with torch.no_grad():
        agent.actor[-1].weight.normal_(generator=generator)  # logits far from uniform
    parts, x = np.array(ppo.action_parts(space)), torch.randn(6, 3, generator=generator)
    logits = agent.actor(x).detach().split(list(parts), dim=1)
    for mask in (None, random_mask(parts, 6, generator)):
        valid = [torch.ones_like(part, dtype=torch.bool) for part in logits] if mask is None else mask.split(list(parts), 1)
        probs = [part.exp() * ok / (part.exp() * ok).sum(1, keepdim=True) for part, ok in zip(logits, valid)]
        joint = torch.tensor(list(itertools.product(*[range(n) for n in parts])))  # every action, as part indices
        expected = torch.stack([torch.stack([p[:, i] for p, i in zip(probs, choice)]).prod(0) for choice in joint], 1)
        for row in range(6):
            _, logprob, entropy = agent.policy(x[row].expand(len(joint), 3), joint,
                                               mask=None if mask is None else mask[row].expand(len(joint), -1))
            possible = expected[row] > 0
            torch.testing.assert_close(logprob[possible].exp(), expected[row][possible], rtol=1e-5, atol=1e-7)
            assert torch.all(logprob[~possible] < -1e7)  # an action with a masked part has no probability
            brute_entropy = -(expected[row][possible] * expected[row][possible].log()).sum()
            torch.testing.assert_close(entropy[0], brute_entropy, rtol=1e-5, atol=1e-6)
        sampled = agent.policy(x, mask=mask)[0]
        assert sampled.shape == (6, len(parts))
        actions = ppo.env_actions(SimpleNamespace(single_action_space=space), sampled.numpy())
        assert all(space.contains(action) for action in actions)  # start offsets and shapes as the env takes them


@pytest.mark.parametrize("space", SPACES[1:3], ids=str)
@pytest.mark.parametrize("ppo", CATEGORICAL, ids=lambda module: module.__name__)
def test_a_masked_value_is_never_sampled_or_chosen_and_carries_no_gradient(ppo, space):
    agent, generator = agent_for(ppo, space), torch.Generator().manual_seed(2)
    agent.actor = torch.nn.Identity()  # the policy's features are the logits themselves
    parts = np.array(ppo.action_parts(space))
    logits = (3 * torch.randn(4, int(parts.sum()), generator=generator)).requires_grad_()
    mask = random_mask(parts, 4, generator)
    starts = np.cumsum(parts) - parts
    many = 5000
    action = agent.policy(logits.repeat(many, 1), mask=mask.repeat(many, 1))[0]
    chosen = torch.zeros(4 * many, int(parts.sum()), dtype=torch.bool)
    chosen[torch.arange(4 * many)[:, None], action + torch.from_numpy(starts)] = True
    assert not (chosen & ~mask.repeat(many, 1)).any()
    assert (chosen.reshape(many, 4, -1).any(0) == mask).all()  # and every valid value is sampled
    best = agent.policy(logits, mask=mask, deterministic=True)[0]
    assert mask[torch.arange(4)[:, None], best + torch.from_numpy(starts)].all()
    _, logprob, entropy = agent.policy(logits, action[:4], mask)
    (gradient,) = torch.autograd.grad((logprob + entropy).sum(), logits)
    assert (gradient[~mask] == 0).all() and (gradient[mask] != 0).any()


@pytest.mark.parametrize("convention", CONVENTION_SOURCES)
@pytest.mark.parametrize("space", MASKED_SPACES)
@pytest.mark.parametrize("ppo", CATEGORICAL, ids=lambda module: module.__name__)
def test_every_action_sent_respects_the_mask_of_its_step_across_autoresets(ppo, space, convention, in_tmp, monkeypatch,
                                                                           capsys):
    """MaskedEnv raises on a masked action and leaves one valid value per part, a new one each step: training,
    resume and evaluation (deterministic and sampled) send only valid actions, the first of each episode under the
    reset's mask (not the last step's); the update scores under the stored masks, so its entropy is exactly 0."""
    env_id = f"test/Masked{space}-{convention}-v0"
    assert run_main(ppo, run_flags(ppo, env_id), monkeypatch) == 0
    assert f"action masks: from {CONVENTION_SOURCES[convention]}\n" in capsys.readouterr().out
    path = glob.glob("runs/*/checkpoint.pt")[0]
    assert [value for _, value in scalars(os.path.dirname(path))["losses/entropy"]] == [0.0]
    assert [value for _, value in scalars(os.path.dirname(path))["losses/approx_kl"]] == [0.0]
    assert run_main(ppo, ["--resume", path, "--total-timesteps", "1024", "--env-id", env_id], monkeypatch) == 0
    for sample in ([], ["--eval-sample"]):
        assert run_main(ppo, ["--eval-checkpoint", path, "--eval-episodes", "2", "--env-id", env_id, *sample],
                        monkeypatch) == 0
        assert "mean return 5.00 ± 0.00 over 2 episodes" in capsys.readouterr().out


@pytest.mark.parametrize("ppo", CATEGORICAL, ids=lambda module: module.__name__)
def test_no_action_mask_ignores_the_masks_and_says_so(ppo, in_tmp, monkeypatch, capsys):
    env_id = "test/MaskedLoose-v0"  # MaskedEnv that takes a masked action (counting it) instead of raising
    assert run_main(ppo, run_flags(ppo, env_id) + ["--no-action-mask"], monkeypatch) == 0
    assert "action masks: from the info's 'action_mask', ignored (--no-action-mask)\n" in capsys.readouterr().out
    entropy = [value for _, value in scalars(glob.glob("runs/*")[0])["losses/entropy"]]
    assert entropy[0] > 1.0  # near log 3: the policy chooses among all three values


@pytest.mark.parametrize("name", ["ContextMultiDiscrete", "ContextMultiBinary"])
@pytest.mark.parametrize("ppo", CATEGORICAL, ids=lambda module: module.__name__)
def test_a_multi_part_task_is_learned(ppo, name, in_tmp):
    """ContextEnv: each part must match the observation; a random policy earns 7/12 (MultiDiscrete) or 1.5 of 2 or 3."""
    vector = ppo.__name__ == "ppo_vector_sameStep"  # its defaults are MuJoCo's, slower here: twice the steps
    settings = {"vectorization_mode": "sync", "total_timesteps": 32768} if vector else {"total_timesteps": 16384}
    path = ppo.train(ppo.Args(env_id=f"test/{name}-v0", checkpoint_interval=0, cuda=False, **settings))
    returns = [value for _, value in scalars(os.path.dirname(path))["charts/episodic_return"]]
    best = 2.0 if name == "ContextMultiDiscrete" else 3.0
    assert np.mean(returns[-200:]) >= 0.9 * best


@pytest.mark.parametrize("ppo", CATEGORICAL, ids=lambda module: module.__name__)
def test_a_checkpoint_of_other_action_parts_is_refused_in_one_line(ppo, in_tmp, monkeypatch):
    """MultiDiscrete([3, 4]) has 7 logits, MultiBinary(3) 6: the head of one does not fit the other."""
    assert run_main(ppo, run_flags(ppo, "test/ContextMultiDiscrete-v0"), monkeypatch) == 0
    path = glob.glob("runs/*/checkpoint.pt")[0]
    for flag in ("--resume", "--eval-checkpoint"):
        message = run_main(ppo, [flag, path, "--env-id", "test/ContextMultiBinary-v0", "--total-timesteps", "1024"],
                           monkeypatch)
        assert message.startswith(f"error: the checkpoint's model does not fit {ppo.__name__}.py's on test/ContextMultiBinary-v0 "
                                  "(another env, setting or network): size mismatch")

"""PPO for continuous (Box) action spaces, in one file: from Pendulum to MuJoCo Humanoid-v5.

    python ppo_continuous.py --env-id Humanoid-v5
    tensorboard --logdir runs

Three parts, each opened by a banner line. The PPO core (Args, envs, Agent, normalization, GAE, loss, train(): the
rollout, GAE and update as visible loops) is all that plain PPO on vectors (MuJoCo) runs through; "detail N" names the
details of "The 37 Implementation Details of PPO" (Huang et al., 2022), "continuous detail N" the 9 for continuous
actions. Capabilities: what the core calls only for images, Dict observations, EnvPool, memory, many agents
(PettingZoo), the defaults table. Run safety: checks, checkpoints, faults, progress, evaluation, changing nothing PPO
computes (its banner: how it takes each change). Where a change goes:
- a setting: a field of Args (its checks: check_settings); a network: Agent (Agent.policy reads the actor);
- a loss term: ppo_loss (the minibatch is a dict; each statistic it returns is logged as losses/<name>);
- a schedule: an entry of coefficients() (logged as charts/<name>; ppo_loss reads coefs[name]); one changed during
  the update (a rate adapted by KL, a learned coefficient): a tensor in `state`, changed in place;
- a piece of state: train()'s `state` (checkpointed, resumed); rollout data: a buffer in train(), then `batch`;
- a rollout statistic: an entry of `charts` at the end of train()'s iteration (logged as charts/<name>).
Then trust it by running: python benchmarks/self_check.py my_ppo.py --against ppo_continuous.py
"""

import os
import signal
import sys


def exit_interrupted(signum=None, frame=None):
    """A stop before training: one line, status 1, a further Ctrl-C let go (raising there would cut the line)."""
    signal.signal(signal.SIGINT, lambda signum, frame: None)
    if signum is not None:  # the handler while the modules load: nothing to close or save yet
        os.write(2, b"interrupted\n")
        os._exit(1)  # a SystemExit raised here can land in a callback of torch's loading, which Python ignores
    sys.exit("interrupted")


if __name__ == "__main__" and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, exit_interrupted)  # Ctrl-C from here on, while the modules load

import contextlib
import copy
import glob
import importlib.util
import json
import math
import re
import shlex
import tempfile
import threading
import time
import traceback
import warnings
from collections import deque
from dataclasses import asdict, dataclass, fields
from typing import Literal, Optional
if sys.platform == "win32":  # the run folder's lock (fcntl) and the stop signals below are POSIX's
    sys.exit(f"error: {os.path.basename(__file__)} runs on Linux and macOS, not on Windows (there, use WSL)")
import fcntl  # noqa: E402

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro
from torch.utils.tensorboard import SummaryWriter

# ==================== PPO core: arguments, envs, agent, normalization, GAE, loss, train() ====================


@dataclass
class Args:
    """PPO for Box actions. Flags not given follow the env where a table says so: ENV_DEFAULTS (Hopper-v5 and its kin,
    EnvPool's DMC tasks, Ant-v5, MountainCarContinuous-v0, Swimmer-v5), IMAGE_DEFAULTS (images of 36 x 36 or more).
    CleanRL's MuJoCo settings: --num-envs 1 --num-steps 2048 --num-minibatches 32 --init-log-std 0 --clip-vloss
    --gae-lambda 0.95 --vf-coef 0.5"""

    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment, part of its run folder's: runs/<env>__<exp-name>__<seed>__<time>/"""
    seed: int = 1
    """seed of the experiment: same seed, same machine, same results"""
    torch_deterministic: bool = True
    """if toggled, sets `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = False
    """if toggled, train on the GPU when there is one (off by default: an MLP trains faster on the CPU)"""
    track: bool = False
    """if toggled, also log to Weights and Biases (needs `pip install wandb`)"""
    wandb_project_name: str = "ppo-single-file"
    """the wandb project name"""
    wandb_entity: Optional[str] = None
    """the entity (team) of the wandb project"""
    capture_video: bool = False
    """if toggled, record videos of env 0 to `videos/` (training) or of every episode (evaluation)"""

    env_id: str = "HalfCheetah-v5"
    """an env id with Box actions: gymnasium's, `module:Id`, EnvPool's (--env-backend) or a PettingZoo env's module"""
    env_kwargs: str = "{}"
    """keyword arguments of gym.make as JSON, e.g. '{"continuous": true}' (LunarLander-v3)"""
    env_backend: Literal["gymnasium", "envpool"] = "gymnasium"
    """what steps the sub-envs: gymnasium, in this process, or EnvPool's C++ threads (`pip install envpool==1.2.5`)"""
    env_threads: int = 0
    """EnvPool's threads (0: one per core this process may use, at most one per sub-env)"""
    total_timesteps: int = 1000000
    """environment steps of the run, as rollout rows (many agents: one per agent and step); raise it on --resume"""
    learning_rate: float = 3e-4
    """the learning rate of the optimizer"""
    num_envs: int = 8
    """the number of parallel sub-environments (with many agents: games, each agent of each a column of the rollout)"""
    num_steps: int = 256
    """the number of steps per sub-environment in each rollout"""
    anneal_lr: bool = True
    """if toggled, anneal the learning rate linearly over the run, to learning_rate / iterations in the last one"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: Optional[float] = None
    """GAE's lambda (default: 1 - action dimensions / 80 within [0.8, 0.95]: Humanoid-v5 0.8, Hopper-v5 0.95)"""
    num_minibatches: int = 8
    """the number of minibatches each rollout is split into"""
    update_epochs: int = 10
    """the number of passes over the rollout in each update"""
    norm_adv: bool = True
    """if toggled, normalize advantages per minibatch"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    clip_vloss: bool = False
    """if toggled, clip the value loss as in the PPO paper's code"""
    ent_coef: float = 0.0
    """coefficient of the entropy bonus"""
    vf_coef: float = 1.0
    """coefficient of the value loss"""
    max_grad_norm: float = 0.5
    """the maximum norm of the gradient (global clipping)"""
    target_kl: Optional[float] = None
    """stop the update early when the approximate KL exceeds this (off when None)"""
    norm_obs: bool = True
    """if toggled, normalize observations by running mean and std (shared by all sub-envs), clipped to [-10, 10]"""
    norm_reward: bool = True
    """if toggled, scale rewards by the running std of the discounted return, clipped to [-10, 10]"""
    hidden_size: int = 64
    """the width of the two tanh layers of the actor and of the critic (after a Nature CNN: none, linear heads)"""
    init_log_std: float = -1.0
    """the log std the policy starts with (std 0.37; ENV_DEFAULTS set it per env, e.g. Hopper-v5 -0.5, Ant-v5 -1.5)"""
    recurrent: Literal["none", "lstm", "gru"] = "none"
    """memory, for envs that hide part of their state: an LSTM or GRU after the encoder (the README gives its cost)"""
    sequence_length: int = 0
    """with memory, the update replays sequences of this many steps (dividing num_steps), each from its first state
    as the weights of the epoch's start compute it, no gradient through it (faster); 0: each sub-env's whole rollout"""
    agent_id: bool = True
    """with many agents (PettingZoo), if toggled, each agent sees its id (one-hot) beside its observation"""
    central_value: bool = False
    """with many agents, if toggled, the critic reads the game's state() too (MAPPO), the actor its observation alone"""

    checkpoint_interval: int = 10
    """write `runs/<run>/checkpoint.pt` every this many iterations (and always at the end); 0: only at the end"""
    resume: Optional[str] = None
    """path of a checkpoint to continue; its settings are used, flags given here override them"""
    eval_checkpoint: Optional[str] = None
    """path of a checkpoint to evaluate (the policy mean, or see --eval-sample) for `eval_episodes` episodes"""
    eval_episodes: int = 10
    """the number of episodes of `--eval-checkpoint`"""
    eval_max_steps: int = 100000
    """an evaluation episode that has not ended after this many steps is cut there (for envs without a time limit)"""
    eval_sample: bool = False
    """if toggled, evaluation samples actions as training does, not the mean (IMAGE_DEFAULTS: on)"""


def check_settings(args):
    """What the algorithm cannot train with, a message each (run safety checks the run's own settings, says these)."""
    batch, minibatches, kl = columns(args) * args.num_steps, max(args.num_minibatches, 1), args.target_kl
    return [message for ok, message in [
        *[(getattr(args, name) > 0, f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}") for name
          in ("num_minibatches", "update_epochs", "hidden_size", "learning_rate", "clip_coef", "max_grad_norm")],
        (batch % minibatches == 0 and batch // minibatches >= 2, f"the batch (columns x num_steps = {batch}) must "
         f"divide into --num-minibatches {minibatches} of 2 rows or more (advantages are normalized per minibatch)"),
        (0 <= args.gamma <= 1 and 0 <= (args.gae_lambda or 0) <= 1, "--gamma and --gae-lambda must lie in [0, 1]"),
        (args.vf_coef >= 0, "--vf-coef must not be negative"),
        (args.sequence_length >= 0 and args.num_steps % (args.sequence_length or 1) == 0,
         f"--sequence-length {args.sequence_length} must divide --num-steps {args.num_steps} (0: whole rollouts)"),
        (kl is None or kl > 0, f"--target-kl must be positive (or left out), got {kl}"),
        (args.hidden_size <= 8192, f"--hidden-size {args.hidden_size} would not fit in memory: at most 8192"),
        (not args.central_value or parallel_games(args.env_id) and args.recurrent == "none",
         "--central-value takes a PettingZoo game, without --recurrent (the value alone reads the game's state)"),
    ] if not ok]


def make_env(env_id, env_kwargs, idx, capture_video, video_folder, film_first=None):
    def thunk():
        os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.gettempdir())  # pygame (an env rendering) needs it set
        if capture_video and idx == 0:
            return filmed(gym.make(env_id, render_mode="rgb_array", **env_kwargs), video_folder, film_first)
        return gym.make(env_id, **env_kwargs)

    return thunk


def make_envs(args, num_envs, video_folder, seed, film_first=None):
    if args.capture_video and not os.environ.get("DISPLAY"):
        os.environ.setdefault("MUJOCO_GL", "egl")  # render MuJoCo without a display
    # detail 1: vectorized architecture; gymnasium 1.x default autoreset is NEXT_STEP, as EnvPool's
    if args.env_backend == "envpool":
        envs = envpool_envs(args, num_envs, seed)  # (Capabilities) EnvPool's C++ threads step the sub-envs
    elif parallel_games(args.env_id):  # (Capabilities) PettingZoo's games: a column for each agent of each game
        envs = ManyAgents(args, num_envs, video_folder, film_first)
    else:
        envs = gym.vector.SyncVectorEnv([make_env(args.env_id, json.loads(args.env_kwargs), i, args.capture_video,
                                                  video_folder, film_first) for i in range(num_envs)])
    space = envs.single_observation_space  # Dict (DMC's position, velocity, ...) and Tuple: one vector, in key order
    if isinstance(space, gym.spaces.Dict) and any(image_shape(entry) for entry in space.values()):
        envs = DictObservations(envs)  # (Capabilities) an image beside other entries (a camera, joints): one row
    elif not image_shape(space) and not (isinstance(space, gym.spaces.Box) and len(space.shape) == 1):
        envs = gym.wrappers.vector.FlattenObservation(envs)  # Discrete: one-hot
    if not isinstance(envs.unwrapped, ManyAgents):  # which keeps each agent's episodes itself
        envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)  # raw, unscaled returns
    return CheckedEnvs(envs)  # run safety (below): the env's exceptions and non-finite numbers get one line


def layer_init(layer, std=np.sqrt(2)):
    torch.nn.init.orthogonal_(layer.weight, std)  # detail 2: orthogonal init, zero biases (the memory keeps torch's)
    torch.nn.init.constant_(layer.bias, 0.0)
    return layer


def mlp(inputs, hidden_sizes, outputs, std):
    """Tanh layers of hidden_sizes, then a linear output layer initialized with gain std (no hidden layer: it alone)."""
    if not hidden_sizes:
        return layer_init(nn.Linear(inputs, outputs), std=std)
    layers, width = [], inputs
    for size in hidden_sizes:
        layers += [layer_init(nn.Linear(width, size)), nn.Tanh()]
        width = size
    return nn.Sequential(*layers, layer_init(nn.Linear(width, outputs), std=std))


class Agent(nn.Module):
    def __init__(self, envs, args):
        super().__init__()
        space, action_dim = envs.single_observation_space, int(np.prod(envs.single_action_space.shape))
        # continuous detail 2: a state-independent log standard deviation, a learned parameter
        self.actor_logstd = nn.Parameter(torch.full((1, action_dim), float(args.init_log_std)))
        self.encoder = encoder_for(space)  # (Capabilities) a CNN for images and Dicts; None: vectors as they are
        features = self.encoder.features if self.encoder else int(np.prod(space.shape))
        layer = {"none": None, "lstm": nn.LSTM, "gru": nn.GRU}[args.recurrent]  # memory: after the encoder, both heads
        self.memory = layer(features, 128 if nature_sized(space) else args.hidden_size) if layer else None
        features = self.memory.hidden_size if self.memory else features
        # detail 13 / continuous detail 4: separate actor and critic, two tanh layers each; none after a Nature CNN
        hidden_sizes = [] if nature_sized(space) else [args.hidden_size, args.hidden_size]
        self.critic = mlp(features, hidden_sizes, 1, std=1.0)
        self.actor_inputs = actor_inputs(envs)  # (Capabilities) None: all features; --central-value: the agent's own
        self.actor = mlp(self.actor_inputs or features, hidden_sizes, action_dim, std=0.01)  # each dimension's mean

    def encode(self, x):
        return x if self.encoder is None else self.encoder(x)

    def initial_state(self, num_envs):
        """The memory's state of each sub-env at an episode's start: zeros (LSTM: h and c side by side; none: empty)."""
        size = 0 if self.memory is None else self.memory.hidden_size * (2 if isinstance(self.memory, nn.LSTM) else 1)
        return torch.zeros(num_envs, size, device=next(self.parameters()).device)

    def remember(self, x, state, keep=None):
        """Features of observations x [T, N, ...], as [T * N, features]. With memory, each sub-env's rows in time order
        from its state [N, S], zeroed after each row where keep [T, N] is 0 (an episode's end; None: no end): no state
        crosses an episode. Returns the features and the state after the last row (no memory: the state as it was)."""
        hidden = self.encode(x.flatten(0, 1))
        if self.memory is None:
            return hidden, state
        return replay(self.memory, hidden.view(*x.shape[:2], -1), state, keep)  # (Capabilities)

    def policy(self, hidden, action=None, deterministic=False, dims=1.0):
        """The policy at the actor's features (rollout, loss and evaluation): an action (sampled unless given, or the
        mean), its log-probability, the entropy. Another head, a state-dependent std: a change here and in __init__."""
        mean = self.actor(hidden[:, : self.actor_inputs])  # continuous detail 1: N(mean(x), std) per action dimension
        log_std = self.actor_logstd.expand_as(mean)
        std = log_std.exp()
        if action is None:
            action = mean if deterministic else mean + std * torch.randn_like(mean)
        # continuous detail 3: independent dimensions, log-probabilities and entropies summed (dims 0: agents' padding)
        log_density = -0.5 * ((action - mean) / std) ** 2 - log_std - 0.5 * math.log(2 * math.pi)
        entropy = log_std + 0.5 * (1.0 + math.log(2 * math.pi))
        return action, (log_density * dims).sum(-1), (entropy * dims).sum(-1)


class RunningMeanStd(gym.wrappers.utils.RunningMeanStd):
    """gymnasium's running mean and variance (Chan et al.'s parallel formula), with a state for checkpoints."""

    def state_dict(self):
        return {"mean": torch.tensor(self.mean), "var": torch.tensor(self.var), "count": float(self.count)}

    def load_state_dict(self, state):
        self.mean, self.var, self.count = state["mean"].numpy().copy(), state["var"].numpy().copy(), state["count"]


def normalize_obs(obs, obs_rms, args, update, floats=None):
    """Continuous details 6 and 7 (--norm-obs): observation normalization with statistics shared by all sub-envs, then
    clip; update=False: frozen (evaluation). floats: of a Dict's rows (DictObservations), the float entries that lead
    each row, the only part normalized (detail 6 is for vectors: a batch of images, more than 2 dimensions, is not)."""
    if floats is not None:
        vector = normalize_obs(obs[:, : 4 * floats].view(np.float32), obs_rms, args, update)
        return np.concatenate([vector.view(np.uint8), obs[:, 4 * floats:]], axis=1)
    if not args.norm_obs or obs.ndim > 2:
        return obs if obs.ndim > 2 else obs.astype(np.float32)  # a batch of images (any other is flat) stays uint8
    if np.any(update):  # True: every row; an array: the rows to count (observed()); False: frozen
        obs_rms.update(obs if update is True else obs[update])
    return np.clip((obs - obs_rms.mean) / np.sqrt(obs_rms.var + 1e-8), -10.0, 10.0).astype(np.float32)


class RewardScaler:
    """Continuous details 8 and 9: divide rewards by the running std of the discounted return (no mean
    subtracted), then clip. Each sub-env's discounted return restarts at every episode end, truncation included."""

    def __init__(self, num_envs, gamma, on):
        self.on = on  # off: rewards pass unchanged
        self.return_rms = RunningMeanStd()
        self.discounted_return = np.zeros(num_envs, np.float64)
        self.gamma = gamma

    def scale(self, reward, real, done):
        """reward, real (the step is a transition, not an autoreset), done (the step ended an episode): [num_envs]."""
        if not self.on:
            return reward
        self.discounted_return = self.discounted_return * self.gamma + reward
        if real.any():
            self.return_rms.update(self.discounted_return[real])
        self.discounted_return[done] = 0.0
        return np.clip(reward / np.sqrt(self.return_rms.var + 1e-8), -10.0, 10.0)


def compute_advantages(rewards, values, next_values, terminations, dones, gamma, gae_lambda):
    """Generalized advantage estimation (detail 5) over a [num_steps, num_envs] rollout, each column (sub-env) its own
    sequence. values[t] is V(obs[t]); next_values[t] is V of the observation after step t, which under NEXT_STEP
    autoreset is the true final observation of an episode that step t ended: the bootstrap a truncation (time limit)
    needs. A termination has no future (no bootstrap); any episode end stops the recursion between episodes."""
    advantages = np.zeros_like(rewards)
    last_advantage = np.zeros(rewards.shape[1], dtype=rewards.dtype)
    for t in reversed(range(rewards.shape[0])):
        delta = rewards[t] + gamma * next_values[t] * (1.0 - terminations[t]) - values[t]
        last_advantage = delta + gamma * gae_lambda * (1.0 - dones[t]) * last_advantage
        advantages[t] = last_advantage
    return advantages


def real_transitions(valid, **rollout):
    """Flatten [num_steps, num_envs] rollout arrays into one batch (a dict of tensors) of the rows with valid == 1.
    Rows with valid == 0 (NEXT_STEP autoreset steps, a departed agent's) are not transitions: no weight at all."""
    keep = valid.reshape(-1) > 0
    return {name: torch.from_numpy(x.reshape((-1,) + x.shape[2:])[keep]) for name, x in rollout.items()}


def minibatches(agent, b_obs, replayed, args):
    """Detail 6: one epoch's minibatches, a fresh shuffle each epoch, covering the batch; each as (its rows, their
    features: an image's CNN runs once a minibatch). With memory (Capabilities) sequences in time, replayed in order."""
    num_minibatches = max(1, min(args.num_minibatches, len(b_obs) // 2))  # 2 rows at least, though rows dropped
    if agent.memory is not None:
        return sequence_minibatches(agent, *replayed, num_minibatches, args.sequence_length)
    order = torch.randperm(len(b_obs), device=b_obs.device)
    return ((mb, agent.encode(b_obs[mb])) for mb in order.tensor_split(num_minibatches))


def ppo_loss(agent, hidden, mb, coefs, args):
    """The clipped PPO loss on one minibatch of real transitions (their features `hidden`; `mb`: the batch's rows),
    and its statistics. coefs: this iteration's coefficients (see train())."""
    _, new_logprob, entropy = agent.policy(hidden, mb["actions"], dims=mb["dims"])
    new_value = agent.critic(hidden).view(-1)
    logratio = new_logprob - mb["logprobs"]
    ratio = logratio.exp()

    advantages = mb["advantages"]
    if args.norm_adv:  # detail 7: normalize advantages per minibatch
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)

    # detail 8: clipped surrogate objective. The ratio pi_new/pi_old is clipped to [1-eps, 1+eps] and the
    # pessimistic (larger) of the two losses is taken, so pushing the ratio past the clip never pays.
    clip = coefs["clip_coef"]
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * torch.clamp(ratio, 1 - clip, 1 + clip)
    pg_loss = torch.max(pg_loss1, pg_loss2).mean()

    returns, old_values = mb["returns"], mb["values"]
    if args.clip_vloss:  # detail 9: value loss clipped around the rollout's value estimate
        v_clipped = old_values + torch.clamp(new_value - old_values, -clip, clip)
        v_loss = 0.5 * torch.max((new_value - returns) ** 2, (v_clipped - returns) ** 2).mean()
    else:
        v_loss = 0.5 * ((new_value - returns) ** 2).mean()
    entropy_loss = entropy.mean()
    loss = pg_loss - coefs["ent_coef"] * entropy_loss + v_loss * coefs["vf_coef"]  # detail 10: one combined loss

    with torch.no_grad():  # detail 12: debug variables, detached from the graph; approx_kl is the k3 estimator
        stats = {"policy_loss": pg_loss.detach(), "value_loss": v_loss.detach(), "entropy": entropy_loss.detach(),
                 "old_approx_kl": (-logratio).mean(), "approx_kl": ((ratio - 1) - logratio).mean(),
                 "clipfrac": ((ratio - 1.0).abs() > clip).float().mean()}
    return loss, stats


def coefficients(args, iteration, num_iterations):
    """What changes per iteration (logged as charts/<name>); a schedule of yours: "ent_coef": args.ent_coef * ..."""
    progress = (iteration - 1.0) / num_iterations  # of the run: 0 at its start
    lr = (1.0 - progress) * args.learning_rate if args.anneal_lr else args.learning_rate  # detail 4: annealed linearly
    return {"learning_rate": lr, "clip_coef": args.clip_coef, "ent_coef": args.ent_coef, "vf_coef": args.vf_coef}


def train(args, checkpoint=None):
    num_envs = columns(args)  # the rollout's columns: a sub-env each, or an agent of each game (ManyAgents)
    num_iterations = args.total_timesteps // (num_envs * args.num_steps)  # one batch an iteration
    start_iteration = checkpoint["iteration"] + 1 if checkpoint else 1  # a resumed run goes on after its checkpoint
    run = Run(args, checkpoint, start_iteration, num_iterations)  # run safety (below): folder, logs, checkpoints
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    seed = args.seed + start_iteration - 1  # a resumed run starts fresh episodes, seeded apart from the first ones
    envs = make_envs(args, args.num_envs, os.path.join("videos", run.name), seed)
    space = envs.single_observation_space
    floats = space.floats if isinstance(space, Packed) else None  # a Dict's float entries, normalized without images
    torch.set_num_threads(torch_threads(space))  # (Capabilities) every core for a Nature CNN
    args.gae_lambda = gae_lambda_for(envs.single_action_space, args.gae_lambda)  # (Capabilities) kept by checkpoints
    agent = Agent(envs, args).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)  # detail 3: eps 1e-5
    obs_rms = RunningMeanStd(shape=space.shape if floats is None else (floats,))
    reward_scaler = RewardScaler(num_envs, args.gamma, args.norm_reward)
    # Everything a checkpoint holds, named once: save and resume go through this dict. New state? Add it here.
    state = {"model": agent, "optimizer": optimizer, "obs_rms": obs_rms, "return_rms": reward_scaler.return_rms}

    rows = (args.num_steps, num_envs)  # Rollout buffer, [num_steps, num_envs]: a column is a sub-env's sequence
    obs = np.zeros(rows + space.shape, dtype=buffer_dtype(space))  # (Capabilities) images stay uint8
    actions = np.zeros(rows + envs.single_action_space.shape, dtype=np.float32)
    logprobs, rewards, terminations, dones, valid = (np.zeros(rows, dtype=np.float32) for _ in range(5))
    low, high = envs.single_action_space.low, envs.single_action_space.high

    with run.guard(envs, state):  # any fault: the last complete iteration is kept, one line says what happened
        global_step = (start_iteration - 1) * num_envs * args.num_steps  # environment steps so far
        next_obs, infos = envs.reset(seed=seed)
        next_obs = normalize_obs(next_obs, obs_rms, args, update=not checkpoint and observed(0, infos), floats=floats)
        next_reset = engine_resets(np.zeros(num_envs, dtype=np.float32), infos)  # none, but an agent yet to join
        dims = action_dims(infos, actions.shape)  # (Capabilities) 1 where a row's agent has the action dimension
        memory_state = agent.initial_state(num_envs)  # the memory's (--recurrent), carried from step to step
        for iteration in range(start_iteration, num_iterations + 1):
            coefs = coefficients(args, iteration, num_iterations)  # detail 4: the learning rate annealed linearly
            optimizer.param_groups[0]["lr"] = coefs["learning_rate"]
            start_memory_state = memory_state  # where the update replays each sub-env's sequence from

            # Rollout: num_steps steps in every sub-environment with the current policy.
            for step in range(args.num_steps):
                global_step += num_envs
                obs[step] = next_obs
                # NEXT_STEP autoreset: the step after an episode ended only resets that sub-env (action ignored,
                # reward 0). It is not a real transition, so it gets valid = 0 and no weight in the update.
                valid[step] = 1.0 - next_reset
                with torch.no_grad():
                    # the state is zeroed after an autoreset row, which read the final observation of an episode
                    hidden, memory_state = agent.remember(torch.from_numpy(obs[step, None]).to(device), memory_state,
                                                          torch.from_numpy(valid[step, None]).to(device))
                    action, logprob, _ = agent.policy(hidden, dims=torch.from_numpy(dims[step]).to(device))
                actions[step] = action.cpu().numpy()
                logprobs[step] = logprob.cpu().numpy()

                # continuous detail 5: the env gets the action clipped to its bounds; the buffer keeps the sampled one
                next_obs, reward, terminated, truncated, infos = envs.step(np.clip(actions[step], low, high))
                next_done = np.logical_or(terminated, truncated).astype(np.float32)
                next_reset = engine_resets(next_done, infos)  # (Capabilities) and rows after an agent left its game
                next_obs = normalize_obs(next_obs, obs_rms, args, update=observed(next_done, infos), floats=floats)
                rewards[step] = reward_scaler.scale(reward, real=valid[step] > 0, done=next_done > 0)
                terminations[step] = terminated  # rows whose value does not bootstrap
                dones[step] = next_done  # rows where GAE stops: a training episode ended, truncated or not
                run.log_episodes(infos, global_step)  # the episodes a person counts: infos["_episode"]

            # Values after the rollout, in one batch (the critic is fixed): V(obs[t + 1]) bootstraps row t, V(next_obs)
            # the last; with memory, each under the state that reached it (a truncated episode's end: its episode's).
            rollout_obs, rollout_valid = torch.from_numpy(obs).to(device), torch.from_numpy(valid).to(device)
            values = torch.zeros(rows, device=device)
            with torch.no_grad():  # a few sub-envs at a time: a CNN then holds one group's activations, not the batch's
                for ids in torch.arange(num_envs).tensor_split(min(args.num_minibatches, num_envs)):
                    hidden, _ = agent.remember(rollout_obs[:, ids], start_memory_state[ids], rollout_valid[:, ids])
                    values[:, ids] = agent.critic(hidden).view(args.num_steps, -1)
                hidden, _ = agent.remember(torch.from_numpy(next_obs[None]).to(device), memory_state)
                next_value = agent.critic(hidden).view(1, num_envs)
            next_values, values = torch.cat([values[1:], next_value]).cpu().numpy(), values.cpu().numpy()
            advantages = compute_advantages(rewards, values, next_values, terminations, dones, args.gamma,
                                            args.gae_lambda)
            returns = advantages + values  # detail 5: the value target is advantage + value

            # Flatten the rollout into one batch, keeping the real transitions only (autoreset rows dropped).
            batch = real_transitions(valid, obs=obs, actions=actions, logprobs=logprobs, advantages=advantages,
                                     returns=returns, values=values, dims=dims)
            batch = {name: x.to(device) for name, x in batch.items()}
            b_obs = batch.pop("obs")  # the rest is what the loss reads

            # Update: update_epochs passes over the batch in shuffled minibatches (with memory: of sequences in time).
            update_stats = []
            for epoch in range(args.update_epochs):
                for mb, hidden in minibatches(agent, b_obs, (rollout_obs, start_memory_state, rollout_valid), args):
                    loss, stats = ppo_loss(agent, hidden, {name: x[mb] for name, x in batch.items()}, coefs, args)
                    if not torch.isfinite(loss):
                        raise FloatingPointError("loss")  # the run keeps its last complete iteration
                    optimizer.zero_grad()
                    loss.backward()
                    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)  # detail 11: global gradient clip
                    optimizer.step()
                    update_stats.append(stats)
                if args.target_kl is not None and stats["approx_kl"] > args.target_kl:
                    break

            # Logging: the loss's statistics averaged over the update, as losses/<name>; `charts` as charts/<name>
            losses = {name: torch.stack([s[name] for s in update_stats]).mean().item() for name in stats}
            var_y, residual = batch["returns"].var().item(), (batch["returns"] - batch["values"]).var().item()
            losses["explained_variance"] = 1 - residual / var_y if var_y else np.nan
            charts = dict(coefs, learning_rate=optimizer.param_groups[0]["lr"])  # the rate the update ended with
            run.end_iteration(iteration, global_step, charts, losses)
    return run.checkpoint_path


# ==================== Capabilities: images, Dict observations, EnvPool, memory, many agents, the defaults, video ===

# The defaults table: flags not given follow the env (env_defaults, applied before the arguments are checked).
IMAGE_DEFAULTS = {"total_timesteps": 10_000_000, "learning_rate": 2.5e-4, "gae_lambda": 0.95, "num_minibatches": 4,
                  "update_epochs": 4, "clip_coef": 0.1, "ent_coef": 0.01, "vf_coef": 0.5,
                  "eval_sample": True}  # CleanRL's Atari update and budget (on CarRacing-v3 the MuJoCo one overshoots)
# Settings per env id, each measured on fresh seeds at 1M, and "dm_control": every DeepMind Control Suite task on
# EnvPool, one family (benchmarks/results/README.md, "Every seed learns", "Defaults per env (issue 80)", "Every env
# gymnasium ships (issue 89)")
ENV_DEFAULTS = {"Hopper-v5": {"init_log_std": -0.5, "hidden_size": 256},  # wider: fewer runs that fall early
                "Walker2d-v5": {"init_log_std": -0.5},
                "BipedalWalker-v3": {"init_log_std": -0.5}, "dm_control": {"init_log_std": -0.5},
                "Ant-v5": {"init_log_std": -1.5},  # a wider start cost it in every screen, a narrower one lifts it
                "MountainCarContinuous-v0": {"init_log_std": 0.0},  # the goal is found before the std narrows
                # Swimmer-v5's gait pays over hundreds of steps, and is found by a wide std and small minibatches
                "Swimmer-v5": {"gamma": 0.9999, "gae_lambda": 0.995, "init_log_std": 0.0, "num_minibatches": 32}}


def gae_lambda_for(action_space, given):
    """Unless given: lower lambda for more action dimensions, a rule fitted on this project's MuJoCo screens
    (benchmarks/results/README.md, "Why GAE's λ splits"): Humanoid-v5 learns at 0.8, Hopper-v5 at 0.95."""
    return given if given is not None else min(0.95, max(0.8, 1.0 - int(np.prod(action_space.shape)) / 80))


def registered_id(env_id):
    """gymnasium's id of an env, without the module typed before a colon to import it (minigrid:MiniGrid-Empty-5x5-v0,
    ale_py:ALE/Pong-v5): the key of every defaults table, and what tells an Atari game ("ALE/")."""
    return env_id.split(":")[-1]


def env_defaults(args, observations):
    """Flags not given follow the env: an env id of ENV_DEFAULTS takes its settings (EnvPool's DMC tasks those of
    "dm_control"), images that a Nature CNN reads (36 x 36 or more) IMAGE_DEFAULTS."""
    entries = observations.values() if isinstance(observations, gym.spaces.Dict) else [observations]
    family = "dm_control" if dmc_task(args) else registered_id(args.env_id)
    if family in ENV_DEFAULTS:
        return defaults_from(f"ENV_DEFAULTS[{family!r}]", ENV_DEFAULTS[family])
    if any(nature_sized(entry) for entry in entries):
        return defaults_from("IMAGE_DEFAULTS", IMAGE_DEFAULTS)
    return args


def dmc_task(args):
    """Whether the env is one of EnvPool's DeepMind Control Suite tasks (CheetahRun-v1, WalkerWalk-v1, ...)."""
    if args.env_backend != "envpool":
        return False
    from envpool.registration import registry

    spec = registry.specs.get(args.env_id)  # (module, class, settings)
    return spec is not None and spec[0] == "envpool.mujoco.dmc"


def defaults_from(name, table):
    """The command line parsed again over a defaults table (flags given still win); the run's first line says so."""
    args = tyro.cli(Args, default=Args(**table))
    taken = [f"{key}={value}" for key, value in table.items() if getattr(args, key) == value]  # not overridden
    print(f"defaults: {name} sets {', '.join(taken)}" if taken else f"defaults: {name} overridden by the flags given")
    return args


def envpool_envs(args, num_envs, seed):
    """EnvPool's C++ threads step the sub-envs (pip install envpool==1.2.5); seeded when made (reset ignores it)."""
    import envpool

    warnings.filterwarnings("ignore", "EnvPool seeds are fixed|.*precision lowered by casting")  # its own notes
    threads = min(args.env_threads or len(os.sched_getaffinity(0)), num_envs)
    envs = envpool.make_gymnasium(args.env_id, num_envs=num_envs, seed=seed, num_threads=threads)
    envs = gym.vector.VectorWrapper(envs)  # EnvPool names the single space where gymnasium names the batched one
    envs.observation_space = gym.vector.utils.batch_space(envs.single_observation_space, num_envs)
    return envs


def image_shape(space):
    """(channels, height, width) of an image, a uint8 Box of 2 or 3 dimensions (channels the smaller end), 7 x 7 or
    more; else None (a smaller one is flattened into the vector, as the CNNs' convolutions would leave nothing)."""
    shape = space.shape if isinstance(space, gym.spaces.Box) and space.dtype == np.uint8 else ()
    if len(shape) not in (2, 3):
        return None
    image = (1, *shape) if len(shape) == 2 else shape if shape[0] <= shape[-1] else (shape[-1], *shape[:2])
    return image if min(image[1:]) >= 7 else None


def nature_sized(space):
    """An image for the Nature CNN: 36 x 36 or more (Atari's 84 x 84); smaller ones (MiniGrid's 7 x 7) go to GridCNN."""
    image = image_shape(space)
    return image is not None and min(image[1:]) >= 36


def buffer_dtype(space):
    """The rollout buffer's type: images (and DictObservations' rows) stay uint8, a quarter of float32's memory."""
    return np.uint8 if image_shape(space) is not None or isinstance(space, Packed) else np.float32


def torch_threads(space):
    """Every core for a Nature CNN; one thread for an MLP or the grid CNN (more slow it down on a busy machine)."""
    entries = space.images if isinstance(space, Packed) else [space]
    return len(os.sched_getaffinity(0)) if any(nature_sized(entry) for entry in entries) else 1


def is_text(key, space):
    """A text entry (MiniGrid's mission; on EnvPool, its characters' codes): left out of what the networks see."""
    return isinstance(space, gym.spaces.Text) or not flattens(space) or (key == "mission" and space.dtype == np.uint8)


def flattens(space):
    """Whether a space flattens into one vector (a space of its own, as MiniGrid's text mission, raises instead)."""
    try:
        return space.is_np_flattenable
    except NotImplementedError:
        return False


class Packed(gym.spaces.Box):
    """The space of DictObservations' rows, bytes: `floats` float32 values, then the uint8 images of `images`."""

    def __init__(self, floats, images):
        self.floats, self.images = floats, images  # images: the image entries' spaces, in the row's order
        super().__init__(0, 255, (4 * floats + sum(int(np.prod(image.shape)) for image in images),), np.uint8)


class DictObservations(gym.vector.VectorObservationWrapper):
    """A Dict observation with images as one row of bytes, so that the rollout buffer and the update take it as any
    observation: first its other entries as float32 (Box flattened, Discrete one-hot; text left out), then each
    image's own uint8 bytes (a quarter of float32's memory). The Agent's encoder splits the row again."""

    def __init__(self, envs):
        super().__init__(envs)
        space = self.space = envs.single_observation_space
        self.images = [key for key, entry in space.items() if image_shape(entry)]
        self.vectors = [key for key, entry in space.items() if not image_shape(entry) and not is_text(key, entry)]
        floats = sum(gym.spaces.flatdim(space[key]) for key in self.vectors)
        self.single_observation_space = Packed(floats, [space[key] for key in self.images])
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)

    def observations(self, observations):
        vectors = [np.stack([gym.spaces.flatten(self.space[key], value) for value in observations[key]])
                   for key in self.vectors]
        floats = np.concatenate([np.zeros((self.num_envs, 0)), *vectors], axis=1).astype(np.float32)
        images = [np.asarray(observations[key]).reshape(self.num_envs, -1) for key in self.images]
        return np.concatenate([floats.view(np.uint8), *images], axis=1)


class NatureCNN(nn.Sequential):
    """Atari details: the Nature CNN (Mnih et al., 2015) on pixels scaled to [0, 1], 512 features for both heads."""

    scale = 255.0

    def __init__(self, channels, height, width):
        convs = [layer_init(nn.Conv2d(channels, 32, 8, 4)), nn.ReLU(), layer_init(nn.Conv2d(32, 64, 4, 2)), nn.ReLU(),
                 layer_init(nn.Conv2d(64, 64, 3, 1)), nn.ReLU(), nn.Flatten()]  # arguments: in, out, kernel, stride
        features = nn.Sequential(*convs)(torch.zeros(1, channels, height, width)).shape[1]
        super().__init__(*convs, layer_init(nn.Linear(features, 512)), nn.ReLU())
        self.features = 512

    def forward(self, x):  # uint8 frames (the buffer's) of shape (N, H, W), (N, C, H, W) or (N, H, W, C)
        x = x.unsqueeze(1) if x.dim() == 3 else x if x.shape[1] == self[0].in_channels else x.movedim(-1, 1)
        if x.device.type == "cpu":  # channels last: oneDNN's convolutions take it ~1.3x faster, the same float32 math
            x = x.contiguous(memory_format=torch.channels_last)
        return super().forward(x.float() / self.scale)


class GridCNN(NatureCNN):
    """An image under 36 x 36, such as MiniGrid's 7 x 7 view of object, color and state indices: three 2 x 2
    convolutions of 16, 32 and 64 channels, the first max-pooled (rl-starter-files' MiniGrid encoder; without the pool
    Empty-Random-5x5 stalled on 1 seed of 5), on the values as they are (indices, not pixels)."""

    scale = 1.0

    def __init__(self, channels, height, width):
        nn.Sequential.__init__(self, layer_init(nn.Conv2d(channels, 16, 2)), nn.ReLU(), nn.MaxPool2d(2),
                               layer_init(nn.Conv2d(16, 32, 2)), nn.ReLU(), layer_init(nn.Conv2d(32, 64, 2)),
                               nn.ReLU(), nn.Flatten())
        self.features = 64 * ((height - 1) // 2 - 2) * ((width - 1) // 2 - 2)


class DictEncoder(nn.Module):
    """Splits DictObservations' rows: each image through a CNN of its own (the Nature CNN from 36 x 36, else GridCNN),
    the float entries beside the images' features."""

    def __init__(self, space):
        super().__init__()
        self.floats, self.shapes = space.floats, [image.shape for image in space.images]
        cnns = [NatureCNN if nature_sized(image) else GridCNN for image in space.images]
        self.cnns = nn.ModuleList(cnn(*image_shape(image)) for cnn, image in zip(cnns, space.images))
        self.features = self.floats + sum(cnn.features for cnn in self.cnns)

    def forward(self, x):
        floats = x[:, : 4 * self.floats].flatten().clone()  # bytes of their own: aligned for float32
        features, start = [floats.view(torch.float32).view(len(x), self.floats)], 4 * self.floats
        for shape, cnn in zip(self.shapes, self.cnns):
            size = int(np.prod(shape))
            features.append(cnn(x[:, start: start + size].reshape(-1, *shape)))
            start += size
        return torch.cat(features, dim=1)


def encoder_for(space):
    """The Agent's encoder: the Nature CNN (Atari details: shared by actor and critic) for an image of 36 x 36 or
    more, DictEncoder for a Dict with images, GridCNN for a smaller image; None for a vector (the MLPs read it)."""
    if nature_sized(space):
        return NatureCNN(*image_shape(space))
    if isinstance(space, Packed):
        return DictEncoder(space)
    return GridCNN(*image_shape(space)) if image_shape(space) else None


def replay(memory, hidden, state, keep=None):
    """The memory (LSTM or GRU) over features [T, N, F] (Agent.remember): each sub-env's rows cut into episodes, run
    at once as one packed batch (a loop over rows is much slower). Returns [T * N, units] and the state after them."""
    steps, n = hidden.shape[:2]
    keep = torch.ones(steps, n, device=hidden.device) if keep is None else keep
    lstm = isinstance(memory, nn.LSTM)  # its state: h and c side by side
    if steps == 1:  # a rollout step or evaluation: one row a sub-env, from its state (the packing costs more)
        out, final = memory(hidden, state[None].chunk(2, dim=2) if lstm else state[None])
        return out[0], (torch.cat(final, dim=2) if lstm else final)[0] * keep[-1].unsqueeze(1)
    starts = torch.cat([torch.ones_like(keep[:1]), 1 - keep[:-1]]).T.flatten()  # sub-env by sub-env
    sequence = starts.cumsum(0).long() - 1  # each row's episode
    lengths = torch.bincount(sequence).cpu()
    rows = hidden.transpose(0, 1).flatten(0, 1).split(lengths.tolist())
    initial = hidden.new_zeros(1, len(lengths), state.shape[1])
    initial[0, sequence[::steps]] = state  # a sub-env's first episode goes on from its state, the others from 0
    out, final = memory(nn.utils.rnn.pack_sequence(rows, enforce_sorted=False),
                        initial.chunk(2, dim=2) if lstm else initial)
    out = torch.cat(nn.utils.rnn.unpad_sequence(nn.utils.rnn.pad_packed_sequence(out)[0], lengths))
    final = (torch.cat(final, dim=2) if lstm else final)[0, sequence[steps - 1:: steps]]
    return out.view(n, steps, -1).transpose(0, 1).flatten(0, 1), final * keep[-1].unsqueeze(1)


def sequence_minibatches(agent, obs, state, valid, num_minibatches, sequence_length):
    """Detail 6 with memory: shuffled minibatches of sequence_length-step sequences (0: whole rollouts), each from its
    first state under this epoch's weights (the rollout [num_steps, num_envs] read again from `state`, no gradient).
    Yields each minibatch's rows of the batch and their features (autoreset rows replayed, left out of the loss)."""
    length = sequence_length or len(valid)
    starts = []  # each sequence's first state
    with torch.no_grad():
        for step in range(0, len(valid), length):
            starts.append(state)
            if step + length < len(valid):
                _, state = agent.remember(obs[step: step + length], state, valid[step: step + length])

    def cut(x):  # [num_steps, num_envs, ...] as [length, sequences, ...]: sequence k * num_envs + n, sub-env n's k-th
        return x.unflatten(0, (-1, length)).transpose(0, 1).flatten(1, 2)

    row = cut((valid > 0).flatten().cumsum(0).view_as(valid) - 1)  # each real row's place in the batch
    obs, valid, starts = cut(obs), cut(valid), torch.cat(starts)
    order = torch.randperm(len(starts), device=valid.device)
    parts = min(num_minibatches, len(starts))
    while parts > 1 and min(rows.sum() for rows in valid.sum(0)[order].tensor_split(parts)) < 2:
        parts -= 1  # 2 real rows at least in each minibatch, though autoreset rows dropped (as without memory)
    for seqs in order.tensor_split(parts):
        seqs = seqs.sort().values  # whole rollouts: the rows in the batch's order (step, then sub-env)
        real = valid[:, seqs].flatten() > 0
        hidden, _ = agent.remember(obs[:, seqs], starts[seqs], valid[:, seqs])
        yield row[:, seqs].flatten()[real], hidden[real]


def filmed(env, video_folder, film_first=None):
    """env filmed to video_folder: training keeps gymnasium's schedule (episodes 0, 1, 8, 27, ...), evaluation films
    its first `film_first` episodes."""
    trigger = (lambda episode: episode < film_first) if film_first else None
    return StreamedVideo(env, video_folder, episode_trigger=trigger, disable_logger=True)


class StreamedVideo(gym.wrappers.RecordVideo):
    """gymnasium's RecordVideo (1.4.0), but each frame goes to the file as it is rendered: RecordVideo holds an
    episode's frames in memory until it ends (a 27,000-step Atari game filmed in color: about 10.9 GB)."""

    writer = None  # moviepy's, as in RecordVideo; opened at an episode's first frame, which gives the size

    def _capture_frame(self):
        frame = self.env.render()
        if self.writer is None:
            from moviepy.video.io.ffmpeg_writer import FFMPEG_VideoWriter
            path = os.path.join(self.video_folder, f"{self._video_name}.mp4")
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # the encoder inherits the mask: a Ctrl-C
            try:  # to the terminal's process group is the run's to act on; the encoder ends when its input does
                self.writer = FFMPEG_VideoWriter(path, (frame.shape[1], frame.shape[0]), self.frames_per_sec)
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        self.writer.write_frame(frame)

    def stop_recording(self):
        if self.writer is not None:  # None if the env's render() failed on the episode's first frame
            self.writer.close()
        self.writer = None
        self.recording = False


# Many agents: PettingZoo's parallel games, every agent of every game a column of the rollout, one policy for all.
def env_module(env_id):
    """The module that --env-id imports: the one before a colon (module:Id), or one named alone (a PettingZoo env's,
    mpe2.simple_spread_v3, or one of yours with a parallel_env() function); None for gymnasium's own ids."""
    if ":" in env_id:
        return env_id.split(":")[0]
    return env_id if env_id not in gym.registry and re.fullmatch(r"[A-Za-z_][\w.]*", env_id) else None


def parallel_games(env_id):
    """The module of PettingZoo's games that --env-id names, imported; None for gymnasium's ids and module:Id."""
    if ":" in env_id or not env_module(env_id):
        return None
    with contextlib.suppress(ImportError, ValueError):  # a dotted name whose package is missing
        return importlib.import_module(env_id) if importlib.util.find_spec(env_id) else None
    return None


def make_game(args, render=False):
    """One PettingZoo game, as --env-id and --env-kwargs name it, rendering frames if asked; what the scripts cannot
    take raises ValueError (said in one line when the env is checked)."""
    module = parallel_games(args.env_id)
    if not hasattr(module, "parallel_env"):  # PettingZoo's AEC envs have env() only
        if hasattr(module, "env") and not getattr(module.env(), "metadata", {}).get("is_parallelizable"):
            raise ValueError(f"{args.env_id} is a turn-based game (PettingZoo's AEC API: one agent acts at a time); "
                             "these scripts train parallel games, where every agent acts at each step")
        raise ValueError(f"{args.env_id} has no parallel_env(): for an AEC env, write a module whose parallel_env() "
                         "returns pettingzoo.utils.conversions.aec_to_parallel(env()), and name it")
    kwargs = {"render_mode": "rgb_array"} if render else {}
    return parallel_games(args.env_id).parallel_env(**kwargs, **json.loads(args.env_kwargs))


def one_space(spaces):
    """One space for a game's agents: theirs, or where they differ (roles: speaker and listener), as Terry et al. (2020)
    share one network across them: 1-D Boxes padded with zeros to the largest (of an action, only the agent's own
    dimensions count: action_dims). Other differences raise ValueError."""
    if len({str(space) for space in spaces}) == 1:
        return spaces[0]
    if all(isinstance(space, gym.spaces.Box) and len(space.shape) == 1 for space in spaces):
        size = max(space.shape[0] for space in spaces)
        low, high = (np.stack([pad(getattr(space, end), size) for space in spaces]) for end in ("low", "high"))
        return gym.spaces.Box(low.min(0), high.max(0), (size,), np.result_type(*[space.dtype for space in spaces]))
    raise ValueError(f"its agents' spaces differ ({', '.join(sorted({str(space) for space in spaces}))}); one policy "
                     "pads 1-D Boxes, no others")


def central_state(game, observation_space):
    """The space of what --central-value's critic reads of a game: its state_space, or where it has none its agents'
    observations side by side; vectors only."""
    shape = game.state_space.shape if hasattr(game, "state_space") else observation_space.shape
    if len(shape) != 1 or len(observation_space.shape) != 1:
        raise ValueError(f"--central-value takes vectors: a state and observations of one dimension, not of shapes "
                         f"{shape} and {observation_space.shape}")
    size = shape[0] if hasattr(game, "state_space") else len(game.possible_agents) * shape[0]
    return gym.spaces.Box(-np.inf, np.inf, (size,))


def actor_inputs(envs):
    """How many of each row's features the actor reads: None, all; with --central-value the agent's own, which lead
    each row (ManyAgents puts the game's state last, for the critic alone)."""
    return getattr(getattr(envs, "unwrapped", envs), "actor_size", None)  # (a stand-in of envs, in a test: all)


def small_frames(space):
    """The observation space of a game's frames larger than 84 x 84 (cooperative_pong's 280 x 480) after Atari's
    preprocessing, as CleanRL's multi-agent Atari script does it: gray, 84 x 84, the last 4 stacked; None for others."""
    image = image_shape(space)
    return gym.spaces.Box(0, 255, (4, 84, 84), np.uint8) if image and min(image[1:]) > 84 else None


def shrink(frame):
    """A frame (height, width, RGB channels last; or gray) in gray at 84 x 84, by area interpolation."""
    frame = frame[..., 0] if frame.ndim == 3 and frame.shape[-1] == 1 else frame  # gray already, one channel
    gray = frame[..., :3] @ np.array([0.299, 0.587, 0.114], np.float32) if frame.ndim == 3 else frame
    small = nn.functional.interpolate(torch.from_numpy(gray.astype(np.float32))[None, None], (84, 84), mode="area")
    return small[0, 0].round().clamp(0, 255).to(torch.uint8).numpy()


def pad(x, size):
    """x followed by zeros, to `size` entries."""
    return np.concatenate([x, np.zeros(size - len(x), x.dtype)])


def action_dims(infos, shape):
    """Of each row's action dimensions, 1.0 for those its agent has and 0.0 for padding (ManyAgents, where agents'
    actions differ in size: info "action_dims"); all 1.0 for any other env. `shape`: the buffer's."""
    return np.broadcast_to(infos.get("action_dims", True), shape).astype(np.float32)


def columns(args):
    """The rollout's columns: one per sub-env, or with PettingZoo's games one per agent of each (the game made once)."""
    module = parallel_games(args.env_id)
    if module is None or not hasattr(module, "parallel_env"):
        return args.num_envs
    game = make_game(args)
    agents = len(game.possible_agents)
    game.close()
    return args.num_envs * agents


class ManyAgents(gym.vector.VectorEnv):
    """`games` PettingZoo parallel games as one vector env of a column per agent of each, autoreset as gymnasium's
    NEXT_STEP. An agent not playing (it left, terminated or truncated before the others, or is yet to join) keeps its
    column: info "left" marks those rows, which engine_resets makes rows without weight, as a reset row is; an agent
    joins at its first observation. When no agent plays, the next step starts the game again (a reset row for each of
    its columns). Each agent's episode goes to the info as RecordEpisodeStatistics gives it ("episode"), the team's
    (the sum over a game's agents) as "team_episode" at the game's first column. --agent-id puts a one-hot of the
    agent's index beside its observation."""

    def __init__(self, args, games, video_folder=None, film_first=None):
        self.games = [make_game(args, render=args.capture_video and g == 0) for g in range(games)]
        game, self.raw_games = self.games[0], list(self.games)  # raw: game 0 unfilmed (its state())
        self.agents = list(game.possible_agents)
        spaces = [game.observation_space(agent) for agent in self.agents]
        space = one_space(spaces)
        self.frames = small_frames(space)  # large frames: gray, 84 x 84, 4 stacked
        space = self.frames or space
        self.padded = space.shape[0] if len({str(s) for s in spaces}) > 1 else None  # observations of sizes that differ
        actions = [game.action_space(agent) for agent in self.agents]
        self.single_action_space = one_space(actions)
        padded = len({str(action) for action in actions}) > 1  # Box actions whose sizes differ
        self.sizes = [action.shape[0] if padded else None for action in actions]  # the first dimensions of the padded
        roles = [agent.rsplit("_", 1)[0] for agent in self.agents]  # a role: the name up to its last "_"
        self.roles = np.array(roles * games) if len(set(roles)) > 1 else None  # infos["role"]: a curve per role
        self.obs = [np.zeros(space.shape, space.dtype)] * (games * len(self.agents))  # until an agent first observes
        if args.capture_video and video_folder is not None:  # game 0 filmed as env 0 is, an episode a game
            self.games[0] = filmed(OneGame(game), video_folder, film_first)
        self.ids = np.eye(len(self.agents), dtype=np.float32) if args.agent_id else None
        entries = {"observation": space, **({"agent_id": gym.spaces.Box(0, 1, self.ids[0].shape)} if args.agent_id
                                            else {})}
        self.states = [np.zeros(central_state(game, space).shape, np.float32)] * games if args.central_value else None
        self.actor_size = sum(map(gym.spaces.flatdim, entries.values())) if args.central_value else None
        if args.central_value:  # the critic's alone: after the agent's own entries (agent_id, observation) in a row
            entries["state"] = central_state(game, space)
        space = gym.spaces.Dict(entries) if len(entries) > 1 else space
        self.num_envs, self.single_observation_space = games * len(self.agents), space
        self.dims = np.stack([np.arange(self.single_action_space.shape[0]) < size for size in self.sizes] * games
                             ) if padded else None
        self.observation_space = gym.vector.utils.batch_space(space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self.metadata = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}
        self.left = np.zeros(self.num_envs, dtype=bool)
        self.returns, self.lengths = np.zeros(self.num_envs), np.zeros(self.num_envs, dtype=np.int64)

    def reset(self, seed=None, options=None):
        for g in range(len(self.games)):
            self.start(g, None if seed is None else seed + g)
        return self.observations(), self.infos({})

    def start(self, g, seed):
        observations, _ = self.games[g].reset(seed=seed)
        for i, agent in enumerate(self.agents):
            column = g * len(self.agents) + i
            self.left[column], self.returns[column], self.lengths[column] = True, 0.0, 0  # waits until it joins
            if agent in observations:
                self.observe(column, observations[agent])
        self.record_state(g)

    def observe(self, column, observation):
        """An agent's first observation (its episode starts) or its next one."""
        if self.frames is not None:  # the newest frame last; at an agent's first, 4 times
            frame = shrink(observation)[None]
            observation = np.repeat(frame, 4, 0) if self.left[column] else np.concatenate([self.obs[column][1:], frame])
        self.obs[column] = observation if self.padded is None else pad(observation, self.padded)
        if self.left[column]:
            self.left[column], self.returns[column], self.lengths[column] = False, 0.0, 0

    def step(self, actions):
        n, infos = len(self.agents), {}
        rewards = np.zeros(self.num_envs)
        terminated, truncated = np.zeros(self.num_envs, dtype=bool), np.zeros(self.num_envs, dtype=bool)
        for g, game in enumerate(self.games):
            playing = range(g * n, (g + 1) * n)
            if self.left[playing].all():  # the game ended at the last step: this one starts it again
                self.start(g, None)
                continue
            acting = {agent: actions[c][:size] for agent, c, size in zip(self.agents, playing, self.sizes)
                      if not self.left[c]}  # of a padded action, the agent's own dimensions
            observations, reward, terminations, truncations, _ = game.step(acting)
            for agent, c in zip(self.agents, playing):
                if agent in observations:  # an agent that acted, or one that joins (its row waited)
                    self.observe(c, observations[agent])
                if agent not in acting:
                    continue
                rewards[c], terminated[c], truncated[c] = reward[agent], terminations[agent], truncations[agent]
                self.returns[c], self.lengths[c] = self.returns[c] + reward[agent], self.lengths[c] + 1
                if terminated[c] or truncated[c]:
                    self.add(infos, "episode", c, self.returns[c], self.lengths[c])
                    self.left[c] = True
            self.record_state(g)
            if self.left[playing].all():
                self.add(infos, "team_episode", g * n, self.returns[playing].sum(), self.lengths[playing].max())
        return self.observations(), rewards, terminated, truncated, self.infos(infos)

    def add(self, infos, key, column, episode_return, length):
        if key not in infos:
            infos[key] = {"r": np.zeros(self.num_envs), "l": np.zeros(self.num_envs, dtype=np.int64)}
            infos["_" + key] = np.zeros(self.num_envs, dtype=bool)
        infos[key]["r"][column], infos[key]["l"][column], infos["_" + key][column] = episode_return, length, True

    def record_state(self, g):
        """--central-value: game g's state() where it has a state_space, else its agents' observations side by side."""
        if self.states is not None:
            game, n = self.raw_games[g], len(self.agents)
            self.states[g] = np.asarray(game.state() if hasattr(game, "state_space") else np.concatenate(
                self.obs[g * n:(g + 1) * n]), np.float32)

    def observations(self):
        """Each column's: the agent's observation, with its id (--agent-id) and its game's state (--central-value)."""
        n, observations = len(self.agents), []
        for c, obs in enumerate(self.obs):
            entries = {"observation": obs}
            if self.ids is not None:
                entries["agent_id"] = self.ids[c % n]
            if self.states is not None:
                entries["state"] = self.states[c // n]
            observations.append(entries if len(entries) > 1 else obs)
        return gym.vector.utils.concatenate(self.single_observation_space, observations,
                                            gym.vector.utils.create_empty_array(self.single_observation_space,
                                                                                self.num_envs))

    def infos(self, infos):
        infos["left"] = self.left.copy()
        if self.dims is not None:
            infos["action_dims"] = self.dims  # each column's: its agent's dimensions of the padded actions
        if self.roles is not None:
            infos["role"] = self.roles
        return infos

    def close(self, **kwargs):
        for game in self.games:
            game.close()


class RoleReturns:
    """Each role's returns where a game has more than one (ManyAgents' info "role"; a role: an agent's name up to its
    last "_", adversary_0's adversary), beside the pooled ones: in training each role's curve,
    charts/episodic_return/<role>, and its last 20 episodes on the progress line; in evaluation each role's agents' mean
    return an episode. Nothing for any other env."""

    def __init__(self):
        self.last_20, self.episodes = {}, {}  # training's; evaluation's (each role's, the last entry: this episode)

    def log(self, writer, infos, global_step):
        for i in np.flatnonzero(infos["_episode"]) if "role" in infos and "episode" in infos else []:
            role, episode_return = infos["role"][i], infos["episode"]["r"][i]
            writer.add_scalar(f"charts/episodic_return/{role}", episode_return, global_step)
            self.last_20.setdefault(role, deque(maxlen=20)).append(episode_return)

    def recent(self):
        return "".join(f", {role} {np.mean(returns):.1f}" for role, returns in self.last_20.items())

    def add(self, infos, reward):
        for role in dict.fromkeys(infos.get("role", [])):
            returns = self.episodes.setdefault(role, [0.0])
            returns[-1] += float(reward[infos["role"] == role].mean())

    def episode_end(self):
        said = "".join(f", {role} {returns[-1]:.2f}" for role, returns in self.episodes.items())
        for returns in self.episodes.values():
            returns.append(0.0)
        return said

    def summary(self):
        for role, returns in self.episodes.items():
            print(f"  {role}: mean return {np.mean(returns[:-1]):.2f} ± {np.std(returns[:-1]):.2f}")


class OneGame(gym.Env):
    """One PettingZoo game as a gymnasium env (its dicts of actions, rewards and ends as they are), to be filmed."""

    def __init__(self, game):
        self.game = game
        self.metadata = game.metadata
        self.render_mode = "rgb_array"

    def reset(self, seed=None, options=None):
        return self.game.reset(seed=seed, options=options)

    def step(self, actions):
        return self.game.step(actions)

    def render(self):
        return self.game.render()

    def close(self):
        self.game.close()


def engine_resets(done, infos):
    """Where the next row is not a transition: where an episode ended (the engine resets the sub-env); with many agents
    also the rows of an agent not playing (it left, or is yet to join)."""
    return np.maximum(done, infos["left"]) if "left" in infos else done


def observed(done, infos):
    """The rows of a step's observations that --norm-obs counts: all but those of an agent not playing, whose row
    repeats its last observation or holds none (ManyAgents); its last one counts, as an episode's final one does."""
    return (done > 0) | ~infos["left"] if "left" in infos else True


# ==================== Run safety: nothing below changes what PPO computes ====================
# The contract: a change to the core never needs an edit here. Run safety names only the run's own settings (env, seed,
# steps and batch shape, checkpoints, evaluation, logging, device). A new Args field is checked finite (its own checks:
# check_settings), logged and checkpointed; each entry of train()'s `state` is checkpointed and restored, of `charts`
# logged as charts/<name>, of the loss's statistics as losses/<name>. Resuming a checkpoint of an edited copy: a setting
# gone is dropped, a new one takes its flag or default, a new `state` entry starts fresh, each said in one line.

SCRIPT = os.path.basename(__file__)  # this file's name, recorded in every checkpoint beside its kind:
KIND = "ppo_continuous.py"  # what its checkpoints are: a copy keeps it, so resumes the checkpoints of its original
# Ctrl-C, kill, a closed terminal, Ctrl-\, a scheduler's warning or CPU limit: each finishes the iteration and saves
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
                signal.SIGXCPU)
# A checkpoint holds one state_dict per entry of train()'s `state`, and these fields; nothing else is read from it.
CHECKPOINT_SCHEMA = {"global_step": int, "iteration": int, "args": dict, "run_name": str, "rng_state": torch.Tensor,
                     "model": dict}


def fail(message):
    """Bad input or a run that cannot go on: one clear line, no traceback, non-zero exit."""
    raise SystemExit(f"error: {message}")


def command(args, flag, checkpoint_path, *more):
    """The command on a checkpoint (flag: --resume or --eval-checkpoint), with --env-id for an env from a module."""
    env = ["--env-id", args.env_id] if env_module(args.env_id) else []
    return shlex.join(["python", sys.argv[0], flag, checkpoint_path, *more, *env])


def first_line(error):
    return (str(error).splitlines() or [type(error).__name__])[0]


def env_kwargs_of(args):
    """--env-kwargs as a dict (one line says what is wrong with it)."""
    try:
        env_kwargs = json.loads(args.env_kwargs)
    except json.JSONDecodeError as e:
        fail(f"--env-kwargs is not valid JSON ({e}): {args.env_kwargs}")
    if not isinstance(env_kwargs, dict):
        fail(f"--env-kwargs must be a JSON object such as '{{\"continuous\": true}}', got {args.env_kwargs}")
    return env_kwargs


def check_args(args, observations=None):
    for name, value in asdict(args).items():  # NaN passes every comparison below, so it is refused first
        if isinstance(value, float) and not math.isfinite(value):
            fail(f"--{name.replace('_', '-')} must be a finite number, got {value}")
    if observations is None:  # the env's own problems are named before any complaint about sizes
        observations = check_env(args, env_kwargs_of(args))
    batch = columns(args) * args.num_steps
    for ok, message in [
        *[(getattr(args, name) > 0, f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}") for name
          in ("total_timesteps", "num_envs", "num_steps", "eval_episodes", "eval_max_steps")],
        (0 <= args.seed < 2**63, f"--seed must lie in [0, 2**63), got {args.seed}"),
        (args.total_timesteps >= batch, f"--total-timesteps {args.total_timesteps} is smaller than one batch "
                                        f"({batch} steps)"),
        (min(args.checkpoint_interval, args.env_threads) >= 0,
         "--checkpoint-interval and --env-threads must not be negative"),
        (not args.track or importlib.util.find_spec("wandb"), "--track needs wandb: pip install wandb"),
        (not args.capture_video or importlib.util.find_spec("moviepy"), "--capture-video needs: pip install moviepy"),
        *[(False, message) for message in check_settings(args)],  # the algorithm's own (core)
    ]:
        if not ok:
            fail(message)


def check_env(args, env_kwargs):
    """One env before training: what this script or its engine cannot train gets one line before the sub-envs."""
    if args.env_backend == "envpool":  # what EnvPool cannot do gets one line naming the flag to drop
        if not importlib.util.find_spec("envpool"):
            fail("--env-backend envpool needs EnvPool: pip install envpool==1.2.5")
        if args.env_id not in importlib.import_module("envpool").list_all_envs():
            fail(f"EnvPool cannot take --env-id {args.env_id}: drop it, or use --env-backend gymnasium")
        for flag, given in (("--env-kwargs", env_kwargs), ("--capture-video", args.capture_video)):
            if given:
                fail(f"EnvPool cannot take {flag}: drop it, or use --env-backend gymnasium")
    games = parallel_games(args.env_id)  # many agents (Capabilities)
    try:
        if args.env_backend == "envpool" or games:  # the engine's own spaces (EnvPool has ids gymnasium does not know)
            env = make_envs(args, 1, None, args.seed).unwrapped  # unwrapped: the spaces before they are flattened
        else:
            rendering = {"render_mode": "rgb_array"} if args.capture_video else {}  # made as env 0 will be
            env = gym.vector.SyncVectorEnv([make_env(args.env_id, {**env_kwargs, **rendering}, 0, False, None)])
    except Exception as e:  # an unknown id, arguments the env does not take, a simulator or renderer that does not load
        fail(f"cannot make env '{args.env_id}'{make_failure(args, e)}")
    actions, observations = env.single_action_space, env.single_observation_space
    with contextlib.suppress(Exception):  # a close() that fails is said when training's envs close, after the run
        env.close()
    if isinstance(actions, (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)):
        fail(f"{args.env_id} has a {type(actions).__name__} action space; {SCRIPT} needs Box (use ppo_discrete.py)")
    if not isinstance(actions, gym.spaces.Box):
        fail(f"{args.env_id} has a {type(actions).__name__} action space, which none of these scripts takes: map it "
             "to a MultiDiscrete (ppo_discrete.py) or a Box (ppo_continuous.py) in a wrapper, e.g. TransformAction")
    if len(actions.shape) != 1:
        fail(f"{args.env_id} has Box actions of shape {actions.shape}; {SCRIPT} takes one-dimensional ones "
             "(reshape them in a wrapper, e.g. gym.wrappers.TransformAction)")
    if not np.issubdtype(actions.dtype, np.floating):
        fail(f"{args.env_id} has actions {actions} that {SCRIPT} does not send: its Box actions are floats "
             "(map them to floats in a wrapper, e.g. TransformAction, or to a MultiDiscrete for ppo_discrete.py)")
    if isinstance(observations, gym.spaces.Dict) and any(image_shape(entry) for entry in observations.values()):
        # DictObservations: the text entries are left out, said in the run's first lines
        if text := [key for key, entry in observations.items() if is_text(key, entry)]:
            print(f"observations: {', '.join(text)} left out (text, or no fixed size: make it numbers in a wrapper)")
    elif not flattens(observations):
        fail(f"{args.env_id} has a {type(observations).__name__} observation space; {SCRIPT} needs one that flattens "
             "into a vector, or a Dict with an image (make one in a wrapper)")
    return observations


def make_failure(args, error):
    """What went wrong when the env was made: the error, where the env's own code raised it, and a hint."""
    kwargs = f" with --env-kwargs '{args.env_kwargs}'" if args.env_kwargs != "{}" else ""
    said = f"{kwargs}: {type(error).__name__}" + (f": {first_line(error)}" if str(error) else "")
    frames = env_frames(error)
    if frames:  # the env's own code (or a package it calls)
        said += f" (raised at {frames[-1].filename}, line {frames[-1].lineno})"
    module = args.env_id.split(":")[0] if ":" in args.env_id else None
    envpool = importlib.import_module("envpool") if importlib.util.find_spec("envpool") else None
    if f"No module named '{module}'" in str(error):
        return f"{said}; is {module}.py in {os.path.dirname(os.path.abspath(__file__))} or on PYTHONPATH?"
    if isinstance(error, gym.error.NameNotFound) and envpool and args.env_id in envpool.list_all_envs():
        return f"{said}; it is one of EnvPool's envs: add --env-backend envpool"
    if isinstance(error, gym.error.NameNotFound) and env_module(args.env_id) and not module:  # many agents' module
        return f'{said}; no module {args.env_id} to import (PettingZoo: pip install "pettingzoo[sisl]==1.27.0")'
    if isinstance(error, gym.error.NameNotFound) and not module:
        return f"{said}; for an env of your own file, name its module: --env-id my_module:MyEnv-v0"
    renderer = re.search(r"\begl|osmesa|glfw|opengl", " ".join([str(error), *(f.filename for f in frames)]), re.I)
    if renderer and "MUJOCO_GL" in os.environ:  # the renderer's own failure (EGL, OSMesa, GLFW, OpenGL)
        return f"{said}; MUJOCO_GL={os.environ['MUJOCO_GL']} is set: can this machine render that way?"
    return said


def env_frames(error):
    """The frames of an error's traceback in the env's own code or a package it calls (not gymnasium's or ours)."""
    ours = (os.path.dirname(gym.__file__), os.path.abspath(__file__), "<frozen ")
    return [frame for frame in traceback.extract_tb(error.__traceback__) if not frame.filename.startswith(ours)]


def load_checkpoint(path):
    """A checkpoint of this script, checked against CHECKPOINT_SCHEMA and Args; anything else gets one line."""
    if not os.path.isfile(path):
        fail(f"checkpoint not found: {path}")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)  # weights_only: data, never code
    except Exception as e:  # a truncated or foreign file: report it, never a traceback
        fail(f"cannot read checkpoint {path}: {first_line(e)}")
    if not isinstance(checkpoint, dict):
        fail(f"{path} is not a checkpoint of {SCRIPT}")
    written_by = checkpoint.get("script", SCRIPT)  # older checkpoints record their script's name only, the oldest none
    kind = checkpoint.get("kind", KIND if written_by in (SCRIPT, KIND) else written_by)
    if kind != KIND:  # a copy keeps KIND: it resumes its original's checkpoints, and the original the copy's
        ours = KIND if SCRIPT == KIND else f"{SCRIPT} (a copy of {KIND})"
        fail(f"{path} is a checkpoint of {kind}, not of {ours}: use {kind}")
    known = {field.name: field.default for field in fields(Args)}
    if not CHECKPOINT_SCHEMA.keys() <= checkpoint.keys() or not isinstance(checkpoint["args"], dict):
        fail(f"{path} is not a checkpoint of {SCRIPT} (expected keys: {', '.join(sorted(CHECKPOINT_SCHEMA))})")
    # damaged: fields, state_dicts (the other entries) or settings of the wrong type (an int may stand for a float)
    wrong = [key for key, kind in CHECKPOINT_SCHEMA.items() if not isinstance(checkpoint[key], kind)
             or type(checkpoint[key]) is bool or (kind is torch.Tensor and checkpoint[key].dtype != torch.uint8)]
    wrong += [key for key, value in checkpoint.items() if key not in CHECKPOINT_SCHEMA and key not in
              ("script", "kind", "cuda_rng_state") and not isinstance(value, (dict, torch.Tensor))]
    wrong += [name for name, value in checkpoint["args"].items() if name in known and known[name] is not None and
              type(value) is not type(known[name]) and not (type(known[name]) is float and type(value) is int)]
    if wrong:
        fail(f"{path} is damaged: wrong type of {', '.join(wrong)}")
    steps = checkpoint["iteration"] * checkpoint["args"].get("num_envs", 0) * checkpoint["args"].get("num_steps", 0)
    named = re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", checkpoint["run_name"])  # a name, never a path
    if not named or not 0 < steps <= checkpoint["global_step"] or checkpoint["global_step"] % steps:  # many agents
        fail(f"{path} is damaged: its run name or step counters are not those of a run")
    model = checkpoint["model"]  # older checkpoints name the mean head actor_mean: read as the actor
    checkpoint["model"] = {re.sub(r"^actor_mean\.", "actor.", key): value for key, value in model.items()}
    if not all(torch.isfinite(value).all() for value in checkpoint["model"].values() if torch.is_tensor(value)):
        fail(f"{path} holds non-finite weights")
    return checkpoint


def restore(checkpoint, state, env_id):
    """Each entry of `state` from the checkpoint's; one it lacks starts fresh, said in a note. Parameters added to a
    module since start fresh, or removed ones are dropped, each named, and the optimizer starts fresh; an entry that
    does not fit (another env, setting or network) cannot resume: one line that says which entry and how."""
    edited = False  # a module gained or lost parameters: the optimizer's moments are those of other parameters
    for name, obj in sorted(state.items(), key=lambda item: isinstance(item[1], torch.optim.Optimizer)):  # it last
        if name not in checkpoint:  # new in this file, or not in an older checkpoint
            print(f"note: the checkpoint has no {name}: it starts fresh")
            continue
        if edited and isinstance(obj, torch.optim.Optimizer):
            print(f"note: the checkpoint's {name} holds moments of other parameters: it starts fresh")
            continue
        if isinstance(obj, nn.Module) and isinstance(checkpoint[name], dict):
            ours, saved = obj.state_dict().keys(), checkpoint[name].keys()
            added, removed = ours - saved, saved - ours
            if added and removed:  # renamed or replaced: not an addition
                fail(f"the checkpoint's {name} does not fit {SCRIPT}'s on {env_id} (another script, env or network): "
                     f"{SCRIPT} has {', '.join(sorted(added))}, the checkpoint {', '.join(sorted(removed))} instead")
            if added or removed:
                print(f"note: {SCRIPT}'s {name} has new {', '.join(sorted(added))}: they start fresh" if added else
                      f"note: the checkpoint's {name} has {', '.join(sorted(removed))}, gone from {SCRIPT}: dropped")
                edited = True
        try:
            if torch.is_tensor(obj):  # a tensor changed in place, such as a coefficient learned in the update
                if obj.shape != checkpoint[name].shape:
                    raise ValueError(f"shape {tuple(checkpoint[name].shape)} where {SCRIPT}'s is {tuple(obj.shape)}")
                with torch.no_grad():
                    obj.copy_(checkpoint[name])
                continue
            shapes = {key: value.shape for key, value in obj.state_dict().items() if torch.is_tensor(value)}
            obj.load_state_dict(checkpoint[name], **({"strict": False} if isinstance(obj, nn.Module) else {}))
            loaded = {key: value.shape for key, value in obj.state_dict().items() if torch.is_tensor(value)}
            moments = [m.shape == p.shape for p, s in getattr(obj, "state", {}).items() for m in s.values() if m.dim()]
            if loaded != shapes or not all(moments):  # an optimizer's moments have the shape of their parameter
                raise ValueError("statistics of the wrong shape")
        except Exception as e:  # a network of another shape (another env or setting), or a damaged entry
            detail = [*str(e).splitlines()[1:], first_line(e)][0].strip()  # torch puts the detail on line 2
            fail(f"the checkpoint's {name} does not fit {SCRIPT}'s on {env_id} (another env, setting or network): "
                 f"{detail}")


def parse_args():
    """Command-line flags; with --resume or --eval-checkpoint the checkpoint's settings are the defaults."""
    sys.argv = [f"{float(a):.0f}" if re.fullmatch(r"\d+(\.\d*)?e\d+", a) and float(a).is_integer() else a
                for a in sys.argv]  # --total-timesteps 1e6: a whole number in float notation is taken for an int
    args = tyro.cli(Args)
    checkpoint = None
    if args.resume or args.eval_checkpoint:
        checkpoint = load_checkpoint(args.eval_checkpoint or args.resume)
        evaluation = {"capture_video": False} if args.eval_checkpoint else {}  # not training's
        known = {field.name for field in fields(Args)}  # an edited copy of this file may have renamed or added some
        for name in sorted(set(checkpoint["args"]) - known):
            print(f"note: the checkpoint's setting {name} = {checkpoint['args'][name]!r} is not in {SCRIPT}: dropped")
        saved = {name: value for name, value in checkpoint["args"].items() if name in known}
        saved.update(evaluation, resume=args.resume, eval_checkpoint=args.eval_checkpoint)
        command_line_env = args.env_id
        args = tyro.cli(Args, default=Args(**saved))  # parse again: flags given on the command line win
        for name in sorted(known - set(saved)):  # new in this file (or in this script since the checkpoint)
            print(f"note: the checkpoint has no setting {name}: {getattr(args, name)!r} applies")
        if env_module(args.env_id) and args.env_id != command_line_env:  # making the env would import that module
            fail(f"the checkpoint's env {args.env_id} imports a module: allow it by naming it, --env-id {args.env_id}")
    observations = check_env(args, env_kwargs_of(args))  # the env first: what it gives may change the defaults
    if not checkpoint:  # a resumed run keeps its settings
        args = env_defaults(args, observations)
    check_args(args, observations)  # the settings as they will train
    return args, checkpoint


class EnvError(Exception):
    """The environment raised an exception (its own exception is the __cause__)."""


class CheckedEnvs(gym.vector.VectorWrapper):
    """The env's exceptions become EnvError; non-finite observations or rewards, FloatingPointError."""

    def reset(self, **kwargs):
        return self.checked(self.env.reset, ("observation",), **kwargs)

    def step(self, actions):
        return self.checked(self.env.step, ("observation", "reward"), actions)

    def close(self, **kwargs):
        return self.checked(self.env.close, (), **kwargs)

    def checked(self, call, finite, *args, **kwargs):
        try:
            result = call(*args, **kwargs)
        except KeyboardInterrupt:  # a second stop signal: the script's, not the env's
            raise
        except BaseException as e:  # SystemExit too: some simulator bindings call sys.exit() when they lose their link
            where = " while closing" if call == self.env.close else ""
            raise EnvError(f"raised {type(e).__name__}: {first_line(e)}{where}") from e
        for index, name in enumerate(finite):
            if not np.isfinite(result[index]).all():
                raise FloatingPointError(name)
        return result


class Run:
    """One start of a run: its folder (locked), TensorBoard, progress, checkpoints, signals, the fault rule."""

    def __init__(self, args, checkpoint, start_iteration, num_iterations):
        self.args, self.checkpoint, batch = args, checkpoint, columns(args) * args.num_steps
        self.num_iterations, self.total_timesteps = num_iterations, num_iterations * batch
        self.global_step = (start_iteration - 1) * batch  # the last complete iteration's step, said by every message
        saved = checkpoint["args"] if checkpoint else asdict(args)
        if (args.num_envs, args.num_steps) != (saved["num_envs"], saved["num_steps"]):
            fail(f"a resumed run keeps its batch: the checkpoint was trained with --num-envs {saved['num_envs']} "
                 f"--num-steps {saved['num_steps']}")
        if start_iteration > num_iterations:
            fail(f"the checkpoint is at step {self.global_step}: pass a --total-timesteps beyond it to extend the run: "
                 f"{command(args, '--resume', args.resume, '--total-timesteps', str(2 * self.global_step))}")
        if args.total_timesteps not in (self.total_timesteps, Args.total_timesteps, IMAGE_DEFAULTS["total_timesteps"]):
            print(f"note: --total-timesteps {args.total_timesteps:,} is rounded down to whole batches of {batch:,}: "
                  f"{self.total_timesteps:,} steps")
        if checkpoint and self.total_timesteps > saved["total_timesteps"] // batch * batch:  # the longer run's schedule
            now = coefficients(args, start_iteration, num_iterations)  # as train() computes it
            before = coefficients(args, start_iteration, saved["total_timesteps"] // batch)
            if changed := [f"{name} {value:.3g}" for name, value in now.items() if value != before[name]]:
                print(f"extending the run to {self.total_timesteps:,} steps: its schedule follows that longer run's, "
                      f"from here {', '.join(changed)}")
        self.name, self.dir, self.lock = open_run_folder(args, checkpoint)
        self.checkpoint_path, self.finished = os.path.join(self.dir, "checkpoint.pt"), False  # finished: see save()
        if checkpoint and os.path.exists(self.checkpoint_path):  # read again under the lock: another process may have
            newer = load_checkpoint(self.checkpoint_path)["global_step"]  # written it, or --resume named an older copy
            if newer != self.global_step:
                fail(f"{self.checkpoint_path} is at step {newer}, not at the step {self.global_step} of {args.resume}: "
                     f"resume {self.checkpoint_path}, or give {args.resume} a folder of its own")
        self.last_complete, self.recent_returns, self.stop_signal, self.last_print = None, deque(maxlen=20), [], 0.0
        self.roles = RoleReturns()
        self.training = False  # until guard(): a stop ends the start (on_signal)
        self.handlers = {sig: signal.signal(sig, self.on_signal) for sig in STOP_SIGNALS}  # guard() restores them

    @contextlib.contextmanager
    def guard(self, envs, state):
        """Restores `state` on resume, opens TensorBoard and catches signals; on any fault applies the rule."""
        args, self.state, excepthook, self.training = self.args, state, threading.excepthook, True
        # TensorBoard writes from a thread of its own: its failed write is said once, in one line, by fail_with
        threading.excepthook = lambda hook: (type(hook.thread).__module__.startswith("tensorboard.")
                                             and isinstance(hook.exc_value, OSError)) or excepthook(hook)
        try:
            for name, obj in state.items():  # what a checkpoint can hold
                if not torch.is_tensor(obj) and not hasattr(obj, "load_state_dict"):
                    fail(f"train()'s state['{name}'] is of type {type(obj).__name__}: a checkpoint holds tensors "
                         "(changed in place) and objects with state_dict() and load_state_dict()")
            if self.checkpoint:
                restore(self.checkpoint, state, args.env_id)
                torch.set_rng_state(self.checkpoint["rng_state"])
                if self.checkpoint.get("cuda_rng_state") and torch.cuda.is_available():
                    torch.cuda.set_rng_state_all(self.checkpoint["cuda_rng_state"])
            if args.track:  # before the writer: wandb mirrors TensorBoard's events
                import wandb
                wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, sync_tensorboard=True,
                           config=asdict(args), name=self.name, id=self.name, resume="allow", save_code=True)
            # purge_step: on resume, TensorBoard drops whatever the interrupted run logged after its checkpoint
            self.writer = SummaryWriter(self.dir, purge_step=self.global_step + 1 if self.checkpoint else None)
            self.writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" +
                                 "\n".join(f"|{k}|{v}|" for k, v in asdict(args).items()))
            if args.capture_video:
                print(f"videos of env 0 go to {os.path.join('videos', self.name)}")
            self.start_time, self.start_step = time.time(), self.global_step
            yield
        except SystemExit:  # a message already given, a checkpoint already written or refused
            raise
        except BaseException as e:
            self.fail_with(e)
        finally:
            threading.excepthook = excepthook
            for sig, handler in self.handlers.items():  # as a script, a finished run ignores them until it exits
                signal.signal(sig, signal.SIG_IGN if self.finished and __name__ == "__main__" else handler)
            with contextlib.suppress(OSError, AttributeError):  # a failed write was reported; or no writer yet
                self.writer.close()
            self.lock.close()
            with contextlib.suppress(*((Exception,) if sys.exc_info()[1] else ())):  # after a fault, that fault is said
                envs.close()
        print(f"evaluate with: {command(args, '--eval-checkpoint', self.checkpoint_path)}\nextend with: "
              f"{command(args, '--resume', self.checkpoint_path, '--total-timesteps', str(2 * self.global_step))}\n"
              f"done: {self.global_step:,} steps; checkpoint at {self.checkpoint_path}")  # last: run.py reads it

    def on_signal(self, signum, frame):
        """In training, a first signal: finish the iteration, save, exit; a second one: stop now (an env that hangs),
        by the rule. Before it, the start ends at once (main() says so) and a new run's folder, empty, goes."""
        self.stop_signal.append(signum)
        if not self.training and not self.checkpoint:  # a resumed run's folder stays as it was
            with contextlib.suppress(OSError):  # empty but for the lock (rmdir leaves a folder with more in it)
                os.remove(os.path.join(self.dir, "train.lock"))
                os.rmdir(self.dir)
        if not self.training or (len(self.stop_signal) > 1 and not self.finished):
            raise KeyboardInterrupt

    def fail_with(self, error):
        """The fault rule: save the last complete iteration of this start (if any), then one line."""
        where, outcome = f"in the iteration after step {self.global_step}", "nothing new to save"
        if self.last_complete is not None:
            self.save()
            outcome = (f"checkpoint of the last complete iteration (step {self.global_step}) saved. "
                       f"Resume with: {command(self.args, '--resume', self.checkpoint_path)}")
        if isinstance(error, EnvError) and (cause := error.__cause__):
            lines = traceback.format_list(env_frames(cause)) + traceback.format_exception_only(cause)
            print("\nthe env's error:\n" + "".join(lines), end="", file=sys.stderr)
        said = {EnvError: f"{self.args.env_id} {error} {where}", FloatingPointError: f"non-finite {error} {where}",
                KeyboardInterrupt: f"stopped by a second signal {where}",  # OSError: TensorBoard's writes (a full disk)
                OSError: f"cannot write the TensorBoard events in {self.dir}: {getattr(error, 'strerror', 0) or error}"}
        for message in [message for kind, message in said.items() if isinstance(error, kind)]:
            fail(f"{message}; {outcome}")
        print(f"\n{SCRIPT} stopped by {type(error).__name__} {where}; {outcome}", file=sys.stderr)
        raise error  # neither the env's nor the disk's fault: show where it happened

    def log_episodes(self, infos, global_step):
        """The raw return and length of each episode that ended in a step (gymnasium's RecordEpisodeStatistics), and
        of each team's where an env gives "team_episode" too (many agents: the sum over a game's agents)."""
        for key, chart in (("episode", "charts/episodic"), ("team_episode", "charts/team_episodic")):
            for i in np.flatnonzero(infos["_" + key]) if key in infos else []:
                self.writer.add_scalar(f"{chart}_return", infos[key]["r"][i], global_step)
                self.writer.add_scalar(f"{chart}_length", infos[key]["l"][i], global_step)
        self.recent_returns.extend(infos["episode"]["r"][infos["_episode"]].tolist() if "episode" in infos else [])
        self.roles.log(self.writer, infos, global_step)  # (Capabilities) a game of roles: a curve per role

    def end_iteration(self, iteration, global_step, charts, losses):
        """Keep this iteration's state, log, show progress, and checkpoint when it is time (or a signal came)."""
        scalars = {**{f"charts/{name}": value for name, value in charts.items()},
                   **{f"losses/{name}": value for name, value in losses.items()}}
        self.global_step, final, args = global_step, iteration == self.num_iterations, self.args
        self.last_complete = {name: obj.detach().clone() if torch.is_tensor(obj) else copy.deepcopy(obj.state_dict())
                              for name, obj in self.state.items()}
        self.last_complete.update(global_step=global_step, iteration=iteration, args=asdict(args), run_name=self.name,
                                  script=SCRIPT, kind=KIND, rng_state=torch.get_rng_state(),
                                  cuda_rng_state=torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [])
        sps = int((global_step - self.start_step) / (time.time() - self.start_time))
        for tag, value in {**scalars, "charts/SPS": sps}.items():
            self.writer.add_scalar(tag, value, global_step)
        self.print_progress(global_step, sps, final)
        if final or self.stop_signal or (args.checkpoint_interval and iteration % args.checkpoint_interval == 0):
            self.writer.flush()  # TensorBoard's events reach the disk with each checkpoint (a failed write shows here)
            self.save()
        if self.stop_signal and not final:  # a signal during the last iteration: the run is finished
            print(f"\nstopped at step {global_step:,}; checkpoint saved. "
                  f"Resume with: {command(self.args, '--resume', self.checkpoint_path)}")
            raise SystemExit(128 + self.stop_signal[0])

    def print_progress(self, global_step, sps, final):
        """A one-line progress bar, redrawn in place on a terminal, a plain line about every 30 s otherwise."""
        now, interactive, returns, total = time.time(), sys.stdout.isatty(), self.recent_returns, self.total_timesteps
        if now - self.last_print < (0.2 if interactive else 30.0) and not final:
            return
        self.last_print, bar = now, "#" * int(30 * global_step / total)
        mean = f"{np.mean(returns):.1f} (last {len(returns)}{self.roles.recent()})" if returns else "- (no episode yet)"
        line = f"[{bar:.<30}] {global_step:,}/{total:,} steps | {sps:,} SPS | return {mean}"
        try:
            print(f"\r{line}" if interactive else line, end="\n" if final or not interactive else "", flush=True)
        except BrokenPipeError:  # the reader of the progress lines went away (`| head`): train on without them
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # later prints find no closed pipe

    def save(self):
        """Write the last complete iteration atomically and durably: the file flushed, renamed, the folder flushed."""
        tmp_path = f"{self.checkpoint_path}.{os.getpid()}.tmp"  # one temporary file per process
        try:
            torch.save(self.last_complete, tmp_path)
            fsync(tmp_path)  # durable, not only atomic: on the disk before the rename, and the rename after it
            os.replace(tmp_path, self.checkpoint_path)
            fsync(self.dir)
        except (OSError, RuntimeError) as e:  # a folder that cannot be written; a full disk (torch.save: RuntimeError)
            with contextlib.suppress(OSError):
                os.remove(tmp_path)
            reason = (getattr(e, "strerror", None) or "the write failed (is the disk full?)" if os.path.isdir(self.dir)
                      else "the run folder is gone")
            fail(f"cannot write checkpoint {self.checkpoint_path}: {reason}; the previous one, if any, is intact")
        self.finished = self.last_complete["global_step"] == self.total_timesteps  # from here a stop changes nothing


def fsync(path):
    os.fsync(descriptor := os.open(path, os.O_RDONLY))  # a file's data, or a folder's entries (a rename), to the disk
    os.close(descriptor)


def open_run_folder(args, checkpoint):
    """(name, folder, lock): a resumed run keeps its checkpoint's folder, a new one gets runs/<name> or <name>-2, -3,
    ... (mkdir is atomic: two runs started in one second never share one); the lock turns a second process away."""
    if checkpoint:
        name, folder = checkpoint["run_name"], os.path.dirname(args.resume) or "."
    else:
        base = re.sub(r"[^A-Za-z0-9_.-]", "-", f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}")
        name, number, folder = base, 1, None
    while folder is None:
        try:
            os.makedirs(os.path.join("runs", name))
            folder = os.path.join("runs", name)
        except FileExistsError:
            number, name = number + 1, f"{base}-{number + 1}"
        except OSError as e:
            fail(f"cannot create the run folder runs/{name}: {e.strerror or e}")
    try:
        lock = open(os.path.join(folder, "train.lock"), "w")
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        fail(f"another process is training {folder}; resume it once that process has stopped")
    except OSError as e:
        fail(f"cannot write in the run folder {folder}: {e.strerror or e}")
    for stale in glob.glob(os.path.join(glob.escape(folder), "checkpoint.pt.*.tmp")):  # of killed processes; ours now
        os.remove(stale)
    return name, folder, lock


def evaluate(args, checkpoint):
    """Run the saved agent, deterministically (the policy mean) or sampling (--eval-sample, on for images), with
    frozen normalization statistics."""
    torch.manual_seed(args.seed)
    video_folder = os.path.join("videos", f"{checkpoint['run_name']}-eval")
    envs = make_envs(args, 1, video_folder, args.seed, film_first=args.eval_episodes)
    columns = envs.num_envs  # 1, or every agent of one game (ManyAgents): the return is an agent's mean
    agent = Agent(envs, args)
    space = envs.single_observation_space
    floats = space.floats if isinstance(space, Packed) else None
    obs_rms = RunningMeanStd(shape=space.shape if floats is None else (floats,))
    restore(checkpoint, {"model": agent, "obs_rms": obs_rms}, args.env_id)  # continuous detail 6: statistics frozen
    action_low, action_high = envs.single_action_space.low, envs.single_action_space.high
    episodic_returns, episode_return, episode_length = [], 0.0, 0
    next_obs, _ = envs.reset(seed=args.seed)
    roles = RoleReturns()  # (Capabilities) a game of roles: each role's mean return too
    memory_state = agent.initial_state(columns)  # the memory's, carried through each episode
    while len(episodic_returns) < args.eval_episodes:
        obs = torch.from_numpy(normalize_obs(next_obs, obs_rms, args, update=False, floats=floats)[None])
        with torch.no_grad():
            hidden, memory_state = agent.remember(obs, memory_state)
            action = agent.policy(hidden, deterministic=not args.eval_sample)[0]  # deterministic: the mean
        next_obs, reward, terminated, truncated, infos = envs.step(np.clip(action.numpy(), action_low, action_high))
        episode_return, episode_length = episode_return + float(reward.mean()), episode_length + 1
        roles.add(infos, reward)
        ended = engine_resets(np.logical_or(terminated, truncated), infos).all()  # every agent has left
        if ended or episode_length == args.eval_max_steps:
            episodic_returns.append(episode_return)
            video = f", {video_folder}/rl-video-episode-{len(episodic_returns) - 1}.mp4" if args.capture_video else ""
            cut = "" if ended else f" (cut at --eval-max-steps {args.eval_max_steps})"
            print(f"episode {len(episodic_returns)}: return {episode_return:.2f}{roles.episode_end()}, "
                  f"{episode_length} steps{cut}{video}", flush=True)
            episode_return, episode_length = 0.0, 0
            if len(episodic_returns) < args.eval_episodes:  # the next episode starts at once, whatever the autoreset
                next_obs, _ = envs.reset()
                memory_state = agent.initial_state(columns)
    envs.close()
    print(f"{args.env_id}: mean return {np.mean(episodic_returns):.2f} ± {np.std(episodic_returns):.2f} over "
          f"{args.eval_episodes} episodes (step {checkpoint['global_step']:,}), "
          f"{'actions sampled from the policy' if args.eval_sample else 'deterministic policy'}")
    roles.summary()
    return episodic_returns


def main():
    for sig in STOP_SIGNALS:  # imports done: until training, a stop raises KeyboardInterrupt (never the env's fault)
        if __name__ == "__main__" and signal.getsignal(sig) is not signal.SIG_IGN:  # (a test's process keeps its own)
            signal.signal(sig, signal.default_int_handler)
    try:
        args, checkpoint = parse_args()
        evaluate(args, checkpoint) if args.eval_checkpoint else train(args, checkpoint)
    except (EnvError, FloatingPointError) as e:  # in evaluation, or closing after training (else: Run.fail_with)
        fail(f"{args.env_id} {e if isinstance(e, EnvError) else f'returned a non-finite {e}'}"
             f"{' during evaluation' if args.eval_checkpoint else ''}")
    except KeyboardInterrupt:  # Ctrl-C before training started (during training it saves a checkpoint instead)
        exit_interrupted()
    except BrokenPipeError:  # the reader of the output went away (`--help | head`): stop quietly, as shell tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the flush at exit finds no closed pipe
        raise SystemExit(1)


if __name__ == "__main__":
    main()

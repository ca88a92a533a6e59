"""PPO for continuous (Box) action spaces, in one file: from Pendulum to MuJoCo Humanoid-v5.

    python ppo_continuous.py --env-id Humanoid-v5
    tensorboard --logdir runs

The script reads top to bottom in the order the data flows: arguments, environments, agent,
normalization, rollout buffer, rollout, GAE, clipped PPO update, logging, checkpoints. Comments of
the form "detail N" name the implementation details of "The 37 Implementation Details of PPO"
(Huang et al., 2022): 1-13 the core ones, "continuous detail N" the 9 for continuous actions.
Episodes run in gymnasium 1.x vector environments with the default NEXT_STEP autoreset; the
transitions that autoreset creates are dropped from the update.
"""

import fcntl
import json
import math
import os
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections import deque
from dataclasses import asdict, dataclass, fields
from typing import Optional

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro
from torch.utils.tensorboard import SummaryWriter


@dataclass
class Args:
    """PPO for Box action spaces. The defaults are CleanRL's MuJoCo settings. For Humanoid-v5 use the README's
    HUMANOID settings, which reach a return of about 4,300 in 1M steps instead of about 600. They also help Ant-v5
    (about 3,200 instead of about 400) and HalfCheetah-v5, and are worse on Walker2d-v5 and Hopper-v5:
    --num-envs 8 --num-steps 256 --num-minibatches 8 --update-epochs 10 --init-log-std -1 --no-clip-vloss --gae-lambda 0.8 --vf-coef 1.0"""

    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment (part of the run folder's name)"""
    seed: int = 1
    """seed of the experiment: same seed, same machine, same results"""
    torch_deterministic: bool = True
    """if toggled, sets `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """if toggled, use the GPU when there is one (falls back to the CPU otherwise)"""
    track: bool = False
    """if toggled, also log to Weights and Biases (needs `pip install wandb`)"""
    wandb_project_name: str = "ppo-single-file"
    """the wandb project name"""
    wandb_entity: Optional[str] = None
    """the entity (team) of the wandb project"""
    capture_video: bool = False
    """if toggled, record videos of env 0 to `videos/` (training) or of every episode (evaluation)"""

    env_id: str = "HalfCheetah-v5"
    """the id of the gymnasium environment (any Box action space)"""
    env_kwargs: str = "{}"
    """keyword arguments of gym.make as JSON, e.g. '{"is_slippery": false}' (FrozenLake-v1), '{"continuous": true}' (LunarLander-v3)"""
    total_timesteps: int = 1000000
    """total environment steps of the run (raise it with --resume to extend a run)"""
    learning_rate: float = 3e-4
    """the learning rate of the optimizer"""
    num_envs: int = 1
    """the number of parallel sub-environments"""
    num_steps: int = 2048
    """the number of steps per sub-environment in each rollout"""
    anneal_lr: bool = True
    """if toggled, anneal the learning rate linearly to 0 over the run"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda of generalized advantage estimation"""
    num_minibatches: int = 32
    """the number of minibatches each rollout is split into"""
    update_epochs: int = 10
    """the number of passes over the rollout in each update"""
    norm_adv: bool = True
    """if toggled, normalize advantages per minibatch"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """if toggled, clip the value loss as in the PPO paper's code"""
    ent_coef: float = 0.0
    """coefficient of the entropy bonus"""
    vf_coef: float = 0.5
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
    """the width of the two hidden layers of the actor and of the critic"""
    init_log_std: float = 0.0
    """the log standard deviation the policy starts with (0: std 1; Humanoid's actions lie in [-0.4, 0.4])"""

    checkpoint_interval: int = 10
    """write `runs/<run>/checkpoint.pt` every this many iterations (and always at the end); 0: only at the end"""
    resume: Optional[str] = None
    """path of a checkpoint to continue; its settings are used, flags given here override them"""
    eval_checkpoint: Optional[str] = None
    """path of a checkpoint to evaluate (the policy mean, or see --eval-sample) for `eval_episodes` episodes, then exit"""
    eval_episodes: int = 10
    """the number of episodes of `--eval-checkpoint`"""
    eval_max_steps: int = 100000
    """an evaluation episode that has not ended after this many steps is cut there (for envs without a time limit)"""
    eval_sample: bool = False
    """if toggled, evaluation samples actions from the policy, as in training, instead of acting deterministically"""


CHECKPOINT_KEYS = {"model", "optimizer", "global_step", "iteration", "args", "run_name", "rng_state", "obs_rms", "return_rms"}

SCRIPT = "ppo_continuous.py"  # recorded in every checkpoint, so that another script's checkpoint is recognized


def fail(message):
    """Bad input or a run that cannot go on: one clear line, no traceback, non-zero exit."""
    raise SystemExit(f"error: {message}")


def check_args(args):
    for name, value in asdict(args).items():  # NaN passes every comparison below, so it is refused first
        if isinstance(value, float) and not math.isfinite(value):
            fail(f"--{name.replace('_', '-')} must be a finite number, got {value}")
    try:
        env_kwargs = json.loads(args.env_kwargs)
    except json.JSONDecodeError as e:
        fail(f"--env-kwargs is not valid JSON ({e}): {args.env_kwargs}")
    if not isinstance(env_kwargs, dict):
        fail(f"--env-kwargs must be a JSON object such as '{{\"is_slippery\": false}}', got {args.env_kwargs}")
    check_env(args, env_kwargs)  # the env's own problems are named before any complaint about sizes
    if not 0 <= args.seed < 2**63:
        fail(f"--seed must lie in [0, 2**63), got {args.seed}")
    positive = ["total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs", "eval_episodes", "eval_max_steps", "hidden_size"]
    for name in positive:
        if getattr(args, name) <= 0:
            fail(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    batch_size = args.num_envs * args.num_steps
    if batch_size % args.num_minibatches != 0:
        fail(f"the batch (num_envs x num_steps = {batch_size}) must divide into --num-minibatches {args.num_minibatches}")
    if args.total_timesteps < batch_size:
        fail(f"--total-timesteps {args.total_timesteps} is smaller than one batch ({batch_size} steps)")
    if batch_size // args.num_minibatches < 2:
        fail(f"minibatches of {batch_size // args.num_minibatches} row cannot be trained on (advantages are normalized per minibatch): lower --num-minibatches")
    if not (0.0 <= args.gamma <= 1.0 and 0.0 <= args.gae_lambda <= 1.0):
        fail("--gamma and --gae-lambda must lie in [0, 1]")
    if args.learning_rate <= 0 or args.clip_coef <= 0 or args.checkpoint_interval < 0:
        fail("--learning-rate and --clip-coef must be positive, --checkpoint-interval not negative")
    if args.max_grad_norm <= 0 or args.vf_coef < 0:
        fail(f"--max-grad-norm must be positive and --vf-coef not negative, got {args.max_grad_norm} and {args.vf_coef}")
    if args.target_kl is not None and args.target_kl <= 0:
        fail(f"--target-kl must be positive (or left out), got {args.target_kl}")


def load_model(agent, checkpoint, env_id):
    """The checkpoint's weights into the agent; a network of another shape (another env) gets one line."""
    try:
        agent.load_state_dict(checkpoint["model"])
    except RuntimeError as e:
        detail = [line.strip() for line in str(e).splitlines()[1:]] or [str(e)]
        fail(f"the checkpoint's network does not fit {env_id}: {detail[0]}")


def load_checkpoint(path):
    if not os.path.isfile(path):
        fail(f"checkpoint not found: {path}")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a truncated or foreign file: report it, never a traceback
        fail(f"cannot read checkpoint {path}: {(str(e).splitlines() or [type(e).__name__])[0]}")
    if not isinstance(checkpoint, dict):
        fail(f"{path} is not a checkpoint of {SCRIPT}")
    owner = checkpoint.get("script", SCRIPT)  # checkpoints written before scripts were recorded pass on to the checks below
    if owner != SCRIPT:
        fail(f"{path} is a checkpoint of {owner}, not of {SCRIPT}: use {owner}")
    if not CHECKPOINT_KEYS <= checkpoint.keys():
        fail(f"{path} is not a checkpoint of {SCRIPT} (expected keys: {', '.join(sorted(CHECKPOINT_KEYS))})")
    unknown = set(checkpoint["args"]) - {field.name for field in fields(Args)} if isinstance(checkpoint["args"], dict) else {"?"}
    if unknown:
        fail(f"{path} is not a checkpoint of {SCRIPT} (unknown settings: {', '.join(sorted(map(str, unknown)))})")
    # a damaged file: settings of the wrong type (an int may stand for a float), counters or random state that are not
    wrong = [field.name for field in fields(Args) if field.name in checkpoint["args"] and field.default is not None
             and type(checkpoint["args"][field.name]) is not type(field.default)
             and not (type(field.default) is float and type(checkpoint["args"][field.name]) is int)]
    wrong += [key for key in ("global_step", "iteration") if type(checkpoint[key]) is not int]
    wrong += [] if isinstance(checkpoint["rng_state"], torch.Tensor) and checkpoint["rng_state"].dtype == torch.uint8 else ["rng_state"]
    wrong += [] if isinstance(checkpoint["model"], dict) else ["model"]
    if wrong:
        fail(f"{path} is damaged: wrong type of {', '.join(wrong)}")
    return checkpoint


def parse_args():
    """Command-line flags; with --resume or --eval-checkpoint the checkpoint's settings are the defaults."""
    args = tyro.cli(Args)
    checkpoint = None
    if args.resume or args.eval_checkpoint:
        checkpoint = load_checkpoint(args.eval_checkpoint or args.resume)
        evaluation = {"capture_video": False, "eval_sample": False} if args.eval_checkpoint else {}  # not the training run's
        saved = Args(**{**checkpoint["args"], **evaluation, "resume": args.resume, "eval_checkpoint": args.eval_checkpoint})
        args = tyro.cli(Args, default=saved)  # parse again: flags given on the command line win
    check_args(args)
    return args, checkpoint


def make_env(env_id, env_kwargs, idx, capture_video, video_folder, film_first=None):
    def thunk():
        if capture_video and idx == 0:
            env = gym.make(env_id, render_mode="rgb_array", **env_kwargs)
            # training keeps gymnasium's schedule (episodes 0, 1, 8, 27, ...); evaluation films its first film_first episodes
            trigger = (lambda episode: episode < film_first) if film_first else None
            env = gym.wrappers.RecordVideo(env, video_folder, episode_trigger=trigger, disable_logger=True)
        else:
            env = gym.make(env_id, **env_kwargs)
        if not isinstance(env.observation_space, gym.spaces.Box) or len(env.observation_space.shape) != 1:
            env = gym.wrappers.FlattenObservation(env)  # images, Dict and Tuple observations become one vector
        return env

    return thunk


def check_env(args, env_kwargs):
    """Make one env before training: an unknown id, keyword arguments it does not take and spaces this
    script cannot train get one line, and the sub-environments are made only once these pass."""
    try:
        env = make_env(args.env_id, env_kwargs, 0, False, None)()
    except Exception as e:  # an unknown id, arguments the env does not take, a simulator or renderer that does not load
        with_kwargs = f" with --env-kwargs '{args.env_kwargs}'" if args.env_kwargs != "{}" else ""
        bad_input = isinstance(e, (gym.error.Error, TypeError, ValueError))  # else the env's own code failed, e.g. its renderer
        renderer = f"; MUJOCO_GL={os.environ['MUJOCO_GL']} is set: can this machine render that way?" if "MUJOCO_GL" in os.environ and not bad_input else ""
        fail(f"cannot make env '{args.env_id}'{with_kwargs}: {type(e).__name__}: {(str(e).splitlines() or [''])[0]}{renderer}")
    action_space, observation_space = env.action_space, env.observation_space
    env.close()
    if not isinstance(action_space, gym.spaces.Box):
        fail(f"{args.env_id} has a {type(action_space).__name__} action space; ppo_continuous.py needs Box (use ppo_discrete.py)")
    if len(action_space.shape) != 1:
        fail(f"{args.env_id} has Box actions of shape {action_space.shape}; ppo_continuous.py takes one-dimensional ones "
             "(reshape them in a wrapper, e.g. gym.wrappers.TransformAction)")
    if not isinstance(observation_space, gym.spaces.Box):
        fail(f"{args.env_id} has a {type(observation_space).__name__} observation space; ppo_continuous.py needs one that flattens into a vector")


def make_envs(args, num_envs, video_folder, film_first=None):
    if args.capture_video and "MUJOCO_GL" not in os.environ and not os.environ.get("DISPLAY"):
        os.environ["MUJOCO_GL"] = "egl"  # render MuJoCo without a display
    if args.capture_video and not os.environ.get("XDG_RUNTIME_DIR"):
        os.environ["XDG_RUNTIME_DIR"] = tempfile.gettempdir()  # else pygame's renderer prints "error: XDG_RUNTIME_DIR is invalid"
    # detail 1: vectorized architecture; gymnasium 1.x default autoreset is NEXT_STEP
    envs = gym.vector.SyncVectorEnv([make_env(args.env_id, json.loads(args.env_kwargs), i, args.capture_video, video_folder, film_first) for i in range(num_envs)])
    return gym.wrappers.vector.RecordEpisodeStatistics(envs)  # logs the raw, unscaled episode returns


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)  # detail 2: orthogonal init, zero biases
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, envs, hidden_size=64, init_log_std=0.0):
        super().__init__()
        obs_dim = int(np.prod(envs.single_observation_space.shape))
        action_dim = int(np.prod(envs.single_action_space.shape))
        # detail 13 / continuous detail 4: separate actor and critic networks, two tanh layers (64-64 by default)
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, hidden_size)),
            nn.Tanh(),
            layer_init(nn.Linear(hidden_size, hidden_size)),
            nn.Tanh(),
            layer_init(nn.Linear(hidden_size, 1), std=1.0),
        )
        self.actor_mean = nn.Sequential(
            layer_init(nn.Linear(obs_dim, hidden_size)),
            nn.Tanh(),
            layer_init(nn.Linear(hidden_size, hidden_size)),
            nn.Tanh(),
            layer_init(nn.Linear(hidden_size, action_dim), std=0.01),
        )
        # continuous detail 2: a state-independent log standard deviation, a learned parameter (starting at 0 by default)
        self.actor_logstd = nn.Parameter(torch.full((1, action_dim), float(init_log_std)))

    def get_value(self, x):
        return self.critic(x)

    def get_action(self, x, action=None):
        """The policy at x: an action (sampled unless given), its log-probability, and the log std."""
        # continuous detail 1: a normal distribution N(mean(x), std) for each action dimension
        mean = self.actor_mean(x)
        log_std = self.actor_logstd.expand_as(mean)
        std = log_std.exp()
        if action is None:
            action = mean + std * torch.randn_like(mean)
        # continuous detail 3: independent dimensions, so the log-probability is the sum over dimensions of log N(a; mean, std)
        logprob = (-0.5 * ((action - mean) / std) ** 2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        return action, logprob, log_std

    def get_action_and_value(self, x, action=None):
        action, logprob, log_std = self.get_action(x, action)
        entropy = (log_std + 0.5 * (1.0 + math.log(2 * math.pi))).sum(-1)  # entropy of the normal, summed over dimensions
        return action, logprob, entropy, self.critic(x)


class RunningMeanStd:
    """Mean and variance of everything seen so far, updated batch by batch (Chan et al.'s parallel formula)."""

    def __init__(self, shape=()):
        self.mean = np.zeros(shape, np.float64)
        self.var = np.ones(shape, np.float64)
        self.count = 1e-4

    def update(self, batch):
        batch_mean, batch_var, batch_count = batch.mean(axis=0), batch.var(axis=0), batch.shape[0]
        delta = batch_mean - self.mean
        total = self.count + batch_count
        self.mean = self.mean + delta * batch_count / total
        self.var = (self.var * self.count + batch_var * batch_count + delta**2 * self.count * batch_count / total) / total
        self.count = total

    def state_dict(self):
        return {"mean": torch.tensor(self.mean), "var": torch.tensor(self.var), "count": float(self.count)}

    def load_state_dict(self, state):
        self.mean, self.var, self.count = state["mean"].numpy().copy(), state["var"].numpy().copy(), state["count"]


def normalize_obs(obs, obs_rms, enabled, update):
    """Continuous details 6 and 7: observation normalization with statistics shared by all sub-envs, then clip.
    update=False uses the statistics without changing them (evaluation)."""
    if not enabled:
        return obs.astype(np.float32)
    if update:
        obs_rms.update(obs)
    return np.clip((obs - obs_rms.mean) / np.sqrt(obs_rms.var + 1e-8), -10.0, 10.0).astype(np.float32)


class RewardScaler:
    """Continuous details 8 and 9: divide rewards by the running std of the discounted return (no mean
    subtracted), then clip. Each sub-env's discounted return restarts at every episode end, truncation included."""

    def __init__(self, num_envs, gamma):
        self.return_rms = RunningMeanStd()
        self.discounted_return = np.zeros(num_envs, np.float64)
        self.gamma = gamma

    def scale(self, reward, real, done):
        """reward, real (the step is a transition, not an autoreset), done (the step ended an episode): [num_envs]."""
        self.discounted_return = self.discounted_return * self.gamma + reward
        if real.any():
            self.return_rms.update(self.discounted_return[real])
        self.discounted_return[done] = 0.0
        return np.clip(reward / np.sqrt(self.return_rms.var + 1e-8), -10.0, 10.0)


def compute_advantages(rewards, values, next_value, terminations, dones, gamma, gae_lambda):
    """Generalized advantage estimation (detail 5) over a [num_steps, num_envs] rollout.

    values[t] is V(obs[t]) and next_value is V of the observation after the last step. Under
    NEXT_STEP autoreset the observation after a step that ended an episode is that episode's true
    final observation, so V(obs[t + 1]) is the right bootstrap for a truncation (time limit).
    A termination has no future: no bootstrap. Any episode end stops the recursion, so advantages
    never flow back across episodes. Each column (sub-environment) is its own sequence.
    """
    num_steps = rewards.shape[0]
    advantages = np.zeros_like(rewards)
    last_advantage = np.zeros_like(next_value)
    for t in reversed(range(num_steps)):
        next_values = next_value if t == num_steps - 1 else values[t + 1]
        delta = rewards[t] + gamma * next_values * (1.0 - terminations[t]) - values[t]
        last_advantage = delta + gamma * gae_lambda * (1.0 - dones[t]) * last_advantage
        advantages[t] = last_advantage
    return advantages


def real_transitions(valid, *rollout):
    """Flatten [num_steps, num_envs] rollout arrays into one batch of the rows with valid == 1.

    The rows with valid == 0 are NEXT_STEP autoreset steps: not transitions of the environment, so
    they get no weight at all in the update (policy, value and entropy losses, advantage statistics).
    """
    keep = valid.reshape(-1) > 0
    return [torch.from_numpy(x.reshape((-1,) + x.shape[2:])[keep]) for x in rollout]


def ppo_loss(agent, obs, actions, old_logprobs, advantages, returns, old_values, args):
    """The clipped PPO loss on one minibatch of real transitions."""
    _, new_logprob, entropy, new_value = agent.get_action_and_value(obs, actions)
    new_value = new_value.view(-1)
    logratio = new_logprob - old_logprobs
    ratio = logratio.exp()

    if args.norm_adv:  # detail 7: normalize advantages per minibatch
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)

    # detail 8: clipped surrogate objective. The ratio pi_new/pi_old is clipped to [1-eps, 1+eps] and the
    # pessimistic (larger) of the two losses is taken, so pushing the ratio past the clip never pays.
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
    pg_loss = torch.max(pg_loss1, pg_loss2).mean()

    if args.clip_vloss:  # detail 9: value loss clipped around the rollout's value estimate
        v_clipped = old_values + torch.clamp(new_value - old_values, -args.clip_coef, args.clip_coef)
        v_loss = 0.5 * torch.max((new_value - returns) ** 2, (v_clipped - returns) ** 2).mean()
    else:
        v_loss = 0.5 * ((new_value - returns) ** 2).mean()
    entropy_loss = entropy.mean()
    loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef  # detail 10: one combined loss

    with torch.no_grad():  # detail 12: debug variables; approx_kl is the k3 estimator
        stats = {
            "policy_loss": pg_loss,
            "value_loss": v_loss,
            "entropy": entropy_loss,
            "old_approx_kl": (-logratio).mean(),
            "approx_kl": ((ratio - 1) - logratio).mean(),
            "clipfrac": ((ratio - 1.0).abs() > args.clip_coef).float().mean(),
        }
    return loss, stats


def save_checkpoint(path, agent, optimizer, args, run_name, global_step, iteration, obs_rms, reward_scaler):
    checkpoint = {
        "model": agent.state_dict(),
        "optimizer": optimizer.state_dict(),
        "global_step": global_step,
        "iteration": iteration,
        "args": asdict(args),
        "run_name": run_name,
        "script": SCRIPT,
        "rng_state": torch.get_rng_state(),
        "cuda_rng_state": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],  # sampling on a GPU draws from these
        "obs_rms": obs_rms.state_dict(),
        "return_rms": reward_scaler.return_rms.state_dict(),
    }
    tmp_path = f"{path}.{os.getpid()}.tmp"  # one temporary file per process
    try:
        torch.save(checkpoint, tmp_path)
        os.replace(tmp_path, path)  # atomic: the previous checkpoint stays whole until the new one is complete
    except (OSError, RuntimeError) as e:  # a folder that cannot be written; a full disk (torch.save raises RuntimeError)
        if os.path.exists(tmp_path):
            os.remove(tmp_path)
        reason = getattr(e, "strerror", None) or "the write failed (is the disk full?)"
        fail(f"cannot write checkpoint {path}: {reason}; the previous checkpoint, if any, is intact")


def print_progress(global_step, total, sps, recent_returns, last_print, final):
    """A one-line progress bar, redrawn in place on a terminal, a plain line about every 30 s otherwise."""
    now = time.time()
    interactive = sys.stdout.isatty()
    if now - last_print < (0.2 if interactive else 30.0) and not final:
        return last_print
    done = int(30 * global_step / total)
    mean_return = f"{np.mean(recent_returns):.1f}" if recent_returns else "-"
    line = f"[{'#' * done}{'.' * (30 - done)}] {global_step:,}/{total:,} steps | {sps:,} SPS | return {mean_return} (last {len(recent_returns)})"
    try:
        print(f"\r{line}" if interactive else line, end="\n" if final or not interactive else "", flush=True)
    except BrokenPipeError:  # the reader of the progress lines went away (`| head`): train on without them
        silence_stdout()
    return now


def silence_stdout():
    """Point stdout at /dev/null, so that later prints and the flush at exit find no closed pipe."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


class EnvError(Exception):
    """The environment raised an exception during a step (its own exception is the __cause__)."""


def print_env_error(error):
    """The env's exception with the frames of its own code (not gymnasium's, not this script's), as Python shows them."""
    ours = (os.path.dirname(gym.__file__), os.path.abspath(__file__))
    frames = [frame for frame in traceback.extract_tb(error.__traceback__) if not os.path.abspath(frame.filename).startswith(ours)]
    print("".join(["\nthe env's error:\n", *traceback.format_list(frames), *traceback.format_exception_only(error)]), end="", file=sys.stderr)


def create_run_dir(base_name):
    """runs/<base_name>, or runs/<base_name>-2, -3, ... if that exists: mkdir is atomic, so two runs
    started in the same second never share a folder."""
    try:
        os.makedirs("runs", exist_ok=True)
    except OSError as e:
        fail(f"cannot create the folder runs/ for this run: {e.strerror or e}")
    name, number = base_name, 1
    while True:
        try:
            os.mkdir(os.path.join("runs", name))
            return name
        except FileExistsError:
            number += 1
            name = f"{base_name}-{number}"
        except OSError as e:
            fail(f"cannot create the run folder runs/{name}: {e.strerror or e}")


def lock_run(run_dir):
    """An exclusive lock on the run folder while this process trains it: a second process gets one line instead of
    writing the same checkpoint and TensorBoard run. The operating system releases it when the process ends."""
    try:
        lock = open(os.path.join(run_dir, "train.lock"), "w")
    except OSError as e:
        fail(f"cannot write in the run folder {run_dir}: {e.strerror or e}")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        fail(f"another process is training {run_dir}; resume it once that process has stopped")
    return lock


def train(args, checkpoint=None):
    batch_size = args.num_envs * args.num_steps
    num_iterations = args.total_timesteps // batch_size
    env_name = args.env_id.replace("/", "-")  # namespaced ids (ALE/Pong-v5) would otherwise nest folders
    global_step = checkpoint["global_step"] if checkpoint else 0
    start_iteration = checkpoint["iteration"] + 1 if checkpoint else 1
    if checkpoint and (args.num_envs, args.num_steps) != (checkpoint["args"]["num_envs"], checkpoint["args"]["num_steps"]):
        fail(f"a resumed run keeps its batch: the checkpoint was trained with --num-envs {checkpoint['args']['num_envs']} "
             f"--num-steps {checkpoint['args']['num_steps']}")
    if start_iteration > num_iterations:
        fail(f"the checkpoint is at step {global_step}: pass a --total-timesteps beyond it to extend the run")
    total_timesteps = num_iterations * batch_size  # the run takes whole batches
    if total_timesteps != args.total_timesteps:
        print(f"note: --total-timesteps {args.total_timesteps:,} is rounded down to whole batches of {batch_size:,}: {total_timesteps:,} steps")
    if checkpoint:  # a resumed run continues in the folder of its checkpoint, wherever it is started from
        run_name, run_dir = checkpoint["run_name"], os.path.dirname(args.resume) or "."
    else:
        run_name = create_run_dir(f"{env_name}__{args.exp_name}__{args.seed}__{int(time.time())}")
        run_dir = os.path.join("runs", run_name)
    run_lock = lock_run(run_dir)
    checkpoint_path = os.path.join(run_dir, "checkpoint.pt")

    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.set_num_threads(1)  # a 64-64 MLP runs fastest on one thread; more threads only add overhead
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    envs = make_envs(args, args.num_envs, os.path.join("videos", run_name))
    agent = Agent(envs, args.hidden_size, args.init_log_std).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)  # detail 3: eps 1e-5
    if checkpoint:
        load_model(agent, checkpoint, args.env_id)
        optimizer.load_state_dict(checkpoint["optimizer"])
        torch.set_rng_state(checkpoint["rng_state"])
        if checkpoint.get("cuda_rng_state") and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(checkpoint["cuda_rng_state"])
    obs_rms = RunningMeanStd(envs.single_observation_space.shape)
    reward_scaler = RewardScaler(args.num_envs, args.gamma)
    if checkpoint:  # continuous detail 6: the normalization statistics continue with the run
        obs_rms.load_state_dict(checkpoint["obs_rms"])
        reward_scaler.return_rms.load_state_dict(checkpoint["return_rms"])

    if args.track:
        try:
            import wandb
        except ImportError:
            fail("--track needs wandb: pip install wandb")
        wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, sync_tensorboard=True, config=asdict(args),
                   name=run_name, id=run_name, resume="allow", save_code=True)
    # TensorBoard writes from a thread; a failed write is said once, in one line, by the OSError handler below
    threading.excepthook = lambda hook: None if isinstance(hook.exc_value, OSError) else threading.__excepthook__(hook)
    # purge_step: on resume, TensorBoard drops whatever the interrupted run logged after its checkpoint
    writer = SummaryWriter(run_dir, purge_step=global_step + 1 if checkpoint else None)
    writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in asdict(args).items()))

    # Rollout buffer, [num_steps, num_envs]: each column is one sub-environment's sequence in time.
    obs_shape = envs.single_observation_space.shape
    obs = np.zeros((args.num_steps, args.num_envs) + obs_shape, dtype=np.float32)
    actions = np.zeros((args.num_steps, args.num_envs) + envs.single_action_space.shape, dtype=np.float32)
    logprobs = np.zeros((args.num_steps, args.num_envs), dtype=np.float32)
    rewards = np.zeros((args.num_steps, args.num_envs), dtype=np.float32)
    terminations = np.zeros((args.num_steps, args.num_envs), dtype=np.float32)
    dones = np.zeros((args.num_steps, args.num_envs), dtype=np.float32)
    valid = np.zeros((args.num_steps, args.num_envs), dtype=np.float32)

    stop_signal = []  # Ctrl-C / SIGTERM: finish the iteration, save, exit
    handlers = {sig: signal.signal(sig, lambda signum, frame: stop_signal.append(signum)) for sig in (signal.SIGINT, signal.SIGTERM)}
    recent_returns = deque(maxlen=20)
    start_time, start_step, last_print = time.time(), global_step, 0.0
    # A resumed run starts fresh episodes, seeded apart from the original run's first ones.
    next_obs, _ = envs.reset(seed=args.seed + start_iteration - 1)
    next_obs = normalize_obs(next_obs, obs_rms, args.norm_obs, update=True)
    action_low, action_high = envs.single_action_space.low, envs.single_action_space.high
    next_done = np.zeros(args.num_envs, dtype=np.float32)

    completed_step, completed_iteration = global_step, start_iteration - 1  # where the last complete iteration ended
    try:
        for iteration in range(start_iteration, num_iterations + 1):
            if args.anneal_lr:  # detail 4: learning rate falls linearly to 0 at the last iteration
                frac = 1.0 - (iteration - 1.0) / num_iterations
                optimizer.param_groups[0]["lr"] = frac * args.learning_rate

            # Rollout: num_steps steps in every sub-environment with the current policy.
            for step in range(args.num_steps):
                global_step += args.num_envs
                obs[step] = next_obs
                # NEXT_STEP autoreset: the step after an episode ended only resets that sub-env (action ignored,
                # reward 0). It is not a real transition, so it gets valid = 0 and no weight in the update.
                valid[step] = 1.0 - next_done
                with torch.no_grad():
                    action, logprob, _ = agent.get_action(torch.from_numpy(obs[step]).to(device))
                actions[step] = action.cpu().numpy()
                logprobs[step] = logprob.cpu().numpy()

                # continuous detail 5: the env gets the action clipped to its bounds; the buffer keeps the sampled one
                try:
                    next_obs, reward, terminated, truncated, infos = envs.step(np.clip(actions[step], action_low, action_high))
                except Exception as e:  # the env crashed: save what was learned, then show the env's error
                    raise EnvError() from e
                if not np.isfinite(next_obs).all() or not np.isfinite(reward).all():
                    raise FloatingPointError("observation" if not np.isfinite(next_obs).all() else "reward")
                next_done = np.logical_or(terminated, truncated).astype(np.float32)
                next_obs = normalize_obs(next_obs, obs_rms, args.norm_obs, update=True)
                if args.norm_reward:
                    reward = reward_scaler.scale(reward, real=valid[step] > 0, done=next_done > 0)
                rewards[step] = reward
                terminations[step] = terminated
                dones[step] = next_done

                if "episode" in infos:
                    for i in np.flatnonzero(infos["_episode"]):
                        recent_returns.append(float(infos["episode"]["r"][i]))
                        writer.add_scalar("charts/episodic_return", infos["episode"]["r"][i], global_step)
                        writer.add_scalar("charts/episodic_length", infos["episode"]["l"][i], global_step)

            # The critic is fixed during the rollout, so its values are computed in one batch afterwards:
            # V(obs[t]) for every row, and V(next_obs) to bootstrap the last step.
            with torch.no_grad():
                values = agent.get_value(torch.from_numpy(obs).to(device)).view(args.num_steps, args.num_envs).cpu().numpy()
                next_value = agent.get_value(torch.as_tensor(next_obs, dtype=torch.float32, device=device)).view(-1).cpu().numpy()
            advantages = compute_advantages(rewards, values, next_value, terminations, dones, args.gamma, args.gae_lambda)
            returns = advantages + values  # detail 5: the value target is advantage + value

            # Flatten the rollout into one batch, keeping the real transitions only (autoreset rows dropped).
            b_obs, b_actions, b_logprobs, b_advantages, b_returns, b_values = (
                x.to(device) for x in real_transitions(valid, obs, actions, logprobs, advantages, returns, values)
            )

            # Update: update_epochs passes over the batch in shuffled minibatches.
            clipfracs = []
            for epoch in range(args.update_epochs):
                # detail 6: a fresh shuffle each epoch; the minibatches together cover the whole batch
                for mb in torch.randperm(len(b_obs), device=device).tensor_split(args.num_minibatches):
                    loss, stats = ppo_loss(agent, b_obs[mb], b_actions[mb], b_logprobs[mb], b_advantages[mb], b_returns[mb], b_values[mb], args)
                    if not torch.isfinite(loss):
                        raise FloatingPointError("loss")
                    optimizer.zero_grad()
                    loss.backward()
                    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)  # detail 11: global gradient clip
                    optimizer.step()
                    clipfracs.append(stats["clipfrac"])
                if args.target_kl is not None and stats["approx_kl"] > args.target_kl:
                    break
            completed_step, completed_iteration = global_step, iteration  # the update is done: nothing of it is lost from here

            # Logging: the last minibatch's losses (as CleanRL does), clipfrac averaged over the update.
            var_y = b_returns.var().item()
            explained_var = np.nan if var_y == 0 else 1 - (b_returns - b_values).var().item() / var_y
            sps = int((global_step - start_step) / (time.time() - start_time))
            writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
            for name in ("value_loss", "policy_loss", "entropy", "old_approx_kl", "approx_kl"):
                writer.add_scalar(f"losses/{name}", stats[name].item(), global_step)
            writer.add_scalar("losses/clipfrac", torch.stack(clipfracs).mean().item(), global_step)
            writer.add_scalar("losses/explained_variance", explained_var, global_step)
            writer.add_scalar("charts/SPS", sps, global_step)
            last_print = print_progress(global_step, total_timesteps, sps, recent_returns, last_print, iteration == num_iterations)

            if iteration == num_iterations or stop_signal or (args.checkpoint_interval and iteration % args.checkpoint_interval == 0):
                writer.flush()  # the TensorBoard events reach the disk with each checkpoint (a failed write surfaces here)
                save_checkpoint(checkpoint_path, agent, optimizer, args, run_name, global_step, iteration, obs_rms, reward_scaler)
            if stop_signal and iteration < num_iterations:  # a signal during the last iteration: the run is finished
                print(f"\nstopped at step {global_step:,}; checkpoint saved. Resume with: python {sys.argv[0]} --resume {checkpoint_path}")
                raise SystemExit(128 + stop_signal[0])
    except EnvError as e:  # keep what the run learned up to its last complete iteration
        save_checkpoint(checkpoint_path, agent, optimizer, args, run_name, completed_step, completed_iteration, obs_rms, reward_scaler)
        print_env_error(e.__cause__)
        fail(f"{args.env_id} raised {type(e.__cause__).__name__} at global step {global_step}; checkpoint of the last complete "
             f"iteration (step {completed_step}) saved. Resume with: python {sys.argv[0]} --resume {checkpoint_path}")
    except FloatingPointError as e:  # caught before the optimizer step: the weights are still finite, so keep them
        if completed_step == start_step:
            fail(f"non-finite {e} at global step {global_step}, in the first iteration of this start: nothing new to save")
        save_checkpoint(checkpoint_path, agent, optimizer, args, run_name, completed_step, completed_iteration, obs_rms, reward_scaler)
        fail(f"non-finite {e} at global step {global_step}; checkpoint of the last complete iteration (step {completed_step}) saved: {checkpoint_path}")
    except OSError as e:  # TensorBoard's events could not be written (a full disk): keep what was learned
        if completed_step > start_step:
            save_checkpoint(checkpoint_path, agent, optimizer, args, run_name, completed_step, completed_iteration, obs_rms, reward_scaler)
        saved = f"checkpoint of the last complete iteration (step {completed_step}) saved: {checkpoint_path}" if completed_step > start_step else "nothing new to save"
        fail(f"cannot write the TensorBoard events in {run_dir}: {e.strerror or e}; {saved}")
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        envs.close()
        try:
            writer.close()
        except OSError:  # a failed write was reported above
            pass
        run_lock.close()
    print(f"done: {global_step:,} steps; checkpoint at {checkpoint_path}")
    return checkpoint_path


def evaluate(args, checkpoint):
    """Run the saved agent deterministically (the policy mean) with frozen normalization statistics."""
    torch.manual_seed(args.seed)
    video_folder = os.path.join("videos", f"{checkpoint['run_name']}-eval")
    envs = make_envs(args, 1, video_folder, film_first=args.eval_episodes)
    agent = Agent(envs, args.hidden_size, args.init_log_std)
    load_model(agent, checkpoint, args.env_id)
    obs_rms = RunningMeanStd(envs.single_observation_space.shape)
    obs_rms.load_state_dict(checkpoint["obs_rms"])  # continuous detail 6: the training statistics, frozen
    action_low, action_high = envs.single_action_space.low, envs.single_action_space.high
    episodic_returns, cut_episodes = [], 0
    episode_return, episode_length = 0.0, 0
    next_obs, _ = envs.reset(seed=args.seed)
    while len(episodic_returns) < args.eval_episodes:
        obs = normalize_obs(next_obs, obs_rms, args.norm_obs, update=False)
        with torch.no_grad():
            action = agent.get_action(torch.from_numpy(obs))[0] if args.eval_sample else agent.actor_mean(torch.from_numpy(obs))
        next_obs, reward, terminated, truncated, _ = envs.step(np.clip(action.numpy(), action_low, action_high))
        episode_return, episode_length = episode_return + float(reward[0]), episode_length + 1
        if terminated[0] or truncated[0] or episode_length == args.eval_max_steps:
            cut_episodes += not (terminated[0] or truncated[0])
            episodic_returns.append(episode_return)
            episode_return, episode_length = 0.0, 0
            if len(episodic_returns) < args.eval_episodes:  # the next episode starts at once, whatever the autoreset mode
                next_obs, _ = envs.reset()
    envs.close()
    print(f"{args.env_id}: mean return {np.mean(episodic_returns):.2f} ± {np.std(episodic_returns):.2f} over {args.eval_episodes} episodes (step {checkpoint['global_step']:,}), "
          f"{'actions sampled from the policy' if args.eval_sample else 'deterministic policy'}")
    if cut_episodes:
        print(f"{cut_episodes} of them cut at --eval-max-steps {args.eval_max_steps} (the env did not end them)")
    if args.capture_video:
        print(f"videos in {video_folder}")
    return episodic_returns


def main():
    try:
        args, checkpoint = parse_args()
        if args.eval_checkpoint:
            evaluate(args, checkpoint)
        else:
            train(args, checkpoint)
    except KeyboardInterrupt:  # Ctrl-C before training started (during training it saves a checkpoint instead)
        raise SystemExit("interrupted")
    except BrokenPipeError:  # the reader of the output went away (`--help | head`): stop quietly, as shell tools do
        silence_stdout()
        raise SystemExit(1)


if __name__ == "__main__":
    main()

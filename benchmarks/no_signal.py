"""The no-signal test bed (issue 47): what narrows the policy's std when there is nothing to learn.

A gymnasium MuJoCo body whose reward is always 0 (its episodes end as before) is registered as
`NoSignal-<Body>` (e.g. NoSignal-HalfCheetah-v5). The bare script trains on it as any env:

    python ppo_continuous.py --env-id benchmarks.no_signal:NoSignal-HalfCheetah-v5 --total-timesteps 500000

Run as a tool, it trains ppo_continuous.py in this process with one change at a time (an experiment, below)
and prints the log std per action dimension (its mean over the dimensions) as the run goes, then one result line:

    python benchmarks/no_signal.py --experiment baseline --env-id NoSignal-HalfCheetah-v5 --total-timesteps 500000

An experiment changes one thing of what PPO computes by replacing a piece of the imported script (nothing in the
script itself changes); extra flags go to the script (e.g. --init-log-std -0.5). The result line goes to stdout
and, with --csv, is appended to that file.
"""

import argparse
import contextlib
import copy
import csv
import os
import sys

import gymnasium as gym
import numpy as np


class NoReward(gym.Wrapper):
    """The body's own dynamics, terminations and time limit; every reward 0."""

    def step(self, action):
        obs, _, terminated, truncated, info = self.env.step(action)
        return obs, 0.0, terminated, truncated, info


BODIES = ("HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5", "Humanoid-v5")
for body in BODIES:
    gym.register(f"NoSignal-{body}", entry_point=lambda body=body, **kwargs: NoReward(gym.make(body, **kwargs)))


def experiments(ppo):
    """name: (what it changes, a function that changes it in the imported script `ppo`, script flags)."""
    original_loss, original_transitions = ppo.ppo_loss, ppo.real_transitions
    live = {}  # the agent being trained, and its copy as it was when the rollout was collected

    class Agent(ppo.Agent):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            live["agent"] = self

    def shuffled_advantages():
        generator = np.random.default_rng(0)
        def real_transitions(valid, **rollout):
            batch = original_transitions(valid, **rollout)
            advantages = batch["advantages"]
            batch["advantages"] = advantages[generator.permutation(len(advantages))]  # independent of the actions
            return batch
        ppo.real_transitions = real_transitions

    def freeze(part):
        def change():
            class Frozen(Agent):
                def __init__(self, *args, **kwargs):
                    super().__init__(*args, **kwargs)
                    getattr(self, part).requires_grad_(False)  # Adam skips a parameter without a gradient
            ppo.Agent = Frozen
        return change

    def sgd_log_std():
        import torch

        class AdamWithSgdLogStd(torch.optim.Adam):
            """Adam for every parameter but the log std, which takes a plain SGD step at the same learning rate."""

            def step(self, closure=None):
                log_std = live["agent"].actor_logstd
                grad, log_std.grad = log_std.grad, None
                super().step(closure)
                with torch.no_grad():
                    log_std -= self.param_groups[0]["lr"] * grad
                log_std.grad = grad

        ppo.torch.optim.Adam = AdamWithSgdLogStd

    def snapshot_per_update():
        """The rollout's network, copied once per update (real_transitions runs once, right before it)."""
        def real_transitions(valid, **rollout):
            live["old"] = copy.deepcopy(live["agent"]).requires_grad_(False)
            return original_transitions(valid, **rollout)
        ppo.real_transitions = real_transitions
        ppo.Agent = Agent

    def logprob(actions, mean, log_std):
        """The Gaussian policy's log-probability of the actions, summed over the action dimensions."""
        density = (-0.5 * ((actions - mean) / log_std.exp()) ** 2 - log_std).sum(-1)
        return density - 0.5 * np.log(2 * np.pi) * mean.shape[-1]

    def clipped_surrogate(new_logprob, old_logprobs, advantages, args):
        """PPO's clipped surrogate loss for these log-probabilities, advantages normalized as the script does."""
        import torch
        if args.norm_adv:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        ratio = (new_logprob - old_logprobs).exp()
        clipped = torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
        return torch.max(-advantages * ratio, -advantages * clipped).mean()

    def policies(agent, hidden):
        """The new policy's mean and log std at the features (here the observations), and the rollout policy's, each
        of shape [batch, action dims]."""
        old = live["old"]
        mean, old_mean = agent.actor(hidden), old.actor(hidden)
        return mean, old_mean, agent.actor_logstd.expand_as(mean), old.actor_logstd.expand_as(mean)

    def decoupled():
        """PPO-CMA / MPO: the mean's surrogate at the rollout's std, the std's surrogate at the rollout's mean."""
        snapshot_per_update()

        def ppo_loss(agent, hidden, mb, coefs, args):
            loss, stats = original_loss(agent, hidden, mb, coefs, args)
            mean, old_mean, log_std, old_log_std = policies(agent, hidden)
            surrogate, actions = 0.0, mb["actions"]
            for new_logprob in (logprob(actions, mean, old_log_std), logprob(actions, old_mean, log_std)):
                surrogate = surrogate + clipped_surrogate(new_logprob, mb["logprobs"], mb["advantages"], args)
            return loss - stats["policy_loss"] + surrogate, stats  # the joint surrogate replaced by the two
        ppo.ppo_loss = ppo_loss

    def held_out(by_env):
        """The mean's surrogate on one half of each batch, at today's std; the std's on the other half, at the mean
        as the first half moves it: the std never meets a mean fitted to its own samples' advantages. The halves
        are rows drawn at random, or (by_env) half of the sub-environments, whose episodes share no advantages."""
        import torch
        split, randperm, generator = {}, torch.randperm, torch.Generator().manual_seed(0)

        def real_transitions(valid, **rollout):
            batch = original_transitions(valid, **rollout)
            if by_env:  # each kept row's sub-environment, in the order real_transitions keeps them
                env = np.tile(np.arange(valid.shape[1]), valid.shape[0])[valid.reshape(-1) > 0]
                std_envs = randperm(valid.shape[1], generator=generator)[: valid.shape[1] // 2].numpy()
                split["std_rows"] = torch.from_numpy(np.isin(env, std_envs))
            else:
                split["std_rows"] = randperm(len(batch["obs"]), generator=generator) < len(batch["obs"]) // 2
            return batch

        def recorded_randperm(n, **kwargs):  # train() draws each epoch's minibatches with it
            split["perm"], split["minibatch"] = randperm(n, **kwargs), 0
            return split["perm"]

        def ppo_loss(agent, hidden, mb, coefs, args):
            loss, stats = original_loss(agent, hidden, mb, coefs, args)
            num_minibatches = max(1, min(args.num_minibatches, len(split["perm"]) // 2))  # as train() splits
            rows = split["perm"].tensor_split(num_minibatches)[split["minibatch"]]
            split["minibatch"] += 1
            std_rows = split["std_rows"][rows].unsqueeze(-1)
            mean = agent.actor(hidden)
            log_std = agent.actor_logstd.expand_as(mean)
            mean = torch.where(std_rows, mean.detach(), mean)
            log_std = torch.where(std_rows, log_std, log_std.detach())
            surrogate = clipped_surrogate(logprob(mb["actions"], mean, log_std), mb["logprobs"], mb["advantages"], args)
            return loss - stats["policy_loss"] + surrogate, stats

        def change():
            ppo.real_transitions, ppo.ppo_loss, ppo.torch.randperm = real_transitions, ppo_loss, recorded_randperm
            ppo.Agent = Agent
        return change

    def kl_penalty(coef):
        """Sample Factory: a penalty on the KL divergence from the rollout's policy (exact, for two Gaussians)."""
        def change():
            snapshot_per_update()

            def ppo_loss(agent, hidden, mb, coefs, args):
                loss, stats = original_loss(agent, hidden, mb, coefs, args)
                mean, old_mean, log_std, old_log_std = policies(agent, hidden)
                kl = (log_std - old_log_std + ((2 * old_log_std).exp() + (old_mean - mean) ** 2)
                      / (2 * (2 * log_std).exp()) - 0.5).sum(-1).mean()
                return loss + coef * kl, stats
            ppo.ppo_loss = ppo_loss
        return change

    def nothing():
        ppo.Agent = Agent

    return {
        "baseline": ("today's update, the bare command", nothing, []),
        "shuffled": ("advantages shuffled across the batch", lambda: (nothing(), shuffled_advantages()), []),
        "no-norm-adv": ("advantages not normalized", nothing, ["--no-norm-adv"]),
        "no-clip": ("no clipping (clip 1e9)", nothing, ["--clip-coef", "1e9"]),
        "mean-frozen": ("only the std updated", freeze("actor"), []),
        "std-frozen": ("only the mean updated", freeze("actor_logstd"), []),
        "sgd-log-std": ("plain SGD for the log std", lambda: (nothing(), sgd_log_std()), []),
        "one-epoch": ("one epoch, one minibatch: one step per rollout", nothing,
                      ["--update-epochs", "1", "--num-minibatches", "1"]),
        "epochs-1": ("one epoch of 8 minibatches: 8 steps per rollout, no sample used twice", nothing,
                     ["--update-epochs", "1"]),
        "minibatches-1": ("10 epochs of one minibatch: 10 steps per rollout, each on the whole batch", nothing,
                          ["--num-minibatches", "1"]),
        "decoupled": ("mean at the rollout's std, std at the rollout's mean", decoupled, []),
        "held-out": ("the std's surrogate on half the batch, at the mean the other half trains", held_out(False), []),
        "held-out-envs": ("the same, the halves half of the sub-environments each", held_out(True), []),
        "kl-0.1": ("KL penalty to the rollout's policy, 0.1", kl_penalty(0.1), []),
        "kl-1": ("KL penalty to the rollout's policy, 1.0", kl_penalty(1.0), []),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experiment", default="baseline")
    parser.add_argument("--env-id", default="NoSignal-HalfCheetah-v5")
    parser.add_argument("--csv", help="append the result line to this CSV file")
    options, flags = parser.parse_known_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, root)
    import ppo_continuous as ppo

    table = experiments(ppo)
    if options.experiment not in table:
        raise SystemExit(f"error: --experiment must be one of {', '.join(table)}")
    what, change, experiment_flags = table[options.experiment]
    change()
    sys.argv = [sys.argv[0], "--env-id", options.env_id, "--exp-name", f"no_signal_{options.experiment}",
                *experiment_flags, *flags]
    args, checkpoint = ppo.parse_args()
    trace = []  # (step, mean log std over the action dimensions)
    end_iteration = ppo.Run.end_iteration

    def logged_end_iteration(run, iteration, global_step, *logged):
        log_std = run.state["model"].actor_logstd.detach().view(-1).numpy()
        if not trace:
            trace.append((0, float(args.init_log_std)))
        trace.append((global_step, float(log_std.mean())))
        if iteration % 25 == 0:
            print(f"step {global_step}: log std per dimension {np.round(log_std, 3).tolist()}", flush=True)
        return end_iteration(run, iteration, global_step, *logged)

    ppo.Run.end_iteration = logged_end_iteration
    with contextlib.redirect_stdout(sys.stderr):
        ppo.train(args, checkpoint)
    steps = np.array([step for step, _ in trace])
    means = np.array([value for _, value in trace])
    halfway = means[np.searchsorted(steps, steps[-1] / 2)]
    row = {"experiment": options.experiment, "env_id": options.env_id, "seed": args.seed, "steps": int(steps[-1]),
           "flags": " ".join(experiment_flags + flags), "start": round(means[0], 4),
           "halfway": round(float(halfway), 4), "end": round(float(means[-1]), 4),
           "drift": round(float(means[-1] - means[0]), 4)}
    print(", ".join(f"{key} {value}" for key, value in row.items()), f"({what})", flush=True)
    if options.csv:
        new = not os.path.exists(options.csv)
        with open(options.csv, "a", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=list(row))
            if new:
                writer.writeheader()
            writer.writerow(row)


if __name__ == "__main__":
    main()

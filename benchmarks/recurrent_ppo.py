"""sb3-contrib's RecurrentPPO at rl-baselines3-zoo's settings for each NoVel env (hyperparams/ppo_lstm.yml), the peer
of `--recurrent lstm` (issue 68). Its envs are benchmarks/novel.py's. Prints the mean return of the last 100 training
episodes at the given step counts, and the deterministic evaluation of the final policy.

    pip install -r requirements.txt -r benchmarks/requirements.txt
    python benchmarks/recurrent_ppo.py --env-id CartPoleNoVel-v1 --total-timesteps 200000 --seed 1
"""

import argparse
import os
import sys
import time

import numpy as np
import torch
from sb3_contrib import RecurrentPPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import VecNormalize

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import novel  # noqa: E402, F401  registers the NoVel envs


def linear(start):
    return lambda progress: progress * start  # the zoo's lin_<x>: x at the start, 0 at the end


ZOO_POLICY = dict(ortho_init=False, activation_fn=torch.nn.ReLU, lstm_hidden_size=64, enable_critic_lstm=True,
                  net_arch=dict(pi=[64], vf=[64]))
LUNAR = dict(n_envs=32, n_steps=512, batch_size=128, gae_lambda=0.98, gamma=0.999, n_epochs=4, ent_coef=0.01,
             policy_kwargs=ZOO_POLICY)
ZOO = {  # normalize: True for each (VecNormalize of observations and rewards)
    "CartPoleNoVel-v1": dict(n_envs=8, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20,
                             ent_coef=0.0, learning_rate=linear(1e-3), clip_range=linear(0.2),
                             policy_kwargs=ZOO_POLICY),
    "PendulumNoVel-v1": dict(n_envs=4, n_steps=1024, gae_lambda=0.95, gamma=0.9, n_epochs=10, ent_coef=0.0,
                             learning_rate=1e-3, clip_range=0.2, use_sde=True, sde_sample_freq=4,
                             policy_kwargs=ZOO_POLICY),
    "LunarLanderNoVel-v3": LUNAR,
    "LunarLanderContinuousNoVel-v3": LUNAR,
    "MountainCarContinuousNoVel-v0": dict(n_envs=8, n_steps=1024, batch_size=256, gamma=0.9999, learning_rate=7.77e-5,
                                          ent_coef=0.00429, clip_range=0.1, n_epochs=10, gae_lambda=0.9,
                                          max_grad_norm=5, vf_coef=0.19, use_sde=True, sde_sample_freq=8,
                                          policy_kwargs=dict(log_std_init=0.0, ortho_init=False, lstm_hidden_size=32,
                                                             enable_critic_lstm=True, net_arch=dict(pi=[64], vf=[64]))),
}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--env-id", default="CartPoleNoVel-v1", choices=sorted(ZOO))
    parser.add_argument("--total-timesteps", type=int, default=200000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--report-at", type=int, nargs="*", default=[])
    cli = parser.parse_args()
    start = time.time()
    torch.set_num_threads(1)
    settings = dict(ZOO[cli.env_id])
    envs = VecNormalize(make_vec_env(cli.env_id, n_envs=settings.pop("n_envs"), seed=cli.seed))
    model = RecurrentPPO("MlpLstmPolicy", envs, seed=cli.seed, device="cpu", **settings)
    model.learn(total_timesteps=cli.total_timesteps)
    # every training episode's return and the step it ended at (all sub-envs step together), from each Monitor
    monitors, ends, returns = envs.venv.envs, [], []
    for monitor in monitors:
        ends.extend(np.cumsum(monitor.get_episode_lengths()) * len(monitors))
        returns.extend(monitor.get_episode_rewards())
    order = np.argsort(ends, kind="stable")
    ends, returns = np.asarray(ends)[order], np.asarray(returns)[order]
    report = [f"{np.mean(returns[ends <= s][-100:]):.2f} at {s:,}" for s in [*cli.report_at, cli.total_timesteps]]
    envs.training, envs.norm_reward = False, False
    mean, std = evaluate_policy(model, envs, n_eval_episodes=10, deterministic=True)
    print(f"{cli.env_id} RecurrentPPO seed {cli.seed}: last-100 mean {', '.join(report)}; deterministic evaluation "
          f"{mean:.2f} ± {std:.2f} (10 episodes); {time.time() - start:.0f} s")

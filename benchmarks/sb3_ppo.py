"""Stable-Baselines3 PPO with the same settings as this project's scripts, for speed comparisons.

    pip install -r benchmarks/requirements.txt
    python benchmarks/sb3_ppo.py --env-id CartPole-v1 --total-timesteps 100000
    python benchmarks/sb3_ppo.py --env-id Hopper-v5 --cleanrl --total-timesteps 100000
    python benchmarks/sb3_ppo.py --env-id Humanoid-v5 --continuous --total-timesteps 1000000 --monitor-dir sb3_humanoid
"""

import argparse
import os
import sys

import torch.nn as nn
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import VecNormalize

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ppo_continuous import ENV_DEFAULTS, gae_lambda_for  # noqa: E402

# The defaults of ppo_discrete.py and of ppo_continuous.py (no value clipping, initial std exp(-1) or its ENV_DEFAULTS',
# GAE's lambda from the action dimensions, ppo_continuous.gae_lambda_for, when gae_lambda is None), and CleanRL's
# MuJoCo settings (benchmarks/common.py SETTINGS["CLEANRL"]). vf_coef in our scripts' units (their value loss is
# vf_coef * 0.5 * squared error, SB3's vf_coef * squared error).
DISCRETE = dict(num_envs=8, n_steps=128, num_minibatches=8, n_epochs=9, learning_rate=1.88e-3, ent_coef=2.7e-5,
                gae_lambda=0.99, clip_range=0.1, clip_range_vf=0.1, log_std_init=0.0, vf_coef=0.687, max_grad_norm=0.3)
CONTINUOUS = dict(num_envs=8, n_steps=256, num_minibatches=8, n_epochs=10, learning_rate=3e-4, ent_coef=0.0,
                  gae_lambda=None, clip_range=0.2, clip_range_vf=None, log_std_init=-1.0, vf_coef=1.0, max_grad_norm=0.5)
CLEANRL = dict(num_envs=1, n_steps=2048, num_minibatches=32, n_epochs=10, learning_rate=3e-4, ent_coef=0.0,
               gae_lambda=0.95, clip_range=0.2, clip_range_vf=0.2, log_std_init=0.0, vf_coef=0.5, max_grad_norm=0.5)

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--env-id", default="CartPole-v1")
    parser.add_argument("--continuous", action="store_true", help="ppo_continuous.py's defaults, with observation and reward normalization")
    parser.add_argument("--cleanrl", action="store_true", help="CleanRL's MuJoCo settings (README: CLEANRL), with normalization")
    parser.add_argument("--vf-coef", type=float, default=None, help="the value loss's weight in our scripts' units "
                        "(default: that of the chosen settings); SB3 gets half of it, which weighs the same")
    parser.add_argument("--total-timesteps", type=int, default=100000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--monitor-dir", default=None, help="write every episode's return, length and time to <dir>/<env>.monitor.csv")
    cli = parser.parse_args()

    config = CLEANRL if cli.cleanrl else CONTINUOUS if cli.continuous else DISCRETE
    if cli.continuous and cli.env_id in ENV_DEFAULTS:  # the settings ppo_continuous.py takes for this env
        config = {**config, "log_std_init": ENV_DEFAULTS[cli.env_id]["init_log_std"]}
    envs = make_vec_env(cli.env_id, n_envs=config["num_envs"], seed=cli.seed, monitor_dir=cli.monitor_dir)
    if cli.continuous or cli.cleanrl:  # running mean/std of observations and of the discounted return, both clipped to [-10, 10]
        envs = VecNormalize(envs, norm_obs=True, norm_reward=True, clip_obs=10.0, clip_reward=10.0, gamma=0.99)
    batch_size = config["num_envs"] * config["n_steps"]
    model = PPO(
        "MlpPolicy",
        envs,
        n_steps=config["n_steps"],
        batch_size=batch_size // config["num_minibatches"],
        n_epochs=config["n_epochs"],
        learning_rate=lambda progress: progress * config["learning_rate"],  # linear annealing, as ours
        gamma=0.99,
        gae_lambda=gae_lambda_for(envs.action_space, config["gae_lambda"]),
        clip_range=config["clip_range"],
        clip_range_vf=config["clip_range_vf"],  # ours clips the value loss (by clip_coef) unless --no-clip-vloss
        ent_coef=config["ent_coef"],
        vf_coef=(config["vf_coef"] if cli.vf_coef is None else cli.vf_coef) / 2,  # SB3's squared error, ours half of it
        max_grad_norm=config["max_grad_norm"],
        policy_kwargs=dict(net_arch=dict(pi=[64, 64], vf=[64, 64]), activation_fn=nn.Tanh, log_std_init=config["log_std_init"]),
        device="cpu",
        seed=cli.seed,
    )
    model.learn(total_timesteps=cli.total_timesteps)

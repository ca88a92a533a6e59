"""Whole-process speed of two commands, e.g. this project's script against Stable-Baselines3 PPO at
identical settings, async against sync sub-environments, or two settings of one script.

Each run is a separate process, timed from start to exit (imports, env creation and the whole
training), and the two contenders alternate (A B A B ...) so that drift of a shared machine hits
both alike. Prints steps per second for every run, the medians and the ratio A/B; `--env-alone` also
times the case's vector env stepping random actions with no learner, as the ceiling, once in every
repeat right after the contenders (so it drifts with them), and gives A's speed as a share of it.

    pip install -r requirements.txt -r benchmarks/requirements.txt
    python benchmarks/speed.py --case cartpole --total-timesteps 500000 --repeats 3
    python benchmarks/speed.py --case humanoid --total-timesteps 100000 --repeats 2 --env-alone
    python benchmarks/speed.py --case humanoid-cleanrl --total-timesteps 100000 --repeats 2 --env-alone
    python benchmarks/speed.py --case humanoid-envpool --total-timesteps 204800 --repeats 2   # pip install envpool==1.2.5
    python benchmarks/speed.py --case dmc-envpool --env-id WalkerWalk-v1 --total-timesteps 102400 --env-alone
    python benchmarks/speed.py --case taxi-masks --total-timesteps 200000 --repeats 3
    python benchmarks/speed.py --case cartpole-lstm --total-timesteps 100000 --repeats 3
    python benchmarks/speed.py --case cartpole-lstm-copies --script old/ppo_discrete.py --script-b ppo_discrete.py
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, SETTINGS  # noqa: E402

SB3 = "benchmarks/sb3_ppo.py"
WAITING = "benchmarks.waiting_env:WaitingPendulum-v0"
NO_CHECKPOINTS = ["--checkpoint-interval", "0"]
CLEANRL = [*SETTINGS["CLEANRL"].split(), *NO_CHECKPOINTS]  # CleanRL's MuJoCo settings (1 sub-env x 2048 steps)

# case -> (env id, {name: [script, flags...]}) for contenders A and B; every command also gets
# --env-id, --total-timesteps and --seed. Both sides run the same hyperparameters (our scripts'
# defaults, which sb3_ppo.py copies), except humanoid-cleanrl, which compares two settings of one script.
CASES = {
    "cartpole": ("CartPole-v1", {"ppo_discrete.py": ["ppo_discrete.py", *NO_CHECKPOINTS], "SB3": [SB3]}),
    "hopper": ("Hopper-v5", {"ppo_continuous.py": ["ppo_continuous.py", *NO_CHECKPOINTS], "SB3": [SB3, "--continuous"]}),
    "humanoid": ("Humanoid-v5", {"ppo_continuous.py": ["ppo_continuous.py", *NO_CHECKPOINTS], "SB3": [SB3, "--continuous"]}),
    # what worker processes buy: 8 sub-envs that each wait ~1 ms per step
    "waiting": (WAITING, {
        "async": ["ppo_vector_sameStep.py", "--vectorization-mode", "async", *NO_CHECKPOINTS],
        "sync": ["ppo_vector_sameStep.py", "--vectorization-mode", "sync", *NO_CHECKPOINTS],
    }),
    # the same hyperparameters (the defaults: 8 sub-envs x 256 steps), the sub-envs in worker processes or in one
    "humanoid-vector": ("Humanoid-v5", {
        "ppo_vector_sameStep.py (async)": ["ppo_vector_sameStep.py", "--vectorization-mode", "async", *NO_CHECKPOINTS],
        "ppo_continuous.py": ["ppo_continuous.py", *NO_CHECKPOINTS],
    }),
    # the engines of --env-backend, the defaults otherwise: EnvPool's C++ threads against gymnasium in one process
    "humanoid-envpool": ("Humanoid-v5", {
        "envpool": ["ppo_continuous.py", "--env-backend", "envpool", *NO_CHECKPOINTS],
        "gymnasium": ["ppo_continuous.py", *NO_CHECKPOINTS],
    }),
    "hopper-envpool": ("Hopper-v5", {
        "envpool": ["ppo_continuous.py", "--env-backend", "envpool", *NO_CHECKPOINTS],
        "gymnasium": ["ppo_continuous.py", *NO_CHECKPOINTS],
    }),
    # the DeepMind Control Suite through EnvPool (any of its tasks with --env-id): one engine thread, or one per core
    "dmc-envpool": ("CheetahRun-v1", {
        "1 thread": ["ppo_continuous.py", "--env-backend", "envpool", "--env-threads", "1", *NO_CHECKPOINTS],
        "a thread per core": ["ppo_continuous.py", "--env-backend", "envpool", *NO_CHECKPOINTS],
    }),
    # invalid-action masks on and ignored (issue 67: what masks cost), both in ppo_discrete.py
    "taxi-masks": ("Taxi-v4", {
        "masks": ["ppo_discrete.py", *NO_CHECKPOINTS],
        "--no-action-mask": ["ppo_discrete.py", "--no-action-mask", *NO_CHECKPOINTS],
    }),
    # two copies of ppo_discrete.py at its defaults: with --script and --script-b, a change against the code before it
    "discrete-copies": ("CartPole-v1", {
        "A": ["ppo_discrete.py", *NO_CHECKPOINTS],
        "B": ["ppo_discrete.py", *NO_CHECKPOINTS],
    }),
    # a memory (--recurrent lstm, issue 68) against none, each script at its defaults otherwise
    "cartpole-lstm": ("CartPole-v1", {
        "none": ["ppo_discrete.py", *NO_CHECKPOINTS],
        "lstm": ["ppo_discrete.py", "--recurrent", "lstm", *NO_CHECKPOINTS],
    }),
    "humanoid-lstm": ("Humanoid-v5", {
        "none": ["ppo_continuous.py", *NO_CHECKPOINTS],
        "lstm": ["ppo_continuous.py", "--recurrent", "lstm", *NO_CHECKPOINTS],
    }),
    # two copies with a memory (--recurrent lstm): with --script and --script-b, a change against the code before it
    "cartpole-lstm-copies": ("CartPole-v1", {
        "A": ["ppo_discrete.py", "--recurrent", "lstm", *NO_CHECKPOINTS],
        "B": ["ppo_discrete.py", "--recurrent", "lstm", *NO_CHECKPOINTS],
    }),
    "humanoid-lstm-copies": ("Humanoid-v5", {
        "A": ["ppo_continuous.py", "--recurrent", "lstm", *NO_CHECKPOINTS],
        "B": ["ppo_continuous.py", "--recurrent", "lstm", *NO_CHECKPOINTS],
    }),
    # the memory's update replaying whole rollouts against sequences of 16 steps (--sequence-length)
    "cartpole-sequences": ("CartPole-v1", {
        "whole": ["ppo_discrete.py", "--recurrent", "lstm", "--sequence-length", "0", *NO_CHECKPOINTS],
        "16 steps": ["ppo_discrete.py", "--recurrent", "lstm", "--sequence-length", "16", *NO_CHECKPOINTS],
    }),
    "humanoid-sequences": ("Humanoid-v5", {
        "whole": ["ppo_continuous.py", "--recurrent", "lstm", *NO_CHECKPOINTS],
        "16 steps": ["ppo_continuous.py", "--recurrent", "lstm", "--sequence-length", "16", *NO_CHECKPOINTS],
    }),
    # the defaults against CleanRL's settings, both in ppo_continuous.py
    "humanoid-cleanrl": ("Humanoid-v5", {
        "defaults": ["ppo_continuous.py", *NO_CHECKPOINTS],
        "CLEANRL": ["ppo_continuous.py", *CLEANRL],
    }),
}


def timed_run(command, workdir):
    start = time.perf_counter()
    environment = {**os.environ, "PYTHONPATH": ROOT}  # lets gymnasium import benchmarks.waiting_env
    result = subprocess.run([sys.executable] + command, cwd=workdir, capture_output=True, text=True, env=environment)
    if result.returncode != 0:
        sys.exit(f"failed: {' '.join(command)}\n{result.stderr[-2000:]}")
    return time.perf_counter() - start


def env_alone_sps(env_id, num_envs, total_timesteps, seed, envpool_threads=None):
    """The vector env ppo_continuous.py builds (num_envs sub-envs in one process, episode statistics; with
    envpool_threads, EnvPool's, made by the script's own make_envs), stepping random actions."""
    import gymnasium as gym

    if envpool_threads is None:
        envs = gym.vector.SyncVectorEnv([lambda: gym.make(env_id)] * num_envs)
        envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    else:
        sys.path.insert(0, ROOT)
        import ppo_continuous

        args = ppo_continuous.Args(env_id=env_id, env_backend="envpool", env_threads=envpool_threads)
        envs = ppo_continuous.make_envs(args, num_envs, None, seed)
    actions = gym.vector.utils.batch_space(envs.single_action_space, num_envs)
    envs.reset(seed=seed)
    actions.seed(seed)
    start = time.perf_counter()
    for _ in range(total_timesteps // num_envs):
        envs.step(actions.sample())
    return total_timesteps // num_envs * num_envs / (time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=sorted(CASES), default="cartpole")
    parser.add_argument("--total-timesteps", type=int, default=500000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--env-alone", action="store_true", help="also time the env alone with random actions")
    parser.add_argument("--env-id", default=None, help="the env of every command instead of the case's own, e.g. "
                        "WalkerWalk-v1 with --case dmc-envpool")
    parser.add_argument("--script", default=None, help="a script path (a copy of one of ours) that takes the place of "
                        "contender A's script, with A's flags: e.g. your experiment against Stable-Baselines3")
    parser.add_argument("--script-b", default=None, help="the same for contender B: e.g. --case discrete-copies "
                        "--script old/ppo_discrete.py --script-b ppo_discrete.py")
    cli = parser.parse_args()
    if cli.repeats < 1 or cli.total_timesteps < 1:
        parser.error("--repeats and --total-timesteps must be at least 1")

    env_id, contenders = CASES[cli.case]
    env_id = cli.env_id or env_id
    pairs = list(contenders.items())  # (name, [script, flags...]) of A, then of B
    for index, script in enumerate((cli.script, cli.script_b)):
        if script and not os.path.isfile(script):
            parser.error(f"no script {script}")
        if script:  # the path in place of that contender's script, its flags kept; named by path and case's name
            name, (_, *flags) = pairs[index]
            pairs[index] = (f"{script} ({name})", [os.path.abspath(script), *flags])
    contenders = dict(pairs)
    common = ["--env-id", env_id, "--total-timesteps", str(cli.total_timesteps), "--seed", str(cli.seed)]
    sps = {name: [] for name in contenders}
    alone = []  # the env alone, measured in every repeat right after the contenders
    name_a, (script_a, *flags_a) = next(iter(contenders.items()))
    # A's sub-envs: its flag, else its script's default (read from its Args; a copy may have its own)
    default = re.search(r"^\s+num_envs: int = (\d+)", open(os.path.join(ROOT, script_a)).read(), re.MULTILINE)
    num_envs = int(flags_a[flags_a.index("--num-envs") + 1] if "--num-envs" in flags_a else default.group(1) if default else 1)
    envpool_threads = None  # A's engine threads, if A steps its sub-envs on EnvPool (0: the script's own choice)
    if "envpool" in flags_a:
        envpool_threads = int(flags_a[flags_a.index("--env-threads") + 1]) if "--env-threads" in flags_a else 0
    with tempfile.TemporaryDirectory() as workdir:  # runs/ of the timed runs go here, not into the repository
        for repeat in range(cli.repeats):
            for name, (script, *flags) in contenders.items():
                elapsed = timed_run([os.path.join(ROOT, script), *flags, *common], workdir)  # an absolute path stays
                sps[name].append(cli.total_timesteps / elapsed)
                print(f"{env_id} repeat {repeat + 1} {name}: {elapsed:.1f} s, {sps[name][-1]:,.0f} SPS", flush=True)
            if cli.env_alone:
                alone.append(env_alone_sps(env_id, num_envs, min(cli.total_timesteps, 50000), cli.seed, envpool_threads))
                print(f"{env_id} repeat {repeat + 1} env alone: {alone[-1]:,.0f} SPS, {name_a} at {sps[name_a][-1] / alone[-1]:.0%} of it", flush=True)
    (name_a, sps_a), (name_b, sps_b) = ((name, statistics.median(values)) for name, values in sps.items())
    print(f"{env_id}: {name_a} {sps_a:,.0f} SPS, {name_b} {sps_b:,.0f} SPS (medians of {cli.repeats}), "
          f"ratio {sps_a / sps_b:.2f}x, {os.cpu_count()} cores")
    if cli.env_alone:
        shares = [a / e for a, e in zip(sps[name_a], alone)]
        print(f"{env_id}: env alone ({num_envs} sub-envs, one process) with random actions {statistics.median(alone):,.0f} SPS "
              f"(median of {cli.repeats}); {name_a} runs at {sps_a / statistics.median(alone):.0%} of it "
              f"(per repeat: {min(shares):.0%} to {max(shares):.0%})")


if __name__ == "__main__":
    main()

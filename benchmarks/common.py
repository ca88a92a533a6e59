"""Shared by the benchmark tools: read a run's episodic returns, normalize scores across envs, and start
the scripts as child processes.

A normalized score is 0 for a uniformly random policy and 1 for the reference: CleanRL's published PPO
(mean of the last 100 episodes over 3 seeds) where it has one, else rl-baselines3-zoo's tuned PPO.
The random-policy returns were measured here with (100 episodes, seed 0):

    python benchmarks/common.py CartPole-v1 Acrobot-v1 LunarLander-v3 Pendulum-v1 HalfCheetah-v5 Hopper-v5 Walker2d-v5 Humanoid-v5 Ant-v5
"""

import contextlib
import ctypes
import glob
import os
import signal
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository, where the scripts are
RETURN_TAG = "charts/episodic_return"
FINAL_EPISODES = 100  # a run's final return is the mean return of its last 100 episodes

# Named settings of the scripts, the one place the tools and the README take them from (README: CLEANRL="...").
SETTINGS = {
    # ppo_continuous.py with CleanRL's MuJoCo settings (its former defaults): better than the defaults on Hopper-v5
    # and Walker2d-v5, far worse on Humanoid-v5, Ant-v5 and HalfCheetah-v5 (benchmarks/results/README.md)
    "CLEANRL": "--num-envs 1 --num-steps 2048 --num-minibatches 32 --init-log-std 0 --clip-vloss --gae-lambda 0.95 "
               "--vf-coef 0.5",
}

# env id: (random policy's return, reference return)
SCORE_RANGES = {
    "CartPole-v1": (23.7, 490.0),  # CleanRL ppo.py, 500k steps
    "Acrobot-v1": (-497.1, -86.4),  # CleanRL ppo.py, 500k steps
    "LunarLander-v3": (-192.0, 200.0),  # the env's "solved" return
    "Pendulum-v1": (-1207.6, -172.0),  # rl-baselines3-zoo, 100k steps
    "HalfCheetah-v5": (-282.5, 1442.6),  # CleanRL ppo_continuous_action.py, 1M steps (v4)
    "Hopper-v5": (16.7, 2382.9),  # same
    "Walker2d-v5": (1.8, 2288.0),  # same
    "Humanoid-v5": (112.6, 716.1),  # same
    "Ant-v5": (-48.0, 1327.0),  # rl-baselines3-zoo, 1M steps (CleanRL publishes none)
}

# The DeepMind Control Suite through EnvPool: CleanRL's PPO and RPO (alpha 0.5), 8M steps, mean of 10 seeds, from
# its docs/rl-algorithms/rpo.md (Shimmy's dm_control/<domain>-<task>-v0), under EnvPool's ids. A DMC score is the
# return over RPO's (every DMC reward lies in [0, 1] per step, so 0 is the floor, not a random policy's return).
CLEANRL_DMC = {  # env id: (PPO at 8M, RPO at 8M)
    "AcrobotSwingup-v1": (26.87, 42.97), "CartpoleSwingup-v1": (590.21, 613.46), "CheetahRun-v1": (472.14, 565.51),
    "FingerSpin-v1": (630.06, 848.67), "HopperHop-v1": (6.48, 62.60), "HopperStand-v1": (3.26, 404.39),
    "HumanoidWalk-v1": (8.92, 77.00), "PendulumSwingup-v1": (472.19, 774.30), "QuadrupedRun-v1": (171.50, 367.98),
    "ReacherHard-v1": (637.84, 576.81), "WalkerRun-v1": (128.18, 391.56), "WalkerWalk-v1": (305.74, 787.11),
}
SCORE_RANGES.update({env_id: (0.0, rpo) for env_id, (_, rpo) in CLEANRL_DMC.items()})

# Atari, EnvPool's ids and ale-py's: a random policy's score (Mnih et al., 2015) and CleanRL's ppo_atari_envpool.py at
# 10M steps (docs/benchmark/ppo_atari_envpool.md, 3 seeds)
CLEANRL_ATARI = {"Pong": (-20.7, 20.45), "Breakout": (1.7, 211.24), "BeamRider": (363.9, 2501.85)}
SCORE_RANGES.update({f"{prefix}{game}-v5": scores for game, scores in CLEANRL_ATARI.items() for prefix in ("", "ALE/")})


class RunNotReadable(Exception):
    pass


def read_run(run_folder, tag=RETURN_TAG):
    """The TensorBoard run under `run_folder`: every episode's step, wall time and return (`tag`: another return, as
    charts/team_episodic_return), the final return, the last step logged, and when the run started. A non-finite
    return makes the run unreadable."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    event_files = glob.glob(os.path.join(run_folder, "**", "events.out.tfevents.*"), recursive=True)
    if not event_files:
        raise RunNotReadable(f"no TensorBoard events under {run_folder}")
    events = EventAccumulator(os.path.dirname(event_files[0]), size_guidance={"scalars": 0})
    events.Reload()
    tags = events.Tags()["scalars"]
    if tag not in tags:
        raise RunNotReadable(f"no {tag} logged under {run_folder} (no episode finished?)")
    episodes = sorted(events.Scalars(tag), key=lambda e: e.step)
    returns = np.array([e.value for e in episodes], dtype=np.float64)
    if not np.isfinite(returns).all():
        raise RunNotReadable(f"non-finite episodic return at step {episodes[np.flatnonzero(~np.isfinite(returns))[0]].step:,}")
    return {
        "steps": np.array([e.step for e in episodes]),
        "wall_times": np.array([e.wall_time for e in episodes]),
        "returns": returns,
        "final_return": float(returns[-FINAL_EPISODES:].mean()),
        "last_step": max(e.step for tag in tags for e in events.Scalars(tag)),
        "start_time": events.FirstEventTimestamp(),
    }


def normalized_score(env_id, score, ranges=SCORE_RANGES):
    """0 for a random policy's return, 1 for the reference's; an env without a range in `ranges` keeps its raw return."""
    if env_id not in ranges:
        return score
    random_return, reference_return = ranges[env_id]
    return (score - random_return) / (reference_return - random_return)


def last_log_line(path):
    """The message that ended a run's log: its last non-empty line, where the scripts write their one-line error,
    or the text inside the box that tyro draws around a command-line error."""
    with open(path, errors="replace") as f:
        lines = [line.strip() for line in f if line.strip()]
    if lines and lines[-1].startswith("╰"):  # tyro's box: its text lines, without borders, rules and the help hint
        top = max((i for i, line in enumerate(lines) if line.startswith("╭")), default=len(lines) - 1)
        text = [line.strip("│ ") for line in lines[top + 1 : -1]]
        lines = [" ".join(t for t in text if t.strip("─") and not t.startswith("For full helptext"))]
    return (lines or [""])[-1][:300]


def script_environment():
    """The environment for a script's process, which runs in a run folder of its own: the repository and the folder
    the tool was started in on PYTHONPATH, so that gymnasium can import env modules from either (e.g. `--env-id
    benchmarks.waiting_env:WaitingPendulum-v0`, or `my_envs:PointReach-v0` with my_envs.py where the tool was started)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.getcwd(), os.environ.get("PYTHONPATH")]))}


STOPS = {signal.SIGINT, signal.SIGTERM}


@contextlib.contextmanager
def stops_held():
    """Hold Ctrl-C and SIGTERM while a child is started: one that lands during the fork raises in fork's own hooks,
    where Python prints it and drops it, and the tool would go on as if never stopped. Held, it comes on leaving."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)


def stop_with_parent():
    """For subprocess.Popen(preexec_fn=...): Linux sends the child SIGTERM when its parent dies, even by SIGKILL.
    The child takes Ctrl-C and SIGTERM again (its parent held them for the fork: stops_held)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def raise_keyboard_interrupt(signum, frame):
    """A SIGTERM handler: stop as on Ctrl-C."""
    raise KeyboardInterrupt


def random_policy_return(env_id, episodes=100, seed=0):
    import gymnasium as gym

    env = gym.make(env_id)
    env.action_space.seed(seed)
    returns = []
    for episode in range(episodes):
        env.reset(seed=seed + episode)
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    return float(np.mean(returns))


if __name__ == "__main__":
    for env_id in sys.argv[1:]:
        value = random_policy_return(env_id)
        print(f"{env_id}: random policy {value:.1f}", flush=True)

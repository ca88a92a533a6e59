"""The cost of a durable checkpoint write (issue 37): torch.save and the rename, with and without the fsync of the file
before the rename and of the run folder after it, for a checkpoint of Humanoid-v5's size (networks, Adam's moments,
observation statistics), alternating the two ways 40 times each in a temporary folder on this machine's disk.

    python benchmarks/checkpoint_write.py
"""

import os
import sys
import tempfile
import time

import gymnasium as gym
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import ppo_continuous as ppo  # noqa: E402


def main(repeats=40):
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("Humanoid-v5")])
    agent = ppo.Agent(envs, ppo.Args())
    optimizer = torch.optim.Adam(agent.parameters(), lr=3e-4, eps=1e-5)
    obs = torch.randn(8, envs.single_observation_space.shape[0])
    (agent.critic(obs).sum() + agent.policy(obs)[1].sum()).backward()
    optimizer.step()  # Adam's moments exist, as in a real checkpoint
    state = {"model": agent.state_dict(), "optimizer": optimizer.state_dict(), "global_step": 1, "iteration": 1,
             "obs_rms": ppo.RunningMeanStd(shape=envs.single_observation_space.shape).state_dict(),
             "rng_state": torch.get_rng_state()}
    folder = tempfile.mkdtemp(dir=".")
    path, tmp = os.path.join(folder, "checkpoint.pt"), os.path.join(folder, "checkpoint.pt.tmp")

    def write(durable):
        start = time.perf_counter()
        torch.save(state, tmp)
        if durable:
            ppo.fsync(tmp)
        os.replace(tmp, path)
        if durable:
            ppo.fsync(folder)
        return time.perf_counter() - start

    times = {False: [], True: []}
    for _ in range(repeats):
        for durable in (False, True):
            times[durable].append(write(durable))
    print(f"checkpoint of {os.path.getsize(path) / 1e3:.0f} kB, {repeats} writes each way, alternating")
    for durable, seconds in times.items():
        print(f"{'atomic and durable' if durable else 'atomic only       '}: median {np.median(seconds) * 1e3:.1f} ms, "
              f"90th percentile {np.percentile(seconds, 90) * 1e3:.1f} ms")
    os.remove(path)
    os.rmdir(folder)


if __name__ == "__main__":
    main()

"""Many agents (issue 90): PettingZoo's parallel games, a column of the rollout per agent of each game, one policy.
Tiny games of our own (no PettingZoo needed): a relay whose second runner leaves early, twins told apart by their id
alone, an AEC-only module and agents whose spaces differ."""

import glob
import importlib.util
import os

import numpy as np
import pytest
import torch
from conftest import run_main, scalars

import ppo_continuous
import ppo_discrete
import ppo_vector_sameStep

ALL = [ppo_discrete, ppo_continuous, ppo_vector_sameStep]

GAMES = '''
import gymnasium as gym
import numpy as np


class Relay:
    """runner_1 leaves (terminated) after `short` steps, runner_0 runs to the time limit `long` (truncated); runner_i
    is paid i + 1 a step, so that every real step pays 1 or more. The observation: the step count. Actions: Discrete(2),
    or with box=True a Box of one number in [-1, 1]."""

    metadata = {"render_fps": 5}

    def __init__(self, short=2, long=5, box=False, render_mode=None):
        self.possible_agents, self.short, self.long, self.box = ["runner_0", "runner_1"], short, long, box
        self.render_mode = render_mode

    def render(self):
        assert self.render_mode == "rgb_array", "a frame asked of a game made without render_mode"
        return np.full((16, 16, 3), 40 * self.t, np.uint8)

    def observation_space(self, agent):
        return gym.spaces.Box(0, 100, (1,), np.float32)

    def action_space(self, agent):
        return gym.spaces.Box(-1, 1, (1,), np.float32) if self.box else gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        self.t, self.agents = 0, list(self.possible_agents)
        return {a: np.zeros(1, np.float32) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        assert sorted(actions) == sorted(self.agents), "an agent that left was asked to act"
        self.t += 1
        rewards = {a: float(self.possible_agents.index(a) + 1) for a in actions}
        terminations = {a: a == "runner_1" and self.t == self.short for a in actions}
        truncations = {a: a == "runner_0" and self.t == self.long for a in actions}
        self.agents = [a for a in self.agents if not (terminations[a] or truncations[a])]
        return ({a: np.full(1, self.t, np.float32) for a in actions}, rewards, terminations, truncations,
                {a: {} for a in actions})

    def close(self):
        pass


class Twins(Relay):
    """One step: both see the same zeros; twin i is paid 1 for action i (a Box: twin_1 for a positive number, twin_0 for
    a negative one). Only an agent id tells them apart."""

    def __init__(self, box=False):
        self.possible_agents, self.box = ["twin_0", "twin_1"], box

    def step(self, actions):
        self.agents = []
        chosen = {a: int(actions[a][0] > 0) if self.box else actions[a] for a in actions}
        return ({a: np.zeros(1, np.float32) for a in actions},
                {a: float(chosen[a] == self.possible_agents.index(a)) for a in actions},
                {a: True for a in actions}, {a: False for a in actions}, {a: {} for a in actions})


class Late(Relay):
    """runner_1 joins at step `short` (its first observation then, paid nothing), both run to the time limit `long`."""

    def reset(self, seed=None, options=None):
        self.t, self.agents = 0, ["runner_0"]
        return {"runner_0": np.zeros(1, np.float32)}, {"runner_0": {}}

    def step(self, actions):
        assert sorted(actions) == sorted(self.agents), "an agent not playing was asked to act"
        self.t += 1
        self.agents = ["runner_0", "runner_1"] if self.t >= self.short else ["runner_0"]
        ends = {a: self.t == self.long for a in self.agents}
        result = ({a: np.full(1, self.t, np.float32) for a in self.agents},
                  {a: float(self.possible_agents.index(a) + 1) * (a in actions) for a in self.agents}, ends,
                  dict(ends), {a: {} for a in self.agents})
        self.agents = [] if self.t == self.long else self.agents
        return result


class Picky(Relay):
    """Discrete(3) actions, action 1 never valid: each agent's info holds its mask, and the game raises on action 1."""

    def action_space(self, agent):
        return gym.spaces.Discrete(3)

    def reset(self, seed=None, options=None):
        obs, infos = super().reset(seed)
        return obs, {a: {"action_mask": np.array([1, 0, 1], np.int8)} for a in infos}

    def step(self, actions):
        if any(action == 1 for action in actions.values()):
            raise ValueError("a masked action")
        obs, rewards, terminations, truncations, infos = super().step(actions)
        return obs, rewards, terminations, truncations, {a: {"action_mask": np.array([1, 0, 1], np.int8)} for a in
                                                          infos}


class Mixed(Relay):
    """One agent's actions a Box, the other's Discrete: no one space pads both."""

    def action_space(self, agent):
        return gym.spaces.Box(-1, 1, (1,)) if agent == "runner_0" else gym.spaces.Discrete(2)


class Stated(Relay):
    """The relay with a state() of its own: the step count and 100 more."""

    state_space = gym.spaces.Box(0, 200, (2,), np.float32)

    def state(self):
        return np.array([self.t, 100 + self.t], np.float32)


class Screens(Relay):
    """The relay seen on a screen of 100 x 90 RGB pixels, each the step count times 30."""

    def observation_space(self, agent):
        return gym.spaces.Box(0, 255, (100, 90, 3), np.uint8)

    def screen(self):
        return np.full((100, 90, 3), 30 * self.t, np.uint8)

    def reset(self, seed=None, options=None):
        obs, infos = super().reset(seed)
        return {a: self.screen() for a in obs}, infos

    def step(self, actions):
        obs, *rest = super().step(actions)
        return ({a: self.screen() for a in obs}, *rest)


class Roles(Relay):
    """hunter_0 and hunter_1 (observations of 2 numbers, Discrete(2) actions or a Box of 1) and prey_0 (1 number,
    Discrete(3) or a Box of 2) for `long` steps: a hunter is paid 1 a step, the prey -1 unless it takes action 2 (a Box:
    its second number above 0). The game raises on an action that is not the agent's own."""

    def __init__(self, long=5, box=False, render_mode=None):
        self.possible_agents, self.short, self.long, self.box = ["hunter_0", "hunter_1", "prey_0"], 0, long, box

    def own(self, agent):
        return 1 + (agent == "prey_0")

    def observation_space(self, agent):
        return gym.spaces.Box(0, 100, (3 - self.own(agent),), np.float32)

    def action_space(self, agent):
        size = self.own(agent)
        return gym.spaces.Box(-1, 1, (size,), np.float32) if self.box else gym.spaces.Discrete(size + 1)

    def reset(self, seed=None, options=None):
        self.t, self.agents = 0, list(self.possible_agents)
        return {a: np.zeros(3 - self.own(a), np.float32) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        for agent, action in actions.items():
            if self.box and np.shape(action) != (self.own(agent),) or not self.box and not 0 <= action <= self.own(agent):
                raise ValueError(f"{agent} was given {action}")
        self.t += 1
        escaped = actions["prey_0"][1] > 0 if self.box else actions["prey_0"] == 2
        rewards = {a: 1.0 if a != "prey_0" else -1.0 * (not escaped) for a in actions}
        ends = {a: self.t == self.long for a in actions}
        self.agents = [] if self.t == self.long else self.agents
        return ({a: np.full(3 - self.own(a), self.t, np.float32) for a in actions}, rewards, ends,
                {a: False for a in actions}, {a: {} for a in actions})
'''


@pytest.fixture
def games(tmp_path, monkeypatch):
    """Modules relay, twins, mixed (parallel_env() each) and aec_only (env() only) on the path; runs land in tmp."""
    for name, kind in (("relay", "Relay"), ("twins", "Twins"), ("mixed", "Mixed"), ("late", "Late"),
                       ("picky", "Picky"), ("roles", "Roles"), ("stated", "Stated"),
                       ("screens", "Screens")):
        (tmp_path / f"{name}.py").write_text(f"{GAMES}\n\ndef parallel_env(**kwargs):\n    return {kind}(**kwargs)\n")
    (tmp_path / "aec_only.py").write_text("class Game:\n    metadata = {'is_parallelizable': True}\n\n\n"
                                          "def env():\n    return Game()\n")
    (tmp_path / "turns.py").write_text("def env():\n    return None\n")  # like PettingZoo's classic games
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def kwargs(ppo):
    return '{"box": true}' if ppo is ppo_continuous else "{}"


@pytest.mark.parametrize("ppo", ALL, ids=lambda module: module.__name__)
def test_an_agent_that_left_keeps_its_column_in_rows_without_weight_until_its_game_ends(ppo, games):
    """Two relays, four columns: runner_1's rows after its step 2 weigh nothing until the game starts again (NEXT_STEP:
    with a reset row for every column); each agent's episode and the team's are reported once."""
    envs = ppo.make_envs(ppo.Args(env_id="relay", env_kwargs=kwargs(ppo)), 2, None, 1)
    assert envs.num_envs == 4 and envs.single_observation_space.shape == (3,)  # the id (2) beside the count (1)
    obs, infos = envs.reset(seed=1)
    assert obs[:, :2].tolist() == [[1, 0], [0, 1], [1, 0], [0, 1]]  # agent ids, one-hot, game by game
    valid, episodes, teams, next_reset = [], [], [], np.zeros(4)
    for _ in range(7):
        valid.append(1 - next_reset)
        obs, reward, terminated, truncated, infos = envs.step(envs.action_space.sample() * 0)
        next_reset = ppo.engine_resets(np.logical_or(terminated, truncated).astype(np.float32), infos)
        if ppo is ppo_vector_sameStep:  # SAME_STEP: the step's own rows, and the episodes in its final info
            valid[-1], infos = ppo.real_rows(infos, 4), infos.get("final_info", {})
        assert ((reward > 0) == (valid[-1] > 0)).all(), "a real step pays, a row without weight does not"
        episodes += [(i, infos["episode"]["r"][i], infos["episode"]["l"][i]) for i in np.flatnonzero(infos.get(
            "_episode", []))]
        teams += [(i, infos["team_episode"]["r"][i]) for i in np.flatnonzero(infos.get("_team_episode", []))]
    same_step = ppo is ppo_vector_sameStep
    # runner_1: 2 steps, 3 waiting, (NEXT_STEP: the restart,) on; runner_0: 5 steps, (NEXT_STEP: the restart,) on
    assert np.array(valid)[:, 1].tolist() == ([1, 1, 0, 0, 0, 1, 1] if same_step else [1, 1, 0, 0, 0, 0, 1])
    assert np.array(valid)[:, 0].tolist() == ([1] * 7 if same_step else [1, 1, 1, 1, 1, 0, 1])
    assert episodes[:4] == [(1, 4.0, 2), (3, 4.0, 2), (0, 5.0, 5), (2, 5.0, 5)]  # SAME_STEP: the next game's too
    assert teams == [(0, 9.0), (2, 9.0)]  # 5 x 1 + 2 x 2, at each game's first column
    envs.close()


@pytest.mark.parametrize("recurrent", ["none", "lstm"])
@pytest.mark.parametrize("ppo", ALL, ids=lambda module: module.__name__)
def test_the_update_gives_no_weight_to_a_departed_agents_rows_and_steps_count_rows(ppo, recurrent, games, monkeypatch):
    """The loss sees exactly the rollout's paying rows (every real step pays, no other row does), every epoch, with a
    memory too (its sequences replay every row, the loss takes the real ones)."""
    args = ppo.Args(env_id="relay", env_kwargs=kwargs(ppo), num_envs=2, num_steps=16, num_minibatches=2,
                    total_timesteps=128, recurrent=recurrent)
    envs = ppo.make_envs(args, 2, None, 1)
    envs.reset(seed=1)
    paying = [sum((envs.step(envs.action_space.sample() * 0)[1] > 0).sum() for _ in range(16)) for _ in range(2)]
    rows, ppo_loss = [], ppo.ppo_loss
    monkeypatch.setattr(ppo, "ppo_loss", lambda agent, hidden, mb, *rest: rows.append(len(mb["advantages"])) or
                        ppo_loss(agent, hidden, mb, *rest))
    path = ppo.train(args)
    epochs = args.update_epochs
    assert paying[0] < 64 and [sum(rows[:len(rows) // 2]), sum(rows[len(rows) // 2:])] == [epochs * n for n in paying]
    assert ppo.load_checkpoint(path)["global_step"] == 128  # 2 iterations x 4 columns x 16 steps: rows, every one
    logged = scalars(os.path.dirname(path))
    assert [value for _, value in logged["charts/team_episodic_return"]][:2] == [9.0, 9.0]
    assert set(value for _, value in logged["charts/episodic_return"]) == {4.0, 5.0}


@pytest.mark.parametrize("agent_id", [True, False], ids=["with the id", "without"])
@pytest.mark.parametrize("ppo", ALL, ids=lambda module: module.__name__)
def test_an_agent_id_tells_agents_with_the_same_observation_apart(ppo, games, agent_id, monkeypatch, capsys):
    steps = "2048" if agent_id else "512"  # without the id no training tells them apart: one iteration shows it
    flags = ["--env-id", "twins", "--env-kwargs", kwargs(ppo), "--num-envs", "8", "--num-steps", "32",
             "--total-timesteps", steps]
    assert run_main(ppo, flags + ([] if agent_id else ["--no-agent-id"]), monkeypatch) == 0
    checkpoint = glob.glob("runs/*/checkpoint.pt")[0]
    assert run_main(ppo, ["--eval-checkpoint", checkpoint, "--env-id", "twins", "--eval-episodes", "4"],
                    monkeypatch) == 0
    mean = float(capsys.readouterr().out.split("mean return ")[1].split(" ")[0])
    assert mean == 1.0 if agent_id else mean == 0.5  # deterministic: without the id both twins take one action


@pytest.mark.parametrize("ppo", ALL, ids=lambda module: module.__name__)
def test_a_run_of_many_agents_resumes_and_extends(ppo, games, monkeypatch, capsys):
    flags = ["--env-id", "relay", "--env-kwargs", kwargs(ppo), "--num-envs", "2", "--num-steps", "16",
             "--num-minibatches", "2"]
    assert run_main(ppo, flags + ["--total-timesteps", "128"], monkeypatch) == 0
    checkpoint = glob.glob("runs/*/checkpoint.pt")[0]
    assert run_main(ppo, ["--resume", checkpoint, "--env-id", "relay", "--total-timesteps", "256"], monkeypatch) == 0
    assert ppo.load_checkpoint(checkpoint)["global_step"] == 256
    assert "extend with:" in capsys.readouterr().out


@pytest.mark.parametrize("ppo", ALL, ids=lambda module: module.__name__)
def test_capture_video_films_the_first_game_in_training_and_every_evaluated_game(ppo, games, monkeypatch):
    """A relay game is 5 steps: each video holds its first frame and one a step (6), of game 0 only."""
    import imageio_ffmpeg
    flags = ["--env-id", "relay", "--env-kwargs", kwargs(ppo), "--num-envs", "2", "--num-steps", "16",
             "--num-minibatches", "2", "--total-timesteps", "64", "--capture-video"]
    assert run_main(ppo, flags, monkeypatch) == 0
    trained = sorted(glob.glob("videos/*/rl-video-episode-*.mp4"))
    assert [os.path.basename(v) for v in trained] == ["rl-video-episode-0.mp4", "rl-video-episode-1.mp4"]
    assert imageio_ffmpeg.count_frames_and_secs(trained[0])[0] == 6
    checkpoint = glob.glob("runs/*/checkpoint.pt")[0]
    assert run_main(ppo, ["--eval-checkpoint", checkpoint, "--env-id", "relay", "--eval-episodes", "3",
                          "--capture-video"], monkeypatch) == 0
    evaluated = sorted(glob.glob("videos/*-eval/*.mp4"))
    assert len(evaluated) == 3 and all(imageio_ffmpeg.count_frames_and_secs(v)[0] == 6 for v in evaluated)


@pytest.mark.parametrize("env_id, said", [
    ("aec_only", "aec_only has no parallel_env(): for an AEC env, write a module whose parallel_env() returns"),
    ("mixed", "its agents' spaces differ (Box(-1.0, 1.0, (1,), float32), Discrete(2)); one policy pads"),
    ("turns", "turns is a turn-based game (PettingZoo's AEC API: one agent acts at a time); these scripts train"),
])
@pytest.mark.parametrize("ppo", ALL, ids=lambda module: module.__name__)
def test_a_game_the_script_cannot_take_gets_one_line(ppo, games, env_id, said, monkeypatch):
    message = run_main(ppo, ["--env-id", env_id, "--env-kwargs", kwargs(ppo)], monkeypatch)
    assert said in message and "\n" not in message


@pytest.mark.parametrize("ppo", ALL, ids=lambda module: module.__name__)
def test_the_statistics_count_observations_not_the_rows_of_an_agent_not_playing(ppo, games, monkeypatch):
    """--norm-obs from one relay game (runner_1 leaves at step 2, runner_0 at 5): its two columns' observations counted
    by hand, 2 iterations of 10 steps. NEXT_STEP: a last observation counts, then the restart's; SAME_STEP: the
    reset's replaces the last. Counted before the mend: every row, 42."""
    flags = ["--env-id", "relay", "--env-kwargs", kwargs(ppo), "--num-envs", "1", "--num-steps", "10",
             "--num-minibatches", "2", "--total-timesteps", "40", "--norm-obs"]
    assert run_main(ppo, flags, monkeypatch) == 0
    statistics = ppo.load_checkpoint(glob.glob("runs/*/checkpoint.pt")[0])["obs_rms"]
    if ppo is ppo_vector_sameStep:  # 4 games of 5 steps: runner_0 sees 1 2 3 4 0, runner_1 1 (then waits) 0
        runner_0, runner_1 = [0] + [1, 2, 3, 4, 0] * 4, [0] + [1, 0] * 4
    else:  # steps 1-6 (6: the restart), twice, and 8 of the next: runner_1 waits at 3, 4, 5
        runner_0, runner_1 = [0] + [1, 2, 3, 4, 5, 0] * 3 + [1, 2], [0] + [1, 2, 0] * 3 + [1, 2]
    counted = runner_0 + runner_1
    assert statistics["count"] == pytest.approx(len(counted) + 1e-4)
    assert statistics["mean"][2].item() == pytest.approx(np.mean(counted), rel=1e-5)  # after the agent id (2)


@pytest.mark.parametrize("ppo", ALL, ids=lambda module: module.__name__)
def test_an_agent_that_joins_late_plays_from_its_first_observation(ppo, games):
    """runner_1 joins at step 2 of 5: its rows before weigh nothing and it is never asked to act before it joins."""
    envs = ppo.make_envs(ppo.Args(env_id="late", env_kwargs=kwargs(ppo)), 1, None, 1)
    obs, infos = envs.reset(seed=1)
    next_reset = ppo.engine_resets(np.zeros(2, dtype=np.float32), infos)
    valid = []
    for _ in range(7):
        valid.append(1 - next_reset)
        obs, reward, terminated, truncated, infos = envs.step(envs.action_space.sample() * 0)
        next_reset = ppo.engine_resets(np.logical_or(terminated, truncated).astype(np.float32), infos)
        if ppo is ppo_vector_sameStep:
            valid[-1] = ppo.real_rows(infos, 2)
        assert ((reward > 0) == (valid[-1] > 0)).all(), "a real step pays, a row without weight does not"
    assert np.array(valid)[:, 1].tolist() == [0, 0, 1, 1, 1, 0, 0]  # joins with its observation at step 2
    assert np.array(valid)[:, 0].tolist() == ([1] * 7 if ppo is ppo_vector_sameStep else [1, 1, 1, 1, 1, 0, 1])
    envs.close()


@pytest.mark.parametrize("ppo", [ppo_discrete, ppo_vector_sameStep], ids=lambda module: module.__name__)
def test_masks_a_game_gives_in_its_agents_infos_hold(ppo, games, monkeypatch):
    flags = ["--env-id", "picky", "--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2",
             "--total-timesteps", "128"]
    assert run_main(ppo, flags, monkeypatch) == 0  # the game raises on a masked action


@pytest.mark.parametrize("ppo", ALL, ids=lambda module: module.__name__)
def test_agents_of_different_spaces_and_roles_share_one_network_with_a_curve_per_role(ppo, games, monkeypatch, capsys):
    """Hunters and a prey of different spaces: each acts only in its own actions (the game raises otherwise), each
    role's returns are logged (hunters 5 a game; the prey at most 0) and evaluated beside the pooled ones."""
    flags = ["--env-id", "roles", "--env-kwargs", kwargs(ppo), "--num-envs", "2",
             "--num-steps", "16", "--num-minibatches", "2", "--total-timesteps", "192"]
    assert run_main(ppo, flags, monkeypatch) == 0
    logged = scalars(glob.glob("runs/*")[0])
    hunters, prey = ([value for _, value in logged[f"charts/episodic_return/{role}"]] for role in ("hunter", "prey"))
    assert hunters == [5.0] * 2 * len(prey) and max(prey) <= 0 and len(logged["charts/episodic_return"]) == 3 * len(prey)
    assert "(last 20, hunter 5.0, prey " in capsys.readouterr().out
    checkpoint = glob.glob("runs/*/checkpoint.pt")[0]
    assert run_main(ppo, ["--eval-checkpoint", checkpoint, "--env-id", "roles", "--env-kwargs", kwargs(ppo),
                          "--eval-episodes", "2"], monkeypatch) == 0
    said = capsys.readouterr().out
    assert ", hunter 5.00, prey " in said and "  hunter: mean return 5.00 ± 0.00" in said and "  prey: mean" in said


@pytest.mark.parametrize("ppo", ALL, ids=lambda module: module.__name__)
def test_a_central_value_reads_the_games_state_and_the_actor_the_agents_own_observation_alone(ppo, games, monkeypatch):
    """--central-value: each agent's row ends with its game's state() (a game without one: its agents' observations
    side by side), which moves the value and leaves the policy as it was; the run trains and evaluates."""
    for env_id, state in (("stated", [1, 101]), ("relay", [1, 1])):
        args = ppo.Args(env_id=env_id, env_kwargs=kwargs(ppo), central_value=True)
        envs = ppo.make_envs(args, 1, None, 1)
        envs.reset(seed=1)
        obs = torch.from_numpy(envs.step(envs.action_space.sample() * 0)[0])  # step 1: both runners at 1
        agent = ppo.Agent(envs, args)
        own = agent.actor_inputs
        assert own == 3 and obs[:, own:].tolist() == [state, state]  # after the id (2) and the observation (1)
        moved = obs.clone()
        moved[:, own:] += 5.0
        assert agent.policy(moved, deterministic=True)[1].tolist() == agent.policy(obs, deterministic=True)[1].tolist()
        assert (agent.critic(moved) != agent.critic(obs)).all()
        envs.close()
    flags = ["--env-id", "stated", "--env-kwargs", kwargs(ppo), "--central-value", "--num-envs", "2",
             "--num-steps", "16", "--num-minibatches", "2", "--total-timesteps", "64"]
    assert run_main(ppo, flags, monkeypatch) == 0
    assert run_main(ppo, ["--eval-checkpoint", glob.glob("runs/*/checkpoint.pt")[0], "--env-id", "stated",
                          "--env-kwargs", kwargs(ppo), "--eval-episodes", "1"], monkeypatch) == 0
    assert "--central-value takes a PettingZoo game" in run_main(ppo, ["--central-value"], monkeypatch)


@pytest.mark.parametrize("ppo", ALL, ids=lambda module: module.__name__)
def test_a_games_large_frames_are_gray_84_by_84_the_last_4_stacked_for_a_cnn(ppo, games, monkeypatch):
    """Atari's preprocessing where a game's frames are larger than 84 x 84: each row, after the agent id (2 float32),
    holds the 4 last frames in gray at 84 x 84 (at a start, the first 4 times); ppo_vector_sameStep.py trains on them."""
    envs = ppo.make_envs(ppo.Args(env_id="screens", env_kwargs=kwargs(ppo)), 1, None, 1)
    seen = [envs.reset(seed=1)[0]] + [envs.step(envs.action_space.sample() * 0)[0] for _ in range(2)]
    assert seen[0].shape == (2, 8 + 4 * 84 * 84) and seen[0].dtype == np.uint8
    frames = [obs[0, 8:].reshape(4, 84, 84) for obs in seen]  # runner_0's
    assert [f[:, 40, 40].tolist() for f in frames] == [[0, 0, 0, 0], [0, 0, 0, 30], [0, 0, 30, 60]]
    assert all((f == f[:, :1, :1]).all() for f in frames)  # each frame uniform, as the screen is
    envs.close()
    if ppo is ppo_vector_sameStep:  # which flattened a game's images into its MLP before; the others' CNN path is one
        flags = ["--env-id", "screens", "--num-envs", "1", "--num-steps", "16", "--num-minibatches", "2",
                 "--total-timesteps", "32"]
        assert run_main(ppo, flags, monkeypatch) == 0


def test_only_an_agents_own_action_dimensions_count_in_its_log_probability_and_entropy(games):
    """ppo_continuous.py, hunters of 1 dimension and a prey of 2: a hunter's padded dimension changes nothing."""
    envs = ppo_continuous.make_envs(ppo_continuous.Args(env_id="roles", env_kwargs='{"box": true}'), 1, None, 1)
    obs, infos = envs.reset(seed=1)
    agent = ppo_continuous.Agent(envs, ppo_continuous.Args())
    dims = torch.from_numpy(ppo_continuous.action_dims(infos, (3, 2)))
    assert dims.tolist() == [[1, 0], [1, 0], [1, 1]]
    hidden = agent.encode(torch.from_numpy(obs))
    action = torch.zeros(3, 2)
    _, logprob, entropy = agent.policy(hidden, action, dims=dims)
    _, moved, _ = agent.policy(hidden, action + torch.tensor([0.0, 3.0]), dims=dims)
    assert moved[:2].tolist() == logprob[:2].tolist() and moved[2] != logprob[2]
    assert entropy[:2].tolist() == pytest.approx([entropy[2].item() / 2] * 2)
    envs.close()


@pytest.mark.skipif(not importlib.util.find_spec("mpe2"), reason="needs mpe2 (pip install mpe2==1.1.1)")
def test_simple_spread_trains_and_evaluates_every_agent(in_tmp, monkeypatch, capsys):
    flags = ["--env-id", "mpe2.simple_spread_v3", "--num-envs", "2", "--num-steps", "32", "--total-timesteps", "384"]
    assert run_main(ppo_discrete, flags, monkeypatch) == 0
    checkpoint = glob.glob("runs/*/checkpoint.pt")[0]
    assert run_main(ppo_discrete, ["--eval-checkpoint", checkpoint, "--env-id", "mpe2.simple_spread_v3",
                                   "--eval-episodes", "2"], monkeypatch) == 0
    assert "25 steps" in capsys.readouterr().out  # a game of 25 cycles, every agent acting


@pytest.mark.skipif(not importlib.util.find_spec("pettingzoo"), reason='needs pip install "pettingzoo[sisl]==1.27.0"')
def test_multiwalker_trains_and_evaluates_every_walker(in_tmp, monkeypatch, capsys):
    flags = ["--env-id", "pettingzoo.sisl.multiwalker_v9", "--num-envs", "1", "--num-steps", "64",
             "--total-timesteps", "384"]
    assert run_main(ppo_continuous, flags, monkeypatch) == 0
    checkpoint = glob.glob("runs/*/checkpoint.pt")[0]
    assert run_main(ppo_continuous, ["--eval-checkpoint", checkpoint, "--env-id", "pettingzoo.sisl.multiwalker_v9",
                                     "--eval-episodes", "1"], monkeypatch) == 0
    assert "mean return" in capsys.readouterr().out

"""Trust a change by running it: a script, or your copy of one, resumes, repeats, evaluates and matches its original.

    python benchmarks/self_check.py my_ppo.py --against ppo_continuous.py
    python benchmarks/self_check.py ppo_discrete.py -- --env-id Acrobot-v1 --recurrent lstm

It starts the script as a user does, in a folder of its own under the system's temporary folder, and reads what the
runs leave there: checkpoints and TensorBoard events. One line per check, then a summary; status 0 when every check
holds, else 1, each failed check naming what differed first (a checkpoint entry, or a tag at a step). The flags after
`--` go to every run (on small batches: --num-envs 2 --num-steps 32 unless given), but the against check drops those of
settings ORIGINAL lacks: it runs both at the copy's defaults. A new code path that a flag turns on is checked by a
second call with it on (`-- --my-flag ...`); a tensor it changes is best checked away from any bound it is clamped to
(a value stuck at its bound resumes alike whether restored or not). The checks:
- resume: a run stopped by a real SIGTERM after its first checkpoint, then resumed, ends exactly where a run left alone
  ends: every entry of its checkpoint (train()'s `state`, with what the copy added, the optimizer, the random state) and
  every scalar TensorBoard received but charts/SPS. A resumed run starts fresh episodes, so this check trains on an env
  of this file (SelfCheckBox-v0, or SelfCheckDiscrete-v0 for ppo_discrete.py's kind) whose episodes end at a rollout's
  boundary and start alike whatever the seed; the other checks train on your env.
- repeat: two runs of the same seed leave the same checkpoint and the same scalars.
- evaluate: the checkpoint evaluates, with the policy's mean (or argmax) and with sampled actions.
- against (with --against ORIGINAL): the copy, with the settings it added at their defaults, trains bit for bit as
  ORIGINAL does, and resumes ORIGINAL's checkpoint.
- contents: what the checkpoint holds and what TensorBoard received; with --against, what the copy added.
A check takes well under a minute on 2 cores at these sizes; --only runs some of them (--only resume repeat), --keep
keeps the runs' folder to look into.
"""

import argparse
import ast
import glob
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import gymnasium as gym
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = {"--num-envs": "2", "--num-steps": "32"}  # small batches, unless the flags given set them
ITERATIONS = 3  # of a run on the user's env; the resume check's runs have 8, so that a stop lands before the end
NOT_COMPARED = {"run_name", "script"}  # entries that differ between two runs by design: folder, file name
NOT_COMPARED_ARGS = {"resume", "eval_checkpoint", "exp_name"}  # exp_name: a copy's file name by default
TIMED = {"charts/SPS"}  # scalars that measure time, not training
CHECKS = ("resume", "repeat", "evaluate", "against", "contents")
NEXT_STEP_KINDS = {"ppo_discrete.py": True, "ppo_continuous.py": False}  # kind: discrete actions (else SAME_STEP, Box)


class SelfCheckEnv(gym.Env):
    """A point pushed by the actions, for the resume check: every episode starts at the same place whatever the seed
    and lasts `length` steps (a rollout's real transitions), then terminates if its first coordinate is positive, else
    is truncated (time limit), so that both kinds of episode end meet the resume boundary."""

    PUSHES = np.array([[-0.1, 0.05], [0.0, 0.0], [0.1, -0.05]])

    def __init__(self, length=31, discrete=False):
        self.length, self.discrete = length, discrete
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
        self.action_space = gym.spaces.Discrete(3) if discrete else gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)  # taken, not used: the start does not depend on it
        self.t, self.x = 0, np.array([0.5, -0.5])
        return self.observe(), {}

    def observe(self):
        return np.array([*self.x, self.t / self.length, 1.0], dtype=np.float32)

    def step(self, action):
        push = self.PUSHES[int(action)] if self.discrete else 0.1 * np.clip(action, -1.0, 1.0)
        self.x, self.t = 0.9 * self.x + push, self.t + 1
        ended = self.t == self.length
        terminated = ended and self.x[0] > 0
        return self.observe(), float(1.0 - np.abs(self.x).sum()), terminated, ended and not terminated, {}


gym.register("SelfCheckBox-v0", entry_point=SelfCheckEnv, kwargs={"discrete": False})
gym.register("SelfCheckDiscrete-v0", entry_point=SelfCheckEnv, kwargs={"discrete": True})


# ---------- Flags ----------

def flag_value(flags, name):
    """The value given to --name in flags (the last one), or None."""
    value = None
    for i, token in enumerate(flags):
        if token == name and i + 1 < len(flags):
            value = flags[i + 1]
        elif token.startswith(name + "="):
            value = token.split("=", 1)[1]
    return value


def without(flags, drop):
    """flags without each --flag (and its value) for which drop(name) is true; name without its leading dashes."""
    kept, dropping = [], False
    for token in flags:
        if token.startswith("--"):
            dropping = drop(token[2:].split("=", 1)[0])
        if not dropping:
            kept.append(token)
    return kept


def settings_of(path):
    """The fields of a script's Args, read from its source (the flags it takes, with dashes)."""
    tree = ast.parse(open(path).read())
    args = next((node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Args"), None)
    if args is None:
        raise SystemExit(f"error: {path} has no Args dataclass: is it one of the PPO scripts, or a copy of one?")
    return [node.target.id for node in args.body if isinstance(node, ast.AnnAssign)]


def kind_of(path):
    """The script's kind (the constant KIND a copy keeps), else its file name (scripts before KIND)."""
    found = re.search(r'^KIND = "([^"]+)"', open(path).read(), re.M)
    return found.group(1) if found else os.path.basename(path)


# ---------- Runs ----------

class Runs:
    """Starts the scripts in folders of their own under one temporary folder, as a user would from a terminal."""

    def __init__(self, keep):
        self.root, self.keep = tempfile.mkdtemp(prefix="self_check_"), keep
        self.environ = {**os.environ, "PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])}

    def start(self, name, script, flags):
        """Start a run in the folder `name` (made if new: a resumed run goes on in its stopped run's folder)."""
        folder = os.path.join(self.root, name)
        os.makedirs(folder, exist_ok=True)
        output = os.path.join(folder, f"output{len(glob.glob(os.path.join(folder, 'output*.txt')))}.txt")
        with open(output, "w") as stream:
            process = subprocess.Popen([sys.executable, os.path.abspath(script), *flags], cwd=folder, env=self.environ,
                                       stdout=stream, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        process.folder, process.output = folder, output
        return process

    def close(self):
        if self.keep:
            print(f"the runs are in {self.root}")
        else:
            shutil.rmtree(self.root, ignore_errors=True)


def finish(process, timeout=600):
    """Wait for a run; (its status, the text it printed)."""
    try:
        status = process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        status = process.wait()
    return status, open(process.output).read()


def last_line(text):
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip() if lines else "(no output)"


def checkpoint_of(process):
    found = glob.glob(os.path.join(process.folder, "runs", "*", "checkpoint.pt"))
    return found[0] if found else None


def stop_after_first_checkpoint(process, timeout=300):
    """Send SIGTERM once the run has written its first checkpoint (the run then saves at the end of its iteration)."""
    deadline = time.time() + timeout
    while process.poll() is None and time.time() < deadline:
        if checkpoint_of(process):
            process.send_signal(signal.SIGTERM)
            return True
        time.sleep(0.01)
    return False


# ---------- What a run leaves ----------

def load(path):
    import torch  # here: the env above is imported by the scripts' processes, which need no torch from this module

    return torch.load(path, map_location="cpu", weights_only=True)


def scalars(process):
    """Every scalar of a run's folder: {tag: [(step, value), ...]} in the order written, what a resumed run's purge
    step discarded left out (as TensorBoard shows it)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util import tensor_util

    files = []
    for path in glob.glob(os.path.join(process.folder, "runs", "*", "events.out.tfevents.*")):
        events = list(EventFileLoader(path).Load())
        files.append((events[0].wall_time if events else 0.0, events))
    found = {}
    for _, events in sorted(files, key=lambda item: item[0]):
        for event in events:
            if event.HasField("session_log") and event.session_log.status == event.session_log.START:
                for tag in found:  # a resumed run's start: what was logged from its step on is dropped
                    found[tag] = [(step, value) for step, value in found[tag] if step < event.step]
            for value in event.summary.value if event.HasField("summary") else []:
                if value.metadata.plugin_data.plugin_name == "scalars":
                    number = tensor_util.make_ndarray(value.tensor).item()
                    found.setdefault(value.tag, []).append((event.step, number))
                elif value.HasField("simple_value"):
                    found.setdefault(value.tag, []).append((event.step, value.simple_value))
    return found


def first_difference(a, b, where=""):
    """Where two checkpoints' contents first differ (a path such as optimizer.state.3.exp_avg), or None."""
    import torch

    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return f"{where or 'the checkpoint'} (entries only in one: {', '.join(map(str, a.keys() ^ b.keys()))})"
        return next((d for key in a for d in [first_difference(a[key], b[key], f"{where}.{key}".strip("."))] if d),
                    None)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return where
        return next((d for i, (x, y) in enumerate(zip(a, b)) for d in [first_difference(x, y, f"{where}.{i}")] if d),
                    None)
    if torch.is_tensor(a) and torch.is_tensor(b):
        same = a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.nan_to_num(0.5), b.nan_to_num(0.5))
        return None if same else where
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return None
    return None if a == b else where


def comparable(checkpoint):
    kept = {key: value for key, value in checkpoint.items() if key not in NOT_COMPARED}
    kept["args"] = {key: value for key, value in checkpoint["args"].items() if key not in NOT_COMPARED_ARGS}
    return kept


def scalar_difference(a, b):
    """The first tag and step where two runs' scalars differ (time excluded), or None."""
    for tag in sorted((a.keys() | b.keys()) - TIMED):
        x, y = a.get(tag, []), b.get(tag, [])
        for i in range(max(len(x), len(y))):
            if i >= len(x) or i >= len(y):
                return f"{tag}: {len(x)} values against {len(y)}"
            if x[i][0] != y[i][0] or not (x[i][1] == y[i][1] or (math.isnan(x[i][1]) and math.isnan(y[i][1]))):
                return f"{tag} at step {x[i][0]} ({x[i][1]!r} against {y[i][1]!r})"
    return None


def same_runs(first, second, what):
    """(holds, said) for two finished runs that should be identical."""
    entry = first_difference(comparable(load(checkpoint_of(first))), comparable(load(checkpoint_of(second))))
    a, b = scalars(first), scalars(second)
    tag = scalar_difference(a, b)
    if entry or tag:
        return False, (f"{what} differ first at checkpoint entry {entry or '(none)'}; "
                       f"in TensorBoard first at {tag or '(none)'}")
    return True, f"{what}: checkpoints and {sum(len(v) for k, v in a.items() if k not in TIMED)} scalars equal"


def ran(process, expected=(0,)):
    """(finished as expected, the status and the run's last line)."""
    status, text = finish(process)
    return status in expected, status, last_line(text), text


# ---------- The checks ----------

def main():
    argv = sys.argv[1:]
    flags = argv[argv.index("--") + 1:] if "--" in argv else []
    epilog = "flags after -- go to every run, but the against check drops those of settings ORIGINAL lacks"
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=epilog)
    parser.add_argument("script", help="a PPO script, or your copy of one")
    parser.add_argument("--against", metavar="ORIGINAL", help="the script your copy was made from")
    parser.add_argument("--keep", action="store_true", help="keep the runs' folder (its path is printed)")
    parser.add_argument("--only", nargs="+", choices=CHECKS, metavar="CHECK",
                        help=f"run these checks alone (of {', '.join(CHECKS)}; default: all)")
    options = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    if options.only and "against" in options.only and not options.against:
        raise SystemExit("error: the against check needs --against ORIGINAL")
    chosen = set(options.only or [name for name in CHECKS if name != "against" or options.against])
    for path in [options.script] + ([options.against] if options.against else []):
        if not os.path.isfile(path):
            raise SystemExit(f"error: no script {path}")
    given = {token[2:].split("=", 1)[0] for token in flags if token.startswith("--")}
    if given & {"resume", "eval-checkpoint"}:
        raise SystemExit("error: the self-check makes its own checkpoints: drop --resume and --eval-checkpoint")
    script, kind = options.script, kind_of(options.script)
    if kind not in NEXT_STEP_KINDS and kind != "ppo_vector_sameStep.py":
        raise SystemExit(f"error: cannot tell the kind of {script} ({kind}): is it a copy of one of the scripts?")

    sized = flags + [token for flag, value in SIZES.items() if flag[2:] not in given for token in (flag, value)]
    num_steps = int(flag_value(sized, "--num-steps"))
    batch = int(flag_value(sized, "--num-envs")) * num_steps
    schedule = lambda iterations: ["--total-timesteps", str(iterations * batch), "--checkpoint-interval", "1"]
    user = without(sized, lambda name: name in ("total-timesteps", "checkpoint-interval")) + schedule(ITERATIONS)
    # the resume check's env: episodes of a rollout's real transitions (NEXT_STEP: all rows but the autoreset one)
    discrete = NEXT_STEP_KINDS.get(kind, False)
    env_id = f"self_check:SelfCheck{'Discrete' if discrete else 'Box'}-v0"
    length = num_steps - 1 if kind in NEXT_STEP_KINDS else num_steps
    own = without(user, lambda name: name in ("env-id", "env-kwargs", "env-backend", "capture-video", "track",
                                               "total-timesteps", "checkpoint-interval"))
    own += ["--env-id", env_id, "--env-kwargs", f'{{"length": {length}}}', *schedule(8)]
    user_env = flag_value(flags, "--env-id")
    named_env = ["--env-id", user_env] if user_env and ":" in user_env else []  # a module's env is named to be made

    runs, results, started = Runs(options.keep), [], time.time()

    def say(name, holds, text):
        results.append((name, holds))
        print(f"{'ok  ' if holds else 'FAIL'}  {name:<9} {text} [{time.time() - started:.0f} s]", flush=True)

    try:
        if "resume" in chosen:
            whole, cut = runs.start("resume_whole", script, own), runs.start("resume_cut", script, own)
        first = runs.start("repeat_1", script, user) if chosen - {"resume"} else None  # what the other checks read
        if "resume" in chosen:
            check_resume(runs, script, env_id, whole, cut, say)
        second = runs.start("repeat_2", script, user) if "repeat" in chosen else None
        if first is not None:
            ok, status, line, _ = ran(first)
            if not ok:
                for name in [name for name in CHECKS if name in chosen and name != "resume"]:
                    say(name, False, f"the run failed (status {status}): {line}")
                if second is not None:
                    finish(second)
            else:
                checks_on(first, second, runs, options, script, user, flags, named_env, chosen, say)
    finally:
        runs.close()
    failed = [name for name, holds in results if not holds]
    print(f"self-check of {script}: {len(results) - len(failed)} of {len(results)} checks hold"
          f"{' (failed: ' + ', '.join(failed) + ')' if failed else ''}, in {time.time() - started:.0f} s")
    return 1 if failed else 0


def checks_on(first, second, runs, options, script, user, flags, named_env, chosen, say):
    """repeat, evaluate, against and contents, on the finished first run of the user's env (`second`: its repeat)."""
    if "evaluate" in chosen:
        evaluations = [runs.start(f"evaluate_{how}", script, ["--eval-checkpoint", checkpoint_of(first),
                                                               "--eval-episodes", "2", "--eval-max-steps", "500",
                                                               *named_env, *extra])
                       for how, extra in (("mean", []), ("sampled", ["--eval-sample"]))]
    if "repeat" in chosen:
        ok, status, line, _ = ran(second)
        seed = flag_value(flags, "--seed") or "1"
        say("repeat", *(same_runs(first, second, f"two runs of seed {seed}") if ok else
                        (False, f"the second run failed (status {status}): {line}")))
    if "evaluate" in chosen:
        said, holds = [], True
        for process, how in zip(evaluations, ("mean or argmax", "sampled")):
            ok, status, line, text = ran(process)
            mean = re.search(r"mean return (\S+ ± \S+)", text)
            holds = holds and ok and bool(mean)
            said.append(f"{how} {mean.group(1)}" if ok and mean else f"{how} failed (status {status}): {line}")
        say("evaluate", holds, "; ".join(said) + " (2 episodes)")
    added = against(runs, options, user, first, say) if "against" in chosen else None
    if "contents" in chosen:
        say("contents", True, contents(first, added))


def check_resume(runs, script, env_id, whole, cut, say):
    """Stop `cut` by SIGTERM after its first checkpoint, resume it, and hold it against `whole`, left alone."""
    signalled = stop_after_first_checkpoint(cut)
    status, text = finish(cut)
    if not signalled or status != 128 + signal.SIGTERM:
        finish(whole)
        return say("resume", False, f"the run did not stop at SIGTERM with status {128 + signal.SIGTERM} after its "
                                    f"first checkpoint (status {status}): {last_line(text)}")
    stopped = load(checkpoint_of(cut))["iteration"]
    rest = runs.start("resume_cut", script, ["--resume", os.path.relpath(checkpoint_of(cut), cut.folder),
                                             "--env-id", env_id])
    for process in (whole, rest):
        ok, status, line, _ = ran(process)
        if not ok:
            return say("resume", False, f"{'the resumed' if process is rest else 'the whole'} run failed "
                                        f"(status {status}): {line}")
    holds, said = same_runs(whole, rest, "resumed and uninterrupted runs")
    say("resume", holds, f"SIGTERM at iteration {stopped} of 8 on {env_id}; {said}")


def against(runs, options, user, first, say):
    """The copy with its added settings at their defaults trains as ORIGINAL does, and resumes ORIGINAL's checkpoint.
    Returns what the copy added: (settings, checkpoint entries, tags)."""
    known = {name.replace("_", "-") for name in settings_of(options.against)}
    plain = without(user, lambda name: name not in known and not (name.startswith("no-") and name[3:] in known))
    original = runs.start("against_original", options.against, plain)
    copy = first if plain == user else runs.start("against_copy", options.script, plain)
    ok, status, line, _ = ran(original)
    copy_ok, copy_status, copy_line, _ = ran(copy)
    if not ok or not copy_ok:
        which, status, line = ("ORIGINAL", status, line) if not ok else ("the copy", copy_status, copy_line)
        say("against", False, f"{which} failed (status {status}): {line}")
        return None
    ours, theirs = load(checkpoint_of(copy)), load(checkpoint_of(original))
    changed = [f"{name} {ours['args'][name]!r} (ORIGINAL: {theirs['args'][name]!r})" for name in theirs["args"]
               if name in ours["args"] and name not in NOT_COMPARED_ARGS and ours["args"][name] != theirs["args"][name]]
    shared = {key: value for key, value in comparable(ours).items() if key in theirs and key != "args"}
    difference = first_difference(shared, {key: comparable(theirs)[key] for key in shared})
    tags_ours, tags_theirs = scalars(copy), scalars(original)
    tag_difference = scalar_difference({tag: tags_ours[tag] for tag in tags_ours if tag in tags_theirs}, tags_theirs)
    if changed or difference or tag_difference:
        say("against", False, f"the copy does not train as {options.against}: "
            + (f"settings whose defaults differ: {', '.join(changed)}" if changed else
               f"first difference at checkpoint entry {difference}" if difference else
               f"first difference at {tag_difference}"))
    else:
        total = 2 * theirs["global_step"]
        resumed = runs.start("against_resume", options.script,
                             ["--resume", checkpoint_of(original), "--total-timesteps", str(total), *
                              (["--env-id", theirs["args"]["env_id"]] if ":" in theirs["args"]["env_id"] else [])])
        ok, status, line, text = ran(resumed)
        notes = [line.removeprefix("note: ") for line in text.splitlines() if line.startswith("note:")]
        said = f"saying: {'; '.join(notes)}" if notes else "with no note"  # the copy's new settings and entries
        say("against", ok, f"trains bit for bit as {options.against} (checkpoint and scalars); "
            + (f"resumes its checkpoint to step {total:,}, {said}" if ok else
               f"cannot resume its checkpoint (status {status}): {line}"))
    return (sorted(set(ours["args"]) - set(theirs["args"])), sorted(set(ours) - set(theirs)),
            sorted(set(tags_ours) - set(tags_theirs)))


def contents(run, added):
    checkpoint, tags = load(checkpoint_of(run)), scalars(run)
    counters = {"global_step", "iteration", "run_name", "script", "kind", "rng_state", "cuda_rng_state"}
    state = [key for key in checkpoint if key not in counters and key != "args"]  # train()'s `state`
    fields = [key for key in checkpoint if key in counters]
    groups = {}
    for tag in sorted(tags):
        groups.setdefault(tag.split("/")[0], []).append(tag.split("/", 1)[-1])
    said = (f"the checkpoint holds state {', '.join(state)}; {', '.join(fields)}; {len(checkpoint['args'])} settings. "
            f"TensorBoard: " + "; ".join(f"{group}/ {', '.join(names)}" for group, names in groups.items()))
    if added:
        settings, entries, new_tags = added
        said += (f". The copy adds settings: {', '.join(settings) or 'none'}; checkpoint entries: "
                 f"{', '.join(entries) or 'none'}; tags: {', '.join(new_tags) or 'none'}")
    return said


if __name__ == "__main__":
    sys.exit(main())

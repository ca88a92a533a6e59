"""Where a run's time goes: one of the scripts under cProfile, its wall time split into phases.

    python benchmarks/breakdown.py ppo_continuous.py --env-id Humanoid-v5 --total-timesteps 40960 $HUMANOID

Every flag after the script goes to the script, as for a run (it writes its run under runs/ as usual;
checkpoints only at the end unless --checkpoint-interval is given). Prints, per phase, the milliseconds per
iteration and the share of the whole process: startup (imports, env and network creation: outside the
training loop), env steps (the vector env, its wrappers included), the policy during the rollout,
observation normalization and reward scaling, the critic's values and GAE after the rollout, the update
(loss, backward, gradient clip, optimizer), logging with the copy of each iteration's state and the
checkpoints, and the rest of the loop.
cProfile adds a cost to every Python call, so call-heavy phases (the env's Python code, the update's
many small operations) come out larger than they are without it: compare runs of this tool with each
other, not with speed.py's numbers.
"""

import cProfile
import os
import pstats
import runpy
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = "<script>"  # stands for the profiled script's file in the tables below

# made by train() before its loop: the env, the network, the optimizer, the run (its folder; TensorBoard's writer on entering
# its guard)
SETUP = [(SCRIPT, "make_envs"), (SCRIPT, "__init__"), ("adam.py", "__init__"), ("contextlib.py", "__enter__")]
# phase: the functions (file name fragment, function name) whose time counts, each only where train() calls it
PHASES = {
    "env steps": [(SCRIPT, "step")],  # the scripts' CheckedEnvs wrapper around the vector env
    # remember: with the values' one pass; the actor's forward pass in the rollout (agent.actor, a module call from
    # train) counts with the critic's under "values and GAE"
    "policy in the rollout": [(SCRIPT, "remember"), (SCRIPT, "policy")],
    "normalization and reward scaling": [(SCRIPT, "normalize_obs"), (SCRIPT, "scale")],
    "values and GAE": [("module.py", "_wrapped_call_impl"), (SCRIPT, "compute_advantages"), (SCRIPT, "real_transitions")],
    "update": [(SCRIPT, "<genexpr>"), (SCRIPT, "sequence_minibatches"), (SCRIPT, "ppo_loss"), ("_tensor.py", "backward"), ("clip_grad.py", "_no_grad_wrapper"),
               ("optimizer.py", "wrapper"), ("_compile.py", "inner")],
    "logging, state copy and checkpoints": [(SCRIPT, "log_episodes"), (SCRIPT, "end_iteration")],
}


def seconds_called_from_train(stats, file_fragment, function, script):
    """Seconds in `function` (of a file whose path contains file_fragment), with what it calls, where train() calls it."""
    file_fragment, total = script if file_fragment == SCRIPT else file_fragment, 0.0
    for (filename, _, name), (_, _, _, _, callers) in stats.stats.items():
        if name == function and file_fragment in filename:
            total += sum(entry[3] for (caller_file, _, caller), entry in callers.items() if caller == "train" and script in caller_file)
    return total


def main():
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        raise SystemExit(0 if len(sys.argv) > 1 else 2)
    script = sys.argv[1] if os.path.isfile(sys.argv[1]) else os.path.join(ROOT, sys.argv[1])  # any path, or one of ours
    if not os.path.isfile(script):
        raise SystemExit(f"error: no script {sys.argv[1]} (here or in {ROOT})")
    flags = sys.argv[2:] if "--checkpoint-interval" in sys.argv else [*sys.argv[2:], "--checkpoint-interval", "0"]
    sys.argv = [script, *flags]
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        profiler.disable()
    whole = time.perf_counter() - start
    stats = pstats.Stats(profiler)

    name_of_script = os.path.basename(script)
    train = sum(entry[3] for (filename, _, name), entry in stats.stats.items() if name == "train" and name_of_script in filename)
    iterations = sum(entry[1] for (filename, _, name), entry in stats.stats.items() if name == "compute_advantages" and name_of_script in filename)
    setup = sum(seconds_called_from_train(stats, *function, name_of_script) for function in SETUP)
    phases = {phase: sum(seconds_called_from_train(stats, *function, name_of_script) for function in functions)
              for phase, functions in PHASES.items()}
    rows = [("startup: imports, env, network", whole - train + setup), *phases.items(),
            ("the rest of the loop", train - setup - sum(phases.values()))]
    print(f"\n{sys.argv[0]} {' '.join(flags)}")
    print(f"whole process {whole:.1f} s, {iterations} iterations under cProfile\n")
    print(f"{'phase':40s} {'ms / iteration':>14s} {'share':>7s}")
    for phase, seconds in rows:
        per_iteration = f"{1000 * seconds / iterations:14.2f}" if iterations and phase != rows[0][0] else f"{'-':>14s}"
        print(f"{phase:40s} {per_iteration} {100 * seconds / whole:6.1f}%")


if __name__ == "__main__":
    main()

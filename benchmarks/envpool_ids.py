"""What ppo_discrete.py and ppo_continuous.py do with each of EnvPool's env ids: train it, or refuse it in one line.

For every id (or those given) and both scripts: the script's own check_env with --env-backend envpool, then, for an
id it passes, the script's make_envs with 2 sub-envs, a reset and 3 steps of random actions. One JSON line per
(script, id) goes to --out: "trains" (with the observation vector's shape), "refused" (with the one line), or
"TRACEBACK" (an exception the check let through: a bug). An id whose env takes the process down or hangs it (a
segfault inside EnvPool) is recorded as "CRASH" and the survey goes on in a new process; the same command resumes.

    pip install envpool==1.2.5
    python benchmarks/envpool_ids.py --out benchmark_runs/envpool_ids.jsonl
    python benchmarks/envpool_ids.py --out ids.jsonl --ids CheetahRun-v1 Pong-v5 FrozenLake-v1
"""

import argparse
import collections
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = ("ppo_discrete", "ppo_continuous")
HANG = 300  # seconds


def surveyed(out):
    """The (script, id) pairs already in the output file."""
    if not os.path.exists(out):
        return set()
    with open(out) as f:
        return {(record["script"], record["id"]) for record in map(json.loads, f)}


def record(out, **fields):
    with open(out, "a") as f:
        f.write(json.dumps(fields) + "\n")


def survey(out, env_ids):
    """In this process: every pair not yet in `out`; the pair under way is named in <out>.current first."""
    import importlib

    import numpy as np

    warnings.filterwarnings("ignore")
    done = surveyed(out)
    for env_id in env_ids:
        for name in SCRIPTS:
            if (name, env_id) in done:
                continue
            with open(out + ".current", "w") as f:
                json.dump([name, env_id], f)
            ppo = importlib.import_module(name)
            args = ppo.Args(env_id=env_id, env_backend="envpool", env_threads=1)
            try:
                ppo.check_env(args, {})
                envs = ppo.make_envs(args, 2, None, 1)
                observations, _ = envs.reset()
                for _ in range(3):
                    actions = np.stack([envs.single_action_space.sample() for _ in range(2)])
                    observations = envs.step(actions)[0]
                envs.close()
                record(out, script=name, id=env_id, outcome="trains", observations=list(observations.shape))
            except SystemExit as refusal:
                record(out, script=name, id=env_id, outcome="refused", message=str(refusal.code))
            except Exception as e:
                record(out, script=name, id=env_id, outcome="TRACEBACK", message=f"{type(e).__name__}: {e}"[:300])
    os.remove(out + ".current")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the JSON-lines file of outcomes (appended to; resumed)")
    parser.add_argument("--ids", nargs="+", default=None, help="these env ids only (default: envpool.list_all_envs())")
    parser.add_argument("--in-this-process", action="store_true", help=argparse.SUPPRESS)  # the worker's own flag
    cli = parser.parse_args()
    import envpool

    env_ids = cli.ids or envpool.list_all_envs()
    if cli.in_this_process:
        return survey(cli.out, env_ids)
    cli.out = os.path.abspath(cli.out)
    while True:  # a worker process surveys until it ends or an env takes it down; then the next one goes on
        worker = [sys.executable, os.path.abspath(__file__), "--out", cli.out, "--in-this-process"]
        with tempfile.TemporaryDirectory() as workdir:  # where some envs write files of their own (VizDoom's ini)
            process = subprocess.Popen(worker + (["--ids", *cli.ids] if cli.ids else []), cwd=workdir,
                                       stderr=subprocess.DEVNULL)
            while process.poll() is None:  # a pair that takes over HANG seconds: its env hangs (after a crash, seen)
                time.sleep(1)
                with contextlib.suppress(OSError):
                    if time.time() - os.path.getmtime(cli.out + ".current") > HANG:
                        process.kill()
        if not os.path.exists(cli.out + ".current"):
            break
        with open(cli.out + ".current") as f:
            name, env_id = json.load(f)
        if (name, env_id) not in surveyed(cli.out):
            record(cli.out, script=name, id=env_id, outcome="CRASH", exit_status=process.returncode)
    with open(cli.out) as f:
        records = [json.loads(line) for line in f]
    for name in SCRIPTS:
        counts = collections.Counter(r["outcome"] for r in records if r["script"] == name and r["id"] in env_ids)
        print(f"{name}.py: " + ", ".join(f"{outcome} {count}" for outcome, count in sorted(counts.items())))
    for r in records:
        if r["outcome"] in ("TRACEBACK", "CRASH") and r["id"] in env_ids:
            print(f"{r['outcome']}: {r['script']}.py {r['id']} {r.get('message', '')}")


if __name__ == "__main__":
    main()

"""Fingerprints of training: a hash of what each script has learned after 8,192 steps at its defaults (the Box
scripts also on Humanoid-v5). Run it before and after a change that must not change what PPO computes: equal
hashes on the same machine mean bit-identical weights, optimizer state, normalization statistics and random state.

    python benchmarks/fingerprint.py
"""

import contextlib
import hashlib
import io
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT  # noqa: E402

sys.path.insert(0, ROOT)
import ppo_continuous  # noqa: E402
import ppo_discrete  # noqa: E402
import ppo_vector_sameStep  # noqa: E402


CASES = [(ppo_discrete, {}), (ppo_continuous, {}), (ppo_continuous, {"env_id": "Humanoid-v5"}),
         (ppo_vector_sameStep, {}), (ppo_vector_sameStep, {"env_id": "Humanoid-v5", "vectorization_mode": "sync"})]

if __name__ == "__main__":
    os.chdir(tempfile.mkdtemp())
    for ppo, settings in CASES:
        with contextlib.redirect_stdout(io.StringIO()):
            path = ppo.train(ppo.Args(**{"total_timesteps": 8192, "cuda": False, **settings}))
        checkpoint, digest = torch.load(path, weights_only=True), hashlib.sha256()
        for key in ("model", "optimizer", "obs_rms", "return_rms", "rng_state"):
            if key in checkpoint:
                buffer = io.BytesIO()
                torch.save(checkpoint[key], buffer)
                digest.update(buffer.getvalue())
        print(f"{ppo.__name__}.py {settings.get('env_id', 'defaults')}: {digest.hexdigest()[:16]}", flush=True)

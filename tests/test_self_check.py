"""benchmarks/self_check.py, run as a user runs it: it passes on a copy of each script that adds a setting, a tensor
in `state` and a chart, and fails, naming what differed, on copies broken on purpose: a tensor the run changes left out
of `state`, an unseeded source of randomness, a changed default."""

import os
import re
import subprocess
import sys

import pytest
from conftest import ROOT

SCRIPTS = ["ppo_discrete.py", "ppo_continuous.py", "ppo_vector_sameStep.py"]
FAST_ENV = {"ppo_discrete.py": "CartPole-v1", "ppo_continuous.py": "Pendulum-v1", "ppo_vector_sameStep.py": "Pendulum-v1"}


def self_check(*argv, cwd):
    """(status, output) of `python benchmarks/self_check.py ARGV` started in cwd."""
    done = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "self_check.py"), *argv], cwd=cwd,
                          capture_output=True, text=True, timeout=600)
    return done.returncode, done.stdout + done.stderr


def copy_of(script, folder, *edits):
    """my_ppo.py in folder: the script with each (old, new) replaced once."""
    text = open(os.path.join(ROOT, script)).read()
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    (folder / "my_ppo.py").write_text(text)
    return "my_ppo.py"


def with_a_decaying_coefficient(decay, in_state):
    """The edits of a researcher's copy: a setting, a tensor the run changes in place each iteration, its chart."""
    field = "    clip_coef: float = "
    return [(field, f'    ent_decay: float = {decay}\n    """the decay of ent_scale per iteration"""\n' + field),
            ("    rows = (args.num_steps, num_envs)", "    ent_scale = torch.ones(())\n" +
             ('    state["ent_scale"] = ent_scale\n' if in_state else "") + "    rows = (args.num_steps, num_envs)"),
            ("            charts = dict(coefs, ", "            ent_scale.mul_(args.ent_decay)\n"
                                                "            charts = dict(coefs, ent_scale=ent_scale.item(), ")]


def line_of(check, output):
    found = re.search(rf"^(ok  |FAIL)  {check} .*$", output, re.M)
    assert found, output
    return found.group(0)


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_copy_that_adds_a_setting_state_and_a_chart_passes_every_check_against_its_script(script, tmp_path):
    # the tensor halves each iteration (it changes no loss): the resume check holds only if it is restored
    copy = copy_of(script, tmp_path, *with_a_decaying_coefficient(0.5, in_state=True))
    status, output = self_check(copy, "--against", os.path.join(ROOT, script), "--", "--env-id", FAST_ENV[script],
                                cwd=tmp_path)
    assert status == 0, output
    for check in ("resume", "repeat", "evaluate", "against", "contents"):
        assert line_of(check, output).startswith("ok  "), output
    assert "SIGTERM at iteration" in line_of("resume", output)
    resumed = line_of("against", output)  # the copy takes its original's checkpoint, each new thing in a note
    assert "resumes its checkpoint to step 384, saying: the checkpoint has no setting ent_decay: 0.5 applies" in resumed
    assert "the checkpoint has no ent_scale: it starts fresh" in resumed
    added = line_of("contents", output).split("The copy adds ")[1]
    assert "settings: ent_decay;" in added and "entries: ent_scale;" in added and "tags: charts/ent_scale" in added
    assert f"self-check of {copy}: 5 of 5 checks hold" in output


def test_a_tensor_left_out_of_state_fails_the_resume_check_at_its_chart(tmp_path):
    copy = copy_of("ppo_continuous.py", tmp_path, *with_a_decaying_coefficient(0.5, in_state=False))
    status, output = self_check(copy, "--only", "resume", cwd=tmp_path)
    assert status == 1, output
    line = line_of("resume", output)
    assert line.startswith("FAIL") and "in TensorBoard first at charts/ent_scale at step" in line, output
    assert "failed: resume" in output.splitlines()[-1]


def test_an_unseeded_source_of_randomness_fails_the_repeat_check(tmp_path):
    returns = "            returns = advantages + values"
    copy = copy_of("ppo_discrete.py", tmp_path, (returns, returns + " + 0.01 * np.random.default_rng().random()"))
    status, output = self_check(copy, "--only", "repeat", cwd=tmp_path)
    assert status == 1, output
    line = line_of("repeat", output)
    assert line.startswith("FAIL") and "two runs of seed 1 differ first at checkpoint entry model." in line, output


def test_a_changed_default_fails_the_against_check_naming_it(tmp_path):
    copy = copy_of("ppo_vector_sameStep.py", tmp_path, ("    max_grad_norm: float = 0.5", "    max_grad_norm: float = 0.4"))
    status, output = self_check(copy, "--against", os.path.join(ROOT, "ppo_vector_sameStep.py"), "--only", "against",
                                "--", "--vectorization-mode", "sync", cwd=tmp_path)
    assert status == 1, output
    line = line_of("against", output)
    assert line.startswith("FAIL") and "settings whose defaults differ: max_grad_norm 0.4 (ORIGINAL: 0.5)" in line


def test_bad_input_gets_one_line(tmp_path):
    (tmp_path / "notes.py").write_text("x = 1\n")
    for argv, message in [(["nowhere.py"], "error: no script nowhere.py"),
                          (["notes.py"], "error: cannot tell the kind of notes.py"),
                          ([os.path.join(ROOT, "ppo_discrete.py"), "--only", "against"],
                           "error: the against check needs --against ORIGINAL"),
                          ([os.path.join(ROOT, "ppo_discrete.py"), "--", "--resume", "x.pt"],
                           "error: the self-check makes its own checkpoints")]:
        status, output = self_check(*argv, cwd=tmp_path)
        assert status != 0 and output.strip().splitlines()[-1].startswith(message) and "Traceback" not in output

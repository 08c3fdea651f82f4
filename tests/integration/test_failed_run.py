"""A run whose update fails midway (issue 20, item 8): an exception injected after one optimizer step of
iteration 5, in a real ``lockstep train`` process with real env loops, as a CUDA out-of-memory error or a
dead rank would raise it. The model is then partly stepped, so no ``final.pt`` may claim it; the failed
batch is counted as dropped, so the transition account still balances; and a resume continues from the
last consistent checkpoint, the periodic one of iteration 4.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from lockstep.learner import checkpoint
from lockstep.observe.run_dir import RunDir

pytestmark = pytest.mark.slow

# lockstep train, with each optimizer step counted and the 9th made to fail once it has stepped:
# two gradient steps per iteration (1 epoch x 2 minibatches), so it is the first step of iteration 5.
FAILING_TRAIN = '''
import sys

from lockstep import cli
from lockstep.learner import trainer

adam, steps = trainer.adam, []


def failing_adam(params, lr, eps):
    optimizer = adam(params, lr, eps)
    step = optimizer.step

    def counted_step(*args, **kwargs):
        result = step(*args, **kwargs)
        steps.append(1)
        if len(steps) == 9:
            raise RuntimeError("injected fault: CUDA out of memory after one optimizer step")
        return result

    optimizer.step = counted_step
    return optimizer


trainer.adam = failing_adam
sys.exit(cli.main(sys.argv[1:]))
'''

ARGS = ["--env", "CartPole-v1", "--actors", "1", "--envs-per-actor", "2", "--transport", "inprocess",
        "--steps-per-env", "16", "--no-progress", "--set", "ppo.epochs=1", "--set", "ppo.minibatches=2"]


def test_an_exception_after_one_optimizer_step_leaves_no_final_checkpoint_and_resume_takes_the_last_good(tmp_path):
    run_dir = tmp_path / "run"
    script = tmp_path / "failing_train.py"
    script.write_text(FAILING_TRAIN)
    failed = subprocess.run([sys.executable, str(script), "train", "--run-dir", str(run_dir), "--total-steps",
                             str(10**6), "--checkpoint-every", "2", *ARGS], capture_output=True, text=True,
                            timeout=300)
    assert failed.returncode != 0 and "injected fault" in failed.stderr, failed.stderr[-3000:]

    checkpoints = run_dir / "checkpoints"
    assert not (checkpoints / "final.pt").exists()  # the model was partly stepped into iteration 5
    assert [p.name for p in checkpoint.periodic(checkpoints)] == ["iter_000002.pt", "iter_000004.pt"]
    assert [row["iteration"] for row in RunDir(run_dir).metrics()] == [1, 2, 3, 4]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert "injected fault" in summary["error"] and summary["checkpoint"] is None and summary["status"] == "failed"
    assert summary["iterations"] == 4 and summary["transitions_trained"] == 4 * 32
    # the failed iteration's batch (32 transitions) was collected and not trained: dropped, and counted
    assert summary["dropped_transitions"] >= 32
    assert summary["transitions_collected"] == summary["transitions_trained"] + summary["dropped_transitions"]

    resumed = subprocess.run([sys.executable, "-m", "lockstep", "train", "--resume", str(run_dir),
                              "--total-steps", str(6 * 32), "--no-progress"], capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from"] == "checkpoints/iter_000004.pt" and summary["error"] is None
    assert summary["status"] == "completed"
    assert summary["iterations"] == 6 and summary["checkpoint"] == "checkpoints/final.pt"
    assert [row["iteration"] for row in RunDir(run_dir).metrics()] == [1, 2, 3, 4, 5, 6]
    assert checkpoint.load(checkpoints / "final.pt")["trainer"]["iteration"] == 6

"""Generated spaces end to end: observation and action spaces drawn by hypothesis (``lockstep_bench.spaces``), each
a small env of ``lockstep.envs.generated`` trained for two iterations in process, ``lockstep audit`` PASSing on
its trail, ``lockstep eval`` playing an episode and ``lockstep export``'s ONNX file choosing eval's deterministic
actions in onnxruntime; one agent, and PettingZoo slots whose agents leave early.

Seeded (``derandomize``): the suite runs the same few examples every time; ``lockstep bench spaces --examples N``
runs many more. A failure prints the case as JSON; ``Case(**json.loads(...))`` and ``run_case`` replay it.
"""

from __future__ import annotations

import json
import subprocess

import gymnasium as gym
import numpy as np
import pytest
from conftest import lockstep_cmd
from hypothesis import HealthCheck, Phase, example, given, settings
from lockstep_bench.spaces import Case, cases, expected_refusal, run_case

from lockstep.envs.generated import Generated, GeneratedParallel, MaskViolation

TIMEOUT_S = 60.0  # per example: a run that hangs is a failure of that example, not of the suite
# no shrinking: every smaller example is another training run; the failing case is printed whole instead
SUITE = settings(derandomize=True, database=None, deadline=None, phases=[Phase.explicit, Phase.generate],
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def _check(case: Case, tmp_path_factory) -> None:
    outcome = run_case(case, tmp_path_factory.mktemp("case") / "run", TIMEOUT_S)
    if expected_refusal(case) is None:
        assert outcome.result == "passed", f"{outcome.message}\ncase: {outcome.case}"
    else:
        assert outcome.result == "refused", f"{outcome.message}\ncase: {outcome.case}"
        assert expected_refusal(case) in outcome.message


# a channels-last image leaf beside a vector, which the actor transposes to [C, H, W] (``envs.images``), its CNN
# trained in bfloat16 while inference, the audit and the export stay float32
CHANNELS_LAST = Case(observation={"dict": {"frame": {"box": [5, 4, 3], "dtype": "uint8"}, "v": {"box": [2]}}},
                     action={"discrete": 3}, precision="bfloat16")

# async (V-trace by default) over an action of several parts with a mask: the current policy's log-probs of
# every part, masked, weigh the lagged samples
ASYNC_MASKED = Case(observation={"dict": {"v": {"box": [3]}}}, action={"dict": {"go": {"discrete": 4},
                                                                                "dial": {"box": [2]}}},
                    mask="legal", mask_key="legal", sync="async")


@settings(SUITE, max_examples=32)
@given(case=cases())
@example(case=CHANNELS_LAST)
@example(case=ASYNC_MASKED)
def test_generated_spaces_of_one_agent_train_pass_the_audit_and_evaluate(case, tmp_path_factory):
    _check(case, tmp_path_factory)


@settings(SUITE, max_examples=16)
@given(case=cases(multi_agent=True))
def test_generated_spaces_of_agents_that_leave_early_train_and_pass_the_audit(case, tmp_path_factory):
    _check(case, tmp_path_factory)


def test_the_generated_env_draws_within_its_spaces_and_raises_on_a_masked_action():
    env = Generated(observation={"dict": {"grid": {"box": [2, 3], "scale": None}, "pair": {"tuple": [
        {"discrete": 3}, {"multi_binary": [2, 2]}]}}}, action={"dict": {"go": {"discrete": 4}, "dial": {"box": [2]},
                                                                         "bits": {"multi_binary": 2}}}, mask="legal")
    obs, _ = env.reset(seed=3)
    assert env.observation_space.contains(obs) and set(obs) == {"grid", "pair", "legal"}
    # one per choice of the categorical parts in the action's (sorted) order: 2 per bit of bits, 4 of go
    assert obs["legal"].shape == (2 * 2 + 4,)
    allowed = np.flatnonzero(obs["legal"][4:])
    assert len(allowed) >= 1
    bits = [int(not obs["legal"][2 * i]) for i in range(2)]  # 0 where 0 is allowed, else 1 (then allowed)
    action = {"bits": np.array(bits, np.int8), "dial": np.zeros(2, np.float32), "go": int(allowed[-1])}
    env.step(action)  # allowed: no error
    obs, _ = env.reset(seed=3)
    forbidden = [a for a in range(4) if not obs["legal"][4 + a]]
    assert forbidden  # seed 3 forbids go 3
    with pytest.raises(MaskViolation, match="'go' chose"):
        env.step({**action, "go": forbidden[0]})
    same, _ = Generated(observation={"box": [3]}, action={"discrete": 2}).reset(seed=5)
    again, _ = Generated(observation={"box": [3]}, action={"discrete": 2}).reset(seed=5)
    assert np.array_equal(same, again)


def test_every_agent_of_the_generated_parallel_env_but_the_last_leaves_early():
    env = GeneratedParallel(observation={"box": [2]}, action={"discrete": 2}, length=5, agents=3)
    env.reset(seed=1)
    left_at = {}
    for t in range(1, 6):
        acting = list(env.agents)
        _, _, terms, truncs, _ = env.step({a: 0 for a in acting})
        left_at |= {a: t for a in acting if terms[a] or truncs[a]}
    assert left_at["agent_2"] == 5 and left_at["agent_0"] < 5 and left_at["agent_1"] < 5
    assert env.agents == [] and isinstance(env.observation_space("agent_0"), gym.spaces.Box)


def test_bench_spaces_writes_its_results(tmp_path):
    done = subprocess.run([*lockstep_cmd(), "bench", "spaces", "--examples", "2", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    report = json.loads((tmp_path / "spaces.json").read_text())
    assert report["examples"] == 2 and len(report["outcomes"]) == 2, done.stderr[-3000:]
    assert done.returncode == (1 if report["failed"] else 0), done.stderr[-3000:]
    assert all(Case(**json.loads(o["case"])) for o in report["outcomes"])
    assert "2 examples:" in (tmp_path / "spaces.md").read_text()

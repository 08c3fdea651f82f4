"""``lockstep export``: the exported file, run by onnxruntime and by ``torch.jit.load`` in a process that never imports
lockstep, chooses the actions ``lockstep eval`` chooses on the same observations, for every model family and space
kind: discrete parts exactly, continuous ones within float32's rounding (``lockstep_bench.parity``).

Each family trains one tiny run (two iterations, in process); parity needs no trained policy, only one that is not
at its initialization's symmetry. A feedforward policy gets every recorded step as one batch (the batch dimension is
free), a recurrent one step after step with its state carried and zeroed where episodes start.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import learner_config, lockstep_cmd
from lockstep_bench import parity

from lockstep.launch.local import train
from lockstep.tools import export

pytest.importorskip("onnxruntime")  # the export extra

GENERATED = "lockstep.envs.generated:Generated"
STEPS = 10  # observations recorded per family

FAMILIES = {
    # name: the run's settings
    "mlp-discrete": {"env.id": "CartPole-v1", "env.normalize_obs": True},
    "mlp-gaussian": {"env.id": "Pendulum-v1", "env.normalize_obs": True, "model.init_log_std": 0.5},
    "multi-discrete": {"env.id": GENERATED, "env.kwargs": {
        "observation": {"box": [3], "scale": None}, "action": {"multi_discrete": [3, 2, 4]}}},
    "multi-binary": {"env.id": GENERATED, "env.kwargs": {
        "observation": {"multi_binary": 3}, "action": {"multi_binary": 3}}},
    # a Dict of every leaf kind with an action mask, acting in a Dict of a Discrete, bits and a Box
    "dict-masked": {"env.id": GENERATED, "env.normalize_obs": True, "env.action_mask_key": "legal", "env.kwargs": {
        "observation": {"dict": {"v": {"box": [2], "scale": 100.0}, "cell": {"discrete": 4},
                                 "grid": {"multi_discrete": [[2, 3], [3, 2]]}, "pair": {"tuple": [
                                     {"multi_binary": 2}, {"box": [2, 2]}]}}},
        "action": {"dict": {"go": {"discrete": 4}, "bits": {"multi_binary": 2}, "dial": {"box": [2], "scale": 0.5}}},
        "mask": "legal", "length": 30}},
    "nature-cnn": {"env.id": GENERATED, "env.kwargs": {
        "observation": {"box": [1, 36, 36], "dtype": "uint8"}, "action": {"tuple": [
            {"discrete": 3}, {"box": [1], "scale": 0.25}]}}},
    # an (H, W, C) image the env gives and lockstep's env transposes, beside a vector: the small CNN
    "channels-last": {"env.id": GENERATED, "env.kwargs": {
        "observation": {"dict": {"frame": {"box": [6, 5, 3], "dtype": "uint8"}, "v": {"box": [2]}}},
        "action": {"discrete": 3}}},
    "lstm-gaussian": {"env.id": "masked:Pendulum-v1", "env.normalize_obs": True, "model.lstm_size": 8},
    "gru-critic": {"env.id": "masked:Pendulum-v1", "model.lstm_size": 8, "model.rnn": "gru", "model.critic_lstm": True},
    "lstm-dict": {"env.id": GENERATED, "model.lstm_size": 8, "model.critic_lstm": True, "env.action_mask_key": "ok",
                  "env.kwargs": {"observation": {"dict": {"v": {"box": [3]}, "d": {"discrete": 3}}},
                                 "action": {"multi_discrete": [2, 3]}, "mask": "ok", "length": 4}},
}
SAMPLED = ("mlp-discrete", "mlp-gaussian", "dict-masked")  # also exported with --sample


def _train(name: str, run_dir: Path) -> Path:
    overrides = {"actors.envs_per_actor": 2, "actors.transport": "inprocess", "ppo.steps_per_env": 8,
                 "ppo.total_steps": 32, "ppo.minibatches": 1, "model.hidden": [8], "learner.device": "cpu",
                 "run.run_dir": str(run_dir), **FAMILIES[name]}
    train(learner_config(overrides), run_dir)
    return run_dir


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """A folder of every family's run (``NAME/``) and exported files (``exported/NAME-VARIANT.onnx``, ``.pt``)."""
    return tmp_path_factory.mktemp("export")


@pytest.fixture(scope="module")
def parity_table(exported) -> dict[tuple[str, str, str], dict[str, float]]:
    """(family, format, variant) -> {output: max |exported - lockstep's|}: every family trained, exported in both
    formats (and sampled, for ``SAMPLED``), and every file run in one process that does not import lockstep."""
    root = exported
    jobs, checks = [], []
    for name in FAMILIES:
        run_dir = _train(name, root / name)
        for variant in ("deterministic", "sample") if name in SAMPLED else ("deterministic",):
            sample = variant == "sample"
            played = parity.reference(run_dir, STEPS, seed=5, deterministic=not sample)
            for fmt in export.FORMATS:
                path = root / "exported" / f"{name}-{variant}{export.SUFFIX[fmt]}"
                assert export.main(run_dir, fmt=fmt, out=str(path), sample=sample) == 0
                card = json.loads(Path(f"{path}.json").read_text())
                jobs.append((fmt, path, parity.feeds(card, played, batched=not card["recurrent"])))
                checks.append(((name, fmt, variant), card, played))
    results = parity.run_elsewhere(jobs)
    table = {key: parity.compare(card, got, played) for (key, card, played), got in zip(checks, results)}
    print("\nfamily x format x variant: max |exported - lockstep's| per output")
    for key, diffs in table.items():
        print(" ", *key, diffs)
    return table


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_exported_file_acts_as_lockstep_eval_in_both_runtimes(parity_table, family):
    variants = ("deterministic", "sample") if family in SAMPLED else ("deterministic",)
    for fmt in export.FORMATS:
        for variant in variants:
            assert (family, fmt, variant) in parity_table  # compare() asserted the parity itself


def test_the_card_names_inputs_outputs_spaces_and_the_version(parity_table, exported):
    card = json.loads((exported / "exported" / "dict-masked-sample.onnx.json").read_text())
    # the leaves in the space's order (a Dict's keys sorted), each in its own dtype; the mask one of them
    assert card["inputs"] == [
        {"name": "obs.cell", "shape": ["batch"], "dtype": "int64"},
        {"name": "obs.grid", "shape": ["batch", 2, 2], "dtype": "int64"},
        {"name": "obs.legal", "shape": ["batch", 8], "dtype": "int8"},
        {"name": "obs.pair[0]", "shape": ["batch", 2], "dtype": "int8"},
        {"name": "obs.pair[1]", "shape": ["batch", 2, 2], "dtype": "float32"},
        {"name": "obs.v", "shape": ["batch", 2], "dtype": "float32"},
        {"name": "noise", "shape": ["batch", 2 * 2 + 4 + 2 * 2], "dtype": "float32"}]  # logits, 2 per Box dim
    assert card["action_mask"] == "obs.legal" and card["sample"] and card["noise_width"] == 12
    assert card["outputs"] == [{"name": "action.bits", "shape": ["batch", 2], "dtype": "int8"},
                               {"name": "action.dial", "shape": ["batch", 2], "dtype": "float32"},
                               {"name": "action.go", "shape": ["batch"], "dtype": "int64"}]
    assert card["policy_version"] == 2 and card["iteration"] == 2 and card["env_id"] == GENERATED
    assert card["env_kwargs"]["mask"] == "legal" and card["lockstep_version"]
    assert card["return_at_export"]["training_mean"] is not None


def test_the_command_writes_a_file_whose_runtimes_refuse_a_wrong_dtype_or_shape_by_the_inputs_name(tmp_path):
    import onnxruntime

    run_dir = _train("mlp-discrete", tmp_path / "run")
    out = tmp_path / "cartpole.onnx"
    done = subprocess.run([*lockstep_cmd(), "export", str(run_dir), "--format", "onnx", "--out", str(out)],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"wrote {out}" in done.stdout and Path(f"{out}.json").is_file()
    session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert session.run(None, {"obs": np.zeros((3, 4), np.float32)})[0].shape == (3,)
    with pytest.raises(Exception, match=r"data type.*tensor\(double\).*expected.*tensor\(float\)"):  # float64
        session.run(None, {"obs": np.zeros((1, 4), np.float64)})
    with pytest.raises(Exception, match="dimensions for input: obs"):
        session.run(None, {"obs": np.zeros((1, 5), np.float32)})
    import torch

    assert export.main(run_dir, fmt="torchscript", out=str(tmp_path / "cartpole.pt")) == 0
    module = torch.jit.load(str(tmp_path / "cartpole.pt"))
    assert module(obs=torch.zeros((3, 4))).shape == (3,)  # the inputs by name, as the card's (obs.v: obs_v)
    with pytest.raises(Exception, match=r"input obs: expected dtype float32"):  # a trace alone would convert it
        module(torch.zeros((1, 4), dtype=torch.float64))
    with pytest.raises(Exception, match=r"input obs: shape \[4\], expected \[batch, 4\]"):
        module(torch.zeros(4))
    missing = subprocess.run([*lockstep_cmd(), "export", str(tmp_path / "nothing"), "--format", "onnx", "--out",
                              str(tmp_path / "x.onnx")], capture_output=True, text=True, timeout=240)
    assert missing.returncode == 2 and "config.yaml" in missing.stderr


def test_a_channels_last_image_is_taken_as_the_env_gives_it(parity_table, exported):
    card = json.loads((exported / "exported" / "channels-last-deterministic.pt.json").read_text())
    assert card["inputs"][0] == {"name": "obs.frame", "shape": ["batch", 6, 5, 3], "dtype": "uint8"}
    assert card["channels_last"] == ["obs.frame"]
    assert card["observation_space"].startswith("{frame: Box(shape=(3, 6, 5)")  # lockstep's [C, H, W]


def test_a_run_of_several_policies_exports_one_file_per_policy(tmp_path):
    from lockstep_bench.spaces import Case

    from lockstep.learner.episodes import EvalError

    run_dir = tmp_path / "run"
    # the critic reads the env's global state beside each agent's observation; the actor, and so the file, does not
    case = Case(observation={"box": [3]}, action={"discrete": 2}, agents=2, policies=True, length=4,
                critic_input="global")
    config = case.config(run_dir)
    config.run.audit = False
    train(config, run_dir)
    with pytest.raises(EvalError, match="2 policies .*--policy NAME"):
        export.export(run_dir, "onnx", tmp_path / "one.onnx")
    (first,) = export.export(run_dir, "onnx", tmp_path / "first.onnx", policy="first")
    card = json.loads(Path(f"{first}.json").read_text())
    assert card["policy"] == "first"
    import onnxruntime

    # every input of the card, the one the graph does not read too (the exporter drops such inputs)
    session = onnxruntime.InferenceSession(str(first), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == [i["name"] for i in card["inputs"]]
    assert "obs.global_state" in [i["name"] for i in card["inputs"]]
    written = export.export(run_dir, "torchscript", tmp_path / "all")
    assert sorted(path.name for path in written) == ["first.pt", "others.pt"]
    card = json.loads(Path(f"{written[0]}.json").read_text())
    # one agent's observation as its slot gives it: its own leaves and whether it still takes part
    assert [i["name"] for i in card["inputs"]] == ["obs.agent_active", "obs.agent_id", "obs.observation",
                                                   "obs.global_state"]
    with pytest.raises(EvalError, match="--policy 'nobody'"):
        export.export(run_dir, "onnx", tmp_path / "x.onnx", policy="nobody")

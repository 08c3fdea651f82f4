"""Recurrent policies (an LSTM or a GRU), SEED-style: the learner keeps each env slot's state between requests.

Checked here: training recomputes exactly what inference computed (step by step, resets where episodes
start); a session carries each slot's state across steps, resets it where an episode ended and starts
from zeros for a new run id; a strict LSTM (and GRU) run passes the audit, which recomputes from the stored
initial states and catches a planted change; an LSTM learns a memory task that an MLP cannot.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from protocol import hello

from lockstep import config as config_lib
from lockstep.config import ModelConfig
from lockstep.envs import env_spec
from lockstep.launch.local import train
from lockstep.learner.rollout import Unroll, assemble
from lockstep.models import RecurrentPolicy, build_policy
from lockstep.tools import audit
from lockstep.transport import lockstep_pb2 as pb
from lockstep.transport.grpc.client import Connection
from lockstep.transport.messages import step_to_proto

CARTPOLE = env_spec("CartPole-v1")


def _policy(seed: int = 0, critic_lstm: bool = False, rnn: str = "lstm") -> RecurrentPolicy:
    torch.manual_seed(seed)
    policy = build_policy(CARTPOLE.observation, CARTPOLE.action,
                          ModelConfig(hidden=[16], lstm_size=8, critic_lstm=critic_lstm, rnn=rnn))
    width = 16 if critic_lstm else 8
    # an LSTM's state is (h, c), a GRU's h alone
    assert isinstance(policy, RecurrentPolicy) and policy.state_size == (2 * width if rnn == "lstm" else width)
    return policy.eval().requires_grad_(False)


CORES = pytest.mark.parametrize("rnn", ["lstm", "gru"])


@CORES
@pytest.mark.parametrize("critic_lstm", [False, True], ids=["shared", "critic-own"])
def test_a_sequence_replays_the_single_steps_of_inference_with_resets(critic_lstm, rnn):
    policy = _policy(critic_lstm=critic_lstm, rnn=rnn)
    T, B = 6, 3
    gen = torch.Generator().manual_seed(1)
    obs = torch.randn(T, B, 4, generator=gen)
    uniform = torch.rand(T, B, 2, generator=gen).clamp(1e-6, 1 - 1e-6)
    starts = torch.zeros(T, B, dtype=torch.bool)
    starts[2, 0] = starts[4, 2] = True
    state = torch.randn(B, policy.state_size, generator=gen)
    initial = state.clone()
    actions, logprobs, values = [], [], []
    for t in range(T):  # what the learner does: reset where an episode starts, then one step
        state = torch.where(starts[t][:, None], torch.zeros_like(state), state)
        a, lp, v, state = policy.step(obs[t], uniform[t], state)
        actions.append(a), logprobs.append(lp), values.append(v)
    logprob, _, value = policy.evaluate(obs, torch.stack(actions), starts, initial)
    torch.testing.assert_close(logprob, torch.stack(logprobs), rtol=0, atol=1e-6)
    torch.testing.assert_close(value, torch.stack(values), rtol=0, atol=1e-6)
    # without the resets the replay differs: the reset is what makes slot 0 forget at step 2
    wrong, _, _ = policy.evaluate(obs, torch.stack(actions), torch.zeros_like(starts), initial)
    assert not torch.allclose(wrong[2:, 0], logprob[2:, 0], atol=1e-4)
    torch.testing.assert_close(wrong[:, 1], logprob[:, 1], rtol=0, atol=1e-6)  # slot 1 never reset


@CORES
def test_the_states_recorded_where_values_are_bootstrapped_are_those_a_forward_pass_recomputes(rnn):
    """The trainer bootstraps from the states inference left (``Batch.after``) instead of a forward pass over the
    whole batch: recorded as a session records them (after each slot's last step, and after a truncated episode's
    end, before the reset), they sit where ``model.states`` puts the states it recomputes, and hold the same."""
    policy = _policy(critic_lstm=True, rnn=rnn)
    T, k = 6, 3
    gen = torch.Generator().manual_seed(2)
    obs = torch.randn(T, k, 4, generator=gen)
    truncated = np.zeros((T, k), bool)
    truncated[1, 0] = truncated[3, 2] = truncated[T - 1, 1] = True  # the last: a truncation at the slot's end
    unroll = Unroll(0, k, T, (4,), np.dtype(np.float32), (), np.dtype(np.int64),
                    initial_state=np.zeros((k, policy.state_size), np.float32))
    state = torch.zeros(k, policy.state_size)
    for t in range(T):
        if t:  # the outcome of step t - 1 arrives with step t's observation, before the reset
            ended = np.flatnonzero(truncated[t - 1])
            unroll.record_outcome(t - 1, np.zeros(k), np.zeros(k, bool), truncated[t - 1], ended,
                                  np.zeros((len(ended), 4), np.float32), state.numpy())
            state = torch.where(torch.as_tensor(truncated[t - 1])[:, None], torch.zeros_like(state), state)
        action, logprob, value, state = policy.step(obs[t], torch.full((k, 2), 0.5), state)
        unroll.record_action(t, obs[t].numpy(), action.numpy(), logprob.numpy(), value.numpy(), 0)
    ended = np.flatnonzero(truncated[T - 1])
    unroll.record_outcome(T - 1, np.zeros(k), np.zeros(k, bool), truncated[T - 1], ended,
                          np.zeros((len(ended), 4), np.float32), state.numpy())
    unroll.finish(np.zeros((k, 4), np.float32), state.numpy())
    batch = assemble(0, [unroll])
    recorded = batch.after()  # [T, k, S]
    recomputed = policy.states(obs, torch.as_tensor(batch.starts), torch.as_tensor(batch.initial_state),
                               cuts={T}).numpy()
    where = [(T - 1, n) for n in range(k)] + list(zip(batch.final_t.tolist(), batch.final_n.tolist()))
    assert sorted(set(where)) == [(1, 0), (3, 2), (T - 1, 0), (T - 1, 1), (T - 1, 2)]
    for t, n in where:
        np.testing.assert_allclose(recorded[t, n], recomputed[t, n], rtol=0, atol=1e-6)
    assert not np.allclose(recorded[1, 0], recorded[T - 1, 0])  # the reset after step 1 made them differ
    # an unroll recorded without states (none given): the batch holds none, and the trainer recomputes them
    plain = Unroll(1, k, T, (4,), np.dtype(np.float32), (), np.dtype(np.int64),
                   initial_state=np.zeros((k, policy.state_size), np.float32))
    for t in range(T):
        plain.record_action(t, obs[t].numpy(), np.zeros(k, np.int64), np.zeros(k), np.zeros(k), 0)
        plain.record_outcome(t, np.zeros(k), np.zeros(k, bool), np.zeros(k, bool), np.zeros(0, np.int64),
                             np.zeros((0, 4), np.float32))
    plain.finish(np.zeros((k, 4), np.float32))
    assert assemble(0, [unroll, plain]).after() is None


@CORES
def test_with_a_critic_core_the_policy_loss_never_reaches_the_critics_memory_nor_the_value_loss_the_actors(rnn):
    policy = _policy(critic_lstm=True, rnn=rnn).train().requires_grad_(True)
    T, B = 5, 2
    obs, starts = torch.randn(T, B, 4), torch.zeros(T, B, dtype=torch.bool)
    actions = torch.randint(0, 2, (T, B))
    logprob, _, value = policy.evaluate(obs, actions, starts, torch.randn(B, policy.state_size))
    core = policy.get_submodule(rnn)
    lstms = [*core.actor.parameters(), *core.critic.parameters()]  # 4 tensors each

    def moved(loss: torch.Tensor) -> list[bool]:
        grads = torch.autograd.grad(loss, lstms, retain_graph=True, allow_unused=True)
        return [g is not None and bool(g.abs().sum() > 0) for g in grads]

    assert moved(logprob.sum()) == [True] * 4 + [False] * 4  # the policy loss trains the actor's LSTM only
    assert moved(value.sum()) == [False] * 4 + [True] * 4  # the value loss the critic's only
    # the state's halves are the two LSTMs': changing the critic's half changes values, never log-probs
    state = torch.randn(B, policy.state_size)
    other = state.clone()
    other[:, 8:16] += 1.0  # h of the critic's core ([h_actor, h_critic], then an LSTM's [c_actor, c_critic]: 8 each)
    a = policy.evaluate(obs, actions, starts, state)
    b = policy.evaluate(obs, actions, starts, other)
    torch.testing.assert_close(a[0], b[0], rtol=0, atol=0)
    assert not torch.allclose(a[2], b[2])


def test_the_mlp_torso_the_cnns_and_the_lstm_are_chosen_from_the_config():
    image = env_spec("CartPole-v1").observation.__class__("box", (4, 84, 84), "uint8",
                                                          low=np.zeros((4, 84, 84)), high=np.full((4, 84, 84), 255))
    small = image.__class__("box", (6, 10, 10), "uint8", low=np.zeros((6, 10, 10)), high=np.ones((6, 10, 10)))
    act = CARTPOLE.action
    nature = build_policy(image, act, ModelConfig())
    assert nature.torso[-2].out_features == 512 and nature.state_size == 0
    assert build_policy(small, act, ModelConfig()).torso[-2].out_features == 128
    assert build_policy(small, act, ModelConfig(lstm_size=32)).state_size == 64
    gru = build_policy(small, act, ModelConfig(lstm_size=32, rnn="gru"))
    assert gru.state_size == 32 and isinstance(gru.gru, torch.nn.GRU) and not hasattr(gru, "lstm")
    with pytest.raises(ValueError, match="image observations"):
        build_policy(CARTPOLE.observation, act, ModelConfig(kind="nature-cnn"))
    frames = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    out, value = nature.features(frames)  # uint8 in: scaled to [0, 1] inside the network
    assert out.shape == (3, 2) and value.shape == (3,)
    torch.testing.assert_close(nature.torso[0](frames), frames.float() / 255)


# -- the session keeps the state ---------------------------------------------------------------------


def _step(obs: np.ndarray, terminated=(False, False)) -> pb.Step:
    return step_to_proto(obs, np.zeros(2, np.float32), np.array(terminated), np.zeros(2, bool),
                         np.zeros(0, np.int64), np.zeros((0, 4), np.float32), np.zeros(0, np.float64),
                         np.zeros(0, np.int64))


def test_a_session_carries_each_slots_state_resets_it_on_done_and_on_a_new_run_id(running_learner):
    running = running_learner({"ppo.steps_per_env": 16, "learner.min_actors": 1, "model.hidden": [16],
                               "model.lstm_size": 8})
    learner = running.learner
    model = learner.trainer.model  # version 0 serves the whole first phase: nothing trains before 16 steps

    def expected(sequence: list[np.ndarray], starts: list[tuple[bool, bool]]) -> np.ndarray:
        obs = torch.as_tensor(np.stack(sequence))  # [t, 2, 4]
        with torch.no_grad():
            states = model.states(obs, torch.as_tensor(starts), torch.zeros(2, 16))
        return states[-1].numpy()

    rng = np.random.default_rng(0)
    seen = [rng.normal(size=(2, 4)).astype(np.float32) for _ in range(4)]
    conn = Connection(running.address, hello(actor_id=3), connect_timeout=10)
    conn.step(_step(seen[0]), np.int64, ())
    session = learner.sessions._live[3]
    np.testing.assert_allclose(session.state, expected(seen[:1], [(False, False)]), atol=1e-6)
    conn.step(_step(seen[1]), np.int64, ())
    np.testing.assert_allclose(session.state, expected(seen[:2], [(False, False)] * 2), atol=1e-6)
    conn.step(_step(seen[2], terminated=(False, True)), np.int64, ())  # slot 1's episode ended: seen[2] starts one
    np.testing.assert_allclose(session.state, expected(seen[:3], [(False, False)] * 2 + [(False, True)]), atol=1e-6)
    assert np.array_equal(session.unroll.initial_state, np.zeros((2, 16)))
    # the same actor again with a new run id (a restart): a new session, from zeros
    again = Connection(running.address, hello(actor_id=3), connect_timeout=10)
    again.step(_step(seen[3]), np.int64, ())
    fresh = learner.sessions._live[3]
    assert fresh is not session
    np.testing.assert_allclose(fresh.state, expected(seen[3:4], [(False, False)]), atol=1e-6)
    again.close()
    conn.close()


# -- end to end ---------------------------------------------------------------------------------------


def _train(run_dir: Path, env: str, **overrides) -> Path:
    config = config_lib.Config()
    config.env.id = env
    config.actors.transport = "inprocess"
    config.run.progress = False
    config.run.run_dir = str(run_dir)
    for key, value in overrides.items():
        config_lib.set_value(config, key, value)
    train(config, run_dir)
    return run_dir


@pytest.fixture(scope="module", params=["lstm", "gru"])
def lstm_cartpole(tmp_path_factory, request) -> Path:
    """Strict CartPole with an LSTM (or a GRU), audited: 2 actors x 2 envs x 64 steps, 4 iterations (episodes
    end inside unrolls, so states are reset mid-sequence)."""
    return _train(tmp_path_factory.mktemp(request.param) / "run", "CartPole-v1", **{
        "run.audit": True, "model.lstm_size": 16, "model.rnn": request.param, "model.hidden": [16],
        "ppo.steps_per_env": 64, "ppo.total_steps": 1024})


def test_a_strict_lstm_run_passes_the_audit_from_its_stored_initial_states(lstm_cartpole):
    report = audit.check(lstm_cartpole)
    assert report.exit_code == 0, audit.format_report(report)
    assert [it.samples for it in report.iterations] == [256] * 4
    assert all(it.max_abs_diff <= 1e-6 for it in report.iterations)
    gru = "gru" in lstm_cartpole.parent.name
    with np.load(lstm_cartpole / "audit" / "batch_000002.npz") as data:
        assert data["initial_state"].shape == (4, 16 if gru else 32)  # a GRU's state is h, an LSTM's (h, c)
        assert data["starts"].any()  # some episode began inside the unroll: the audit replayed a reset
        assert np.abs(data["initial_state"]).sum() > 0  # the second unroll starts from carried, non-zero states


def _planted(run: Path, tmp_path: Path, name: str, change) -> audit.AuditReport:
    import shutil
    copy = Path(shutil.copytree(run, tmp_path / name))
    path = copy / "audit" / "batch_000002.npz"
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    arrays[name] = change(arrays[name].copy())
    np.savez_compressed(path, **arrays)
    return audit.check(copy)


def test_the_audit_catches_a_changed_initial_state_or_a_dropped_reset(lstm_cartpole, tmp_path):
    def shift(state):
        state[1] += 0.5
        return state

    report = _planted(lstm_cartpole, tmp_path, "initial_state", shift)
    assert report.exit_code == 1
    bad = report.iteration(2)
    assert bad.mismatched > 0 and "does not recompute" in bad.failures[0]
    assert all(it.clean for it in report.iterations if it.iteration != 2)

    report = _planted(lstm_cartpole, tmp_path, "starts", lambda starts: np.zeros_like(starts))
    assert report.exit_code == 1 and report.iteration(2).mismatched > 0


@pytest.mark.slow
def test_an_lstm_learns_to_recall_what_an_mlp_cannot(tmp_path):
    settings = {"model.hidden": [32], "actors.count": 2, "actors.envs_per_actor": 8, "ppo.steps_per_env": 16,
                "ppo.total_steps": 8192, "ppo.lr": 3e-3, "run.seed": 1}
    lstm = _train(tmp_path / "lstm", "lockstep.envs.tasks:Recall", **settings, **{"model.lstm_size": 32})
    mlp = _train(tmp_path / "mlp", "lockstep.envs.tasks:Recall", **settings)

    def final_mean(run: Path) -> float:
        import json
        return json.loads((run / "summary.json").read_text())["episode_return_mean"]

    # chance, and the best any memoryless policy can do, is 0; remembering the cue gives 1
    assert final_mean(lstm) >= 0.9
    assert final_mean(mlp) <= 0.4

"""No client can end a run: generated clients (``lockstep_bench.fuzz``) against real ``lockstep learner`` processes
over gRPC and shared memory, beside an honest ``lockstep actor`` that trains on.

One learner per config serves every example of its test (each example one client's conversation: its hello,
steps, order and disconnect); per example, the learner must not exit or fail, every invalid message must be
refused with a named status and every valid one answered, and the honest actor must not be refused; per config,
once the examples are done, the honest actor's iterations rose while they ran, ``lockstep audit`` passes, no
refused step's sentinel reached an audit batch and the learner's memory stayed within a bound.

Seeded (``hypothesis.seed``, no shrinking): the suite runs the same examples every time; ``lockstep bench fuzz
--examples N`` runs many more. A finding prints its example as JSON; ``fuzz.Session.parse`` rebuilds it.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import lockstep_cmd
from lockstep_bench import fuzz

pytestmark = pytest.mark.slow

EXAMPLES = 24  # per config: one learner start, about five seconds of client sessions, an audit
AUDIT_BATCHES = 4  # of each run, spread over it: an LSTM's audit replays every step (the long form audits all)


def _findings(report: fuzz.TargetReport) -> str:
    return "\n\n".join(f"{f['finding']}\nexample: {f['session']}" for f in report.findings)


@pytest.mark.parametrize("name", ["frozenlake", "mask-lstm", "teams", "critic"])
def test_no_generated_client_ends_the_run_refused_data_stays_out_of_batches_and_the_honest_actor_trains_on(
        name, tmp_path):
    report = fuzz.run_target(fuzz.TARGETS[name], EXAMPLES, tmp_path, seed=0, audit_batches=AUDIT_BATCHES,
                             log=lambda line: None)
    assert report.examples == EXAMPLES
    assert not report.findings, _findings(report)
    assert report.rows_after > report.rows_before  # the honest actor's iterations rose while the clients ran
    assert sum(o.answers for o in report.outcomes) > 0  # the examples reach steps that are answered ...
    refused_at = {o.at.split(" ")[0] for o in report.outcomes if o.result == "refused"}
    assert {"hello", "step"} <= refused_at, refused_at  # ... and hellos and steps that are refused


def test_a_session_is_rebuilt_from_its_description():
    session = fuzz.Session(transport="shm", hello=fuzz.HelloPlan(envs="partial", whole=2),
                           steps=[fuzz.StepPlan(seed=1, mutation="obs-nan", done=0.5)], ending="retry")
    assert fuzz.Session.parse(session.describe()) == session


def test_bench_fuzz_writes_its_counts(tmp_path):
    done = subprocess.run([*lockstep_cmd(), "bench", "fuzz", "--examples", "3", "--target", "critic",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    report = json.loads((tmp_path / "fuzz.json").read_text())
    assert report["examples"] == 3 and sum(report["by_outcome"].values()) == 3, done.stdout[-3000:]
    assert done.returncode == (1 if report["findings"] else 0), done.stderr[-3000:]
    assert "3 examples in" in (tmp_path / "fuzz.md").read_text()

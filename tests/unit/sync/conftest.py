"""Shared by the admission gate tests (lockstep.sync.AdmissionGate).

Three harnesses, one file each:

* ``test_gate_threads.py``: simulations with real threads (16 actors with random
  delays and a trainer), checked on their outcome, never on their timing;
* ``test_gate_unit.py``: single-threaded scripted scenarios with exact expectations;
* ``test_gate_model.py``: a hypothesis state machine against a reference model.
"""

from __future__ import annotations

import pytest

from lockstep.sync import Admission, AdmissionGate, RequestResult


class Releases:
    """Release callbacks for single-threaded tests: ``for_(m)`` records the calls per member."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, Admission]] = []

    def for_(self, member):
        return lambda admission: self.calls.append((member, admission))

    def take(self) -> list[tuple[object, Admission]]:
        """The calls since the last ``take``, by member."""
        calls, self.calls = self.calls, []
        return sorted(calls, key=lambda c: c[0])

    def admit(self, gate: AdmissionGate, member) -> Admission:
        """Request for ``member``, which must be admitted at once (and complete and close nothing)."""
        result = gate.request(member, self.for_(member))
        assert result.admission is not None, f"member {member} was held: {result}"
        assert result.completed is None and result.closed == (), result
        return result.admission

    def finish(self, gate: AdmissionGate, member) -> RequestResult:
        """Act until the member's unroll is complete; return the result of the request that completed it."""
        while True:
            result = gate.request(member, self.for_(member))
            if result.completed is not None:
                if gate.max_lag == 0:
                    assert result.admission is None, f"strict: the completing request was admitted: {result}"
                return result
            assert result.admission is not None, f"member {member} was held mid-unroll: {result}"
            assert result.closed == ()


@pytest.fixture
def releases() -> Releases:
    return Releases()

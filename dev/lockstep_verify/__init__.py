"""An exhaustive explicit-state model checker for the admission gate (``lockstep.sync.gate``).

The checker drives the *real* :class:`~lockstep.sync.gate.AdmissionGate` (or a
subclass: any ``factory(steps_per_phase, min_members, max_lag, **options)``)
through every interleaving of the events of a small system laid out like the
learner, and checks the protocol's properties on every transition and every
reachable state. The gate never blocks -- ``request`` admits or holds, and a held
request's ``release`` is called later from ``join``, ``leave`` or ``publish`` -- so
one event is one gate call and the reachable states form a finite graph that
breadth-first search enumerates. It is verification tooling: nothing at run time
imports it.

Modules
    state     the named state types (``World``, ``ActorState``, ``Unroll``, ...)
    model     ``Config`` and ``Model``: the initial state, the enabled events
    events    ``Transition``: one method per event, and the checks on the gate's answers
    freeze    cloning and freezing the gate into a hashable image
    symmetry  the state key up to renaming actors
    checker   the search: ``check``, ``replay``, ``Report``
    cli       ``python -m lockstep_verify``

The system
    actors   N of them, each a state machine
                 out --join--> ready --request--> admitted --infer--> ready --request--> ...
                                          \\--> held --(release)--> admitted
             ``infer`` is an event of its own, taken any time after the admission
             and before the actor's next request; it stamps the sample with the
             version inference uses *at that moment* (the learner's snapshot), so a
             publish may fall between an admission and its inference. With
             ``disconnects`` an actor may ``leave`` in any joined state (ready, held,
             admitted) and join again, as the same member, up to ``reconnects``
             times.
    learner  keeps each actor's current unroll (begun by an admission of step 0, as
             ``learner._Session`` does), files it as complete when a request
             returns ``completed``, and assembles a phase's batch when the gate
             closes it, from the complete unrolls of ``ClosedPhase.members``.
    trainer  ``train`` takes the oldest closed phase u, checks its batch, and swaps
             the inference snapshot to version u + 1; ``publish`` then calls
             ``gate.publish(u + 1)``. They are two events, as in the learner
             (snapshot first, then the gate), so inference may already run on u + 1
             before the gate has heard of it. Training phase ``versions - 1``
             finishes the run (no publish); this bounds the state space.

A state is the gate's internal state frozen into a hashable tuple -- started,
published, next_close, members as (member, phase, steps, first_phase), held members
with their callbacks, open phases with the members that completed them, and any
other attribute a gate grows, frozen generically -- plus a ``World``: the actors,
the complete unrolls, the trainer's queue and versions. The gate object is cloned
for each transition (its lock replaced by a fresh one). BFS with a visited set gives
shortest counterexamples; a violating transition is reported with its trace and not
explored further.

Options
    symmetry      actors are interchangeable (the gate uses member ids only as dict
                  keys and to order its answers), so states equal up to renaming
                  actors are one state: up to N! fewer. The canonical form
                  attributes to each member everything in the gate that names it
                  (members are the strings "A0", "A1", ..., so names can be told from
                  numbers) and falls back to the plain key for any shape it cannot
                  attribute; actors with different ``weights`` are never merged.
    exact_stamps  True: each sample keeps its stamp until the trainer checks it.
                  False: the stamp is checked at inference against the sample's
                  phase (which is the version that will train it: the structural
                  checks below tie the unroll's phase, the completed phase, the
                  closed phase and the trained version together) and then dropped
                  from the state; the trainer still checks each unroll's phase and
                  steps. Stamps are write-only data, so this merges only states whose
                  futures are the same; it cuts K=2 from 10^6 states to 5*10^4.
    cutoff, min_unroll, start_version, weights
                  passed on to the gate (``weights`` to ``join``): the straggler
                  cut-off then allows an unroll of ceil(min_unroll*T)..T steps.
    stop_on_violation, max_states
                  end the search early (the report is then not ``complete``).

Properties (``Violation.prop``)
    safety    on every transition:
              * every sample trained by version u was produced by a version in
                [u - max_lag, u] (strict: exactly u); every admission for phase u
                carries the published version, and it lies in [u - max_lag, u];
              * each member contributes exactly T samples, steps 0..T-1 once each
                (with the cut-off: a prefix of at least ceil(min_unroll*T)), to
                each closed phase it is in; a complete unroll is never lost (a
                closed phase's members are exactly the members with a complete
                unroll of it); nothing is admitted into, or completed in, a phase
                already closed; a member is never admitted again into a phase it has
                completed; a phase never closes while a live member's unroll of it
                is unfinished; an admission continues the member's unroll (step 0
                only after the last one completed);
              * phases close in order, each once; the trainer gets them in order;
              * ``release`` is called at most once per held request, and only while
                that request is held (never after its member left);
              * strict mode: nothing is admitted between the close of phase v and
                ``publish(v + 1)``;
              * ``leave`` reports as dropped exactly the steps of the unfinished unroll;
              * the gate raises nothing.
    lag       at inference: 0 <= phase - stamp <= max_lag (pipelined: lag <= K).
    deadlock  no reachable state, unfinished, with the gate started, where every
              live actor (at least one) is held and the trainer has nothing to
              train or publish; no terminal state but "finished" and "abandoned"
              (no actor joined, none may join again).
    liveness  of held requests: from every reachable state, the actors that stay
              (events request, infer, train, publish: nobody joins or leaves)
              reach a state where no live actor is held, or the run is finished, or
              the gate has not started (waiting for ``min_members`` is by design).
              Backward reachability over the explored graph. (With joins and leaves
              allowed it would hold trivially: everyone can leave.)
    progress  from every reachable state where the gate has started and some actor
              is joined, those same events can finish the run.

Sizes and times (``python -m lockstep_verify`` prints this table for
``STANDARD``; one core of a shared 2-core VM, CPython 3.11, load ~2; T=2 and
min_members 1 unless noted; "rejoin" = reconnects per actor; every row "ok" for
gate.py as of this writing):

    config                                                 states  transitions    s
    strict, 2 actors, 3 versions, rejoin 1                   3463        11060   0.3
    strict, 2 actors, 3 versions, rejoin 1, min_members 2    1992         6275   0.1
    strict, 2 actors, 3 versions, rejoin 2, sym              4237        13816   0.3
    strict, 3 actors, 3 versions, rejoin 1, sym, st@inf     23093       110206   2.8
    pipelined K=1, 2 actors, 3 versions, rejoin 1, sym      42611       164782   4.1
    pipelined K=1, 2 actors, 3 versions, rejoin 0, sym       5412        19256   0.4
    pipelined K=1, 2 actors, 3 versions, no leave            7628        16247   0.4
    pipelined K=2, 2 actors, 3 versions, rejoin 1, sym, st@inf  47490   172327   4.5
    pipelined K=2, 2 actors, 3 versions, rejoin 0, sym, st@inf   4588    15185   0.4
    pipelined K=1, 3 actors, 2 versions, rejoin 0, sym, st@inf   9421    41286   1.1
    strict, cutoff 0.6, weights (2, 1), rejoin 1             6494        20286   0.4
    pipelined K=1, cutoff 0.6, weights (2, 1), st@inf        4825        14761   0.3
    strict, 3 actors, T=3, 2 versions, cutoff 0.5, min_unroll 0.5, sym, st@inf
                                                             2075         8967   0.2
    ("sym" = symmetry, "st@inf" = exact_stamps=False.) Run once by hand, also ok:
    pipelined K=1, 2 actors, rejoin 1, no reductions          84724 states      8 s
    pipelined K=2, 2 actors, rejoin 1, sym, exact stamps     990384 states    390 s
    pipelined K=2, 2 actors, T=1, 5 versions, rejoin 2, sym  959392 states    170 s
    pipelined K=1, 3 actors, 3 versions, rejoin 1, sym, st@inf 327883 states  130 s
    pipelined K=1, 2 actors, T=3, 4 versions, rejoin 2, sym, st@inf 87071     9 s
    strict, 3 actors, 3 versions, rejoin 2, sym, st@inf       79438 states     11 s
    pipelined K=1, 3 actors, 2 versions, rejoin 1, cutoff 0.6, weights (2, 1, 1),
        sym, st@inf                                           764581 states    150 s

History: the checker found the rejoin bug in an earlier gate.py -- in pipelined
mode a member that completed phase u+1 while phase u was still collecting, then
left and rejoined, was put back into phase u+1 (``_joining_phase`` looked only at
the phases of present members) and collected it a second time: 2T admissions in
one phase, the first unroll silently replaced. Shortest trace (K=1, 11 events):
A0 joins and takes step 0 of phase 0; A1 joins (into phase 1), takes its two
steps, completes phase 1 (held for phase 2), leaves, rejoins, and is admitted as
step 0 of phase 1 again. gate.py now counts phases with complete unrolls in
``_joining_phase`` (and closes an abandoned phase that such a phase waits beyond);
tests/test_verify.py keeps the old rule as a planted bug.

tests/test_verify.py runs the smaller configurations above (about 20 s on one
core), and checks that planted bugs are caught with a (shortest) trace: a gate
ignoring max_lag, one closing a phase too early, one never closing an abandoned
phase, one keeping a held request after its member left, one releasing twice, one
whose publish releases nobody, one cutting stragglers below min_unroll, and the
old rejoin rule.
"""

from lockstep_verify.checker import Report, Violation, check, config_name, replay
from lockstep_verify.cli import STANDARD, main
from lockstep_verify.model import Config
from lockstep_verify.state import Event, Finding

__all__ = ["STANDARD", "Config", "Event", "Finding", "Report", "Violation", "check", "config_name", "main", "replay"]

"""``python -m lockstep_verify``: check one configuration, or the standard ones, and print a table."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from lockstep_verify.checker import Report, check, config_name

# The configurations the package docstring's table lists (T = 2 unless set): every
# mode and option, each small enough to check in seconds.
STANDARD: tuple[dict[str, Any], ...] = (
    {"actors": 2, "steps": 2, "versions": 3, "max_lag": 0},
    {"actors": 2, "steps": 2, "versions": 3, "max_lag": 0, "min_members": 2},
    {"actors": 2, "steps": 2, "versions": 3, "max_lag": 0, "reconnects": 2, "symmetry": True},
    {"actors": 3, "steps": 2, "versions": 3, "max_lag": 0, "symmetry": True, "exact_stamps": False},
    {"actors": 2, "steps": 2, "versions": 3, "max_lag": 1, "symmetry": True},
    {"actors": 2, "steps": 2, "versions": 3, "max_lag": 1, "reconnects": 0, "symmetry": True},
    {"actors": 2, "steps": 2, "versions": 3, "max_lag": 1, "disconnects": False},
    {"actors": 2, "steps": 2, "versions": 3, "max_lag": 2, "symmetry": True, "exact_stamps": False},
    {"actors": 2, "steps": 2, "versions": 3, "max_lag": 2, "reconnects": 0, "symmetry": True, "exact_stamps": False},
    {"actors": 3, "steps": 2, "versions": 2, "max_lag": 1, "reconnects": 0, "symmetry": True, "exact_stamps": False},
    {"actors": 2, "steps": 2, "versions": 3, "max_lag": 0, "cutoff": 0.6, "weights": (2, 1)},
    {"actors": 2, "steps": 2, "versions": 3, "max_lag": 1, "cutoff": 0.6, "weights": (2, 1), "reconnects": 0,
     "exact_stamps": False},
    {"actors": 3, "steps": 3, "versions": 2, "max_lag": 0, "cutoff": 0.5, "min_unroll": 0.5, "reconnects": 0,
     "symmetry": True, "exact_stamps": False},
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lockstep_verify",
                                     description="Exhaustively model-check the admission gate "
                                                 "(with no options: the standard configurations).")
    parser.add_argument("--actors", type=int, help="check this one configuration (the other options shape it)")
    parser.add_argument("--steps", type=int, default=2, help="T, steps per unroll")
    parser.add_argument("--versions", type=int, default=3, help="phases trained before the run finishes")
    parser.add_argument("--max-lag", type=int, default=0, help="0: strict; K >= 1: pipelined")
    parser.add_argument("--reconnects", type=int, default=1, help="joins after the first, per actor")
    parser.add_argument("--min-members", type=int, default=1)
    parser.add_argument("--cutoff", type=float, help="the straggler cut-off")
    parser.add_argument("--min-unroll", type=float, default=0.0)
    parser.add_argument("--no-disconnects", action="store_true", help="actors never leave")
    parser.add_argument("--stamps-at-inference", action="store_true", help="exact_stamps=False")
    parser.add_argument("--symmetry", action="store_true", help="merge states equal up to renaming actors")
    parser.add_argument("--traces", action="store_true", help="print the counterexample traces")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the checks; print a row per configuration as it finishes (stderr), then the table (stdout).

    Returns 0 if every configuration was checked completely and found ok.
    """
    args = _parser().parse_args(argv)
    if args.actors is not None:
        configs = [{"actors": args.actors, "steps": args.steps, "versions": args.versions, "max_lag": args.max_lag,
                    "reconnects": args.reconnects, "min_members": args.min_members, "cutoff": args.cutoff,
                    "min_unroll": args.min_unroll, "disconnects": not args.no_disconnects,
                    "exact_stamps": not args.stamps_at_inference, "symmetry": args.symmetry}]
    else:
        configs = list(STANDARD)
    rows: list[tuple[str, ...]] = []
    reports: list[Report] = []
    for c in configs:
        r = check(**c)
        reports.append(r)
        rows.append((config_name(r.config), str(r.states), str(r.transitions), f"{r.seconds:.2f}", r.result()))
        print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
    head = ("config", "states", "transitions", "seconds", "result")
    widths = [max(len(row[k]) for row in rows + [head]) for k in range(len(head))]
    for row in [head, tuple("-" * w for w in widths)] + rows:
        # the config and result columns left-aligned, the numbers right-aligned
        print("  ".join(x.ljust(w) if k in (0, 4) else x.rjust(w) for k, (x, w) in enumerate(zip(row, widths))))
    if args.traces or args.actors is not None:
        for r in reports:
            for v in r.violations:
                print(f"\n{config_name(r.config)}\n{v.format()}")
    return 0 if all(r.ok for r in reports) else 1

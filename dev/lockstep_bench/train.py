"""``python -m lockstep_bench.train [--jitter-ms MS] [--collect-only] [--design NAME] LOCKSTEP_TRAIN_ARGS ...``:
``lockstep train`` with a benchmark's parts in the learner (``lockstep_bench.hooks``); every other argument is
``lockstep train``'s.

    --jitter-ms MS           adversarial delays up to MS milliseconds (``hooks.JitteredBackend``)
    --collect-only           collect and check every batch, never train (``hooks.CollectOnlyTrainer``)
    --design NAME            a reference synchronization design instead of sync.strategy's: spin-flags,
                             spin-redo, reject-retry or seqlock (``lockstep_bench.reference``)
    --inference-threads N    with --design: the threads that run its forward passes (default 2)
"""

from __future__ import annotations

import argparse
import functools
import sys

from lockstep import cli
from lockstep_bench import hooks, reference
from lockstep_bench.runs import Knobs


def main(argv: list[str] | None = None) -> int:
    own = argparse.ArgumentParser(prog="python -m lockstep_bench.train", add_help=False)  # -h: lockstep train's
    own.add_argument("--jitter-ms", type=float, default=0.0)
    own.add_argument("--collect-only", action="store_true")
    own.add_argument("--design", choices=list(reference.DESIGNS), default="")
    own.add_argument("--inference-threads", type=int, default=2)
    knobs, rest = own.parse_known_args(argv)
    args = cli.build_parser().parse_args(["train", *rest])
    args.func = functools.partial(cli.cmd_train, parts=hooks.parts(Knobs(knobs.jitter_ms, knobs.collect_only,
                                                                         knobs.design, knobs.inference_threads)))
    return cli.run(args)


if __name__ == "__main__":
    sys.exit(main())

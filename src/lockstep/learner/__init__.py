"""The learner: sessions, backends, batched inference, rollouts, training and checkpoints,
wired together by ``wiring.Learner``."""


class RunFailed(RuntimeError):
    """The learner's own code raised ``error`` (inference, an update, the books; never an actor's input): the
    run stopped, its error logged once with its traceback. ``Learner.serve`` raises it from the error."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(f"the learner failed: {type(error).__name__}: {error}")

"""What runs inside a Ray actor: lockstep's actor loop (``lockstep.actor.run``) in a Ray worker process.

Ray imports this module in every worker that hosts an actor, so it imports neither torch (the actor side
never does) nor ray: ``launch/ray.py`` turns ``RayActor`` into a Ray actor class on the driver.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import tempfile
from dataclasses import replace

from lockstep import actor
from lockstep.actor import ActorOptions

log = logging.getLogger("lockstep.actor")

LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


class RayActor:
    """One lockstep actor. ``run`` holds the worker until the learner says training is over.

    The driver asks ``where`` before ``run``: a Ray actor runs its calls in order, so the answer names
    the process that then runs the loop.
    """

    def __init__(self, options: ActorOptions, log_level: int = logging.INFO, tls_ca_pem: bytes | None = None) -> None:
        _log_to_stderr(log_level)
        self.options = options
        self._ca_file = None
        if tls_ca_pem:  # the driver's file is not on this node: write the certificate here
            fd, self._ca_file = tempfile.mkstemp(prefix="lockstep-ca-", suffix=".pem")
            with os.fdopen(fd, "wb") as f:
                f.write(tls_ca_pem)
            self.options = replace(options, tls_ca=self._ca_file)

    def __repr__(self) -> str:  # Ray prefixes the lines it forwards with this: "(lockstep-actor-3 pid=...)"
        return f"lockstep-actor-{self.options.actor_id}"

    def where(self) -> tuple[int, str]:
        """This worker's process id and host name."""
        return os.getpid(), socket.gethostname()

    def run(self) -> int:
        """The actor loop; returns its exit code (0: training finished). A crash ends the worker process
        itself, so that Ray restarts the actor, as a dead local actor process is restarted."""
        try:
            return actor.run(self.options)
        except Exception:
            log.exception("actor %d crashed", self.options.actor_id)
            self._remove_ca_file()
            sys.stderr.flush()
            os._exit(1)
        finally:
            self._remove_ca_file()

    def _remove_ca_file(self) -> None:
        if self._ca_file:
            os.unlink(self._ca_file)
            self._ca_file = None


def _log_to_stderr(level: int) -> None:
    """lockstep's log lines go to the worker's stderr, which Ray forwards to the driver and keeps in its logs.
    Only the ``lockstep`` logger is configured: the worker's root logger is Ray's."""
    logger = logging.getLogger("lockstep")
    if not any(getattr(h, "lockstep", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(LOG_FORMAT, datefmt="%H:%M:%S"))
        handler.lockstep = True
        logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False

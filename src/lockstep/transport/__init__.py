"""Transport: how actors and the learner talk: one connection loop (connection.py) and the framings that feed it
(gRPC, shared memory; the in-process one is the actor's). Moves bytes, validates shapes, knows no PPO."""

PROTOCOL = 1  # bump when the messages change incompatibly
SERVICE = "lockstep.v1.Learner"
METHOD = f"/{SERVICE}/Connect"
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024

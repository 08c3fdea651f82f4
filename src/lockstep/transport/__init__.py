"""Transport: the gRPC protocol between actors and the learner. Moves bytes, validates shapes, knows no PPO."""

PROTOCOL = 1  # bump when the messages change incompatibly
SERVICE = "lockstep.v1.Learner"
METHOD = f"/{SERVICE}/Connect"
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024

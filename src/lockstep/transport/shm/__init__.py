"""Same-host framing: arrays in shared memory, wake-ups on a unix socket."""

"""User tools on a finished (or running) run directory: ``lockstep eval`` and ``lockstep audit``."""

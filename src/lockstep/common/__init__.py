"""Plumbing shared by every package: atomic file writes, backoff, trees of arrays, a process's parent."""

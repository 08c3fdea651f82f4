"""Plumbing shared by both sides: atomic file writes, backoff, the torch device."""

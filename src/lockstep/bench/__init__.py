"""Benchmarks (``lockstep bench ...``): each writes a Markdown table and a JSON file to ``--out``."""

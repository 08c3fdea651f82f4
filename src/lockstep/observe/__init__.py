"""What a run tells: episode statistics, metrics.csv and summary.json, the time split, progress, W&B, plots."""

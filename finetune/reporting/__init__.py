"""Looking at runs: plots from metrics.jsonl, experiment trackers, and the comparison of several runs."""

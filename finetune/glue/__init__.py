"""GLUE: its task table, GLUE-score conventions, its report, the `evaluate` metric and leaderboard submissions."""

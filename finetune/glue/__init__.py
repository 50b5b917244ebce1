"""GLUE: the task table, offline metrics, GLUE-score conventions, hub reading and leaderboard submissions."""

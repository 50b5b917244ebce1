"""GLUE: the task table, offline metrics and (later) leaderboard submissions."""

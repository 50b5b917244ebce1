"""What the CLI runs that does not train: eval, predict, profile, generate, push, merge (one module per command)."""

"""What every task kind shares, below the layers that read, train and score: the task record (TaskSpec and its
helpers: specs.py) and the metrics of the classification and regression kinds (metrics.py)."""

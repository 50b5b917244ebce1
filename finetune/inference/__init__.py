"""Running a trained model: batched prediction, ensembles of checkpoints, language-model validation and scoring."""

"""Models. Importing the package registers the AWD-LSTM classes with transformers' Auto classes, so that
`AutoModelForCausalLM` / `AutoModelForSequenceClassification.from_pretrained` load this toolkit's LSTM checkpoints."""

from finetune.models import awd_lstm, awd_lstm_classifier  # noqa: F401  (registration on import)

"""Models. Importing the package registers the AWD-LSTM classes, the n-gram model and the mean-pooling classifier
with transformers' Auto classes, so that `AutoModelForCausalLM` / `AutoModelForSequenceClassification.from_pretrained`
load this toolkit's own checkpoints."""

from finetune.models import awd_lstm, awd_lstm_classifier, mean_pooling, ngram  # noqa: F401  (registration on import)

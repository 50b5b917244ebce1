"""Models. Importing the package registers the AWD-LSTM classes, the n-gram model, the causal transformer
(Transformer-XL memory, sparse attention) and the mean-pooling classifier with transformers' Auto classes, so that
`AutoModelForCausalLM` / `AutoModelForSequenceClassification.from_pretrained` load this toolkit's own checkpoints."""

# Imported for what importing them does: each registers its classes with transformers' Auto classes.
from finetune.models import awd_lstm, awd_lstm_classifier, causal_transformer, mean_pooling, ngram  # noqa: F401

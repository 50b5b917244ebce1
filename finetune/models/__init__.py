"""Models. Importing the package registers the AWD-LSTM classes, the n-gram model, the causal transformer
(Transformer-XL memory, sparse attention) and the mean-pooling classifier with transformers' Auto classes, so that
`AutoModelForCausalLM` / `AutoModelForSequenceClassification.from_pretrained` load this toolkit's own checkpoints."""

from finetune.models import (  # noqa: F401
    awd_lstm,
    awd_lstm_classifier,
    causal_transformer,
    mean_pooling,
    ngram,  # (registration on import)
)

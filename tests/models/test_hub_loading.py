"""Loading a checkpoint runs the checkpoint's own layers: no kernels fetched from the Hub behind the user's back."""

from __future__ import annotations

from transformers import AutoModelForSequenceClassification, BertConfig, BertForSequenceClassification

from finetune.models.loading import load_model


def test_a_loaded_model_does_not_swap_in_hub_kernels(tmp_path):
    # transformers 5.2x defaults `use_kernels` to on: model.eval() then downloads kernel code (an H200 without
    # network stopped there). The toolkit's models train and predict with the layers their checkpoint names.
    config = BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    BertForSequenceClassification(config).save_pretrained(tmp_path)
    model = load_model(AutoModelForSequenceClassification, str(tmp_path))
    assert model.use_kernels is False
    model.eval()  # the switch that would kernelize
    assert model.use_kernels is False

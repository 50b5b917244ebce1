"""ULMFiT's AWD-LSTM classifier: concat pooling without padding, BPT3C, loading from a language model, layer groups."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModelForSequenceClassification

from finetune.models.awd_lstm import AWDLSTMConfig, AWDLSTMForCausalLM
from finetune.models.awd_lstm_classifier import AWDLSTMForSequenceClassification, concat_pool
from finetune.models.backbones import layer_groups

PAD = 1


def tiny_config(**overrides) -> AWDLSTMConfig:
    settings = dict(vocab_size=30, embedding_size=8, hidden_size=12, num_layers=2, pad_token_id=PAD, num_labels=3)
    settings.update(overrides)
    return AWDLSTMConfig(**settings)


def tiny_classifier(**overrides) -> AWDLSTMForSequenceClassification:
    torch.manual_seed(0)
    return AWDLSTMForSequenceClassification(tiny_config(**overrides))


def trained_norms(model: AWDLSTMForSequenceClassification) -> AWDLSTMForSequenceClassification:
    """The model after a few training-mode passes, so BatchNorm's running statistics are not the identity."""
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(input_ids=torch.randint(2, 30, (6, 10)))
    return model.eval()


def right_padded(rows: list[list[int]], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids and attention_mask as DataCollatorWithPadding makes them (right padding with PAD)."""
    input_ids = torch.tensor([row + [PAD] * (width - len(row)) for row in rows])
    attention_mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows])
    return input_ids, attention_mask


def test_shapes_and_classification_loss():
    model = tiny_classifier()
    input_ids = torch.randint(2, 30, (4, 11))
    labels = torch.tensor([0, 2, 1, 0])
    output = model(input_ids=input_ids, labels=labels)
    assert output.logits.shape == (4, 3)
    assert torch.allclose(output.loss, F.cross_entropy(output.logits, labels))
    assert model(input_ids=input_ids).loss is None
    assert model.config.classifier_bptt == 70 and model.config.classifier_hidden == 50  # defaults written back


def test_concat_pool_is_last_max_mean_of_real_positions():
    outputs = torch.randn(2, 5, 4)
    mask = torch.tensor([[True] * 5, [True, True, True, False, False]])
    pooled = concat_pool(outputs, mask)
    assert pooled.shape == (2, 12)
    real = outputs[1, :3]
    assert torch.equal(pooled[1], torch.cat([real[-1], real.amax(dim=0), real.mean(dim=0)]))
    assert torch.equal(pooled[0, :4], outputs[0, -1])


def test_padding_does_not_change_the_logits():
    model = trained_norms(tiny_classifier())
    text, other = [5, 9, 3, 17, 8, 22, 4], [7, 6, 2, 11, 25, 13, 19, 3, 9, 10, 12, 28]
    alone = model(*right_padded([text], 7)).logits
    padded = model(*right_padded([text], 15)).logits
    beside_longer = model(*right_padded([text, other], 12)).logits[0]
    without_mask = model(input_ids=right_padded([text], 15)[0]).logits  # pad ids found from the config
    for logits in (padded[0], beside_longer, without_mask[0]):
        torch.testing.assert_close(logits, alone[0], atol=1e-6, rtol=1e-5)


def test_empty_text_gives_finite_logits():
    model = tiny_classifier().eval()
    logits = model(*right_padded([[], [4, 5]], 3)).logits
    assert torch.isfinite(logits).all()


def test_reading_in_chunks_equals_reading_in_one_go():
    chunked = trained_norms(tiny_classifier(classifier_bptt=4, classifier_max_len=8))
    whole = AWDLSTMForSequenceClassification(tiny_config(classifier_bptt=1000, classifier_max_len=1000)).eval()
    whole.load_state_dict(chunked.state_dict())
    torch.manual_seed(3)
    documents = [torch.randint(2, 30, (25,)).tolist(), torch.randint(2, 30, (10,)).tolist()]
    batch = right_padded(documents, 25)
    torch.testing.assert_close(chunked(*batch).logits, whole(*batch).logits, atol=1e-6, rtol=1e-5)


def test_gradients_reach_the_encoder_only_through_the_last_max_len_tokens():
    no_dropout = dict(
        output_dropout=0.0, hidden_dropout=0.0, input_dropout=0.0, embedding_dropout=0.0, weight_dropout=0.0
    )
    early, late = list(range(2, 10)), list(range(10, 18))  # tokens of the first two chunks, of the last two
    input_ids = torch.tensor([early + late, early[::-1] + late[::-1]])

    def embedding_gradient(max_len: int) -> torch.Tensor:
        model = tiny_classifier(classifier_bptt=4, classifier_max_len=max_len, **no_dropout).train()
        model(input_ids=input_ids, labels=torch.tensor([0, 1])).loss.backward()
        return model.awd_lstm.embedding.weight.grad.abs().sum(dim=1)

    bounded = embedding_gradient(max_len=8)
    assert (bounded[early] == 0).all() and (bounded[late] > 0).all()
    assert (embedding_gradient(max_len=16)[early] > 0).all()  # a long enough window reaches the first chunk


def test_max_len_shorter_than_bptt_is_an_error():
    with pytest.raises(ValueError, match="classifier_max_len"):
        tiny_classifier(classifier_bptt=10, classifier_max_len=5)


def test_a_training_batch_of_one_works():
    model = tiny_classifier().train()
    model(input_ids=torch.randint(2, 30, (1, 6)), labels=torch.tensor([1])).loss.backward()


def test_regression_loss_is_mean_squared_error():
    model = tiny_classifier(num_labels=1, problem_type="regression")
    labels = torch.tensor([0.5, 3.2, 1.0])
    output = model(input_ids=torch.randint(2, 30, (3, 7)), labels=labels)
    assert output.logits.shape == (3, 1)
    assert torch.allclose(output.loss, F.mse_loss(output.logits.squeeze(-1), labels))


def test_loads_the_encoder_of_a_language_model_checkpoint(tmp_path):
    torch.manual_seed(0)
    language_model = AWDLSTMForCausalLM(tiny_config())
    language_model.save_pretrained(tmp_path)
    model, info = AutoModelForSequenceClassification.from_pretrained(tmp_path, num_labels=3, output_loading_info=True)
    assert isinstance(model, AWDLSTMForSequenceClassification)
    assert not info["unexpected_keys"]  # the decoder is ignored quietly
    assert {key.split(".")[0] for key in info["missing_keys"]} == {"classifier"}  # only the head is new
    expected = language_model.awd_lstm.state_dict()
    loaded = model.awd_lstm.state_dict()
    assert loaded.keys() == expected.keys()
    assert all(torch.equal(loaded[key], expected[key]) for key in expected)
    assert torch.isfinite(model(input_ids=torch.randint(2, 30, (2, 5))).logits).all()


def test_classifier_dropout_survives_the_fine_tune_stages_config_route(tmp_path):
    AWDLSTMForCausalLM(tiny_config()).save_pretrained(tmp_path)
    # As finetune/models/heads.py does: AutoConfig drops keys the config class does not declare.
    config = AutoConfig.from_pretrained(tmp_path, classifier_dropout=0.25, num_labels=2)
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path, config=config)
    assert (model.classifier.hidden.dropout.p, model.classifier.output.dropout.p) == (0.25, 0.1)
    default = AutoModelForSequenceClassification.from_pretrained(tmp_path, num_labels=2)
    assert default.classifier.hidden.dropout.p == 0.4  # ULMFiT's, when the config leaves it unset


def test_save_and_load_round_trip(tmp_path):
    model = trained_norms(tiny_classifier(classifier_bptt=5, classifier_dropout=0.2))
    model.save_pretrained(tmp_path)
    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    assert isinstance(loaded, AWDLSTMForSequenceClassification)
    assert (loaded.config.classifier_bptt, loaded.config.classifier_dropout) == (5, 0.2)
    assert loaded.classifier.hidden.dropout.p == 0.2
    input_ids = torch.randint(2, 30, (3, 12))
    torch.testing.assert_close(loaded(input_ids=input_ids).logits, model(input_ids=input_ids).logits)


def test_layer_groups_embedding_each_layer_then_head():
    model = tiny_classifier()
    groups = layer_groups(model)
    encoder = model.awd_lstm
    expected = [list(encoder.embedding.parameters())] + [list(layer.parameters()) for layer in encoder.layers]
    assert len(groups) == len(expected) + 1
    for group, parameters in zip(groups, expected):
        assert [id(p) for p in group] == [id(p) for p in parameters]
    assert {id(p) for p in groups[-1]} == {id(p) for p in model.classifier.parameters()}


@pytest.mark.slow
def test_every_stage_brings_the_registration_with_it():
    """A fresh interpreter that imports only a stage knows awd_lstm checkpoints (eval once did not)."""
    import subprocess
    import sys

    stages = ("finetune.stages.finetune", "finetune.commands.evaluate", "finetune.stages.pretrain")
    code = (
        "import {stage}; from transformers import AutoConfig, AutoModelForSequenceClassification; "
        "print(type(AutoModelForSequenceClassification.from_config("
        "AutoConfig.for_model('awd_lstm', vocab_size=20, embedding_size=4, hidden_size=4, num_layers=1))).__name__)"
    )
    # The three interpreters side by side: each spends its seconds importing torch and transformers.
    running = {
        stage: subprocess.Popen([sys.executable, "-c", code.format(stage=stage)], stdout=subprocess.PIPE, text=True)
        for stage in stages
    }
    for stage, process in running.items():
        output, _ = process.communicate(timeout=300)
        assert process.returncode == 0 and output.strip() == "AWDLSTMForSequenceClassification", stage


def test_training_loss_carries_ar_and_tar_of_real_tokens_in_its_gradient_only():
    """fastai's classifier regularises the encoder's top layer too; here padding is left out of both means."""
    input_ids, attention_mask = right_padded([[5, 6, 7, 8, 9], [10, 11, 12]], width=5)
    labels = torch.tensor([0, 2])
    model = tiny_classifier(
        embedding_dropout=0.0,
        input_dropout=0.0,
        hidden_dropout=0.0,
        weight_dropout=0.0,
        classifier_dropout=0.0,
        classifier_hidden_dropout=0.0,
    ).train()
    assert (
        model.config.classifier_activation_regularization,
        model.config.classifier_temporal_activation_regularization,
    ) == (2.0, 1.0)  # fastai's alpha, beta
    regularised = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    regularised.loss.backward()
    got = {name: parameter.grad.clone() for name, parameter in model.named_parameters()}

    model.zero_grad()
    model.config.classifier_activation_regularization = model.config.classifier_temporal_activation_regularization = 0
    plain = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    top = model.awd_lstm(input_ids).last_hidden_state  # (batch, time, features), no dropout anywhere
    real = attention_mask.bool()
    pairs = real[:, 1:] & real[:, :-1]
    ar = top[real].pow(2).mean()
    tar = (top[:, 1:] - top[:, :-1])[pairs].pow(2).mean()
    embedding = model.awd_lstm.embedding.weight
    (plain_gradient,) = torch.autograd.grad(plain.loss, embedding, retain_graph=True)
    (plain.loss + 2.0 * ar + 1.0 * tar).backward()
    assert torch.equal(regularised.loss.detach(), plain.loss.detach())  # the value is the task loss alone
    for name, parameter in model.named_parameters():
        torch.testing.assert_close(got[name], parameter.grad, rtol=1e-4, atol=1e-5)
    assert (got["awd_lstm.embedding.weight"] - plain_gradient).abs().max() > 1e-4  # the penalty did change it


def test_ar_and_tar_off_or_in_evaluation_leave_the_plain_loss_and_gradient():
    input_ids = torch.randint(2, 30, (3, 6))
    labels = torch.tensor([0, 1, 2])
    off = tiny_classifier(classifier_activation_regularization=0.0, classifier_temporal_activation_regularization=0.0)
    on = tiny_classifier()
    for model in (off, on):
        model.eval()  # BatchNorm and dropout fixed, and no penalty: both give the same loss and gradients
        model(input_ids=input_ids, labels=labels).loss.backward()
    for (name, first), (_, second) in zip(off.named_parameters(), on.named_parameters()):
        torch.testing.assert_close(first.grad, second.grad, msg=name)


def test_recipe_keys_reach_the_awd_lstm_classifier_and_are_refused_elsewhere(tmp_path):
    from finetune.errors import UserError
    from finetune.glue.specs import GLUE_TASKS
    from finetune.kinds.classifier_keys import classifier_keys
    from finetune.models.heads import load_classifier
    from finetune.recipes import BackboneConfig
    from tests.conftest import save_tiny_masked_lm

    AWDLSTMForCausalLM(tiny_config()).save_pretrained(tmp_path / "lstm")
    backbone = BackboneConfig(
        checkpoint=str(tmp_path / "lstm"), activation_regularization=0.5, temporal_activation_regularization=0.0
    )
    model = load_classifier(backbone, GLUE_TASKS["sst2"], None)
    assert (
        model.config.classifier_activation_regularization,
        model.config.classifier_temporal_activation_regularization,
    ) == (0.5, 0.0)
    # the refused option, named by its recipe key as the stages name it
    with (
        pytest.raises(UserError, match=r"model.activation_regularization: only the AWD-LSTM classifier"),
        classifier_keys(),
    ):
        load_classifier(backbone, GLUE_TASKS["sst2"], None, pooling="mean")
    bert = BackboneConfig(checkpoint=str(save_tiny_masked_lm(tmp_path / "bert")), temporal_activation_regularization=1)
    refused = r"model.temporal_activation_regularization: .*is a 'bert' model"
    with pytest.raises(UserError, match=refused), classifier_keys():
        load_classifier(bert, GLUE_TASKS["sst2"], None)

"""method auto's rule: contrastive for a sentence-embedding checkpoint with few labelled rows per class, plain
otherwise; and the techniques method contrastive changes where the recipe left them to their defaults."""

from __future__ import annotations

from finetune.kinds.method import (
    CONTRASTIVE_HEAD_LR,
    CONTRASTIVE_UP_TO,
    choose_method,
    contrastive_problem,
    contrastive_techniques,
    stage_two_line,
)

FEW = {"negative": 8, "positive": 8}


def test_auto_trains_contrastively_on_a_sentence_model_with_few_rows_per_class():
    choice = choose_method("auto", FEW, sentence_model=True, pooling="mean")
    assert choice.method == "contrastive" and "8 labelled rows per class" in choice.reason


def test_auto_trains_plainly_otherwise_and_says_why():
    many = {"a": CONTRASTIVE_UP_TO + 1, "b": CONTRASTIVE_UP_TO + 1}
    cases = {
        "more than": choose_method("auto", many, True, "mean"),
        "not a sentence-embedding model": choose_method("auto", FEW, False, "model"),
        "trains a head": choose_method("auto", None, True, "mean"),
        "pooling is model": choose_method("auto", FEW, True, "model"),
        "class 'b' has no training row": choose_method("auto", {"a": 5, "b": 0}, True, "mean"),
    }
    for said, choice in cases.items():
        assert choice.method == "plain" and said in choice.reason, (said, choice)


def test_a_class_of_one_row_trains_contrastively_when_asked_and_plainly_under_auto():
    assert choose_method("contrastive", {"a": 5, "b": 1}, True, "mean").method == "contrastive"
    assert contrastive_problem({"a": 5, "b": 1}, "mean") is None  # method contrastive is not refused
    auto = choose_method("auto", {"a": 5, "b": 1}, True, "mean")
    assert auto.method == "plain" and "class 'b' has one training row" in auto.reason


def test_a_method_in_the_recipe_is_kept():
    assert choose_method("plain", FEW, True, "mean").reason == "set in the recipe"
    assert choose_method("contrastive", {"a": 500}, True, "mean").method == "contrastive"


def test_contrastive_trains_the_head_alone_where_the_recipe_left_it_open(finetune_recipe_data, write_recipe):
    from finetune.recipes import load_recipe

    data = dict(finetune_recipe_data, unfreezing={}, training={"batch_size": 8, "device": "cpu"})
    recipe = load_recipe(write_recipe(data))
    recipe._technique_sources = {"unfreezing.mode": "default for a bert transformer", "training.lr": "default"}
    changed = contrastive_techniques(recipe)
    assert changed.unfreezing.mode == "gradual" and changed.unfreezing.schedule == [1]
    assert changed.training.lr == CONTRASTIVE_HEAD_LR
    recipe._technique_sources = {"unfreezing.mode": "set", "training.lr": "set"}
    kept = contrastive_techniques(recipe)
    assert (kept.unfreezing, kept.training.lr) == (recipe.unfreezing, recipe.training.lr)


def test_auto_counts_a_multilabel_tasks_positive_rows_per_label():
    labels = {"a": 3, "b": 1, "c": 0}  # rare labels pair through the others' rows: no minimum per label
    choice = choose_method("auto", labels, True, "mean", per_label=True)
    assert choice.method == "contrastive" and "1 positive rows per label (median)" in choice.reason
    many = {"a": CONTRASTIVE_UP_TO + 1, "b": CONTRASTIVE_UP_TO + 3}
    cases = {
        f"{CONTRASTIVE_UP_TO + 2} positive rows per label (median), more than": choose_method(
            "auto", many, True, "mean", per_label=True
        ),
        "no dissimilar pair": choose_method(
            "auto", labels, True, "mean", "every two rows ... no dissimilar pair", True
        ),
        "pooling is model": choose_method("auto", labels, True, "model", per_label=True),
    }
    for said, choice in cases.items():
        assert choice.method == "plain" and said in choice.reason, (said, choice)


def test_a_label_of_few_rows_is_no_problem_unpaired_rows_are():
    assert contrastive_problem({"a": 0, "b": 1}, "mean", per_label=True) is None
    assert contrastive_problem({"a": 0, "b": 1}, "mean", "no similar pair", per_label=True) == "no similar pair"
    assert "class 'a' has no training row" in str(contrastive_problem({"a": 0, "b": 1}, "mean"))
    assert contrastive_problem({"a": 1, "b": 8}, "mean") is None  # a class of one row pairs with itself (ATIS)


def test_self_training_auto_is_off_until_a_gain_is_measured_and_says_so():
    from finetune.kinds.method import choose_self_training

    choice = choose_self_training("auto", 500, FEW)
    assert choice is not None and choice.rounds == 0
    assert choice.line().startswith("self-training: off (auto: no gain measured yet (SST-2, 8 labels per class")
    assert "self_training.rounds: 2 runs it" in choice.line()


def test_self_training_auto_runs_rounds_with_unlabelled_text_and_few_labels_per_class(monkeypatch):
    from finetune.kinds import method
    from finetune.kinds.method import SELF_TRAINING_ROUNDS, SELF_TRAINING_UP_TO, choose_self_training

    monkeypatch.setattr(method, "SELF_TRAINING_MEASURED_GAIN", True)  # the rule auto follows once a gain is measured

    choice = choose_self_training("auto", 500, FEW)
    assert choice is not None and choice.rounds == SELF_TRAINING_ROUNDS
    assert choice.line() == (
        f"self-training: {SELF_TRAINING_ROUNDS} rounds (auto: 500 unlabelled rows and 8 labelled rows per class "
        f"(median), at most {SELF_TRAINING_UP_TO} (finetune/kinds/method.py))"
    )
    many = {"a": SELF_TRAINING_UP_TO + 1, "b": SELF_TRAINING_UP_TO + 1}
    off = choose_self_training("auto", 500, many)
    assert off is not None and off.rounds == 0
    assert off.line().startswith(f"self-training: off (auto: {SELF_TRAINING_UP_TO + 1} labelled rows per class")


def test_self_training_says_nothing_without_unlabelled_text_and_keeps_rounds_set_in_the_recipe():
    from finetune.kinds.method import choose_self_training

    assert choose_self_training("auto", 0, FEW) is None and choose_self_training(3, 0, FEW) is None
    assert choose_self_training(1, 10, {"a": 500}).line() == "self-training: 1 round (set in the recipe)"
    assert choose_self_training(0, 10, FEW).line() == "self-training: off (set in the recipe)"


def test_a_round_adds_four_times_the_smallest_class_by_default():
    from finetune.kinds.method import PSEUDO_LABELS_PER_CLASS, pseudo_labels_per_class

    assert pseudo_labels_per_class(None, {"a": 8, "b": 3}) == PSEUDO_LABELS_PER_CLASS * 3
    assert pseudo_labels_per_class(7, {"a": 8, "b": 3}) == 7
    assert pseudo_labels_per_class(None, {"a": 0}) == 1


def test_the_stage_two_line_advises_against_it_for_sentence_models_and_says_how_for_the_others():
    for sentence_model, fresh in ((True, True), (True, None), (False, True)):
        line = stage_two_line(sentence_model, fresh)
        assert "not run, nor advised" in line and "bench/stage2_drift.py" in line
    assert "a sentence-embedding model" in stage_two_line(True, True)
    assert "without a language-model head" in stage_two_line(False, True)
    for fresh in (False, None):  # a masked LM with its head, or a hub name not fetched yet
        line = stage_two_line(False, fresh)
        assert "not run by a finetune run" in line and "finetune pretrain" in line and "docs/ulmfit.md" in line

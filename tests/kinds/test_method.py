"""method auto's rule: contrastive for a sentence-embedding checkpoint with few labelled rows per class, plain
otherwise; and the techniques method contrastive changes where the recipe left them to their defaults."""

from __future__ import annotations

from finetune.kinds.method import CONTRASTIVE_HEAD_LR, CONTRASTIVE_UP_TO, choose_method, contrastive_techniques

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
        "class 'b' has 1 training row": choose_method("auto", {"a": 5, "b": 1}, True, "mean"),
    }
    for said, choice in cases.items():
        assert choice.method == "plain" and said in choice.reason, (said, choice)


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

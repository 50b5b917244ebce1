"""task.labels_per_class: the labelled rows drawn class by class (stratified, seeded by the draw), their record,
and what cannot be drawn."""

from __future__ import annotations

import numpy as np
import pytest

from finetune.errors import UserError
from finetune.kinds.labelled_rows import NO_LABEL, class_rows, describe, draw_rows, labelled_subset

NAMES = ("negative", "neutral", "positive")
LABELS = np.array([0] * 20 + [1] * 7 + [2] * 13)  # 40 training rows of three classes


def test_a_draw_takes_exactly_labels_per_class_rows_of_each_class():
    for per_class in (1, 3, 7):
        rows = draw_rows(LABELS, NAMES, per_class, draw=0)
        assert rows == sorted(set(rows))
        assert np.bincount(LABELS[rows], minlength=3).tolist() == [per_class] * 3


def test_the_same_draw_gives_the_same_rows_and_another_draw_others():
    rows = draw_rows(LABELS, NAMES, 5, draw=3)
    assert draw_rows(LABELS, NAMES, 5, draw=3) == rows
    others = [draw_rows(LABELS, NAMES, 5, draw=draw) for draw in range(5)]
    assert len({tuple(other) for other in others}) == 5  # 20-, 7- and 13-row classes: five different draws


def test_a_class_with_fewer_rows_gives_all_of_them_and_says_so():
    record = labelled_subset(LABELS, NAMES, 10, draw=1, file_rows=list(range(40)))
    assert record["counts"] == {"negative": 10, "neutral": 7, "positive": 10}
    assert record["fewer"] == {"neutral": 7}
    assert set(np.flatnonzero(LABELS == 1)) <= set(record["rows"])
    line = describe(record)
    assert "\n" not in line
    assert line == (
        "task.labels_per_class 10, draw 1: 27 of the 40 training rows (negative 10, neutral 7, positive 10); "
        "class 'neutral' has 7 rows, all taken"
    )


def test_the_record_names_the_training_files_rows():
    """After dev_split's hold-out the pool is some of the file's rows: the record maps positions back to them."""
    file_rows = list(range(100, 140))
    record = labelled_subset(LABELS, NAMES, 2, draw=0, file_rows=file_rows)
    assert record["rows"] == [100 + position for position in record["positions"]]
    assert record["pool_rows"] == 40 and len(record["rows"]) == 6


@pytest.mark.parametrize(
    ("labels", "per_class", "named"),
    [
        (np.array([0] * 10 + [1] + [2] * 10), 4, "class 'neutral' has 1 training row (draw 2"),
        (np.array([0] * 10 + [2] * 10), 4, "class 'neutral' has no training rows"),
    ],
)
def test_a_class_that_cannot_be_drawn_is_one_line_naming_it(labels, per_class, named):
    with pytest.raises(UserError) as raised:
        labelled_subset(labels, NAMES, per_class, draw=2, file_rows=list(range(len(labels))))
    message = str(raised.value)
    assert message.startswith("task.labels_per_class: ") and named in message and "\n" not in message


def test_one_row_of_a_class_is_enough_for_one_per_class():
    labels = np.array([0] * 10 + [1] + [2] * 10)
    assert labelled_subset(labels, NAMES, 1, draw=0, file_rows=list(range(21)))["counts"]["neutral"] == 1


def test_a_multi_label_draw_tops_every_label_up_from_the_rarest():
    generator = np.random.default_rng(0)
    labels = (generator.random((60, 3)) < [0.1, 0.3, 0.6]).astype(np.float32)  # rare, common and frequent labels
    labels[:5] = 0  # some rows of no label
    names = ("PER", "LOC", "ORG")
    groups = class_rows(labels, names)
    assert list(groups) == [*names, NO_LABEL] and len(groups[NO_LABEL]) >= 5
    rows = draw_rows(labels, names, 4, draw=0)
    chosen = labels[rows].astype(bool)
    for index, name in enumerate(names):
        assert chosen[:, index].sum() >= min(4, len(groups[name]))  # at least 4 rows carry each label
    assert (~chosen.any(axis=1)).sum() >= 4  # and at least 4 rows carry none
    assert draw_rows(labels, names, 4, draw=0) == rows and draw_rows(labels, names, 4, draw=1) != rows


def test_self_training_reads_the_rows_a_run_trains_on_quietly(finetune_recipe_data, write_recipe, task_dir, capsys):
    """What self-training leaves out of the text it labels: the drawn rows (not the training file's others, which the
    model may label) and the dev rows, as the run's stage reads them (dev_split and the draw seeded by the draw), and
    without the stage's line."""
    from finetune.kinds.dev_split import drawn_split
    from finetune.kinds.labelled_rows import labelled_rows
    from finetune.recipes import load_recipe

    (task_dir / "dev.tsv").unlink()  # dev_split holds the dev rows out of train.tsv
    finetune_recipe_data["task"].update(labels_per_class=4, dev_split=0.25)
    recipe = load_recipe(write_recipe(dict(finetune_recipe_data, draw=2)), check_paths=False)
    capsys.readouterr()
    train, dev = labelled_rows(recipe)
    assert capsys.readouterr().out == ""
    lines = [line.split("\t") for line in (task_dir / "train.tsv").read_text().splitlines()[1:]]
    file_labels = np.array([int(label) for _, label in lines])
    kept, dev_rows = drawn_split(len(lines), 0.25, 2, file_labels)
    drawn = labelled_subset(file_labels[kept], ("0", "1"), 4, 2, kept)["rows"]
    assert [texts[0] for texts in train.texts] == [lines[row][0] for row in drawn]
    assert [texts[0] for texts in dev.texts] == [lines[row][0] for row in dev_rows]
    assert np.bincount(train.labels).tolist() == [4, 4] and len(dev_rows) == 10

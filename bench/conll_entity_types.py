"""Real multi-label data without a download: which entity types (PER, ORG, LOC, MISC) each CoNLL-2003 sentence
contains, as a task folder for `task.kind: multilabel`.

    .venv/bin/python bench/conll_entity_types.py OUT_FOLDER        # OUT_FOLDER outside the repository

reads ../shared/data/conll2003 (train.txt, valid.txt, test.txt in CoNLL columns) and writes OUT_FOLDER/train.jsonl,
dev.jsonl and test.jsonl: one {"text": the sentence's words joined by spaces, "labels": its entity types, in the
order PER, ORG, LOC, MISC} per sentence; a sentence without entities has no labels. A recipe reads them with

    task: {name: conll-entity-types, kind: multilabel, data_dir: OUT_FOLDER, text_columns: [text],
           label_column: labels, labels: [PER, ORG, LOC, MISC], threshold: dev}

CoNLL-2003 train: 14,041 sentences; PER in 31%, ORG 33%, LOC 37%, MISC 19%, none in 21% (dev 3,250, test 3,453).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from _common import ROOT, SHARED, require

sys.path.insert(0, str(ROOT))

from finetune.kinds.tokens.data import read_conll

CONLL = SHARED / "data" / "conll2003"
ENTITY_TYPES = ("PER", "ORG", "LOC", "MISC")
SPLITS = {"train": "train.txt", "dev": "valid.txt", "test": "test.txt"}


def entity_types(tags: list[str]) -> list[str]:
    """The entity types a sentence's BIO tags mention, in ENTITY_TYPES order."""
    found = {tag.partition("-")[2] for tag in tags if tag != "O"}
    unknown = found - set(ENTITY_TYPES)
    if unknown:
        raise ValueError(f"entity type(s) {', '.join(sorted(unknown))} outside {', '.join(ENTITY_TYPES)}")
    return [kind for kind in ENTITY_TYPES if kind in found]


def write_split(source: Path, target: Path) -> Counter:
    """One JSON line per sentence of a CoNLL file; returns how many sentences hold each type (and none)."""
    sentences = read_conll(source)
    counts = Counter()
    with open(target, "w", encoding="utf-8") as handle:
        for words, tags in zip(sentences.words, sentences.tags):
            labels = entity_types(tags)
            counts.update(labels or ["(none)"])
            handle.write(json.dumps({"text": " ".join(words), "labels": labels}, ensure_ascii=False) + "\n")
    counts["sentences"] = len(sentences.words)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the task folder to write (outside the repository)")
    out = parser.parse_args().out.resolve()
    if out == ROOT or ROOT in out.parents:
        sys.exit(f"bench: write the task folder outside the repository, not in {out}")
    for name in SPLITS.values():
        require(CONLL / name, f"CoNLL-2003 {name}")
    out.mkdir(parents=True, exist_ok=True)
    for split, name in SPLITS.items():
        counts = write_split(CONLL / name, out / f"{split}.jsonl")
        shares = ", ".join(f"{kind} {counts[kind] / counts['sentences']:.0%}" for kind in (*ENTITY_TYPES, "(none)"))
        print(f"{split}: {counts['sentences']:,} sentences ({shares}) -> {out / f'{split}.jsonl'}")


if __name__ == "__main__":
    main()

"""Split the SQuAD 2.0 dev sample (../shared/data/squad-v2-sample/dev-v2.0-sample.json: five real articles of
SQuAD 2.0 dev, 1,407 questions) by article into train.json and dev.json for `task.kind: spans`.

    python bench/squad_sample_split.py runs/squad-sample-data            # dev: the last article (Victoria_(Australia))
    python bench/squad_sample_split.py OUT --dev Normans                 # another article held out

Training on four articles and scoring the fifth checks the question-answering pipeline end to end (windows,
no-answer, EM / F1); it is not a SQuAD score: the published ones train on SQuAD's 130,000 training questions and
score all of dev.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SAMPLE = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "squad-v2-sample" / "dev-v2.0-sample.json"


def split_by_article(sample: dict, dev_titles: list[str]) -> tuple[dict, dict]:
    """Two SQuAD documents: the articles not in dev_titles, and those in it (in the sample's order)."""
    train = [article for article in sample["data"] if article["title"] not in dev_titles]
    dev = [article for article in sample["data"] if article["title"] in dev_titles]
    version = sample.get("version", "v2.0")
    return {"version": version, "data": train}, {"version": version, "data": dev}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder to write train.json and dev.json into")
    parser.add_argument("--sample", type=Path, default=SAMPLE)
    parser.add_argument("--dev", nargs="+", help="titles of the held-out articles (default: the last article)")
    arguments = parser.parse_args()
    if not arguments.sample.is_file():
        sys.exit(f"no {arguments.sample}: the SQuAD 2.0 sample is expected in ../shared/data/squad-v2-sample/")
    sample = json.loads(arguments.sample.read_text(encoding="utf-8"))
    titles = [article["title"] for article in sample["data"]]
    dev_titles = arguments.dev or titles[-1:]
    unknown = [title for title in dev_titles if title not in titles]
    if unknown:
        sys.exit(f"--dev: no article {unknown[0]!r} (articles: {', '.join(titles)})")
    arguments.out.mkdir(parents=True, exist_ok=True)
    for name, document in zip(("train", "dev"), split_by_article(sample, dev_titles)):
        questions = sum(len(paragraph["qas"]) for article in document["data"] for paragraph in article["paragraphs"])
        (arguments.out / f"{name}.json").write_text(json.dumps(document, ensure_ascii=False), encoding="utf-8")
        print(f"{arguments.out / (name + '.json')}: {len(document['data'])} article(s), {questions:,} questions")


if __name__ == "__main__":
    main()

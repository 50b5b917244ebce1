"""Generate the quickstart data: an unlabeled review corpus and a small sentiment task in GLUE layout.

    python data/make_quickstart_data.py      # rewrites data/quickstart/ (fixed seed: same bytes every time)

The data is built so that pretraining measurably helps. Sentiment is carried by adjectives.
The labelled task trains on a few "seen" adjectives only, while most dev and test examples use
adjectives that never occur in the task's training set. Those adjectives do occur in the
unlabeled corpus, next to cues of their polarity ("i loved it", "would recommend"), so a
masked language model learns which side each belongs to; a randomly initialised classifier
cannot know, and stays near chance on them.
"""

from __future__ import annotations

import random
from pathlib import Path

SEED = 13
OUT = Path(__file__).resolve().parent / "quickstart"

POSITIVE = [
    "excellent",
    "wonderful",
    "superb",
    "delightful",
    "brilliant",
    "charming",
    "splendid",
    "terrific",
    "marvelous",
    "lovely",
    "fantastic",
    "stunning",
    "gorgeous",
    "pleasant",
    "fabulous",
    "outstanding",
    "enjoyable",
    "magnificent",
    "remarkable",
    "exquisite",
    "graceful",
    "elegant",
    "heartwarming",
    "uplifting",
]
NEGATIVE = [
    "awful",
    "terrible",
    "dreadful",
    "horrible",
    "boring",
    "dull",
    "tedious",
    "bland",
    "mediocre",
    "clumsy",
    "lousy",
    "atrocious",
    "miserable",
    "dismal",
    "painful",
    "pointless",
    "shoddy",
    "sloppy",
    "tiresome",
    "unbearable",
    "annoying",
    "disappointing",
    "forgettable",
    "lifeless",
]
SEEN_PER_SIDE = 6  # adjectives per polarity that the labelled training set may use

NOUNS = [
    "film",
    "movie",
    "story",
    "plot",
    "script",
    "cast",
    "acting",
    "ending",
    "soundtrack",
    "dialogue",
    "pacing",
    "score",
    "direction",
    "performance",
    "scenery",
    "camera",
    "work",
    "lead",
    "actor",
    "lead",
    "actress",
    "villain",
    "hero",
    "finale",
    "opening",
    "visuals",
    "editing",
    "costumes",
    "sequel",
    "premise",
    "twist",
]
SUBJECTS = ["the " + noun for noun in NOUNS if noun not in ("work", "lead", "actor", "actress")]
INTENSIFIERS = ["", "", "really ", "very ", "quite ", "truly ", "rather ", "so ", "absolutely ", "pretty "]
NEUTRAL_CLAUSES = [
    "i watched it on a sunday",
    "it runs about two hours",
    "i saw it with my brother",
    "it came out last year",
    "the theater was half empty",
    "i went in knowing nothing",
    "it is based on a novel",
    "we got popcorn",
    "the director is new",
    "my friend picked it",
    "it was raining outside",
    "i saw the late show",
]
# Polarity cues appear in the corpus only, never in the labelled task.
CUES = {
    +1: [
        "i loved it",
        "i would recommend it",
        "what a treat",
        "i enjoyed every minute",
        "go and see it",
        "i would watch it again",
        "a real pleasure",
        "it made my day",
        "five stars",
        "worth every penny",
    ],
    -1: [
        "i hated it",
        "i would not recommend it",
        "what a waste",
        "i regretted every minute",
        "avoid it",
        "i walked out early",
        "a real chore",
        "it ruined my evening",
        "one star",
        "want my money back",
    ],
}


def adjective_phrase(rng: random.Random, words: list[str]) -> str:
    """An adjective with an optional intensifier."""
    return rng.choice(INTENSIFIERS) + rng.choice(words)


def corpus_review(rng: random.Random, lexicon: dict[int, list[str]]) -> str:
    """A 12-20 sentence review whose adjectives and cues all agree in polarity."""
    polarity = rng.choice((+1, -1))
    words = lexicon[polarity]
    sentences = []
    for _ in range(rng.randint(12, 20)):
        form = rng.randrange(6)
        if form == 0:
            sentences.append(f"{rng.choice(SUBJECTS)} was {adjective_phrase(rng, words)}")
        elif form == 1:
            sentences.append(
                f"{rng.choice(SUBJECTS)} was {rng.choice(words)} and {rng.choice(SUBJECTS)} "
                f"was {adjective_phrase(rng, words)}"
            )
        elif form == 2:
            sentences.append(f"{rng.choice(CUES[polarity])} , {rng.choice(SUBJECTS)} was {rng.choice(words)}")
        elif form == 3:
            sentences.append(
                f"a {rng.choice(words)} , {rng.choice(words)} {rng.choice(NOUNS)} . {rng.choice(CUES[polarity])}"
            )
        elif form == 4:
            sentences.append(f"{rng.choice(words)} , {rng.choice(words)} and {adjective_phrase(rng, words)}")
        else:
            sentences.append(rng.choice(CUES[polarity]))
    return " . ".join(sentences) + " ."


def task_example(rng: random.Random, lexicon: dict[int, list[str]]) -> tuple[str, int]:
    """A one-sentence review without any polarity cue but its adjective(s); label 1 = positive."""
    polarity = rng.choice((+1, -1))
    words = lexicon[polarity]
    form = rng.randrange(3)
    if form == 0:
        text = f"{rng.choice(SUBJECTS)} was {adjective_phrase(rng, words)} ."
    elif form == 1:
        text = f"{rng.choice(NEUTRAL_CLAUSES)} , and {rng.choice(SUBJECTS)} was {adjective_phrase(rng, words)} ."
    else:
        text = f"{rng.choice(SUBJECTS)} was {rng.choice(words)} and {rng.choice(SUBJECTS)} was {rng.choice(words)} ."
    return text, int(polarity > 0)


def write_tsv(path: Path, header: list[str], rows: list[list[str]]) -> None:
    """A GLUE-style TSV: header row, tab-separated, no quoting."""
    with open(path, "w", encoding="utf-8", newline="\n") as handle:
        handle.write("\t".join(header) + "\n")
        for row in rows:
            handle.write("\t".join(row) + "\n")


def main() -> None:
    rng = random.Random(SEED)
    everything = {+1: POSITIVE, -1: NEGATIVE}
    seen = {polarity: words[:SEEN_PER_SIDE] for polarity, words in everything.items()}
    unseen = {polarity: words[SEEN_PER_SIDE:] for polarity, words in everything.items()}

    corpus = OUT / "corpus"
    task = OUT / "task"
    corpus.mkdir(parents=True, exist_ok=True)
    task.mkdir(parents=True, exist_ok=True)
    (corpus / "train.txt").write_text("\n".join(corpus_review(rng, everything) for _ in range(1800)) + "\n")
    (corpus / "valid.txt").write_text("\n".join(corpus_review(rng, everything) for _ in range(80)) + "\n")

    train = [task_example(rng, seen) for _ in range(400)]

    # dev and test: a quarter with seen adjectives, three quarters with adjectives the task never shows
    def evaluation_set(size: int) -> list[tuple[str, int]]:
        return [task_example(rng, seen if rng.random() < 0.25 else unseen) for _ in range(size)]

    dev, test = evaluation_set(600), evaluation_set(600)
    write_tsv(task / "train.tsv", ["sentence", "label"], [[text, str(label)] for text, label in train])
    write_tsv(task / "dev.tsv", ["sentence", "label"], [[text, str(label)] for text, label in dev])
    write_tsv(task / "test.tsv", ["index", "sentence"], [[str(index), text] for index, (text, _) in enumerate(test)])


if __name__ == "__main__":
    main()

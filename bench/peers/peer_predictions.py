"""Run the peer prediction script unchanged, and keep the logits its `Trainer.predict` returned.

    python bench/peers/peer_predictions.py --save-to LOGITS.npy -- PEER.py [peer options]

../shared/bench/peers/hf_predict.py prints its examples/s and metric, not its predictions. This wrapper patches
`transformers.Trainer.predict` before running the peer with `runpy`, the peer's folder first on sys.path as
`python PEER.py` has it (the peer imports hf_glue_finetune from beside itself). The patched `predict` calls the
original and keeps the predictions it returns; they are written to LOGITS.npy after the peer has finished, so
inside the peer's timed region the wrapper adds one function call and a list append.
"""

from __future__ import annotations

import sys

import numpy as np
import transformers

from _hf_peer import run_unchanged, wrapper_parser


def main() -> None:
    arguments = wrapper_parser(__doc__, "the .npy file for the logits").parse_args()
    kept = []
    original_predict = transformers.Trainer.predict

    def predict_and_keep(trainer, *args, **kwargs):
        output = original_predict(trainer, *args, **kwargs)
        kept.append(output.predictions)
        return output

    transformers.Trainer.predict = predict_and_keep
    run_unchanged(arguments.peer)
    if len(kept) != 1:
        sys.exit(f"bench: the peer called Trainer.predict {len(kept)} times, expected once")
    np.save(arguments.save_to, kept[0])


if __name__ == "__main__":
    main()

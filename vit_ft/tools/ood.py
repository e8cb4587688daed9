"""Out-of-distribution awareness for the tools: a trained folder's feature bank (`tasks.feature_bank`) read
once, and the logits of a batch computed together with its pooled features, so that predict, evaluate and the
demo mark the images unlike the training images without a second pass through the model.

    scorer = OODScorer.of(trained)                 # scorer.bank None (and scorer.why says why) without a bank
    for batch in iter_batches(trained, files, forward=scorer.forward):
        scores, flags = scorer.last                # of the batch's decoded images: score above 1 is flagged
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..tasks.feature_bank import FeatureBank, feature_taps, read_feature_bank
from .trained import Trained

logger = logging.getLogger("vit_ft")


@dataclass
class OODScorer:
    """The feature bank of `trained` (None without one, `why` saying why in one line) and `forward`, the
    inference loop's forward that returns the logits as `Trained.logits` does and keeps the batch's
    out-of-distribution scores and flags in `last`."""

    trained: Trained
    bank: FeatureBank | None
    why: str = ""
    last: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)

    @classmethod
    def of(cls, trained: Trained) -> OODScorer:
        """The scorer of a loaded model: its run folder's bank (a Hub model has none)."""
        origin = trained.origin
        bank, why = read_feature_bank(origin.run_folder if origin.path is not None else None)
        if bank is not None and bank.features.shape[1] != _hidden_size(trained):
            bank, why = None, (
                f"the feature bank in {origin.run_folder} holds {bank.features.shape[1]}-wide features, the model "
                f"{_hidden_size(trained)}-wide ones: it belongs to another model; fine-tune again to get one"
            )
        return cls(trained, bank, why)

    def note(self) -> str:
        """One line on what the score is, or why there is none."""
        if self.bank is None:
            return f"No out-of-distribution score: {self.why}."
        ood = self.bank.ood
        return (
            f"An image is unlike the training images when its {ood['k']}-th nearest of {len(self.bank)} training "
            f"images is further than for {100 * ood['quantile']:g} % of the {ood['images']} {ood['split']} images, "
            "in the model's pooled features or in its patch embeddings (ood_score: that distance over the "
            "threshold, the larger of the two; above 1 is unlike)."
        )

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """`(batch, channels, height, width)` -> the logits `(batch, num_labels)` (`Trained.logits`); with a
        bank, the batch's scores and flags in `last`, from the features of the same forward pass."""
        if self.bank is None:
            return self.trained.logits(pixel_values)
        with feature_taps(self.trained.model) as taps:
            logits = self.trained.logits(pixel_values)
        self.last = self.bank.unlike_training({space: value.cpu().numpy() for space, value in taps.items()})
        return logits


def _hidden_size(trained: Trained) -> int:
    config: Any = trained.model.config
    return 2 * config.hidden_size if getattr(config, "pooling", None) == "cls+mean" else config.hidden_size


__all__ = ["OODScorer"]

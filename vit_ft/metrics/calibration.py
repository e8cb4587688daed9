"""Calibration of a classifier's probabilities (Guo et al. 2017, "On Calibration of Modern Neural Networks",
arXiv 1706.04599): reliability bins, the expected calibration error, and temperature scaling.

Temperature scaling divides the logits by one scalar T > 0 fitted on held-out data (the validation split) by
minimising the negative log-likelihood; the predicted class never changes, only how sure the model says it is.

    temperature = fit_temperature(val_logits, val_labels)
    probabilities = softmax_with_temperature(test_logits, temperature)
    bins = reliability_bins(probabilities.max(-1), probabilities.argmax(-1) == test_labels)
    bins.ece
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

ECE_BINS = 15  # Guo et al.'s M = 15 equal-width confidence bins
# a fitted temperature is kept inside these bounds: beyond them the validation split is too small or too
# easy to say anything (every image right with margin drives T towards 0)
TEMPERATURE_RANGE = (0.05, 20.0)
# a config's record of a temperature already folded into its classifier head (weights and bias divided by it):
# its logits are calibrated as they are, so no tool divides them again (`vit_ft.tasks.temperature.fold_temperature`)
FOLDED_TEMPERATURE_ATTRIBUTE = "folded_temperature"


def softmax_with_temperature(logits: torch.Tensor | np.ndarray, temperature: float = 1.0) -> torch.Tensor:
    """`softmax(logits / temperature)` over the last dimension, `(batch, num_classes)` float32 (a tensor)."""
    logits = torch.as_tensor(logits).float()
    return (logits / float(temperature)).softmax(dim=-1)


@dataclass(frozen=True)
class ReliabilityBins:
    """Confidence histogram of `num_bins` equal-width bins ((m-1)/M, m/M]: per bin the image count, the mean
    confidence and the accuracy (NaN in an empty bin)."""

    edges: np.ndarray  # (num_bins + 1,) from 0 to 1
    counts: np.ndarray  # (num_bins,) int
    confidence: np.ndarray  # (num_bins,) mean top-1 probability of the bin's images
    accuracy: np.ndarray  # (num_bins,) fraction of the bin's images predicted right

    @property
    def ece(self) -> float:
        """Expected calibration error: sum over bins of |B_m| / n * |acc(B_m) - conf(B_m)|."""
        total = self.counts.sum()
        if total == 0:
            return 0.0
        filled = self.counts > 0
        gaps = np.abs(self.accuracy[filled] - self.confidence[filled])
        return float((self.counts[filled] / total * gaps).sum())


def reliability_bins(
    confidences: np.ndarray | torch.Tensor, correct: np.ndarray | torch.Tensor, num_bins: int = ECE_BINS
) -> ReliabilityBins:
    """Bin the top-1 probabilities `(n,)` with whether each prediction was right `(n,)` into `num_bins`
    equal-width bins ((m-1)/M, m/M], as Guo et al. (a confidence of exactly 0 goes into the first bin)."""
    confidences = np.asarray(confidences, dtype=np.float64).reshape(-1)
    correct = np.asarray(correct, dtype=np.float64).reshape(-1)
    if len(confidences) != len(correct):
        raise ValueError(f"{len(confidences)} confidences but {len(correct)} correctness values.")
    index = np.clip(np.ceil(confidences * num_bins).astype(np.int64) - 1, 0, num_bins - 1)
    counts = np.bincount(index, minlength=num_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        confidence = np.bincount(index, weights=confidences, minlength=num_bins) / counts
        accuracy = np.bincount(index, weights=correct, minlength=num_bins) / counts
    return ReliabilityBins(np.linspace(0.0, 1.0, num_bins + 1), counts, confidence, accuracy)


def expected_calibration_error(
    probabilities: np.ndarray | torch.Tensor, labels: np.ndarray | torch.Tensor, num_bins: int = ECE_BINS
) -> float:
    """ECE of `(n, num_classes)` probabilities against `(n,)` label ids, `num_bins` equal-width bins."""
    probabilities = np.asarray(probabilities, dtype=np.float64)
    correct = probabilities.argmax(axis=-1) == np.asarray(labels).reshape(-1)
    return reliability_bins(probabilities.max(axis=-1), correct, num_bins).ece


def negative_log_likelihood(
    logits: np.ndarray | torch.Tensor, labels: np.ndarray | torch.Tensor, temperature: float = 1.0
) -> float:
    """Mean cross-entropy of `softmax(logits / temperature)` `(n, num_classes)` against `(n,)` label ids."""
    logits = torch.as_tensor(logits).double()
    labels = torch.as_tensor(np.asarray(labels), dtype=torch.int64).reshape(-1)
    return float(torch.nn.functional.cross_entropy(logits / float(temperature), labels))


def fit_temperature(
    logits: np.ndarray | torch.Tensor, labels: np.ndarray | torch.Tensor, max_iter: int = 100
) -> float:
    """The temperature T minimising the NLL of `softmax(logits / T)` on `(n, num_classes)` logits and `(n,)`
    labels: L-BFGS on log T (so T stays positive), as Guo et al.; kept within TEMPERATURE_RANGE, and 1.0 when
    the fit does not lower the NLL (no data, or an optimiser failure)."""
    logits = torch.as_tensor(logits).double().detach()
    labels = torch.as_tensor(np.asarray(labels), dtype=torch.int64).reshape(-1)
    if len(logits) == 0:
        return 1.0
    log_t = torch.zeros((), dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([log_t], lr=0.5, max_iter=max_iter, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(logits / log_t.exp(), labels)
        loss.backward()
        return loss

    optimizer.step(closure)
    low, high = TEMPERATURE_RANGE
    temperature = float(np.clip(float(log_t.detach().exp()), low, high))
    if not np.isfinite(temperature) or negative_log_likelihood(logits, labels, temperature) > (
        negative_log_likelihood(logits, labels, 1.0)
    ):
        return 1.0
    return temperature


__all__ = [
    "ECE_BINS",
    "FOLDED_TEMPERATURE_ATTRIBUTE",
    "ReliabilityBins",
    "TEMPERATURE_RANGE",
    "expected_calibration_error",
    "fit_temperature",
    "negative_log_likelihood",
    "reliability_bins",
    "softmax_with_temperature",
]

"""The feature bank: L2-normalised pooled features of the training images (a capped, class-stratified sample),
saved beside the model as `feature_bank.safetensors`, and the out-of-distribution score fitted on it.

The score is Sun et al. 2022's deep nearest neighbour (arXiv 2204.06507): the cosine distance from an image's
pooled feature to its k-th nearest neighbour in the bank. An image unlike every training image is far from all
of them, whatever the softmax says (a sharpened softmax is "100 %" on a landscape photo). The threshold is the
`OOD_QUANTILE` quantile of the distances of the validation split (images the bank does not hold), fitted once
at the end of the fine-tune, like the calibration temperature; predict, evaluate and the demo read it back.

The bank is what the data audit (near-duplicates, leaks, outliers) and the kNN classifier reuse: `neighbours`
answers "the k most similar training images" for any features, with their labels and training-split rows.

    bank = read_feature_bank("outputs/digits")          # None for a folder without one
    scores, flags = bank.unlike_training(features)      # (n,) distances, (n,) bool
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..data.images import load_image
from ..utils.files import staged_file

logger = logging.getLogger("vit_ft")

FEATURE_BANK_FILE = "feature_bank.safetensors"
BANK_MAX_IMAGES = 20_000  # 20k x 768 float32 = 61 MB: a kNN over it is one matrix product per batch
FIT_MAX_IMAGES = 10_000  # validation images the threshold is fitted on: a 0.99 quantile needs no more
OOD_NEIGHBOURS = 5  # k: the k-th neighbour's distance; small banks (digits: 1.3k images) need a small k
OOD_QUANTILE = 0.99  # of validation's distances: about 1 % of in-distribution images flagged
INPUT_SAMPLE = 256  # training images read to describe the expected input (size, colours, background)


# ---- features ------------------------------------------------------------------------------------------------


def pre_logits(model: torch.nn.Module, pixel_values: torch.Tensor) -> torch.Tensor:
    """`(batch, channels, height, width)` -> the pooled `(batch, hidden)` features the classifier head sees (CLS
    after the final LayerNorm, or the patch-token mean for `pooling: mean`)."""
    backbone = getattr(model, "vit", model)  # ViTFTForImageClassification.vit is the encoder with its pooling
    return backbone(pixel_values=pixel_values).pooler_output


def normalized(features: np.ndarray | torch.Tensor) -> np.ndarray:
    """`(n, hidden)` features scaled to unit L2 norm, float32 (a zero row stays zero)."""
    features = np.asarray(features, dtype=np.float32)
    norms = np.linalg.norm(features, axis=-1, keepdims=True)
    return features / np.maximum(norms, 1e-12)


@torch.inference_mode()
def pooled_features(
    model: torch.nn.Module, transform: Any, images: Sequence[Any], batch_size: int = 128
) -> tuple[np.ndarray, list[int]]:
    """The pooled features `(decoded, hidden)` of `images` ({"bytes", "path"} values or paths) through the eval
    `transform` (`data.transforms.ImageClassificationTransform`), on the model's device, and the indices of the
    images that decoded (one that does not is left out)."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    chunks, kept = [], []
    try:
        for start in range(0, len(images), batch_size):
            pixels = []
            for offset, image in enumerate(images[start : start + batch_size]):
                try:
                    pixels.append(transform.transform_image(image))
                except Exception:  # noqa: BLE001 - an image that does not decode has no feature
                    continue
                kept.append(start + offset)
            if pixels:
                chunks.append(pre_logits(model, torch.stack(pixels).to(device)).float().cpu().numpy())
    finally:
        model.train(was_training)
    hidden = chunks[0].shape[1] if chunks else 0
    return (np.concatenate(chunks) if chunks else np.zeros((0, hidden), np.float32)), kept


def stratified_rows(labels: np.ndarray, limit: int, seed: int = 0) -> np.ndarray:
    """At most `limit` row indices, sorted, each class (a multi-label row: its first label) in proportion to its
    share and at least one row of each; all rows when there are no more than `limit`."""
    labels = np.asarray(labels)
    if len(labels) <= limit:
        return np.arange(len(labels))
    keys = labels.argmax(axis=1) if labels.ndim == 2 else labels
    rng = np.random.default_rng(seed)
    chosen = []
    for key in np.unique(keys):
        rows = np.flatnonzero(keys == key)
        take = max(1, round(limit * len(rows) / len(labels)))
        chosen.append(rng.choice(rows, size=min(take, len(rows)), replace=False))
    return np.sort(np.concatenate(chosen))[: max(limit, len(chosen))]


# ---- the bank -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FeatureBank:
    """L2-normalised pooled features of training images with their labels and rows in the training split, the
    out-of-distribution threshold fitted on validation (`ood`, {} before the fit) and a description of the
    input the model expects (`expected_input`: size, colours, background)."""

    features: np.ndarray  # (n, hidden) float32, unit norm
    labels: np.ndarray  # (n,) int64 class ids, or (n, num_labels) uint8 multi-hot rows
    rows: np.ndarray  # (n,) int64: each feature's row in the training split
    ood: dict[str, Any] = field(default_factory=dict)  # {"k", "quantile", "threshold", "split", "images", ...}
    expected_input: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.features)

    def neighbours(self, features: np.ndarray, k: int, chunk: int = 1024) -> tuple[np.ndarray, np.ndarray]:
        """The `k` most similar bank entries of each of `(m, hidden)` features (normalised here): `(m, k)`
        cosine similarities, highest first, and `(m, k)` bank indices (`labels[i]`, `rows[i]` name them)."""
        k = min(k, len(self))
        queries = normalized(features)
        similarities = np.zeros((len(queries), k), np.float32)
        indices = np.zeros((len(queries), k), np.int64)
        for start in range(0, len(queries), chunk):
            scores = queries[start : start + chunk] @ self.features.T  # (chunk, n)
            top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
            order = np.argsort(-np.take_along_axis(scores, top, axis=1), axis=1, kind="stable")
            indices[start : start + chunk] = np.take_along_axis(top, order, axis=1)
            similarities[start : start + chunk] = np.take_along_axis(scores, indices[start : start + chunk], 1)
        return similarities, indices

    def distances(self, features: np.ndarray, k: int | None = None) -> np.ndarray:
        """`(m,)` cosine distance (1 - similarity, 0 to 2) to the k-th nearest bank entry (default: the fitted
        k): the out-of-distribution score, higher is less like the training images."""
        k = k or int(self.ood.get("k", OOD_NEIGHBOURS))
        similarities, _ = self.neighbours(features, k)
        return 1.0 - similarities[:, -1]

    @property
    def threshold(self) -> float | None:
        return self.ood.get("threshold")

    def unlike_training(self, features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`(m,)` scores (`distances`) and `(m,)` flags: score above the threshold fitted on validation."""
        if self.threshold is None:
            raise ValueError("the feature bank has no fitted threshold (fit_ood was not run on it).")
        scores = self.distances(features)
        return scores, scores > self.threshold

    def fit_ood(
        self, features: np.ndarray, split: str = "validation", k: int = OOD_NEIGHBOURS, quantile: float = OOD_QUANTILE
    ) -> FeatureBank:
        """A copy with the threshold fitted on `(m, hidden)` features of held-out images (the validation split:
        none of them is in the bank): the `quantile` of their k-th neighbour distances."""
        if len(features) == 0:
            return self
        scores = self.distances(features, k)
        threshold = float(np.quantile(scores, quantile))
        ood = {"k": k, "quantile": quantile, "threshold": threshold, "split": split, "images": int(len(scores)),
               "flagged": int((scores > threshold).sum()), "median_distance": float(np.median(scores))}  # fmt: skip
        return FeatureBank(self.features, self.labels, self.rows, ood, self.expected_input)

    def record(self) -> dict[str, Any]:
        """What the run record keeps of the bank: its file, size and the fitted threshold."""
        return {"file": FEATURE_BANK_FILE, "images": len(self), "hidden": int(self.features.shape[1]),
                "ood": self.ood, "expected_input": self.expected_input}  # fmt: skip

    def save(self, path: str | os.PathLike) -> Path:
        """Write the bank as safetensors (features, labels, rows; the fit and the input as JSON metadata),
        staged and renamed: an existing file stays whole if writing fails."""
        from safetensors.numpy import save_file

        path = Path(path)
        tensors = {"features": np.ascontiguousarray(self.features, np.float32),
                   "labels": np.ascontiguousarray(self.labels), "rows": np.ascontiguousarray(self.rows, np.int64)}  # fmt: skip
        metadata = {"ood": json.dumps(self.ood), "expected_input": json.dumps(self.expected_input)}
        with staged_file(path) as partial:
            save_file(tensors, str(partial), metadata=metadata)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> FeatureBank:
        """The bank saved at `path`; a file that is not one is a ValueError naming it."""
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="numpy") as f:
                metadata = f.metadata() or {}
                tensors = {name: f.get_tensor(name) for name in ("features", "labels", "rows")}
        except Exception as error:  # safetensors' errors name neither the file nor the fix
            raise ValueError(
                f"{path} is not a readable feature bank ({type(error).__name__}: {error}); delete it (the model "
                "works without it, minus the out-of-distribution score) or copy the folder again."
            ) from error
        return cls(tensors["features"].astype(np.float32), tensors["labels"], tensors["rows"].astype(np.int64),
                   json.loads(metadata.get("ood", "{}")), json.loads(metadata.get("expected_input", "{}")))  # fmt: skip


def read_feature_bank(folder: str | os.PathLike | None) -> tuple[FeatureBank | None, str]:
    """The bank of a model folder and "", or None and why there is none (one line, for the tools to say)."""
    if folder is None:
        return None, "a Hub model has no feature bank, so no image is marked unlike the training images"
    path = Path(folder) / FEATURE_BANK_FILE
    if not path.is_file():
        return None, (
            f"{folder} has no {FEATURE_BANK_FILE} (a fine-tune before vit-ft wrote one, or no fine-tune), so no "
            "image is marked unlike the training images; fine-tune again to get one"
        )
    bank = FeatureBank.load(path)
    if bank.threshold is None:
        return None, f"{path} has no fitted threshold (the fine-tune had no validation split)"
    return bank, ""


# ---- what the model expects -------------------------------------------------------------------------------------


def describe_input(images: Sequence[Any], limit: int = INPUT_SAMPLE) -> dict[str, Any]:
    """What the training images look like, from up to `limit` of them (decoded to RGB, as the model sees them):
    the median size `[width, height]`, whether they are grey (every pixel's channels equal), and their background (the border pixels' mean
    brightness, 0-255: "dark" below 85, "light" above 170, else "mixed")."""
    sizes, grey, borders = [], True, []
    for image in list(images)[:limit]:
        try:
            img = load_image(image)
        except Exception:  # noqa: BLE001 - an image that does not decode says nothing
            continue
        sizes.append(img.size)
        pixels = np.asarray(img.convert("RGB"), dtype=np.float32)
        grey = grey and bool(np.ptp(pixels, axis=-1).max() <= 8)  # JPEG noise aside, R = G = B
        edge = np.concatenate([pixels[0], pixels[-1], pixels[:, 0], pixels[:, -1]])
        borders.append(float(edge.mean()))
    if not sizes:
        return {}
    brightness = float(np.mean(borders))
    background = "dark" if brightness < 85 else "light" if brightness > 170 else "mixed"
    return {"size": [int(np.median([s[0] for s in sizes])), int(np.median([s[1] for s in sizes]))],
            "colours": "grey" if grey else "colour", "background": background,
            "border_brightness": round(brightness, 1), "images_read": len(sizes)}  # fmt: skip


def expected_input_text(expected: dict[str, Any], model_size: Sequence[int] | None = None) -> str:
    """One sentence on the input a model expects: "grey images about 32x32 pixels on a dark background"."""
    if not expected:
        size = f"{model_size[1]}x{model_size[0]} pixels (the model's input size)" if model_size else "any size"
        return f"images like its training images, resized to {size}"
    width, height = expected["size"]
    background = {"dark": "on a dark background", "light": "on a light background"}.get(expected["background"], "")
    colours = "grey images" if expected["colours"] == "grey" else "colour images"
    return " ".join(part for part in (colours, f"of about {width}x{height} pixels", background) if part)


# ---- the fine-tune's bank -------------------------------------------------------------------------------------


def build_feature_bank(
    model: torch.nn.Module,
    transform: Any,
    images: Sequence[Any],
    labels: np.ndarray,
    rows: np.ndarray,
    validation_images: Sequence[Any] | None,
) -> FeatureBank:
    """The bank of a fine-tuned `model`: the pooled features of the training `images` (their `labels` and
    `rows` in the training split: a `stratified_rows` sample) through the eval `transform`, the threshold fitted
    on the validation images (when there are any) and the description of the training images."""
    features, kept = pooled_features(model, transform, images)
    rows, labels = np.asarray(rows)[kept], np.asarray(labels)[kept]
    labels = labels.astype(np.uint8) if labels.ndim == 2 else labels.astype(np.int64)
    expected = describe_input([images[i] for i in kept[:INPUT_SAMPLE]])
    bank = FeatureBank(normalized(features), labels, rows.astype(np.int64), {}, expected)
    if validation_images is not None and len(validation_images) and len(bank):
        held_out, _ = pooled_features(model, transform, validation_images)
        bank = bank.fit_ood(held_out)
        logger.info(
            "Feature bank: %d training images; unlike the training images above a %d-NN cosine distance of %.4f "
            "(the %g quantile of %d validation images).", len(bank), bank.ood["k"], bank.threshold,
            bank.ood["quantile"], bank.ood["images"],
        )  # fmt: skip
    return bank


__all__ = [
    "BANK_MAX_IMAGES",
    "FEATURE_BANK_FILE",
    "FIT_MAX_IMAGES",
    "OOD_NEIGHBOURS",
    "OOD_QUANTILE",
    "FeatureBank",
    "build_feature_bank",
    "describe_input",
    "expected_input_text",
    "normalized",
    "pooled_features",
    "pre_logits",
    "read_feature_bank",
    "stratified_rows",
]

"""The feature bank: L2-normalised features of the training images (a capped, class-stratified sample), saved
beside the model as `feature_bank.safetensors`, and the out-of-distribution score fitted on it.

Two features per image, both from one forward pass: the pooled feature the classifier head sees (`features`:
what the image shows, for the kNN classifier, leak and duplicate search) and the mean patch embedding (`input`:
the patch projection before any block, averaged over the patches: what the input looks like, its contrast,
colours and texture). The score is Sun et al. 2022's deep nearest neighbour (arXiv 2204.06507) in each space:
the cosine distance to the k-th nearest training image, divided by its threshold, the `OOD_QUANTILE` quantile
of the validation split's distances (images the bank does not hold), fitted once at the end of the fine-tune
like the calibration temperature. An image is unlike the training images when either ratio is above 1: the
pooled feature alone, trained to separate classes, maps noise and photos close to some class (measured on
digits: 25-46 % of foreign images flagged); the input space alone knows the input's statistics, not what it
shows. predict, evaluate and the demo read the fit back.

    bank, why = read_feature_bank("outputs/digits")     # None and a one-line reason for a folder without one
    with feature_taps(model) as taps:                   # both spaces from the pass that gives the logits
        logits = model(pixel_values=pixels).logits
    scores, flags = bank.unlike_training({space: t.numpy() for space, t in taps.items()})  # (n,) ratios, bool
    similarities, indices = bank.neighbours(taps["features"].numpy(), k=20)  # the kNN classifier, the audit
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..utils.files import staged_file
from ..utils.option_values import BANK_MAX_IMAGES
from ..utils.progress import Progress
from .expected_input import INPUT_SAMPLE, describe_input, expected_input_text

logger = logging.getLogger("vit_ft")

# the per-image columns of predict's output and evaluate's predictions.csv, after the task's: whether the image
# looks unlike the training images (either space's ratio above 1) and the larger ratio; empty without a bank
OOD_COLUMNS = ("unlike_training", "ood_score")

FEATURE_BANK_FILE = "feature_bank.safetensors"
FIT_MAX_IMAGES = 10_000  # validation images the threshold is fitted on: a 0.99 quantile needs no more
OOD_NEIGHBOURS = 10  # k; measured on digits (1.3k training images): k = 5, 10, 20 flag alike
OOD_QUANTILE = 0.99  # of validation's distances, per space: about 1-2 % of in-distribution images flagged
SPACES = ("features", "input")  # the bank's two feature spaces: pooled (what the head sees), mean patch embedding


# ---- features ------------------------------------------------------------------------------------------------


def pre_logits(model: torch.nn.Module, pixel_values: torch.Tensor | dict[str, torch.Tensor]) -> torch.Tensor:
    """`(batch, channels, height, width)` (or a NaFlex batch's dict) -> the pooled `(batch, hidden)` features the
    classifier head sees (CLS after the final LayerNorm, or the patch-token mean for `pooling: mean`)."""
    backbone = getattr(model, "vit", model)  # ViTFTForImageClassification.vit is the encoder with its pooling
    inputs = pixel_values if isinstance(pixel_values, dict) else {"pixel_values": pixel_values}
    return backbone(**inputs).pooler_output


@contextmanager
def feature_taps(model: torch.nn.Module) -> Iterator[dict[str, torch.Tensor]]:
    """Within the block, each forward pass of `model` (the classifier's, or `pre_logits`) leaves its pooled
    features `(batch, hidden)` under "features" and its mean patch embedding `(batch, hidden)` under "input" in
    the dict yielded: both spaces of the bank from the pass that gives the logits."""
    backbone = getattr(model, "vit", model)
    taps: dict[str, torch.Tensor] = {}

    def pooled(module: Any, args: Any, output: Any) -> None:
        taps["features"] = output.pooler_output.float()

    def patches(module: Any, args: Any, output: torch.Tensor) -> None:
        taps["input"] = output.float().mean(dim=1)  # (B, N, hidden) -> (B, hidden)

    hooks = [backbone.register_forward_hook(pooled),
             backbone.embeddings.patch_embeddings.register_forward_hook(patches)]  # fmt: skip
    try:
        yield taps
    finally:
        for hook in hooks:
            hook.remove()


def normalized(features: np.ndarray | torch.Tensor) -> np.ndarray:
    """`(n, hidden)` features scaled to unit L2 norm, float32 (a zero row stays zero)."""
    features = np.asarray(features, dtype=np.float32)
    norms = np.linalg.norm(features, axis=-1, keepdims=True)
    return features / np.maximum(norms, 1e-12)


@torch.inference_mode()
def bank_features(
    model: torch.nn.Module, transform: Any, images: Sequence[Any], batch_size: int = 128,
    desc: str = "Feature bank", logits: bool = False,
) -> tuple[dict[str, np.ndarray], list[int]]:  # fmt: skip
    """Both spaces' features {"features", "input"} -> `(decoded, hidden)` of `images` ({"bytes", "path"} values
    or paths) through the eval `transform` (`data.transforms.ImageClassificationTransform`), on the model's
    device, and the indices of the images that decoded (one that does not is left out). `logits`: the whole
    model runs, head included, and its `(decoded, num_labels)` logits come under "logits" too (the calibration's,
    from the same pass). Its progress shows as `desc` (`utils.progress.Progress`); the caller says first what
    the pass is for and how big it is."""
    parameter = next(model.parameters())  # the model's device and dtype (bf16 weights take bf16 pixels)
    was_training = model.training
    model.eval()
    chunks: dict[str, list[np.ndarray]] = {space: [] for space in (*SPACES, "logits")[: len(SPACES) + logits]}
    forward = (lambda inputs: model(**inputs).logits) if logits else (lambda inputs: pre_logits(model, inputs))
    kept: list[int] = []
    try:
        with feature_taps(model) as taps, Progress(len(images), desc) as progress:
            for start in range(0, len(images), batch_size):
                pixels = []
                for offset, image in enumerate(images[start : start + batch_size]):
                    try:
                        pixels.append(transform.transform_image(image))
                    except Exception:  # noqa: BLE001 - an image that does not decode has no feature
                        continue
                    kept.append(start + offset)
                if pixels:  # stacked pixels, or a padded NaFlex batch (the transform's own collation)
                    batch = getattr(transform, "collate", torch.stack)(pixels)
                    if isinstance(batch, dict):
                        out = forward({name: value.to(parameter.device) for name, value in batch.items()})
                    else:
                        out = forward({"pixel_values": batch.to(parameter.device, parameter.dtype)})
                    for space in chunks:
                        chunks[space].append((out if space == "logits" else taps[space]).float().cpu().numpy())
                progress.update(len(images[start : start + batch_size]))
    finally:
        model.train(was_training)
    return {space: np.concatenate(found) if found else np.zeros((0, 0), np.float32)
            for space, found in chunks.items()}, kept  # fmt: skip


def stratified_rows(labels: np.ndarray, limit: int, seed: int = 0) -> np.ndarray:
    """About `limit` row indices (rounding and the one-row minimum may add one per class), sorted, each class (a
    multi-label row: its first label) in proportion to its share and at least one row of each; all rows when
    there are no more than `limit`. Fewer than one per class (a smoke run's bank of 16 on 120 classes): one row
    of each of `limit` classes drawn at random, never more than `limit`."""
    labels = np.asarray(labels)
    if len(labels) <= limit:
        return np.arange(len(labels))
    keys = labels.argmax(axis=1) if labels.ndim == 2 else labels
    rng = np.random.default_rng(seed)
    classes = np.unique(keys)
    if limit < len(classes):
        drawn = rng.choice(classes, size=limit, replace=False)
        return np.sort([rng.choice(np.flatnonzero(keys == key)) for key in drawn])
    chosen = []
    for key in np.unique(keys):
        rows = np.flatnonzero(keys == key)
        take = max(1, round(limit * len(rows) / len(labels)))
        chosen.append(rng.choice(rows, size=min(take, len(rows)), replace=False))
    return np.sort(np.concatenate(chosen))


# ---- the bank -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FeatureBank:
    """L2-normalised features of training images in both spaces, with their labels, rows in the training split
    (as the fine-tune loaded it) and file paths, the out-of-distribution fit on validation (`ood`, {} before `fit_ood`) and a description of the input
    the model expects (`expected_input`: size, colours, background)."""

    features: np.ndarray  # (n, hidden) float32, unit norm: the pooled features the head sees
    labels: np.ndarray  # (n,) int64 class ids, or (n, num_labels) uint8 multi-hot rows
    rows: np.ndarray  # (n,) int64: each image's row in the training split
    input: np.ndarray | None = None  # (n, hidden) float32, unit norm: the mean patch embeddings
    ood: dict[str, Any] = field(default_factory=dict)  # {"k", "quantile", "thresholds", "split", "images", ...}
    expected_input: dict[str, Any] = field(default_factory=dict)
    sources: tuple[str, ...] = ()  # each image's file path ("" for an image stored as bytes only)

    def __len__(self) -> int:
        return len(self.features)

    def space(self, name: str) -> np.ndarray:
        """The bank's `(n, hidden)` features of one of SPACES."""
        found = self.features if name == "features" else self.input if name == "input" else None
        if found is None:
            raise ValueError(f"the feature bank has no {name!r} features; its spaces are {list(SPACES)}.")
        return found

    def neighbours(
        self, features: np.ndarray, k: int, space: str = "features", chunk: int = 1024
    ) -> tuple[np.ndarray, np.ndarray]:
        """The `k` most similar bank images of each of `(m, hidden)` features (normalised here) in `space`:
        `(m, k)` cosine similarities, highest first, and `(m, k)` bank indices (`labels[i]`, `rows[i]` name
        them)."""
        bank = self.space(space)
        k = min(k, len(self))
        queries = normalized(features)
        similarities = np.zeros((len(queries), k), np.float32)
        indices = np.zeros((len(queries), k), np.int64)
        for start in range(0, len(queries), chunk):
            scores = queries[start : start + chunk] @ bank.T  # (chunk, n)
            top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
            order = np.argsort(-np.take_along_axis(scores, top, axis=1), axis=1, kind="stable")
            indices[start : start + chunk] = np.take_along_axis(top, order, axis=1)
            similarities[start : start + chunk] = np.take_along_axis(scores, indices[start : start + chunk], 1)
        return similarities, indices

    def distances(self, features: np.ndarray, space: str = "features", k: int | None = None) -> np.ndarray:
        """`(m,)` cosine distance (1 - similarity, 0 to 2) to the k-th nearest bank image in `space` (default k:
        the fitted one); higher is less like the training images."""
        k = k or int(self.ood.get("k", OOD_NEIGHBOURS))
        similarities, _ = self.neighbours(features, k, space)
        return 1.0 - similarities[:, -1]

    @property
    def fitted(self) -> bool:
        return bool(self.ood.get("thresholds"))

    def unlike_training(self, features: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """`(m,)` scores and `(m,)` flags of images given by their features {space: `(m, hidden)`} (both spaces,
        as `feature_taps` leaves them): the score is the largest of each space's distance over its threshold,
        so an image is flagged (score above 1) when it is further from the training images than the fitted
        quantile of validation in either space."""
        if not self.fitted:
            raise ValueError("the feature bank has no fitted threshold (fit_ood was not run on it).")
        thresholds = self.ood["thresholds"]
        ratios = [self.distances(features[space], space) / max(thresholds[space], 1e-12) for space in thresholds]
        scores = np.max(ratios, axis=0)
        return scores, scores > 1.0

    def fit_ood(
        self, features: dict[str, np.ndarray], split: str = "validation", k: int = OOD_NEIGHBOURS,
        quantile: float = OOD_QUANTILE,
    ) -> FeatureBank:  # fmt: skip
        """A copy with each space's threshold fitted on held-out images' features {space: `(m, hidden)`} (the
        validation split: none of them is in the bank): the `quantile` of their k-th neighbour distances."""
        spaces = [space for space in SPACES if space in features and (space == "features" or self.input is not None)]
        count = len(features["features"])
        if count == 0:
            return self
        thresholds = {space: float(np.quantile(self.distances(features[space], space, k), quantile)) for space in spaces}
        fitted = replace(self, ood={"k": k, "quantile": quantile, "thresholds": thresholds})
        flagged = int(fitted.unlike_training(features)[1].sum())
        return replace(fitted, ood={**fitted.ood, "split": split, "images": count, "flagged": flagged})

    def record(self) -> dict[str, Any]:
        """What the run record keeps of the bank: its file, size and the fit."""
        return {"file": FEATURE_BANK_FILE, "images": len(self), "hidden": int(self.features.shape[1]),
                "ood": self.ood, "expected_input": self.expected_input}  # fmt: skip

    def save(self, path: str | os.PathLike) -> Path:
        """Write the bank as safetensors (features, input, labels, rows; the fit, the expected input and the
        sources as JSON metadata), staged and renamed: an existing file stays whole if writing fails."""
        from safetensors.numpy import save_file

        path = Path(path)
        tensors = {"features": np.ascontiguousarray(self.features, np.float32),
                   "labels": np.ascontiguousarray(self.labels), "rows": np.ascontiguousarray(self.rows, np.int64)}  # fmt: skip
        if self.input is not None:
            tensors["input"] = np.ascontiguousarray(self.input, np.float32)
        metadata = {"ood": json.dumps(self.ood), "expected_input": json.dumps(self.expected_input),
                    "sources": json.dumps(list(self.sources))}  # fmt: skip
        with staged_file(path) as partial:
            save_file(tensors, str(partial), metadata=metadata)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> FeatureBank:
        """The bank saved at `path`; a file that is not one is a ValueError naming it and the fix."""
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="numpy") as f:
                metadata = f.metadata() or {}
                tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 - safe_open has no iter
            features, labels, rows = tensors["features"], tensors["labels"], tensors["rows"]
            ood, expected = json.loads(metadata.get("ood", "{}")), json.loads(metadata.get("expected_input", "{}"))
            sources = tuple(json.loads(metadata.get("sources", "[]")))
        except Exception as error:  # safetensors' errors name neither the file nor the fix
            raise ValueError(
                f"{path} is not a readable feature bank ({type(error).__name__}: {error}); delete it (the model "
                "works without it, minus the out-of-distribution score) or copy the folder again."
            ) from error
        return cls(features.astype(np.float32), labels, rows.astype(np.int64), tensors.get("input"), ood, expected,
                   sources)  # fmt: skip


def ood_cells(outputs: Any, i: int) -> dict[str, Any]:
    """Image `i`'s OOD_COLUMNS of an evaluation's outputs (`unlike_training` flags and `ood_scores`); None (an
    empty cell, as predict writes) where they were not scored: no bank, or test-time augmentation."""
    if getattr(outputs, "unlike_training", None) is None:
        return dict.fromkeys(OOD_COLUMNS)
    return {"unlike_training": bool(outputs.unlike_training[i]), "ood_score": float(outputs.ood_scores[i])}


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
    if not bank.fitted:
        return None, f"{path} has no fitted threshold (the fine-tune had no validation split)"
    return bank, ""


# ---- the fine-tune's bank -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FrozenFeatures:
    """`bank_features` of rows of one split, kept by a pass whose backbone stays frozen (a probe's), so that a
    later pass over those rows (the feature bank's) reads them instead of running the model again."""

    rows: np.ndarray  # the split's rows that were passed
    features: dict[str, np.ndarray]  # both spaces, of the rows that decoded
    kept: list[int]  # positions in `rows` that decoded

    def select(self, rows: Sequence[int]) -> tuple[dict[str, np.ndarray], list[int]] | None:
        """What `bank_features` returns for `rows` of the same split, or None when one of them was not passed."""
        passed = {int(row) for row in self.rows}
        if any(int(row) not in passed for row in rows):
            return None
        decoded = {int(self.rows[k]): j for j, k in enumerate(self.kept)}  # row -> its index in `features`
        kept = [i for i, row in enumerate(rows) if int(row) in decoded]
        index = np.asarray([decoded[int(rows[i])] for i in kept], dtype=np.int64)
        return {space: values[index] for space, values in self.features.items()}, kept


def build_feature_bank(
    model: torch.nn.Module,
    transform: Any,
    images: Sequence[Any],
    labels: np.ndarray,
    rows: np.ndarray,
    validation_images: Sequence[Any] | None,
    computed: tuple[dict[str, np.ndarray], list[int]] | None = None,
    held_out: tuple[dict[str, np.ndarray], list[int]] | None = None,
) -> FeatureBank:
    """The bank of a fine-tuned `model`: both spaces' features of the training `images` (their `labels` and
    `rows` in the training split: a `stratified_rows` sample) through the eval `transform`, the thresholds fitted
    on the validation images (when there are any) and the description of the training images. `computed` and
    `held_out`: `bank_features` of those training and validation images already (`FrozenFeatures.select`)."""
    features, kept = computed if computed is not None else bank_features(model, transform, images)
    rows, labels = np.asarray(rows)[kept], np.asarray(labels)[kept]
    labels = labels.astype(np.uint8) if labels.ndim == 2 else labels.astype(np.int64)
    expected = describe_input([images[i] for i in kept[:INPUT_SAMPLE]])
    sources = tuple(_path_of(images[i]) for i in kept)
    bank = FeatureBank(normalized(features["features"]), labels, rows.astype(np.int64),
                       normalized(features["input"]), {}, expected, sources)  # fmt: skip
    if validation_images is not None and len(validation_images) and len(bank):
        if held_out is None:
            held_out = bank_features(model, transform, validation_images, desc="Feature bank, validation")
        bank = bank.fit_ood(held_out[0])
        logger.info(
            "Feature bank: %d training images; unlike them: further than the %g quantile of %d validation images "
            "from the %d-th nearest (cosine distance %s).", len(bank), bank.ood["quantile"], bank.ood["images"],
            bank.ood["k"], ", ".join(f"{space} {value:.4f}" for space, value in bank.ood["thresholds"].items()),
        )  # fmt: skip
    return bank


def _path_of(image: Any) -> str:
    """An image's file path: a {"bytes", "path"} value's path, a path as given, "" for bytes alone."""
    path = image.get("path") if isinstance(image, dict) else image if isinstance(image, (str, os.PathLike)) else None
    return str(path) if path else ""


__all__ = [
    "BANK_MAX_IMAGES",
    "FEATURE_BANK_FILE",
    "FIT_MAX_IMAGES",
    "OOD_COLUMNS",
    "OOD_NEIGHBOURS",
    "OOD_QUANTILE",
    "SPACES",
    "FeatureBank",
    "FrozenFeatures",
    "bank_features",
    "ood_cells",
    "build_feature_bank",
    "feature_taps",
    "describe_input",
    "expected_input_text",
    "normalized",
    "pre_logits",
    "read_feature_bank",
    "stratified_rows",
]

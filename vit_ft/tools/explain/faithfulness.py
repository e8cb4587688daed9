"""Whether a map shows what the model used: deletion and insertion curves (Petsiuk et al. 2018, RISE) and the
model-randomisation sanity check (Adebayo et al. 2018).

- Deletion: the patches are removed in the map's order, most relevant first, each replaced by the image's mean
  colour (its per-channel mean over the valid pixels: "mean-filled", not blurred); the target's probability is
  read after each step and the area under that curve over the removed fraction 0..1 is the score (lower is
  more faithful). Insertion starts from the fully mean-filled image and puts the patches back in the same order
  (higher is better). A random order is the floor either way.
- Randomisation: the top blocks and the head are re-initialised (truncated normal, the model's
  `initializer_range`; norms to 1 and 0) and the Spearman rank correlation between each image's map before and
  after is taken; a map that does not depend on the weights (an edge detector) keeps a high correlation.
  `cascading_randomization` does it as Adebayo et al.'s cascade: the head, then one block more at a time from
  the top down to the first, a correlation after each step.

    auc = perturbation_auc(model, pixels, maps, target, "deletion")     # (batch,)
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ...data.input_spec import expand_patch_mask, mean_colour, valid_patches
from .methods import Inputs, _as_inputs, check_target, explain

STEPS = 16  # points of a curve after the start (the patches are removed in STEPS near-equal groups)


def probability_function(config: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """The task's probability of each class from logits: the sigmoid for a multi-label model, else the softmax."""
    if getattr(config, "problem_type", None) == "multi_label_classification":
        return torch.sigmoid
    return lambda logits: torch.softmax(logits, dim=-1)


@torch.no_grad()
def perturbation_curves(
    model: torch.nn.Module, inputs: Inputs, maps: torch.Tensor, target: Any, mode: str = "deletion",
    steps: int = STEPS, batch_size: int = 32,
) -> torch.Tensor:  # fmt: skip
    """The target's probability as patches are deleted (or inserted) in the order of `maps` `(batch,
    num_patches)`, most relevant first: `(batch, steps + 1)`, the first point the untouched (or fully
    mean-filled) image. NaFlex padding never counts as a patch."""
    if mode not in ("deletion", "insertion"):
        raise ValueError(f"mode must be 'deletion' or 'insertion', got {mode!r}.")
    device = next(model.parameters()).device
    given = _as_inputs(inputs, device)
    pixels = given["pixel_values"]
    target = check_target(target, model.config.num_labels, pixels.shape[0])
    probability = probability_function(model.config)
    fill = mean_colour(given, model.config.num_channels)
    valid = valid_patches(given)
    curves = []
    for i in range(pixels.shape[0]):
        count = int(valid[i].sum()) if valid is not None else maps.shape[1]
        order = torch.argsort(maps[i, :count].float(), descending=True, stable=True)
        removed = torch.zeros(steps + 1, maps.shape[1], dtype=torch.bool)
        for step in range(1, steps + 1):  # the first round(step / steps * count) patches of the order
            removed[step, order[: round(step * count / steps)]] = True
        keep = ~removed if mode == "deletion" else removed
        keep = expand_patch_mask(keep.to(device), pixels[i], model.config.patch_hw).to(pixels.dtype)
        images = pixels[i] * keep + fill[i] * (1 - keep)  # (steps + 1, ...)
        extra = {
            k: v[i : i + 1].expand(len(images), *v.shape[1:]) for k, v in given.items() if k != "pixel_values"
        }
        points = []
        for start in range(0, len(images), batch_size):
            part = {k: v[start : start + batch_size] for k, v in extra.items()}
            logits = model(pixel_values=images[start : start + batch_size], **part).logits.float()
            points.append(probability(logits)[:, int(target[i])].cpu())
        curves.append(torch.cat(points))
    return torch.stack(curves)


def curve_auc(curves: torch.Tensor) -> torch.Tensor:
    """The area under each `(batch, steps + 1)` curve over the fraction 0..1 (trapezoids): `(batch,)`."""
    return torch.from_numpy(np.trapezoid(curves.numpy(), dx=1.0 / (curves.shape[1] - 1), axis=1)).float()


def perturbation_auc(model: torch.nn.Module, inputs: Inputs, maps: torch.Tensor, target: Any, mode: str = "deletion",
                     steps: int = STEPS) -> torch.Tensor:  # fmt: skip
    """Deletion (lower is better) or insertion (higher is better) AUC per image, `(batch,)`."""
    return curve_auc(perturbation_curves(model, inputs, maps, target, mode, steps))


def random_maps(maps: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """Maps of the same shape whose order is random (each image its own permutation): the floor of both curves."""
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(maps.shape, generator=generator)


@torch.no_grad()
def randomized_copy(model: torch.nn.Module, top_blocks: int = 1, seed: int = 0) -> torch.nn.Module:
    """A copy of the classifier with its head and its last `top_blocks` blocks re-initialised (Adebayo et al.'s
    cascading randomisation from the top): linear weights truncated normal with the model's
    `initializer_range`, biases 0, norms 1 and 0. The head is drawn, not zeroed, so that gradients still flow."""
    copied = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    std = copied.config.initializer_range
    modules = [*copied.vit.layers[len(copied.vit.layers) - top_blocks :], copied.classifier]
    for parameter_owner in modules:
        for name, parameter in parameter_owner.named_parameters():
            if name.endswith("bias"):
                parameter.zero_()
            elif parameter.dim() == 1:  # norm weights and layer scale
                parameter.fill_(1.0)
            else:
                drawn = torch.randn(parameter.shape, generator=generator).clamp_(-2, 2) * std
                parameter.copy_(drawn.to(parameter.dtype))
    return copied.eval()


def cascading_randomization(
    model: torch.nn.Module, inputs: Inputs, method: str, target: Any, seed: int = 0
) -> list[dict[str, Any]]:
    """Adebayo et al. 2018's cascading randomisation: the head re-initialised, then the blocks from the top down,
    one more at a time, until every block is (`randomized_copy` with `seed`); after each step the
    mean Spearman correlation of each image's map with the trained model's, for the same `target` classes.
    Returns `num_hidden_layers + 1` rows: {"randomised": "head" | "head + top k blocks", "blocks": k,
    "spearman": mean}. A map that depends on what the model learned falls as the cascade goes down."""
    maps = explain(model, inputs, method, target=target)
    rows = []
    for blocks in range(len(model.vit.layers) + 1):
        randomized = explain(randomized_copy(model, top_blocks=blocks, seed=seed), inputs, method, target=target)
        name = "head" if blocks == 0 else f"head + top {blocks} block{'s' if blocks > 1 else ''}"
        rows.append({"randomised": name, "blocks": blocks, "spearman": float(spearman(maps, randomized).mean())})
    return rows


def spearman(maps: torch.Tensor, others: torch.Tensor) -> torch.Tensor:
    """Spearman's rank correlation between each pair of maps `(batch, num_patches)`: `(batch,)` (scipy's)."""
    from scipy.stats import spearmanr

    values = [
        0.0 if a.max() == a.min() or b.max() == b.min() else spearmanr(a.numpy(), b.numpy()).statistic
        for a, b in zip(maps.float(), others.float(), strict=True)
    ]  # a constant map ranks nothing: it correlates with no map
    return torch.tensor(np.nan_to_num(np.asarray(values, dtype=np.float64), nan=0.0)).float()


__all__ = [
    "STEPS",
    "cascading_randomization",
    "curve_auc",
    "perturbation_auc",
    "perturbation_curves",
    "probability_function",
    "random_maps",
    "randomized_copy",
    "spearman",
]

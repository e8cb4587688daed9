"""What the model learned, as in Figure 7 of the ViT paper (arXiv 2010.11929), plus attention rollout.

- the principal components of the patch-embedding filters (paper: "RGB embedding filters, first 28 PCs");
- the cosine similarity of each position embedding with all others, one small map per patch position;
- the mean attention distance of each head against depth ("attention distance" in pixels);
- attention-rollout overlays (Abnar & Zuidema 2020) for given images.

The figures are drawn by `vit_ft.reports.inspection_figures`; the model is loaded once (`trained.load_trained`).

    run_inspection("outputs/digits", "figures/digits", images=["a.png", "b.png"])
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from ...data.images import collect_image_files
from ...reports.figures import display_image, plot_image_grid, short
from ...reports.inspection_figures import (
    grey_images,
    plot_attention_distance,
    plot_patch_embedding_components,
    plot_position_similarity,
)
from ...utils.limits import MAX_IMAGE_TOKENS
from ...utils.output_dir import OutputFiles, check_output_dir
from ..evaluate.data import folders_read, resolve_eval_data
from ..explain.rollout import heatmap_image, overlay_heatmap, rollout_maps
from ..inference import describe_error, iter_batches
from ..trained import Trained, load_trained

logger = logging.getLogger("vit_ft")

NUM_FILTER_COMPONENTS = 28  # as in the paper's Figure 7 (left)
INSPECTION_FILES = OutputFiles(  # only these are replaced in --output_dir, its other files kept
    "inspect",
    ("patch_embedding_pca.png", "position_similarity.png", "attention_distance.png", "attention_rollout.png",
     "inspection.json"),
    "an inspection's figures",
)  # fmt: skip


# ---------------------------------------------------------------------------------------------------------
# Patch-embedding filters
# ---------------------------------------------------------------------------------------------------------


def patch_embedding_components(
    weight: torch.Tensor, num_components: int = NUM_FILTER_COMPONENTS
) -> tuple[torch.Tensor, torch.Tensor]:
    """PCA of the patch-embedding filters `(hidden, channels, patch_h, patch_w)`.

    Each of the `hidden` filters is one sample of `channels * patch_h * patch_w` values. Returns the first
    `k = min(num_components, hidden, channels * patch_h * patch_w)` principal directions as filters
    `(k, channels, patch_h, patch_w)` (unit norm, signs as the SVD gives them) and their explained variance
    ratios `(k,)`, largest first.
    """
    hidden = weight.shape[0]
    flat = weight.detach().float().reshape(hidden, -1).cpu()  # (hidden, channels * patch_h * patch_w)
    centered = flat - flat.mean(dim=0, keepdim=True)
    _, singular, vh = torch.linalg.svd(centered, full_matrices=False)  # vh: (min(hidden, features), features)
    variance = singular**2
    k = min(num_components, vh.shape[0])
    ratio = variance / variance.sum().clamp_min(1e-12)
    return vh[:k].reshape(k, *weight.shape[1:]), ratio[:k]


# ---------------------------------------------------------------------------------------------------------
# Position embeddings
# ---------------------------------------------------------------------------------------------------------


def position_similarity(
    position_embeddings: torch.Tensor, grid: tuple[int, int], num_prefix_tokens: int = 1
) -> torch.Tensor:
    """Cosine similarity between patch position embeddings.

    `position_embeddings` is `(1, num_prefix_tokens + grid_h * grid_w, hidden)` (the CLS slot is dropped).
    Returns `(grid_h * grid_w, grid_h, grid_w)`: entry [p] is the map of position p's similarity with every
    position, row-major like the patch sequence.
    """
    gh, gw = grid
    table = position_embeddings.detach().float().cpu()[0, num_prefix_tokens:]  # (gh*gw, hidden)
    if len(table) != gh * gw:
        raise ValueError(f"{len(table)} patch position embeddings do not fit a {gh}x{gw} grid.")
    unit = torch.nn.functional.normalize(table, dim=-1)
    return (unit @ unit.T).reshape(gh * gw, gh, gw)


# ---------------------------------------------------------------------------------------------------------
# Mean attention distance
# ---------------------------------------------------------------------------------------------------------


def patch_distances(grid: tuple[int, int], patch_size: tuple[int, int]) -> torch.Tensor:
    """Euclidean distance in pixels between the centres of every pair of patches, `(num_patches, num_patches)`,
    patches in row-major order."""
    rows, cols = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")
    centres = torch.stack([rows.flatten() * patch_size[0], cols.flatten() * patch_size[1]], dim=-1).float()
    return torch.cdist(centres, centres)  # (P, P); the half-patch offset cancels out


def max_patch_distance(grid: tuple[int, int], patch_size: tuple[int, int]) -> float:
    """The largest possible value: between the centres of opposite corner patches."""
    return math.hypot((grid[0] - 1) * patch_size[0], (grid[1] - 1) * patch_size[1])


def uniform_attention_distance(grid: tuple[int, int], patch_size: tuple[int, int]) -> float:
    """The mean attention distance of a head that attends equally to every patch: the mean distance between
    two patch centres, the reference a local head falls below."""
    return float(patch_distances(grid, patch_size).mean())


def mean_attention_distance(
    attentions: Sequence[torch.Tensor],
    grid: tuple[int, int],
    patch_size: tuple[int, int],
    num_prefix_tokens: int = 1,
) -> torch.Tensor:
    """Mean attention distance per image, layer and head, `(batch, layers, heads)`, in pixels.

    `attentions` holds one `(batch, heads, tokens, tokens)` map per layer, tokens = prefix + grid_h * grid_w.
    For each query patch, the attention over the key patches (prefix tokens dropped, weights renormalised to
    sum to 1) weights the pixel distance to each key patch; the result is averaged over query patches. It is
    the paper's "attention distance", analogous to a receptive field size, and lies in [0, max distance].
    """
    distances = patch_distances(grid, patch_size)  # (P, P)
    per_layer = []
    for layer in attentions:
        weights = layer[:, :, num_prefix_tokens:, num_prefix_tokens:].float()  # (B, heads, P, P)
        weights = weights / weights.sum(dim=-1, keepdim=True).clamp_min(1e-12)
        per_query = (weights * distances.to(weights.device)).sum(dim=-1)  # (B, heads, P)
        per_layer.append(per_query.mean(dim=-1).cpu())  # (B, heads)
    return torch.stack(per_layer, dim=1)  # (B, layers, heads)


@torch.inference_mode()
def attention_distances(
    classifier: Trained, sources: Sequence[Any], batch_size: int = 32, progress: bool | None = None
) -> tuple[torch.Tensor, int]:
    """Mean attention distance `(layers, heads)` over the images in `sources` (paths, bytes, {"bytes",
    "path"} values) at the classifier's resolution; images that do not decode are skipped. Also returns how
    many images were used."""
    height, width = classifier.preprocessing.image_size
    patch = tuple(classifier.model.config.patch_hw)
    grid = (height // patch[0], width // patch[1])

    def forward(pixels: torch.Tensor) -> torch.Tensor:  # (B, channels, height, width) -> (layers, heads)
        attentions = classifier.model(
            pixel_values=pixels.to(classifier.device), output_attentions=True
        ).attentions
        prefix = classifier.model.config.num_prefix_tokens  # class, distillation and register tokens
        return mean_attention_distance(attentions, grid, patch, num_prefix_tokens=prefix).sum(dim=0)

    total, used = None, 0
    for batch in iter_batches(classifier, sources, batch_size, 0, "Attention distance", progress, forward):
        for error in batch.errors.values():  # one unreadable sample must not stop the figure
            logger.warning("Skipping an image that does not decode (%s).", describe_error(error))
        if batch.decoded:
            total = batch.outputs if total is None else total + batch.outputs
            used += len(batch.decoded)
    if total is None:
        raise ValueError("None of the sample images decodes; cannot compute attention distances.")
    return total / used, used


# ---------------------------------------------------------------------------------------------------------
# Attention rollout
# ---------------------------------------------------------------------------------------------------------


MAX_ROLLOUT_PANELS = 11  # images drawn in attention_rollout.png; with the mean panel a 4x3 grid


@torch.inference_mode()
def plot_rollout(
    classifier: Trained, images: Sequence[str | os.PathLike], path: str | os.PathLike
) -> tuple[Path, list[dict[str, Any]]]:
    """Attention-rollout overlays on the centre crop the model sees, titled with the file name and the top-1
    prediction (calibrated probability), for the first MAX_ROLLOUT_PANELS images that decode, and a last panel
    with the mean map over all of them: the figure stays the same size however many images are given. Every
    image gets a record (its label and score, or why it did not decode)."""
    panels: list[Image.Image] = []
    titles: list[str] = []
    records, maps = [], []
    for source in images:
        try:
            pixels = classifier.transform.transform_image(str(source))[None].to(classifier.device)
        except Exception as error:  # an unreadable image must not stop the other figures
            logger.warning("No rollout for %s: %s", source, describe_error(error))
            records.append({"image": str(source), "error": describe_error(error)})
            continue
        heatmap = rollout_maps(classifier.model, pixels)[0].float().cpu()  # (grid_h, grid_w)
        score, index = classifier.probabilities(pixels)[0].max(dim=0)
        label = classifier.id2label[int(index)]
        records.append({"image": str(source), "label": label, "score": float(score), "error": None})
        maps.append(heatmap)
        if len(panels) < MAX_ROLLOUT_PANELS:
            shown = display_image(str(source), classifier.preprocessing.image_size, height=224)
            panels.append(overlay_heatmap(shown, heatmap.numpy()))
            titles.append(f"{short(Path(source).name, 28)}\n{short(label)} ({float(score):.2f})")
    if not panels:
        raise ValueError(f"None of the --images decodes: {[r['error'] for r in records]}")
    mean = torch.stack(maps).mean(dim=0)
    panels.append(heatmap_image(mean, height=224))
    titles.append(f"mean map over {len(maps)} images")
    suptitle = (
        f"Attention rollout on the centre crop the model sees ({len(panels) - 1} of {len(maps)} images shown)"
        if len(maps) > len(panels) - 1
        else "Attention rollout on the centre crop the model sees"
    )
    scale = ("jet", "attention rollout, each map scaled from its lowest (0) to its highest patch (1)")
    figure = plot_image_grid(panels, titles, path, suptitle=suptitle, columns=min(4, len(panels)), colorbar=scale)
    return figure, records


# ---------------------------------------------------------------------------------------------------------
# The whole command
# ---------------------------------------------------------------------------------------------------------


def _sample_sources(
    trained: Trained,
    images: Sequence[str | os.PathLike] | None,
    recipe: str | None,
    data_dir: str | os.PathLike | None,
    num_images: int,
    seed: int | None,
) -> tuple[list[Any], str, list[str]]:
    """Images for the attention distances: a random sample of the evaluation data (see
    `vit_ft.tools.evaluate.data.resolve_eval_data`), or the given images when there is no data to sample; their
    description, and the folders read (`folders_read`)."""
    if recipe is None and data_dir is None and trained.run_record is None:
        if not images:
            raise ValueError(
                f"{trained.source} records no evaluation data (no vit_ft_run.json): pass --images, --data_dir or "
                "--recipe to give the images the attention distances are computed on."
            )
        given = [str(image) for image in images][:num_images]
        return given, f"the {len(given)} given images", folders_read(trained.origin)
    data = resolve_eval_data(  # the images only (id2label None): their labels need not be the model's
        trained.origin, None, recipe, data_dir, seed=seed, max_samples=num_images
    )
    return list(data.dataset["image"]), data.description, folders_read(trained.origin, data)


def _embedding_figures(
    network: torch.nn.Module, output_dir: Path, figures: dict[str, str], grey: bool = False
) -> dict[str, Any]:
    """Figure 7 (left and centre): the patch-embedding filters' principal components (of the filters summed over
    their channels when the data is `grey`: what a grey pixel meets) and the position embeddings' similarity;
    their file names go into `figures`, their numbers are returned for inspection.json."""
    embeddings = network.vit.embeddings
    weight = embeddings.patch_embeddings.projection.weight  # (hidden, channels, patch_h, patch_w)
    components, explained = patch_embedding_components(weight.sum(dim=1, keepdim=True) if grey else weight)
    figures["patch_embedding_pca"] = plot_patch_embedding_components(
        components, explained, output_dir / "patch_embedding_pca.png"
    ).name
    grid = tuple(network.config.grid_size)
    numbers = {"grey": grey, "components": len(components), "explained_variance_ratio": explained.tolist()}
    if embeddings.position_embeddings is None:  # rotary positions (DINOv3): no learned table to compare
        return {"patch_embedding_pca": numbers, "position_similarity": {"skipped": "rotary positions, no table"}}
    similarity = position_similarity(embeddings.position_embeddings, grid, network.config.num_position_prefix)
    path, panels = plot_position_similarity(similarity, output_dir / "position_similarity.png")
    figures["position_similarity"] = path.name
    return {"patch_embedding_pca": numbers, "position_similarity": {"grid": list(grid), "panels": panels}}


def _distance_figure(
    trained: Trained, sources: list[Any], sample: str, batch_size: int, progress: bool | None, path: Path
) -> dict[str, Any]:
    """Figure 7 (right): each head's mean attention distance over `sources`, drawn to `path`; the numbers."""
    distances, used = attention_distances(trained, sources, batch_size, progress)
    height, width = trained.preprocessing.image_size
    patch = tuple(trained.model.config.patch_hw)
    grid = (height // patch[0], width // patch[1])
    max_distance = max_patch_distance(grid, patch)
    uniform = uniform_attention_distance(grid, patch)
    plot_attention_distance(distances, max_distance, path, uniform_distance=uniform)
    return {
        "images": used,
        "sample": sample,
        "max_distance": max_distance,
        "uniform_distance": uniform,
        "mean_distance": distances.tolist(),  # [layer][head], pixels
    }


def run_inspection(
    model: str | os.PathLike,
    output_dir: str | os.PathLike,
    images: Sequence[str | os.PathLike] | None = None,
    recipe: str | None = None,
    data_dir: str | os.PathLike | None = None,
    num_images: int = 32,
    image_size: int | Sequence[int] | None = None,
    batch_size: int = 16,
    seed: int | None = None,
    device: str | None = None,
    progress: bool | None = None,
    max_tokens: int | None = MAX_IMAGE_TOKENS,
    bf16: str | bool = False,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Write patch_embedding_pca.png, position_similarity.png, attention_distance.png, attention_rollout.png
    (with `images`) and inspection.json (the numbers behind them) to `output_dir`; returns that JSON.

    `max_tokens` bounds the patch tokens per image at `image_size` (None: no bound); `bf16` runs the model
    under bf16 autocast ("auto": where the hardware has native bf16). Nothing is written before the model loads;
    `output_dir` may not be, nor lie inside, a folder the inspection reads (the model's, the data's). Only the
    inspection's own files there are replaced (`INSPECTION_FILES`: a file of those names it did not write only
    with `overwrite`); the folder's other files are kept.
    """
    given = [model, *([data_dir] if data_dir is not None else [])]
    check_output_dir(output_dir, inputs=given, holds="the figures")  # before the model loads
    output_dir = Path(output_dir)
    INSPECTION_FILES.check(output_dir, overwrite)
    trained = load_trained(model, image_size, device, max_tokens=max_tokens, bf16=bf16)
    if images:  # a folder gives its image files, as predict's inputs do
        given, images = images, collect_image_files(images)
        if not images:
            raise FileNotFoundError(f"--images {' '.join(map(str, given))}: no image files there.")
    sources, sample, read = _sample_sources(trained, images, recipe, data_dir, num_images, seed)
    check_output_dir(output_dir, inputs=read)  # the recorded data's folders too
    figures: dict[str, str] = {}
    with INSPECTION_FILES.staged(output_dir, overwrite) as staging:
        embedding = _embedding_figures(trained.model, staging, figures, grey=grey_images(sources))
        path = staging / "attention_distance.png"
        distance = _distance_figure(trained, sources, sample, batch_size, progress, path)
        figures["attention_distance"] = path.name
        rollout = []
        if images:
            path, rollout = plot_rollout(trained, images, staging / "attention_rollout.png")
            figures["attention_rollout"] = path.name
        summary = {
            "model": trained.source,
            "image_size": list(trained.preprocessing.image_size),
            "patch_size": list(trained.model.config.patch_hw),
            **embedding,
            "attention_distance": distance,
            "rollout": rollout,
            "figures": figures,
        }
        (staging / "inspection.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    logger.info("Figures in %s: %s", output_dir, ", ".join(figures.values()))
    return summary


__all__ = [
    "INSPECTION_FILES",
    "attention_distances",
    "max_patch_distance",
    "mean_attention_distance",
    "patch_distances",
    "patch_embedding_components",
    "plot_rollout",
    "position_similarity",
    "run_inspection",
    "uniform_attention_distance",
]

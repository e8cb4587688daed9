"""What the model learned, as in Figure 7 of the ViT paper (arXiv 2010.11929), plus attention rollout.

- the principal components of the patch-embedding filters (paper: "RGB embedding filters, first 28 PCs");
- the cosine similarity of each position embedding with all others, one small map per patch position;
- the mean attention distance of each head against depth ("attention distance" in pixels);
- attention-rollout overlays (Abnar & Zuidema 2020) for given images.

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

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

from ..model.configuration_vit_ft import MAX_IMAGE_TOKENS  # noqa: E402
from ..reports.figures import display_image, plot_image_grid, short  # noqa: E402
from .eval_data import resolve_eval_data  # noqa: E402
from .inference import Classifier, describe_error, iter_batches, load_classifier  # noqa: E402
from .rollout import overlay_heatmap, rollout_maps  # noqa: E402

logger = logging.getLogger("vit_ft")

NUM_FILTER_COMPONENTS = 28  # as in the paper's Figure 7 (left)


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


def plot_patch_embedding_components(
    components: torch.Tensor, explained: torch.Tensor, path: str | os.PathLike, columns: int = 7
) -> Path:
    """The components `(k, 3, patch_h, patch_w)` as small RGB images (each min-max scaled), 7 per row."""
    k = len(components)
    rows = math.ceil(k / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(1.3 * columns, 1.45 * rows + 0.6), squeeze=False)
    for i, ax in enumerate(axes.flat):
        ax.axis("off")
        if i >= k:
            continue
        image = components[i].permute(1, 2, 0).numpy()  # (patch_h, patch_w, channels)
        image = (image - image.min()) / max(float(image.max() - image.min()), 1e-12)
        ax.imshow(image if image.shape[-1] == 3 else image.mean(-1), interpolation="nearest", cmap="gray")
        ax.set_title(f"PC{i + 1} {100 * float(explained[i]):.1f}%", fontsize=7)
    fig.suptitle(f"RGB embedding filters (first {k} principal components)", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


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


def similarity_mosaic(similarity: torch.Tensor) -> np.ndarray:
    """The `(grid_h * grid_w, grid_h, grid_w)` maps tiled as a grid_h x grid_w grid of panels separated by
    one NaN row/column: `(grid_h * (grid_h + 1) - 1, grid_w * (grid_w + 1) - 1)`. Panel (r, c) is the map of
    the patch at row r, column c."""
    count, gh, gw = similarity.shape
    if count != gh * gw:
        raise ValueError(f"Expected {gh * gw} maps of {gh}x{gw}, got {count}.")
    mosaic = np.full((gh * (gh + 1) - 1, gw * (gw + 1) - 1), np.nan, dtype=np.float32)
    for position in range(count):
        r, c = divmod(position, gw)
        top, left = r * (gh + 1), c * (gw + 1)
        mosaic[top : top + gh, left : left + gw] = similarity[position].numpy()
    return mosaic


def count_mosaic_panels(mosaic: np.ndarray, grid: tuple[int, int]) -> int:
    """How many panels of a `similarity_mosaic` hold a map (no NaN inside the panel)."""
    gh, gw = grid
    return sum(
        bool(np.isfinite(mosaic[r * (gh + 1) : r * (gh + 1) + gh, c * (gw + 1) : c * (gw + 1) + gw]).all())
        for r in range((mosaic.shape[0] + 1) // (gh + 1))
        for c in range((mosaic.shape[1] + 1) // (gw + 1))
    )


def plot_position_similarity(similarity: torch.Tensor, path: str | os.PathLike) -> tuple[Path, int]:
    """The paper's position-embedding figure: a panel per patch position, each a grid_h x grid_w map of
    its cosine similarity with all positions. Returns the PNG path and the number of panels drawn."""
    _, gh, gw = similarity.shape
    mosaic = similarity_mosaic(similarity)
    side = float(np.clip(0.28 * max(gh, gw) + 3, 5, 16))
    fig, ax = plt.subplots(figsize=(side * gw / max(gh, gw) + 1.3, side * gh / max(gh, gw)))
    cmap = plt.get_cmap("viridis").with_extremes(bad="white")  # the gaps between panels
    image = ax.imshow(mosaic, cmap=cmap, vmin=-1, vmax=1, interpolation="nearest")
    step = max(1, math.ceil(max(gh, gw) / 16))  # at most ~16 labelled rows/columns
    ax.set_xticks(
        [c * (gw + 1) + (gw - 1) / 2 for c in range(0, gw, step)], [str(c + 1) for c in range(0, gw, step)]
    )
    ax.set_yticks(
        [r * (gh + 1) + (gh - 1) / 2 for r in range(0, gh, step)], [str(r + 1) for r in range(0, gh, step)]
    )
    ax.tick_params(length=0, labelsize=8)
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.set_xlabel("Input patch column")
    ax.set_ylabel("Input patch row")
    ax.set_title("Position embedding similarity")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.02, label="Cosine similarity")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100 if max(gh, gw) <= 16 else 150)
    plt.close(fig)
    return path, count_mosaic_panels(mosaic, (gh, gw))


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
    classifier: Classifier, sources: Sequence[Any], batch_size: int = 32, progress: bool | None = None
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
        return mean_attention_distance(attentions, grid, patch).sum(dim=0)

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


def plot_attention_distance(distances: torch.Tensor, max_distance: float, path: str | os.PathLike) -> Path:
    """The paper's Figure 7 (right): each head's mean attention distance (pixels) against network depth."""
    layers, heads = distances.shape
    fig, ax = plt.subplots(figsize=(5.5, 4.2))
    colors = plt.get_cmap("tab20" if heads > 10 else "tab10")
    depth = np.arange(1, layers + 1)
    for head in range(heads):
        ax.scatter(
            depth, distances[:, head].numpy(), s=16, color=colors(head % colors.N), label=f"head {head + 1}"
        )
    ax.set_xlabel("Network depth (layer)")
    ax.set_ylabel("Mean attention distance (pixels)")
    ax.set_xticks(depth if layers <= 16 else depth[:: math.ceil(layers / 16)])
    ax.set_xlim(0.5, layers + 0.5)
    ax.set_ylim(0, max_distance * 1.02 if max_distance > 0 else 1)
    ax.set_title("Mean attention distance per head")
    if heads <= 16:
        ax.legend(fontsize=6, ncol=2, loc="lower right", markerscale=0.8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------------------
# Attention rollout
# ---------------------------------------------------------------------------------------------------------


@torch.inference_mode()
def plot_rollout(
    classifier: Classifier, images: Sequence[str | os.PathLike], path: str | os.PathLike
) -> tuple[Path, list[dict[str, Any]]]:
    """Each image (the centre crop the model sees) next to its attention-rollout overlay, titled with the
    top-1 prediction. An image that does not decode is left out (its record holds the reason)."""
    panels: list[Image.Image] = []
    titles: list[str] = []
    records = []
    for source in images:
        name = short(Path(source).name, 28)
        try:
            pixels = classifier.transform.transform_image(str(source))[None].to(classifier.device)
            shown = display_image(str(source), classifier.preprocessing.image_size, height=224)
        except Exception as error:  # an unreadable image must not stop the other figures
            logger.warning("No rollout for %s: %s", source, describe_error(error))
            records.append({"image": str(source), "error": describe_error(error)})
            continue
        heatmap = rollout_maps(classifier.model, pixels)[0].cpu()  # (grid_h, grid_w)
        probabilities = classifier.logits(pixels).softmax(dim=-1)[0]
        score, index = probabilities.max(dim=0)
        label = classifier.id2label[int(index)]
        records.append({"image": str(source), "label": label, "score": float(score), "error": None})
        panels += [shown, overlay_heatmap(shown, heatmap.numpy())]
        titles += [name, f"rollout: {short(label)} ({float(score):.2f})"]
    if not panels:
        raise ValueError(f"None of the --images decodes: {[r['error'] for r in records]}")
    columns = 4 if len(panels) > 2 else 2
    return plot_image_grid(panels, titles, path, suptitle="Attention rollout", columns=columns), records


# ---------------------------------------------------------------------------------------------------------
# The whole command
# ---------------------------------------------------------------------------------------------------------


def _sample_sources(
    model: str,
    classifier: Classifier,
    images: Sequence[str | os.PathLike] | None,
    recipe: str | None,
    data_dir: str | os.PathLike | None,
    num_images: int,
    seed: int | None,
) -> tuple[list[Any], str]:
    """Images for the attention distances: a random sample of the evaluation data (see
    `vit_ft.tools.evaluation.resolve_eval_data`), or the given images when there is no data to sample."""
    if recipe is None and data_dir is None and classifier.run_record is None:
        if not images:
            raise ValueError(
                f"{model} records no evaluation data (no vit_ft_run.json): pass --images, --data_dir or --recipe "
                "to give the images the attention distances are computed on."
            )
        return [str(image) for image in images][
            :num_images
        ], f"the {min(len(images), num_images)} given images"
    data = resolve_eval_data(model, classifier.id2label, recipe, data_dir, seed=seed, max_samples=num_images)
    return list(data.dataset["image"]), data.description


def _embedding_figures(
    network: torch.nn.Module, output_dir: Path, figures: dict[str, str]
) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int], int]:
    """Figure 7 (left and centre): the patch-embedding filters' principal components and the position
    embeddings' similarity; their file names go into `figures`."""
    embeddings = network.vit.embeddings
    components, explained = patch_embedding_components(embeddings.patch_embeddings.projection.weight)
    figures["patch_embedding_pca"] = plot_patch_embedding_components(
        components, explained, output_dir / "patch_embedding_pca.png"
    ).name
    grid = tuple(network.config.grid_size)
    similarity = position_similarity(embeddings.position_embeddings, grid)
    path, panels = plot_position_similarity(similarity, output_dir / "position_similarity.png")
    figures["position_similarity"] = path.name
    return components, explained, grid, panels


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
) -> dict[str, Any]:
    """Write patch_embedding_pca.png, position_similarity.png, attention_distance.png, attention_rollout.png
    (with `images`) and inspection.json (the numbers behind them) to `output_dir`; returns that JSON."""
    model = str(model)
    output_dir = Path(output_dir)
    # `max_tokens` bounds the patch tokens per image at `image_size` (None: no bound); `bf16` runs the model
    # under bf16 autocast ("auto": where the hardware has native bf16); nothing is written before the model loads
    classifier = load_classifier(model, image_size, device, max_tokens=max_tokens, bf16=bf16)
    output_dir.mkdir(parents=True, exist_ok=True)
    network = classifier.model
    config = network.config
    figures: dict[str, str] = {}

    components, explained, grid, panels = _embedding_figures(network, output_dir, figures)
    sources, sample = _sample_sources(model, classifier, images, recipe, data_dir, num_images, seed)
    distances, used = attention_distances(classifier, sources, batch_size, progress)
    height, width = classifier.preprocessing.image_size
    patch = tuple(config.patch_hw)
    max_distance = max_patch_distance((height // patch[0], width // patch[1]), patch)
    figures["attention_distance"] = plot_attention_distance(
        distances, max_distance, output_dir / "attention_distance.png"
    ).name

    rollout = []
    if images:
        path, rollout = plot_rollout(classifier, images, output_dir / "attention_rollout.png")
        figures["attention_rollout"] = path.name

    summary = {
        "model": model,
        "image_size": [height, width],
        "patch_size": list(patch),
        "patch_embedding_pca": {
            "components": len(components),
            "explained_variance_ratio": explained.tolist(),
        },
        "position_similarity": {"grid": list(grid), "panels": panels},
        "attention_distance": {
            "images": used,
            "sample": sample,
            "max_distance": max_distance,
            "mean_distance": distances.tolist(),  # [layer][head], pixels
        },
        "rollout": rollout,
        "figures": figures,
    }
    (output_dir / "inspection.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    logger.info("Figures in %s: %s", output_dir, ", ".join(figures.values()))
    return summary


__all__ = [
    "attention_distances",
    "count_mosaic_panels",
    "max_patch_distance",
    "mean_attention_distance",
    "patch_distances",
    "patch_embedding_components",
    "plot_attention_distance",
    "plot_patch_embedding_components",
    "plot_position_similarity",
    "plot_rollout",
    "position_similarity",
    "run_inspection",
    "similarity_mosaic",
]

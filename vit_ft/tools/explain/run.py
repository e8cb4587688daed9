"""`vit-ft inspect --explain METHOD [--target CLASS] --images ...`: one class-specific map per image, drawn over
the centre crop the model sees, into explanation.png, with the numbers in explanation.json.

    run_explanation("outputs/digits", "figures/digits", images=["a.png"], explain="grad_rollout", target="3")

The model runs in float32 (gradients under bf16 autocast would change the maps' ranks in their last digits for
no gain on a few images).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ...data.images import collect_image_files
from ...reports.figures import display_image, plot_image_grid, short
from ...utils.limits import MAX_IMAGE_TOKENS
from ...utils.output_dir import OutputFiles, check_output_dir
from ...utils.progress import Progress
from ..inference import describe_error
from ..trained import Trained, load_trained
from .methods import CLASS_SPECIFIC, check_method, explain, patch_grids
from .rollout import overlay_heatmap

logger = logging.getLogger("vit_ft")

EXPLANATION_FILES = OutputFiles("explain", ("explanation.png", "explanation.json"), "an explanation's figure")
MAX_PANELS = 12  # images drawn in explanation.png; every image gets a record in explanation.json


def resolve_target(target: str | int | None, id2label: dict[int, str]) -> int | None:
    """A `--target` class name or index -> its index (None: each image's predicted class); one that the model
    does not have is a ValueError naming a few of its classes."""
    if target is None:
        return None
    names = {name: index for index, name in id2label.items()}
    if str(target) in names:
        return names[str(target)]
    if str(target).lstrip("-").isdigit() and int(target) in id2label:
        return int(target)
    some = ", ".join(list(names)[:8]) + (", ..." if len(names) > 8 else "")
    raise ValueError(
        f"--target {target!r} is not a class of this model: pass a class name ({some}) or an index "
        f"0..{len(id2label) - 1}."
    )


def refuse_export(model: str | os.PathLike, needs: str = "--explain") -> None:
    """An export folder (ONNX graphs, no PyTorch weights) is a ValueError naming what `needs` the PyTorch model (by
    default --explain: an export has no gradients or attention maps)."""
    folder = Path(model)
    weights = (
        "model.safetensors",
        "model.safetensors.index.json",
        "pytorch_model.bin",
        "adapter_config.json",
    )
    if (
        folder.is_dir()
        and any(folder.glob("*.onnx"))
        and not any((folder / name).is_file() for name in weights)
    ):
        raise ValueError(
            f"{needs} needs the PyTorch model: {model} is an ONNX export, which has no gradients or attention "
            "maps; pass the folder it was exported from (e.g. outputs/digits)."
        )


def explain_image(
    trained: Trained, source: Any, method: str, target: int | None
) -> tuple[torch.Tensor, int, float]:
    """One image's map `(grid_h, grid_w)` for `target` (None: the predicted class), that class and its probability."""
    pixels = trained.transform.transform_image(str(source))
    inputs = trained.transform.collate([pixels])  # images, or a NaFlex batch
    probabilities = trained.probabilities(inputs)[0]
    chosen = int(probabilities.argmax()) if target is None else target
    maps = explain(trained.model, inputs, method, target=chosen)
    return patch_grids(maps, inputs, trained.model.config.patch_hw)[0], chosen, float(probabilities[chosen])


def plot_explanations(
    trained: Trained, images: Sequence[str | os.PathLike], method: str, target: int | None, path: Path
) -> list[dict[str, Any]]:
    """Overlays of `method`'s map for each image (the first MAX_PANELS that decode) and one record per image."""
    panels, titles, records = [], [], []
    with Progress(len(images), f"Explaining ({method})") as progress:
        for source in images:
            try:
                heatmap, chosen, probability = explain_image(trained, source, method, target)
            except (OSError, ValueError) as error:  # an unreadable image must not stop the others
                logger.warning("No explanation for %s: %s", source, describe_error(error))
                records.append({"image": str(source), "error": describe_error(error)})
                progress.update(1)
                continue
            label = trained.id2label[chosen]
            records.append({"image": str(source), "target": label, "target_index": chosen,
                            "probability": probability, "map": heatmap.tolist(), "error": None})  # fmt: skip
            if len(panels) < MAX_PANELS:
                shown = display_image(str(source), trained.preprocessing.image_size, height=224)
                panels.append(overlay_heatmap(shown, heatmap.numpy()))
                titles.append(f"{short(Path(source).name, 28)}\n{short(label)} ({probability:.2f})")
            progress.update(1)
    if not panels:
        raise ValueError(f"None of the --images decodes: {[r['error'] for r in records]}")
    which = "the predicted class" if target is None else f"class {trained.id2label[target]!r}"
    kind = "class-specific" if method in CLASS_SPECIFIC else "class-agnostic"
    scale = ("jet", f"{method}, each map scaled from its lowest (0) to its highest patch (1)")
    suptitle = f"{method} ({kind}) for {which}: title = target class (its probability)"
    plot_image_grid(panels, titles, path, suptitle=suptitle, columns=min(4, len(panels)), colorbar=scale)
    return records


def run_explanation(
    model: str | os.PathLike,
    output_dir: str | os.PathLike,
    images: Sequence[str | os.PathLike] | None = None,
    explain: str = "grad_rollout",
    target: str | int | None = None,
    image_size: int | Sequence[int] | None = None,
    device: str | None = None,
    max_tokens: int | None = MAX_IMAGE_TOKENS,
    overwrite: bool = False,
    recipe: str | None = None,
    data_dir: str | os.PathLike | None = None,
    **ignored: Any,  # the inspect command's other flags (batch size, bf16, seed, ...): not used by explanations
) -> dict[str, Any]:
    """Write explanation.png and explanation.json (method, target, each image's map and probability) to
    `output_dir`; returns that JSON. The method and target are checked before anything is written."""
    check_method(explain)
    if not images:
        raise ValueError(
            f"--explain {explain} draws maps on images: pass --images (files, folders or patterns)."
        )
    if recipe is not None or data_dir is not None:
        raise ValueError("--explain draws maps on the --images only: drop --recipe / --data_dir.")
    refuse_export(model)
    check_output_dir(output_dir, inputs=[model], holds="the figures")
    output_dir = Path(output_dir)
    EXPLANATION_FILES.check(output_dir, overwrite)
    given, files = images, collect_image_files(images)
    if not files:
        raise FileNotFoundError(f"--images {' '.join(map(str, given))}: no image files there.")
    trained = load_trained(model, image_size, device, max_tokens=max_tokens, bf16=False)
    check_method(explain, trained.model)
    index = resolve_target(target, trained.id2label)
    with EXPLANATION_FILES.staged(output_dir, overwrite) as staging:
        records = plot_explanations(trained, files, explain, index, staging / "explanation.png")
        summary = {
            "model": trained.source,
            "method": explain,
            "class_specific": explain in CLASS_SPECIFIC,
            "target": None if index is None else trained.id2label[index],
            "image_size": list(trained.preprocessing.image_size),
            "images": records,
        }
        (staging / "explanation.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    logger.info("Explanation in %s: explanation.png, explanation.json", output_dir)
    return summary


__all__ = [
    "EXPLANATION_FILES",
    "explain_image",
    "refuse_export",
    "plot_explanations",
    "resolve_target",
    "run_explanation",
]

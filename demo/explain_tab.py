"""The demo's map: the attention rollout (Abnar & Zuidema 2020, class-agnostic) over the crop the model sees,
or for a class picked under it the gradient-weighted rollout (Chefer et al. 2021, `vit_ft.tools.explain`); the
colour legend; the panel and its class picker."""

from __future__ import annotations

from typing import Any

import gradio as gr
import numpy as np
import torch
from PIL import Image

from vit_ft.data.images import resize_and_center_crop
from vit_ft.tools.explain.methods import explain
from vit_ft.tools.explain.rollout import rollout_maps

HEAT_ALPHA = 0.6  # overlay_heatmap's default: the legend shows the same blend
ALL_CLASSES = "every class (attention rollout)"  # the class picker's first choice: the class-agnostic map
DISPLAY_SIDE = 448  # the heat map is drawn at about this size (longer side), whatever the model's resolution


def class_map(model: torch.nn.Module, pixels: torch.Tensor, target: int | None) -> torch.Tensor:
    """`(grid_h, grid_w)`: the attention rollout of `pixels` `(1, 3, height, width)` for `target` None, else the
    gradient-weighted rollout for that class index."""
    if target is None:
        return rollout_maps(model, pixels)[0]
    patch_h, patch_w = model.config.patch_hw
    grid = (pixels.shape[-2] // patch_h, pixels.shape[-1] // patch_w)
    return explain(model, pixels, "grad_rollout", target=target)[0].reshape(grid)


def map_panel(classifier: Any) -> tuple[gr.Image, gr.Dropdown]:
    """The map's caption, image, class picker and legend (in the current Gradio column); -> the image and picker."""
    height, width = classifier.size
    gr.Markdown(
        f"**Attention rollout** on the centre crop the model sees ({height}x{width}, enlarged)"
        + (": one map for the image, the same for every label (rollout is class-agnostic)."
           if classifier.multi_label else ":"),
        elem_id="rollout-caption",
    )  # fmt: skip
    # no label badge nor buttons laid over the map
    heatmap = gr.Image(type="pil", format="png", show_label=False, interactive=False, buttons=[],
                       elem_id="rollout")  # fmt: skip
    target = gr.Dropdown([ALL_CLASSES, *classifier.labels.values()], value=ALL_CLASSES,
                         label="Map for the class", elem_id="explain-class")  # fmt: skip
    gr.HTML(legend_html(), elem_id="legend")
    return heatmap, target


def legend_html() -> str:
    """The heat map's colour legend: the blend `overlay_heatmap` draws over a mid-grey image, from no
    attention (the image as it is) to the most (red), as a CSS gradient."""
    from matplotlib import colormaps

    stops = []
    for heat in np.linspace(0, 1, 9):
        rgb = (1 - HEAT_ALPHA * heat) * 0.5 + HEAT_ALPHA * heat * np.asarray(colormaps["jet"](heat)[:3])
        stops.append(f"rgb({', '.join(str(round(255 * c)) for c in rgb)}) {100 * heat:.0f}%")
    return (
        '<div id="legend-bar" style="height: 14px; border-radius: 3px; '
        f'background: linear-gradient(to right, {", ".join(stops)});"></div>'
        '<div style="display: flex; justify-content: space-between; font-size: 0.85em;">'
        "<span>least attention (image as it is)</span><span>most attention</span></div>"
    )


def display_view(image: Image.Image, size: tuple[int, int], resample: int) -> Image.Image:
    """The crop the model sees (same geometry), `size` (height, width) for the page: enlarged with nearest
    neighbour, so that a small image (a 32x32 digit) shows sharp pixels rather than a blur, and reduced with
    the model's own resampling."""
    enlarging = size[0] > image.height or size[1] > image.width  # the cover scale is above 1
    return resize_and_center_crop(image, size, resample=Image.Resampling.NEAREST if enlarging else resample)


__all__ = ["ALL_CLASSES", "DISPLAY_SIDE", "HEAT_ALPHA", "class_map", "display_view", "legend_html", "map_panel"]

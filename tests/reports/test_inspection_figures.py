"""vit_ft.reports.inspection_figures: the position-similarity mosaic, one panel per patch position."""

import numpy as np
import pytest
import torch

from vit_ft.reports.inspection_figures import count_mosaic_panels, plot_position_similarity, similarity_mosaic
from vit_ft.tools.inspect.run import position_similarity


def test_position_similarity_has_one_panel_per_position(tmp_path):
    grid = (3, 5)
    torch.manual_seed(0)
    table = torch.randn(1, 1 + 15, 32)
    similarity = position_similarity(table, grid)
    assert similarity.shape == (15, 3, 5)
    mosaic = similarity_mosaic(similarity)
    for position in range(15):
        r, c = divmod(position, 5)
        panel = mosaic[r * 4 : r * 4 + 3, c * 6 : c * 6 + 5]
        assert np.unravel_index(np.argmax(panel), panel.shape) == (r, c)  # most similar to itself
        assert panel[r, c] == pytest.approx(1.0)
    assert count_mosaic_panels(mosaic, grid) == 15
    path, panels = plot_position_similarity(similarity, tmp_path / "pos.png")
    assert panels == 15 and path.is_file()


def test_attention_distance_draws_the_uniform_reference_and_keeps_its_legend_off_the_points(
    tmp_path, monkeypatch
):
    from vit_ft.reports import inspection_figures
    from vit_ft.reports.inspection_figures import plot_attention_distance

    saved, close = [], inspection_figures.plt.close
    monkeypatch.setattr(inspection_figures.plt, "close", saved.append)
    try:
        plot_attention_distance(torch.rand(4, 3) * 20, 40.0, tmp_path / "d.png", uniform_distance=17.5)
        (fig,) = saved
        ax = fig.axes[0]
        (reference,) = ax.get_lines()
        assert list(reference.get_ydata()) == [17.5, 17.5] and "uniform attention" in reference.get_label()
        renderer = fig.canvas.get_renderer()
        legend = ax.get_legend()
        assert legend.get_window_extent(renderer).x0 >= ax.get_window_extent(renderer).x1  # beside the panel
        assert [t.get_text() for t in legend.get_texts()][-1].startswith("uniform attention")
    finally:
        for figure in saved:
            close(figure)


def test_grey_data_is_told_from_colour_data():
    from PIL import Image

    from vit_ft.reports.inspection_figures import grey_images

    grey = Image.fromarray(np.arange(64, dtype=np.uint8).reshape(8, 8), "L")
    grey_rgb = grey.convert("RGB")  # R = G = B: grey stored as colour
    colour = Image.fromarray(np.dstack([np.zeros((8, 8)), np.full((8, 8), 200), np.zeros((8, 8))]).astype(np.uint8))
    assert grey_images([grey, grey_rgb, b"not an image"])  # an image that does not decode says nothing
    assert not grey_images([grey, colour])
    assert grey_images([grey] * 8 + [colour])  # the first 8 are looked at
    assert not grey_images([b"not an image"])


@pytest.mark.parametrize(("channels", "title"), [(3, "RGB embedding filters"), (1, "Grey embedding filters")])
def test_patch_embedding_components_are_grey_for_one_channel(tmp_path, monkeypatch, channels, title):
    from vit_ft.reports import inspection_figures
    from vit_ft.tools.inspect.run import patch_embedding_components

    saved, close = [], inspection_figures.plt.close
    monkeypatch.setattr(inspection_figures.plt, "close", saved.append)
    try:
        weight = torch.randn(32, 3, 4, 4)  # as the grey input meets it: summed over the channels
        components, explained = patch_embedding_components(weight if channels == 3 else weight.sum(1, keepdim=True))
        inspection_figures.plot_patch_embedding_components(components, explained, tmp_path / "pca.png")
        (fig,) = saved
        assert fig._suptitle.get_text().startswith(title)
        shapes = {ax.get_images()[0].get_array().shape for ax in fig.axes if ax.get_images()}
        assert shapes == ({(4, 4, 3)} if channels == 3 else {(4, 4)})  # colour only where the input has it
        if channels == 1:
            assert {ax.get_images()[0].get_cmap().name for ax in fig.axes if ax.get_images()} == {"gray"}
    finally:
        for figure in saved:
            close(figure)


def test_image_grid_draws_the_colour_scale_of_its_heat_maps(saved_figures, tmp_path):
    from PIL import Image

    from vit_ft.reports.figures import plot_image_grid

    images = [Image.new("RGB", (30, 30), "red")] * 3
    plot_image_grid(images, ["a", "b", "c"], tmp_path / "plain.png", suptitle="three")
    plot_image_grid(images, ["a", "b", "c"], tmp_path / "scaled.png", suptitle="three",
                    colorbar=("jet", "rollout, scaled to each map"))  # fmt: skip
    plain, scaled = saved_figures
    assert len(scaled.axes) == len(plain.axes) + 1
    scale = scaled.axes[-1]
    assert scale.get_xlabel() == "rollout, scaled to each map" and scale.get_xlim() == (0, 1)
    renderer = scaled.canvas.get_renderer()
    lowest_image = min(ax.get_window_extent(renderer).y0 for ax in scaled.axes[:-1] if ax.get_images())
    label = scale.xaxis.label.get_window_extent(renderer)
    assert label.y0 >= 0 and label.y1 <= lowest_image  # under the images, inside the figure

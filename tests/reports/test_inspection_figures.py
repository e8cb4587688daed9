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

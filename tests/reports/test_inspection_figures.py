"""vit_ft.reports.inspection_figures: the position-similarity mosaic, one panel per patch position."""

import numpy as np
import pytest
import torch

from vit_ft.reports.inspection_figures import count_mosaic_panels, plot_position_similarity, similarity_mosaic
from vit_ft.tools.inspection import position_similarity


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

"""Fixtures shared by the figure tests."""

import matplotlib.pyplot as plt
import pytest

from vit_ft.reports import figures


@pytest.fixture
def saved_figures(monkeypatch):
    """The figures the code under test saved, as they were saved (its plt.close is deferred to the end)."""
    saved, close = [], plt.close
    monkeypatch.setattr(figures.plt, "close", saved.append)
    yield saved
    for fig in saved:
        close(fig)

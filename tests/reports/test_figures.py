"""vit_ft.reports.figures: image grids, the confusion matrix and the mistakes grid."""

import itertools

import matplotlib.pyplot as plt
import numpy as np
import pytest
from PIL import Image

from vit_ft.reports import figures
from vit_ft.reports.figures import (
    Mistake,
    normalize_rows,
    plot_confusion_matrix,
    plot_image_grid,
    plot_mistakes,
    short,
    wrap_title,
)
from vit_ft.tools.evaluation import confusion_counts

# Stanford Dogs' folder names: WordNet id, then the breed, no spaces; among them the longest
DOGS = ["n02109047-Great_Dane", "n02107574-Greater_Swiss_Mountain_dog", "n02089078-black-and-tan_coonhound",
        "n02110063-malamute", "n02097474-Tibetan_terrier", "n02106662-German_shepherd"]  # fmt: skip


@pytest.fixture
def saved_figures(monkeypatch):
    """The figures the code under test saved, as they were saved (its plt.close is deferred to the end)."""
    saved, close = [], plt.close
    monkeypatch.setattr(figures.plt, "close", saved.append)
    yield saved
    for fig in saved:
        close(fig)


def boxes_overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_normalize_rows_gives_fractions_of_each_true_class():
    counts = np.array([[3, 1, 0], [0, 0, 0], [2, 2, 4]])
    normalized = normalize_rows(counts)
    np.testing.assert_allclose(normalized, [[0.75, 0.25, 0], [0, 0, 0], [0.25, 0.25, 0.5]])


def test_confusion_matrix_figure_grows_with_the_class_count(tmp_path):
    rng = np.random.default_rng(0)
    sizes = {}
    for n in (10, 120):
        labels = rng.integers(0, n, 2000)
        counts = confusion_counts(
            labels, np.where(rng.random(2000) < 0.7, labels, rng.integers(0, n, 2000)), n
        )
        path = plot_confusion_matrix(
            counts, {i: f"breed number {i}" for i in range(n)}, tmp_path / f"{n}.png"
        )
        with Image.open(path) as image:
            sizes[n] = image.size
    assert sizes[120][0] > 2.5 * sizes[10][0]  # room for 120 rows of labels


def test_image_grid_leaves_a_missing_image_empty_and_short_cuts_long_names(tmp_path):
    images = [Image.new("RGB", (30, 20), "red"), None, Image.new("RGB", (30, 20), "blue")]
    path = plot_image_grid(images, ["a", "b", "c"], tmp_path / "grid.png", suptitle="three")
    with Image.open(path) as image:
        assert image.size[0] > 100 and image.size[1] > 100
    assert short("n02109047-Great_Dane", 10) == "n02109047…" and len(short("x" * 40)) == 18
    assert short("cat") == "cat"


def test_no_mistakes_is_said_in_the_figure(tmp_path):
    path = plot_mistakes([], images=[], image_size=(16, 16), path=tmp_path / "none.png")
    with Image.open(path) as image:
        pixels = np.asarray(image.convert("L"))
    assert pixels.min() < 128  # the "No mistakes" text is drawn, not an empty canvas


def test_wrap_title_breaks_names_without_spaces_and_keeps_every_character():
    for name in DOGS:
        wrapped = wrap_title(name, width=20)
        assert all(len(line) <= 20 for line in wrapped.split("\n"))
        assert wrapped.replace("\n", "") == name  # wrapped, not shortened
    assert wrap_title("n02107574-Greater_Swiss_Mountain_dog", 20) == "n02107574-Greater_\nSwiss_Mountain_dog"
    assert wrap_title("x" * 50, width=10, max_lines=3) == "xxxxxxxxxx\nxxxxxxxxxx\nxxxxxxxxx…"


def test_mistakes_grid_titles_with_real_class_names_do_not_overlap(saved_figures, tmp_path):
    pairs = list(itertools.permutations(DOGS, 2))[:9]
    rows = [Image.new("RGB", (40, 30), (40 * i, 90, 200 - 20 * i)) for i in range(len(pairs))]
    mistakes = [Mistake(i, i, f"{i}.png", true, pred, 0.93, 0.01) for i, (true, pred) in enumerate(pairs)]
    plot_mistakes(mistakes, rows, (32, 32), tmp_path / "mistakes.png")
    (fig,) = saved_figures
    renderer = fig.canvas.get_renderer()
    axes = [ax for ax in fig.axes if ax.get_title()]
    assert len(axes) == 9
    titles = {ax: ax.title.get_window_extent(renderer) for ax in axes}
    figure_box = fig.bbox
    for ax, box in titles.items():
        true, pred = pairs[axes.index(ax)]
        text = ax.get_title().replace("\n", "")
        assert true in text and pred in text  # the whole names, wrapped
        assert figure_box.x0 <= box.x0 and box.x1 <= figure_box.x1 and box.y1 <= figure_box.y1
        for other in axes:
            assert other is ax or not boxes_overlap(box, titles[other]), (ax.get_title(), other.get_title())
            assert not boxes_overlap(box, other.get_window_extent(renderer)), ax.get_title()  # nor an image

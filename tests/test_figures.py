"""vit_ft.figures: image grids, the confusion matrix and the mistakes grid."""

import numpy as np
from PIL import Image

from vit_ft.evaluation import confusion_counts
from vit_ft.figures import normalize_rows, plot_confusion_matrix, plot_image_grid, plot_mistakes, short


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
    path = plot_mistakes([], data=None, image_size=(16, 16), path=tmp_path / "none.png")
    with Image.open(path) as image:
        pixels = np.asarray(image.convert("L"))
    assert pixels.min() < 128  # the "No mistakes" text is drawn, not an empty canvas

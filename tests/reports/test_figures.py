"""vit_ft.reports.figures and charts: image grids, the confusion matrix, the mistakes grid, the per-class chart
and the reliability diagram."""

import itertools

import numpy as np
import pytest
from PIL import Image

from vit_ft.reports.charts import normalize_rows, plot_confusion_matrix
from vit_ft.reports.figures import (
    Mistake,
    plot_image_grid,
    plot_mistakes,
    short,
    wrap_title,
)
from vit_ft.tasks.single_label import confusion_counts

# Stanford Dogs' folder names: WordNet id, then the breed, no spaces; among them the longest
DOGS = ["n02109047-Great_Dane", "n02107574-Greater_Swiss_Mountain_dog", "n02089078-black-and-tan_coonhound",
        "n02110063-malamute", "n02097474-Tibetan_terrier", "n02106662-German_shepherd"]  # fmt: skip



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


def test_confusion_matrix_shows_counts_beside_fractions_and_errors_on_their_own_scale(
    saved_figures, tmp_path
):
    counts = np.array([[97, 3, 0], [0, 50, 0], [1, 0, 9]])
    plot_confusion_matrix(counts, {0: "cat", 1: "dog", 2: "fox"}, tmp_path / "cm.png")
    (fig,) = saved_figures
    ax = fig.axes[0]
    cells = {t.get_text() for t in ax.texts}
    assert cells == {"0.97\n(97)", "0.03\n(3)", "1.00\n(50)", "0.10\n(1)", "0.90\n(9)"}  # no "0.00" cells
    right, errors = ax.get_images()
    assert right.get_clim() == (0, 1) and errors.get_clim() == (0, 0.1)  # errors scaled to the largest error
    # the smallest error is drawn clearly coloured, not near-white as on one 0..1 scale
    r, g, b, _ = errors.cmap(errors.norm(0.03))
    assert r > 0.8 and g < 0.6 and b < 0.6
    labels = {cbar_ax.get_ylabel() for cbar_ax in fig.axes[1:]}
    assert labels == {"right: fraction of the true class", "errors: fraction of the true class"}


def test_per_class_chart_has_precision_and_recall_bars_and_its_legend_off_them(saved_figures, tmp_path):
    from vit_ft.reports.charts import plot_per_class
    from vit_ft.tasks.single_label import per_class_table

    counts = np.array([[8, 2, 0], [1, 9, 0], [0, 0, 0]])  # "fox" never seen nor predicted: left out
    plot_per_class(
        per_class_table(counts, {0: "cat", 1: "dog", 2: "fox"}), tmp_path / "pc.png", "test split, 20 images"
    )
    (fig,) = saved_figures
    ax = fig.axes[0]
    widths = [round(patch.get_width(), 3) for patch in ax.patches]
    assert widths == [0.889, 0.818, 0.8, 0.9]  # precision of cat, dog, then recall of cat, dog
    assert [t.get_text() for t in ax.get_yticklabels()] == ["cat (n=10)", "dog (n=10)"]
    assert "test split, 20 images" in ax.get_title()
    # zoomed to the bars (lowest 0.8), from a round step below, and the start named
    assert ax.get_xlim() == pytest.approx((0.75, 1.0)) and "axis from 0.75" in ax.get_xlabel()
    (baseline,) = ax.get_lines()  # recall of all 20 images together: 17 right, the accuracy
    assert list(baseline.get_xdata()) == pytest.approx([0.85, 0.85])
    renderer = fig.canvas.get_renderer()
    legend = ax.get_legend().get_window_extent(renderer)
    assert legend.y0 >= ax.get_window_extent(renderer).y1 - 1  # above the bars
    assert sorted(t.get_text() for t in ax.get_legend().get_texts()) == [
        "all classes: recall 0.850", "precision", "recall"
    ]


@pytest.mark.parametrize(
    ("values", "floor", "limits"),
    [
        ([0.91, 0.97, 1.0], 1.0, (0.85, 1.0)),  # 0.91-1.0 fills the axis
        ([0.96, 1.0], 0.93, (0.9, 1.0)),  # the baseline below the bars kept in view
        ([0.3, 0.99], 1.0, (0.0, 1.0)),  # far from 1: the whole range
        ([0.6, 0.99], 0.2, (0.0, 1.0)),  # a baseline far below: the whole range
        ([], 1.0, (0.0, 1.0)),
    ],
)
def test_fraction_axes_are_zoomed_to_their_values(values, floor, limits):
    from vit_ft.reports.charts import zoomed_fraction_limits

    assert zoomed_fraction_limits(np.array(values), floor) == pytest.approx(limits)


def test_per_class_chart_of_many_classes_shows_the_lowest_f1(saved_figures, tmp_path):
    from vit_ft.reports.charts import PER_CLASS_CHART_MAX_CLASSES, plot_per_class

    table = [{"class": f"c{i}", "support": 5, "predicted": 5, "precision": i / 100, "recall": i / 100,
              "f1": i / 100} for i in range(100)]  # fmt: skip
    plot_per_class(table, tmp_path / "pc.png", "validation")
    (fig,) = saved_figures
    shown = [t.get_text().split(" ")[0] for t in fig.axes[0].get_yticklabels()]
    assert shown == [f"c{i}" for i in range(PER_CLASS_CHART_MAX_CLASSES)]
    assert fig.get_size_inches()[1] < 12


def test_reliability_diagram_draws_the_bins_the_diagonal_and_states_the_ece(saved_figures, tmp_path):
    from vit_ft.metrics.calibration import reliability_bins
    from vit_ft.reports.charts import plot_reliability_diagram

    bins = reliability_bins(np.array([0.95, 0.97, 0.62, 0.5, 0.6]), np.array([1, 0, 1, 1, 0]))
    plot_reliability_diagram(
        bins, tmp_path / "rel.png", "test split, 5 images", temperature=1.5, uncalibrated_ece=0.6
    )
    (fig,) = saved_figures
    top, bottom = fig.axes
    assert "ECE 0.480 (15 bins; temperature 1.50, ECE 0.600 before)" in top.get_title()
    assert "test split, 5 images" in top.get_title()
    accuracy, gaps = top.containers
    assert accuracy.get_label() == "accuracy" and gaps.get_label() == "gap to confidence"
    # the filled bins (0.467, 0.533], (0.533, 0.6], (0.6, 0.667], (0.933, 1]
    assert [round(bar.get_x(), 3) for bar in accuracy] == [0.467, 0.533, 0.6, 0.933]
    assert [bar.get_height() for bar in accuracy] == [1.0, 0.0, 1.0, 0.5]
    assert [round(bar.get_height(), 3) for bar in gaps] == [0.5, 0.6, 0.38, 0.46]
    (diagonal,) = top.get_lines()
    assert list(diagonal.get_xdata()) == [0, 1] and list(diagonal.get_ydata()) == [0, 1]
    assert [p.get_height() for p in bottom.patches] == [1, 1, 1, 2]  # the images of each filled bin
    assert bottom.get_yscale() == "log" and "2 of 5 in (0.93, 1.00]" in bottom.get_title()


def test_reliability_diagram_names_each_bins_count_and_fades_the_sparse_ones(saved_figures, tmp_path):
    from vit_ft.metrics.calibration import reliability_bins
    from vit_ft.reports.charts import SPARSE_BIN_IMAGES, plot_reliability_diagram

    # as a well-trained model: nearly all images in the top bin, a few scattered below
    confidences = np.r_[np.full(346, 0.99), np.full(10, 0.9), 0.5, 0.7, 0.78, 0.78]
    correct = np.r_[np.ones(346), np.ones(7), np.zeros(3), 0, 1, 1, 0].astype(bool)
    plot_reliability_diagram(reliability_bins(confidences, correct), tmp_path / "rel.png", "test split")
    (fig,) = saved_figures
    top, bottom = fig.axes
    accuracy, gaps = top.containers
    counts = [int(t.get_text()) for t in top.texts]
    assert counts == [1, 1, 2, 10, 346]  # over each filled bar, lowest confidence first
    faded = [bar.get_alpha() < 1 for bar in accuracy]
    assert faded == [count < SPARSE_BIN_IMAGES for count in counts] == [True, True, True, False, False]
    legend = [t.get_text() for t in top.get_legend().get_texts()]
    assert f"bin of < {SPARSE_BIN_IMAGES} images (faded)" in legend and legend[0] == "accuracy"
    assert bottom.get_yscale() == "log" and bottom.get_ylim()[0] < 1  # a one-image bin still shows
    assert "346 of 360 in (0.93, 1.00]" in bottom.get_title()


def test_predict_figure_titles_name_how_many_of_all_the_images_they_show():
    from vit_ft.tasks.multi_label import MultiLabel
    from vit_ft.tasks.single_label import SingleLabel

    assert SingleLabel().figure_title(24, 37) == "Top-1 predictions (24 shown of 37)"
    assert MultiLabel().figure_title(24, 37).endswith("24 images shown of 37")
    assert SingleLabel().figure_title(5) == "Top-1 predictions (5 shown of 5)"

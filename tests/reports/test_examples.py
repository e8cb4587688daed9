"""vit_ft.reports.examples: the output folder's examples/, whatever the class names."""

import datasets
import numpy as np
from PIL import Image

from vit_ft.reports.examples import write_examples


def test_class_names_too_long_for_a_file_name_are_shortened_and_kept_apart(tmp_path):
    """A 255-byte class name is a valid folder name but `NN_<name>.png` is not (File name too long)."""
    names = ["a" * 255, "a" * 254 + "b", "é" * 127, "cat"]
    images = [Image.fromarray(np.full((8, 8, 3), 40 * i, dtype=np.uint8)) for i in range(len(names))]
    dataset = datasets.Dataset.from_dict(
        {"image": images, "label": list(range(len(names)))},
        features=datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=names)}),
    )
    written = write_examples(dataset, names, tmp_path)
    assert len(written) == len(names) and all(path.is_file() for path in written)
    assert all(len(path.name.encode()) <= 255 for path in written)
    assert len({path.name for path in written}) == len(names)
    assert written[0].name.startswith("00_aaaa") and written[3].name == "03_cat.png"
    assert written[2].name.startswith("02_é")  # a readable prefix, cut on a character boundary

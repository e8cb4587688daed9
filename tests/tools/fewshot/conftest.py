"""The few-shot tests' images: the digits image folders, and a small three-class copy."""

import shutil
from pathlib import Path

import pytest

from vit_ft.data.digits import write_digits_imagefolder


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    return write_digits_imagefolder(tmp_path_factory.mktemp("fewshot") / "digits")


@pytest.fixture(scope="module")
def small_digits(digits, tmp_path_factory) -> Path:
    """Three digit classes, 12 training and 4 test images each."""
    root = tmp_path_factory.mktemp("small") / "digits"
    for split, count in (("train", 12), ("test", 4)):
        for digit in ("0", "1", "2"):
            (root / split / digit).mkdir(parents=True)
            for path in sorted((digits / split / digit).iterdir())[:count]:
                shutil.copy(path, root / split / digit / path.name)
    return root

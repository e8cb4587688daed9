"""vit_ft.commands.fewshot: its flags' values."""

import pytest

from vit_ft.commands.fewshot import parse_shots


def test_parse_shots():
    assert parse_shots("25, 1,5,10,5") == (1, 5, 10, 25)
    assert parse_shots([3, 1]) == (1, 3)
    for bad in ("", "0", "1,x", "-1", "1.5"):
        with pytest.raises(ValueError, match="positive numbers of images per class"):
            parse_shots(bad)

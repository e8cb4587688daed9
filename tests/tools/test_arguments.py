"""vit_ft.tools.arguments: the model and data flags of the tools that run a model."""

import pytest

from vit_ft.tools.arguments import add_data_arguments, add_inference_arguments
from vit_ft.utils.cli import tool_parser


def test_tool_parser_takes_model_data_and_inference_arguments():
    parser = tool_parser("doc")
    add_data_arguments(parser, "Evaluate")
    add_inference_arguments(parser, batch_size=7)
    args = parser.parse_args(["--model", "m", "--data_dir", "d", "--image_size", "48", "--seed", "3"])
    assert vars(args) == {
        "model": "m", "recipe": None, "data_dir": "d", "seed": 3, "image_size": 48, "batch_size": 7, "device": None,
        "max_tokens": 4096, "bf16": "auto",
    }  # fmt: skip


def test_recipe_and_data_dir_exclude_each_other_and_model_is_required():
    """A parser mistake is a ValueError (one `error:` line through run_tool), not argparse's usage and exit 2."""
    parser = tool_parser("doc")
    add_data_arguments(parser, "Evaluate")
    with pytest.raises(ValueError, match="argument --data_dir: not allowed with argument --recipe .*--help"):
        parser.parse_args(["--model", "m", "--recipe", "r", "--data_dir", "d"])
    with pytest.raises(ValueError, match="the following arguments are required: --model"):
        parser.parse_args([])
    with pytest.raises(ValueError, match="unrecognized arguments: --mod m"):  # no abbreviations
        parser.parse_args(["--model", "m", "--mod", "m"])

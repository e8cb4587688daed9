"""vit_ft.cli: the arguments and logging the command-line tools share."""

import logging

import pytest

from vit_ft.cli import add_data_arguments, add_inference_arguments, setup_logging, tool_parser


def test_tool_parser_takes_model_data_and_inference_arguments():
    parser = tool_parser("doc")
    add_data_arguments(parser, "Evaluate")
    add_inference_arguments(parser, batch_size=7)
    args = parser.parse_args(["--model", "m", "--data_dir", "d", "--image_size", "48", "--seed", "3"])
    assert vars(args) == {
        "model": "m", "recipe": None, "data_dir": "d", "seed": 3, "image_size": 48, "batch_size": 7, "device": None,
    }  # fmt: skip


def test_recipe_and_data_dir_exclude_each_other_and_model_is_required(capsys):
    parser = tool_parser("doc")
    add_data_arguments(parser, "Evaluate")
    with pytest.raises(SystemExit):
        parser.parse_args(["--model", "m", "--recipe", "r", "--data_dir", "d"])
    assert "not allowed with argument" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser.parse_args([])
    assert "--model" in capsys.readouterr().err


def test_setup_logging_shows_vit_ft_info_on_stdout(capsys):
    root = logging.getLogger()
    handlers = list(root.handlers)
    root.handlers = []  # basicConfig only configures a root logger without handlers
    try:
        setup_logging(timestamps=False)
        logging.getLogger("vit_ft.test").info("hello")
        assert "INFO vit_ft.test: hello" in capsys.readouterr().out
    finally:
        root.handlers = handlers

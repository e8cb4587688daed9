"""vit_ft.utils.cli: the arguments and logging the command-line tools share."""

import logging

import pytest

from vit_ft.utils.cli import (
    add_data_arguments,
    add_inference_arguments,
    error_line,
    run_tool,
    setup_logging,
    tool_parser,
)


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


def _raises(error: BaseException):
    def main(argv):
        raise error

    return main


@pytest.mark.parametrize(
    ("error", "line"),
    [
        (ValueError("--top_k 0 must be positive; pass e.g. --top_k 5."), "error: --top_k 0 must be positive; pass e.g. --top_k 5."),
        (FileNotFoundError(2, "No such file or directory", "x.png"), "error: x.png: no such file or folder. Check the path."),
        (OSError("weights\n  cannot\tbe read"), "error: weights cannot be read."),
        (KeyError("no column 'img'; pass --image_column"), "error: no column 'img'; pass --image_column."),
        (KeyboardInterrupt(), "error: interrupted."),
    ],
)  # fmt: skip
def test_run_tool_turns_a_users_error_into_one_line_and_exit_1(monkeypatch, capsys, error, line):
    """Exit 1, or 130 (the shell's code for Ctrl-C) for an interrupt."""
    monkeypatch.delenv("VIT_FT_DEBUG", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        run_tool(_raises(error), [])
    assert exit_info.value.code == (130 if isinstance(error, KeyboardInterrupt) else 1)
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [error_line(error)] and err.startswith(line), err
    assert "Traceback" not in err


def test_run_tool_removes_debug_and_shows_the_traceback_with_it_or_the_variable(monkeypatch, capsys):
    seen = []
    monkeypatch.delenv("VIT_FT_DEBUG", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        run_tool(lambda argv: seen.append(argv), ["--model", "m", "--debug"])
    assert exit_info.value.code == 0 and seen == [["--model", "m"]]
    for argv, env in ((["--debug"], None), ([], "1")):
        if env is not None:
            monkeypatch.setenv("VIT_FT_DEBUG", env)
        with pytest.raises(SystemExit):
            run_tool(_raises(ValueError("bad value. Fix it.")), argv)
        err = capsys.readouterr().err
        assert "Traceback" in err and err.strip().splitlines()[-1] == "error: bad value. Fix it."


def test_run_tool_lets_a_programming_error_keep_its_traceback(monkeypatch):
    monkeypatch.delenv("VIT_FT_DEBUG", raising=False)
    with pytest.raises(TypeError):
        run_tool(_raises(TypeError("a bug")), [])


def test_run_tool_says_where_an_interrupted_run_stands(monkeypatch, capsys):
    monkeypatch.delenv("VIT_FT_DEBUG", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        run_tool(_raises(KeyboardInterrupt()), [], interrupted=lambda: "interrupted; resume with --resume.")
    assert exit_info.value.code == 130
    assert capsys.readouterr().err.strip() == "error: interrupted; resume with --resume."


def test_run_tool_closes_open_progress_bars_before_the_interrupted_line(monkeypatch):
    """A bar left open would redraw itself at exit, after the one line."""
    import io

    from tqdm.auto import tqdm

    monkeypatch.delenv("VIT_FT_DEBUG", raising=False)
    bar = tqdm(total=10, file=io.StringIO())

    def interrupted(argv):
        bar.update(3)
        raise KeyboardInterrupt

    with pytest.raises(SystemExit):
        run_tool(interrupted, [])
    assert bar not in tqdm._instances and bar.disable  # closed

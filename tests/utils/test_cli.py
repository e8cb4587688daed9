"""vit_ft.utils.cli: the error handling the command-line tools share."""

import pytest

from vit_ft.utils.cli import error_line, run_tool


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

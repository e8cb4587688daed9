"""vit_ft.utils.logs: the one logging setup, for the tools and the fine-tune."""

import logging

import pytest

from vit_ft.utils.logs import setup_logging


@pytest.fixture
def bare_root():
    """A function that empties the root logger's handlers (basicConfig only configures a root logger without
    any; pytest adds its own when the test starts, so the test calls it); handlers and levels are restored."""
    root = logging.getLogger()
    handlers = list(root.handlers)
    levels = {name: logging.getLogger(name).level for name in ("vit_ft", "__main__")}
    yield lambda: setattr(root, "handlers", [])
    root.handlers = handlers
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


def test_setup_logging_shows_vit_ft_info_on_stdout(capsys, bare_root):
    bare_root()
    setup_logging(timestamps=False)
    logging.getLogger("vit_ft.test").info("hello")
    assert "INFO vit_ft.test: hello" in capsys.readouterr().out


def test_the_fine_tune_setting_quiets_other_processes_and_sets_the_libraries(capsys, bare_root):
    import transformers

    before = transformers.utils.logging.get_verbosity()
    bare_root()
    try:
        setup_logging(level=logging.WARNING, library_level=logging.ERROR, loggers=("vit_ft", "__main__"))
        logging.getLogger("vit_ft.test").info("not on this process")
        logging.getLogger("__main__").warning("shown")
        out = capsys.readouterr().out
        assert "not on this process" not in out and "WARNING __main__: shown" in out
        assert transformers.utils.logging.get_verbosity() == logging.ERROR
    finally:
        transformers.utils.logging.set_verbosity(before)

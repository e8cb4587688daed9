"""vit_ft.utils.logs: the one logging setup, for the tools and the fine-tune."""

import logging
import os

import pytest

from vit_ft.utils.logs import setup_logging


@pytest.fixture
def bare_root():
    """A function that empties the root logger's handlers (basicConfig only configures a root logger without
    any; pytest adds its own when the test starts, so the test calls it); handlers and levels are restored."""
    from datasets.utils import enable_progress_bars, is_progress_bar_enabled

    root = logging.getLogger()
    handlers = list(root.handlers)
    levels = {name: logging.getLogger(name).level for name in ("vit_ft", "__main__")}
    bars = is_progress_bar_enabled()  # setup_logging turns them off where stderr is not a terminal
    yield lambda: setattr(root, "handlers", [])
    root.handlers = handlers
    if bars:
        enable_progress_bars()
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


def test_a_log_that_is_not_a_terminal_gets_no_library_bars(monkeypatch):
    import datasets.utils
    import transformers

    from vit_ft.utils.logs import plain_library_logs

    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    monkeypatch.delenv("HF_DATASETS_DISABLE_PROGRESS_BARS", raising=False)
    datasets.utils.enable_progress_bars()
    transformers.utils.logging.enable_progress_bar()
    try:
        plain_library_logs(terminal=True)  # a terminal keeps them
        assert (
            datasets.utils.is_progress_bar_enabled() and transformers.utils.logging.is_progress_bar_enabled()
        )
        plain_library_logs(terminal=False)  # Slurm, nohup, accelerate launch's pipe
        assert not datasets.utils.is_progress_bar_enabled()
        assert not transformers.utils.logging.is_progress_bar_enabled()
        assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"  # libraries imported later, and workers
    finally:
        datasets.utils.enable_progress_bars()
        transformers.utils.logging.enable_progress_bar()
        import huggingface_hub.utils

        huggingface_hub.utils.enable_progress_bars()

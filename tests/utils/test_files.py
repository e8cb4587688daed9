"""vit_ft.utils.files: a file or folder appears whole, with the mode open()/mkdir give, or not at all."""

import os
import stat

import pytest

from vit_ft.utils.files import (
    MAX_STEM_BYTES,
    file_stem,
    move_into_place,
    staged_file,
    staged_folder,
    temporary_sibling,
    write_text_atomically,
)


def _mode(path):
    return stat.S_IMODE(path.stat().st_mode)


def _umask():
    umask = os.umask(0)
    os.umask(umask)
    return umask


def test_write_text_atomically_replaces_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "sub" / "a.json"
    target.parent.mkdir()
    target.write_text("old")
    assert write_text_atomically(target, "new é") == target
    assert target.read_text(encoding="utf-8") == "new é"
    assert _mode(target) == 0o666 & ~_umask()
    assert sorted(p.name for p in target.parent.iterdir()) == ["a.json"]


def test_staged_file_keeps_the_old_file_when_writing_fails(tmp_path):
    target = tmp_path / "figure.png"
    target.write_text("old")
    with pytest.raises(RuntimeError), staged_file(target) as partial:
        assert partial.parent == tmp_path and partial.name.startswith(".figure.png.")
        assert partial.suffix == ".png"  # savefig picks the format from it
        partial.write_text("half")
        raise RuntimeError("drawing failed")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["figure.png"]


def test_temporary_sibling_and_move_into_place(tmp_path):
    target = tmp_path / "new" / "preds.csv"
    partial = temporary_sibling(target)
    assert partial.parent == target.parent and partial.stat().st_size == 0
    assert _mode(partial) == 0o600  # mkstemp's
    move_into_place(partial, target)
    assert target.is_file() and not partial.exists() and _mode(target) == 0o666 & ~_umask()


def test_staged_folder_replaces_a_folder_whole(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "stale.bin").write_text("x")
    with staged_folder(folder) as partial:
        (partial / "config.json").write_text("{}")
    assert [p.name for p in folder.iterdir()] == ["config.json"]
    assert _mode(folder) == 0o777 & ~_umask()  # not mkdtemp's 0700
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_staged_folder_keeps_the_old_folder_when_writing_fails(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "old.bin").write_text("x")
    with pytest.raises(RuntimeError), staged_folder(folder) as partial:
        (partial / "half.bin").write_text("x")
        raise RuntimeError
    assert [p.name for p in folder.iterdir()] == ["old.bin"]
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_staged_folder_without_replace_leaves_a_folder_another_process_wrote(tmp_path):
    folder = tmp_path / "digits"
    with pytest.raises(OSError), staged_folder(folder, replace=False) as partial:
        (partial / "mine").write_text("x")
        folder.mkdir()
        (folder / "theirs").write_text("x")
    assert [p.name for p in folder.iterdir()] == ["theirs"]
    assert [p.name for p in tmp_path.iterdir()] == ["digits"]


def test_file_stem_keeps_short_names_and_shortens_long_ones_with_a_hash():
    assert file_stem("golden retriever/2") == "golden_retriever_2"
    long_a, long_b = "x" * 300, "x" * 299 + "y"
    assert len(file_stem(long_a).encode()) <= MAX_STEM_BYTES
    assert file_stem(long_a).startswith("x" * 100) and file_stem(long_a) != file_stem(long_b)
    assert len(file_stem("é" * 200).encode()) <= MAX_STEM_BYTES

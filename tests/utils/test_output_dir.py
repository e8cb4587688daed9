"""vit_ft.utils.output_dir: the one output-folder guard, as the fine-tune, sweep, few-shot and push use it,
and `OutputFiles`, the rule that keeps a user's files in a folder a command writes into."""

import errno
import json
import os
import re

import pytest

from vit_ft.utils.output_dir import OUTPUT_RECORD, OutputFiles, check_output_dir, record_outputs, written_by
from vit_ft.utils.run_record import write_run_record


def test_a_new_or_empty_folder_is_accepted(tmp_path):
    assert check_output_dir(tmp_path / "new") == tmp_path / "new"
    assert check_output_dir(tmp_path, finished="run") == tmp_path


def test_a_file_is_refused_naming_the_flag_and_what_goes_there(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(
        NotADirectoryError, match=r"^--output_dir .*f is a file, not a folder; pass another --output_dir\.$"
    ):
        check_output_dir(tmp_path / "f")
    with pytest.raises(
        NotADirectoryError, match=r"is a file, not a folder; pass a folder for a.md, a.png\.$"
    ):
        check_output_dir(tmp_path / "f", holds="a.md, a.png")


def test_a_finished_run_is_refused_unless_the_caller_allows_it(tmp_path):
    write_run_record(tmp_path, {"finished": True})
    with pytest.raises(FileExistsError, match=r"holds a finished run, whose model .*--overwrite_output_dir"):
        check_output_dir(
            tmp_path, finished="run, whose model this run would replace; pass --overwrite_output_dir."
        )
    check_output_dir(tmp_path)  # finished=None: allowed (overwrite or resume)
    check_output_dir(tmp_path, finished=lambda folder: None)
    with pytest.raises(FileExistsError, match="holds a finished sweep"):
        check_output_dir(tmp_path, finished=lambda folder: "sweep, ...")
    write_run_record(tmp_path, {"finished": False})
    check_output_dir(tmp_path, finished="run")  # an unfinished run is resumed or replaced by the caller


def test_inside_an_input_folder_is_refused(tmp_path):
    data = tmp_path / "data"
    (data / "cat").mkdir(parents=True)
    with pytest.raises(
        ValueError, match=r"--output_dir .* is inside the input folder .*data; pass a folder outside"
    ):
        check_output_dir(data / "cat", inputs=[data, "google/vit-base-patch16-224"])
    with pytest.raises(ValueError, match="inside the input folder"):
        check_output_dir(data, inputs=[data])
    assert check_output_dir(tmp_path / "reports", inputs=[data]) == (tmp_path / "reports").resolve()


def test_new_refuses_anything_that_exists(tmp_path):
    with pytest.raises(FileExistsError, match=r"exists; stage into a new folder\.$"):
        check_output_dir(tmp_path, flag="--local_dir", new="stage into a new folder")
    (tmp_path / "f").write_text("x")
    with pytest.raises(FileExistsError, match="exists; stage into a new folder"):
        check_output_dir(tmp_path / "f", flag="--local_dir", new="stage into a new folder")
    check_output_dir(tmp_path / "staged", flag="--local_dir", new="stage into a new folder")


def test_an_input_reached_through_a_link_or_a_folder_not_made_yet_is_refused(tmp_path):
    """The fine-tune's --model_name_or_path pre --output_dir pre (or pre/run, or a link to pre): refused."""
    base = tmp_path / "pre"
    base.mkdir()
    (tmp_path / "link").symlink_to(base)
    for output in (base, base / "run" / "deeper", tmp_path / "link", tmp_path / "link" / "run"):
        with pytest.raises(ValueError, match="inside the input folder"):
            check_output_dir(output, inputs=[base])
    with pytest.raises(ValueError, match="inside the input folder"):
        check_output_dir(base, inputs=[tmp_path / "link"])
    check_output_dir(tmp_path / "pre-run", inputs=[base])  # a sibling whose name starts alike is not inside


# --- OutputFiles: a command replaces only its own files in its output folder ------------------------------

REPORT = OutputFiles("report", ("report.md", "figure.png", "extra.csv", "sub/table.csv"), "a report")
EXPORT_LIKE = OutputFiles("export", ("model.onnx", "config.json"), "an export", own_needs_overwrite=True)


def _write(folder, names, text):
    with REPORT.staged(folder) as staging:
        for name in names:
            (staging / name).parent.mkdir(parents=True, exist_ok=True)
            (staging / name).write_text(text)


def _old(path, text="mine"):
    """A user's file, a year old: its bytes and mtime are what must survive."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, (1e9, 1e9))
    return path


def test_the_commands_files_replace_only_their_earlier_selves(tmp_path):
    folder = tmp_path / "out"
    neighbours = [_old(folder / "notes.txt"), _old(folder / "sub" / "keep.csv"), _old(folder / "README.md")]
    _write(folder, ["report.md", "extra.csv", "sub/table.csv"], "first")
    assert written_by(folder, "report") == {"report.md", "extra.csv", "sub/table.csv"}
    _write(folder, ["report.md", "figure.png"], "second")  # again: no --overwrite needed for its own files
    assert (folder / "report.md").read_text() == (folder / "figure.png").read_text() == "second"
    # its earlier files not written again are removed: a report never sits beside another run's table
    assert not (folder / "extra.csv").exists() and not (folder / "sub" / "table.csv").exists()
    for path in neighbours:
        assert path.read_text() == "mine" and path.stat().st_mtime == 1e9
    assert written_by(folder, "report") == {"report.md", "figure.png"}
    hidden = sorted(p.name for p in folder.iterdir() if p.name.startswith("."))
    assert hidden == [OUTPUT_RECORD]  # no staging folder left


@pytest.mark.parametrize(
    ("files", "command", "overwrite", "words"),
    [
        # a user's file of the command's names: refused, naming it and the fix
        ({"report.md": "mine"}, REPORT, False, r"holds report.md, not written there by vit_ft report; pass "
         r"--overwrite to replace it \(the folder's other files are kept\), or another --output_dir\.$"),
        ({"report.md": "", "figure.png": "", "extra.csv": "", "sub/table.csv": ""}, REPORT, False,
         r"holds extra.csv, figure.png, report.md and 1 more, not written .* replace them"),
        # an export's own earlier files: replaced only when asked
        ({"model.onnx": "own"}, EXPORT_LIKE, False, r"holds an export \(model.onnx\); pass --overwrite to "
         r"replace it \(the folder's other files are kept\), or another --output_dir\.$"),
        ({"sub/table.csv/": None}, REPORT, True, r"table.csv is a folder, where report writes a file of a "
         r"report; move it away, or pass another --output_dir\.$"),
    ],
)  # fmt: skip
def test_refused_before_anything_loads(tmp_path, files, command, overwrite, words):
    for name, text in files.items():
        if text is None:
            (tmp_path / name).mkdir(parents=True)
        else:
            _old(tmp_path / name, text)
    if command is EXPORT_LIKE:
        record_outputs(tmp_path, "export", files)
    before = {p: p.stat().st_mtime for p in tmp_path.rglob("*")}
    with pytest.raises(OSError, match=words):
        command.check(tmp_path, overwrite)
    with pytest.raises(OSError, match=words), command.staged(tmp_path, overwrite) as staging:  # checked again
        for name in files:
            (staging / name.rstrip("/")).parent.mkdir(parents=True, exist_ok=True)
            (staging / name.rstrip("/")).write_text("new")
    assert {p: p.stat().st_mtime for p in tmp_path.rglob("*")} == before  # nothing moved, nothing left


def test_overwrite_replaces_the_users_files_of_its_names_and_keeps_the_rest(tmp_path):
    users = _old(tmp_path / "report.md")
    stale = _old(tmp_path / "extra.csv")  # one of its names, written before the record was kept
    kept = _old(tmp_path / "notes.txt")
    REPORT.check(tmp_path, overwrite=True)
    _old(tmp_path / "model.onnx")
    EXPORT_LIKE.check(tmp_path, overwrite=True)
    with REPORT.staged(tmp_path, overwrite=True) as staging:
        (staging / "report.md").write_text("new")
    assert users.read_text() == "new" and not stale.exists()
    assert kept.read_text() == "mine" and kept.stat().st_mtime == 1e9
    assert (tmp_path / "model.onnx").read_text() == "mine"  # another command's names: not this one's to touch


def test_a_failure_while_writing_changes_nothing(tmp_path):
    folder = tmp_path / "new"
    with pytest.raises(KeyError), REPORT.staged(folder) as staging:
        (staging / "report.md").write_text("half")
        raise KeyError("boom")
    assert not folder.exists()  # created for the write, removed with it
    _old(tmp_path / "report.md")
    record_outputs(tmp_path, "report", ["report.md"])
    with pytest.raises(KeyError), REPORT.staged(tmp_path) as staging:
        (staging / "report.md").write_text("half")
        raise KeyError("boom")
    assert (tmp_path / "report.md").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == [OUTPUT_RECORD, "report.md"]


def test_a_full_disk_is_the_one_line_naming_the_file_and_the_fix(tmp_path):
    folder = tmp_path / "out"
    keep = _old(folder / "notes.txt")
    with pytest.raises(OSError) as info, REPORT.staged(folder) as staging:
        (staging / "report.md").write_text("x")
        raise OSError(errno.ENOSPC, "No space left on device", str(staging / "figure.png"))
    line = str(info.value)
    assert info.value.errno == errno.ENOSPC and "\n" not in line and "Errno" not in line
    assert re.fullmatch(
        rf"no space left on the disk holding {re.escape(str(folder / 'figure.png'))} "
        r"\(\S+ \w?B free there\); "
        rf"nothing in {re.escape(str(folder))} was changed\. "
        r"Free some space, or pass --output_dir on another disk\.",
        line,
    ), line
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"] and keep.stat().st_mtime == 1e9


@pytest.mark.parametrize("record", ["not json", "[1, 2]", '{"report": "report.md"}', '{"report": [1]}'])
def test_an_unreadable_record_lists_nothing(tmp_path, record):
    (tmp_path / OUTPUT_RECORD).write_text(record)
    assert written_by(tmp_path, "report") == set()
    record_outputs(tmp_path, "report", ["report.md"])
    assert json.loads((tmp_path / OUTPUT_RECORD).read_text()) == {"report": ["report.md"]}

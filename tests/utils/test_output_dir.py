"""vit_ft.utils.output_dir: the one output-folder guard, as the fine-tune, sweep, few-shot and push use it."""

import pytest

from vit_ft.utils.output_dir import check_output_dir
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

"""vit_ft.utils.hub_ids: one answer to "is this a Hub repository id?" (huggingface_hub's validate_repo_id)."""

import pytest

from vit_ft.utils.hub_ids import check_hub_id, is_hub_id, is_hub_model, looks_like_path


@pytest.mark.parametrize(
    "name", ["vit", "me/vit-dogs", "google/vit-base-patch16-224", "_private", "a.b/c_d", "123"]
)
def test_hub_ids(name):
    assert is_hub_id(name) and not looks_like_path(name)
    check_hub_id(name)


# Where the two regexes this module replaced disagreed (tools.inference's, reports.reporting's), and names
# both let through although the Hub refuses them: each is now refused everywhere.
@pytest.mark.parametrize(
    "name",
    [
        "vit-",  # ends in '-': both regexes took it
        "me/vit.",  # ends in '.'
        "me/.vit",  # a name starting with '.': reporting's took it
        "me/-vit",  # a name starting with '-': reporting's took it
        "vit\n",  # reporting's `$` matched before the newline
        "café/vit",  # reporting's \w took non-ASCII letters
        "me/vit--dogs",  # '--' and '..' are reserved
        "me/vit..dogs",
        "me/vit.git",
        "a" * 97,  # longer than 96
        "a/b/c",
        "",
        None,
        3,
    ],
)
def test_not_hub_ids(name):
    assert not is_hub_id(name)
    with pytest.raises(ValueError, match="is not a repo id; a repo id is 'namespace/name'"):
        check_hub_id(name)


def test_underscore_first_is_a_hub_id_for_all_callers():
    """tools.inference took a leading '_', reporting's regex did not (the model card dropped the link)."""
    assert is_hub_id("_private/vit") and is_hub_model("_private/vit")


@pytest.mark.parametrize("name", ["/abs/model", "./model", "../model", "~/model", "model-", "my model"])
def test_paths(name):
    assert looks_like_path(name)


@pytest.mark.parametrize(
    "name, is_path",
    [
        ("outputs/digitz", True),  # its namespace, outputs/, is a folder here: a path, even though it is missing
        ("outputs", False),  # a bare name is a Hub id unless it exists
        ("me/vit", False),  # no folder me/ here: a Hub id
        ("./me/vit", True),
        ("outputs/digits/checkpoint-5", True),  # more than one slash
    ],
)
def test_a_namespace_that_is_a_local_folder_makes_a_path(tmp_path, monkeypatch, name, is_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "outputs" / "digits").mkdir(parents=True)
    assert looks_like_path(name) is is_path


def test_a_local_folder_is_not_a_hub_model(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "outputs" / "digits").mkdir(parents=True)
    assert is_hub_id("outputs/digits") and not is_hub_model("outputs/digits")
    assert is_hub_model("outputs/dogs")


def test_check_hub_id_names_the_flag():
    with pytest.raises(ValueError, match=r"^--repo 'a/b/c' is not a repo id"):
        check_hub_id("a/b/c", flag="--repo")


def test_without_network_a_missing_folder_still_fails_and_an_uncached_hub_id_is_named(tmp_path, monkeypatch):
    """`--print_plan`'s check: the local answers stand, the Hub is never asked (offline or not)."""
    from huggingface_hub import constants

    from vit_ft.utils import hub_ids

    def asked(*args, **kwargs):
        raise AssertionError("the Hub was asked")

    monkeypatch.setattr(hub_ids, "check_hub_reachable", asked)
    (tmp_path / "model").mkdir()
    for offline in (False, True):
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
        with hub_ids.without_network() as unchecked:
            hub_ids.check_reference(tmp_path / "model", "--model here", "a folder")
            with pytest.raises(FileNotFoundError, match="no such folder; did you mean"):
                hub_ids.check_reference(tmp_path / "modle", "--model typo", "a folder")
            hub_ids.check_reference("me/not-cached", "--model me/not-cached", "a folder", cache_dir=tmp_path)
        assert len(unchecked) == 1 and unchecked[0].startswith("--model me/not-cached: a Hub id, not in the Hub cache")
        assert ("offline mode" in unchecked[0]) is offline
    with pytest.raises(AssertionError, match="the Hub was asked"):  # outside it, the Hub is asked as before
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        hub_ids.check_reference("me/not-cached", "--model me/not-cached", "a folder", cache_dir=tmp_path)

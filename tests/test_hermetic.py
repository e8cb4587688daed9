"""The suite is hermetic: no test reads the checkout's outputs/ or data/, the user's Hugging Face cache, or the Hub
variables of the user's shell (issue 44 item 4, issue 53 item 4)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO, tiny_hf_config
from .fake_hub import HUB_VARIABLES

# what a cluster's shell exports, every value wrong for the suite
HOSTILE = {"HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "0", "HF_EVALUATE_OFFLINE": "1",
           "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": "/nonexistent/hf-home", "HF_TOKEN": "hf_not_a_token"}  # fmt: skip


def test_every_test_runs_in_an_empty_folder_of_its_own(tmp_path):
    assert Path.cwd() == tmp_path and not any(tmp_path.iterdir())


def test_the_suite_sets_its_own_hub_variables_whatever_the_shell_exports(tmp_path):
    assert set(HOSTILE) == set(HUB_VARIABLES)
    probe = f"import os, tests.conftest\nprint({{k: os.environ.get(k) for k in {HUB_VARIABLES!r}}})"
    env = {**os.environ, **HOSTILE, "PYTHONPATH": str(REPO)}
    ran = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    seen = eval(ran.stdout.strip().splitlines()[-1])  # noqa: S307 - our own probe's dict
    assert seen["HF_HUB_OFFLINE"] == "1" and seen["HF_DATASETS_OFFLINE"] == "1"
    assert seen["TRANSFORMERS_OFFLINE"] is seen["HF_EVALUATE_OFFLINE"] is seen["HF_TOKEN"] is seen["HF_ENDPOINT"] is None
    assert seen["HF_HOME"] != HOSTILE["HF_HOME"] and not seen["HF_HOME"].startswith(str(Path.home()))


def test_a_checkout_holding_another_runs_outputs_changes_no_result(tmp_path):
    """The README's first command leaves outputs/digits-pretrained and data/digits in the checkout; the two tests
    that read the working folder failed there. Here the folder pytest starts in holds that, and an outputs/ of
    another family (a SigLIP config where the digits backbone belongs)."""
    from transformers import SiglipVisionConfig, ViTModel

    ViTModel(tiny_hf_config()).save_pretrained(tmp_path / "outputs" / "digits-pretrained")
    (tmp_path / "outputs" / "digits").mkdir()
    SiglipVisionConfig().save_pretrained(tmp_path / "outputs" / "mine")
    (tmp_path / "data" / "digits" / "train").mkdir(parents=True)
    tests = ["tests/arguments/test_recipes.py::test_a_model_flag_drops_the_recipes_pretraining_unless_it_is_given_too",
             "tests/arguments/test_pooling.py::test_a_recipe_of_cls_pooling_with_a_siglip_checkpoint_is_refused_in_parse_args"]  # fmt: skip

    class Outcomes:  # what the inner session ran, test by test
        def __init__(self):
            self.seen: dict[str, str] = {}

        def pytest_runtest_logreport(self, report):
            if report.when == "call" or report.outcome != "passed":
                self.seen[report.nodeid] = report.outcome

    # in this process (pytester's in-process run): the inner session starts in tmp_path, as pytest started there
    outcomes = Outcomes()
    # (a --basetemp of its own: the default one would make it prune the outer sessions' folders)
    code = pytest.main(["-q", "-p", "no:cacheprovider", "-p", "no:xdist", "--rootdir", str(REPO), "--basetemp",
                        str(tmp_path / "inner"), *(str(REPO / test) for test in tests)], plugins=[outcomes])  # fmt: skip
    assert code == 0 and len(outcomes.seen) == 4 and set(outcomes.seen.values()) == {"passed"}, outcomes.seen

"""vit_ft.tools.trained: the one reader of a trained model (full, merged and LoRA folders, preprocessing, run
record) that predict, evaluate, inspect, push and the demo all use, reading the folder once."""

import collections
import json
import subprocess
import sys
from pathlib import Path

import pytest

from vit_ft import ViTFTForImageClassification
from vit_ft.tools import trained
from vit_ft.tools.evaluate.run import run_evaluation
from vit_ft.tools.export.hub import stage_for_hub
from vit_ft.tools.inspect.run import run_inspection
from vit_ft.tools.predict.run import run_prediction

from ..conftest import REPO, randomize, tiny_ft_config


@pytest.fixture
def loads(monkeypatch):
    """Records every model that goes through `trained.load_model`, the one place models are loaded."""
    calls = []
    real = trained.load_model
    monkeypatch.setattr(
        trained, "load_model", lambda origin, **kw: calls.append(origin.name) or real(origin, **kw)
    )
    return calls


def test_every_tool_loads_through_the_one_loader(tiny_finetuned_dir, tmp_path, loads):
    test_dir = json.loads((tiny_finetuned_dir / "vit_ft_run.json").read_text())["data"]["test_dir"]
    image = next(p for p in sorted(Path(test_dir).glob("*/*.png")))
    model = str(tiny_finetuned_dir)
    run_prediction(model, [image], tmp_path / "preds.csv", progress=False)
    assert loads == [model]
    run_evaluation(model, tmp_path / "eval", max_samples=8, progress=False)
    assert loads == [model] * 2
    run_inspection(model, tmp_path / "inspect", num_images=2, progress=False)
    assert loads == [model] * 3
    stage_for_hub(tiny_finetuned_dir, tmp_path / "staged", "me/digits", format="transformers")
    assert loads == [model] * 4
    sys.path.insert(0, str(REPO / "demo"))
    try:
        from app import Classifier as DemoClassifier
    finally:
        sys.path.remove(str(REPO / "demo"))
    DemoClassifier(tiny_finetuned_dir)
    assert loads == [model] * 5


def test_loaded_classifier_brings_preprocessing_labels_and_record(tiny_finetuned_dir):
    classifier = trained.load_trained(tiny_finetuned_dir, device="cpu")
    processor = json.loads((tiny_finetuned_dir / "preprocessor_config.json").read_text())
    assert classifier.preprocessing.image_size == (processor["size"]["height"], processor["size"]["width"])
    assert list(classifier.preprocessing.mean) == processor["image_mean"]
    assert classifier.id2label == {int(k): v for k, v in classifier.model.config.id2label.items()}
    assert classifier.run_record == json.loads((tiny_finetuned_dir / "vit_ft_run.json").read_text())


def test_a_plain_folder_loads_without_importing_peft(tmp_path):
    model = randomize(ViTFTForImageClassification(tiny_ft_config(num_labels=3)))
    model.save_pretrained(tmp_path)
    script = (
        "import sys\nfrom vit_ft.tools.trained import load_trained\n"
        f"load_trained({str(tmp_path)!r}, device='cpu')\nprint('peft' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "False"


def test_an_evaluation_reads_the_folders_record_and_processor_once(tiny_finetuned_dir, tmp_path, monkeypatch):
    """The run record, the image processor and the training curves are read once in a whole evaluation (the
    loader, the recorded data, the report's link and the curves' copy all take them from the loaded model)."""
    reads = collections.Counter()
    read_text = Path.read_text

    def counting(path, *args, **kwargs):
        reads[path.name] += 1
        return read_text(path, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", counting)
    run_evaluation(str(tiny_finetuned_dir), tmp_path / "eval", max_samples=8, progress=False)
    assert reads["vit_ft_run.json"] == 1 and reads["preprocessor_config.json"] == 1
    assert (tmp_path / "eval" / "training_curves.png").is_file()  # found through the origin's run folder


def test_locate_says_where_a_model_comes_from(tmp_path, monkeypatch):
    monkeypatch.setattr("vit_ft.utils.hub_ids.in_hub_cache", lambda *a, **k: True)  # offline mode can load it
    hub = trained.locate("me/vit-dogs")  # no such folder here: a Hub id
    assert hub.hub_id == "me/vit-dogs" and hub.path is None and hub.record is None and hub.run_folder is None
    out = tmp_path / "out"
    (out / "adapter").mkdir(parents=True)
    (out / "adapter" / "adapter_config.json").write_text("{}")
    (out / "vit_ft_run.json").write_text(json.dumps({"recipe": "r", "finished": True}))
    for given in (out, out / "adapter"):
        origin = trained.locate(given)
        assert origin.run_folder == out and origin.adapter == out / "adapter" and origin.loads_adapter
        assert origin.record == {"recipe": "r", "finished": True} and origin.hub_id is None
    (out / "config.json").write_text("{}")  # a LoRA run's merged model beside its adapter: loaded as is
    assert not trained.locate(out).loads_adapter and trained.locate(out / "adapter").loads_adapter
    (out / "vit_ft_run.json").write_text(json.dumps({"recipe": "r", "finished": False}))
    with pytest.raises(ValueError, match="did not finish .* resume it"):
        trained.locate(out)
    with pytest.raises(FileNotFoundError, match="no such folder"):
        trained.locate(tmp_path / "missing")

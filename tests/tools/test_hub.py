"""Sharing on the Hub: the whole push path against a local stand-in for the Hub API, then a clean load."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from peft import LoraConfig, PeftModel, get_peft_model
from PIL import Image
from transformers import ViTForImageClassification, ViTImageProcessorPil

from vit_ft import ViTFTForImageClassification
from vit_ft.tools.export.hub import push_output_dir, stage_for_hub
from vit_ft.tools.predict.run import predict_files
from vit_ft.tools.trained import load_trained

from ..conftest import REPO, WITHOUT_VIT_FT
from ..fake_hub import FakeHub, git_blob_id

# the code a saved model folder carries: the model file and what it imports (no loading or conversion code)
CODE_FILES = {"modeling_vit_ft.py", "configuration_vit_ft.py", "pos_embed.py", "rotary.py", "inputs.py", "norms.py",
              "naflex.py", "knn_head.py", "prompts.py", "sizes.py"}
RECORD_FILES = {
    "labels.json",
    "training_curves.png",
    "vit_ft_run.json",
    "all_results.json",
    "eval_results.json",
}

# A fresh interpreter in which `import vit_ft` fails, as on a machine that only has transformers: loads the
# received vit_ft repo with its own code and the default push with none (AutoModel and pipeline(), as a user
# and the Hub's widget do), and runs them on the same pixels and images.
CLEAN_PROCESS = WITHOUT_VIT_FT + textwrap.dedent(
    """
    import json, sys
    import torch
    from transformers import AutoModelForImageClassification, pipeline
    vit_ft_repo, default_repo, pixels_path, out_path, *images = sys.argv[1:]
    remote = AutoModelForImageClassification.from_pretrained(vit_ft_repo, trust_remote_code=True).eval()
    plain = AutoModelForImageClassification.from_pretrained(default_repo).eval()
    classify = pipeline("image-classification", model=default_repo)
    assert "vit_ft" not in sys.modules
    pixels = torch.load(pixels_path)
    with torch.no_grad():
        out = {"remote_cls": type(remote).__module__ + "." + type(remote).__name__,
               "plain_cls": type(plain).__module__ + "." + type(plain).__name__,
               "remote": remote(pixels).logits.tolist(), "plain": plain(pixels).logits.tolist()}
    out["pipeline"] = [classify(image, top_k=5) for image in images]
    json.dump(out, open(out_path, "w"))
    """
)


def push_env(hub: FakeHub, tmp: Path) -> dict[str, str]:
    """The environment of a push: the fake Hub's endpoint and a dummy token, set before huggingface_hub loads."""
    return hub.env(tmp)


@pytest.fixture(scope="module")
def pushed(tiny_finetuned_dir, tmp_path_factory):
    """The default push and `--format vit_ft` by `scripts/push_to_hub.py` (two processes at once) to one fake
    Hub."""
    tmp = tmp_path_factory.mktemp("push")
    script = str(REPO / "scripts" / "push_to_hub.py")
    runs = {
        "vit_ft": [tiny_finetuned_dir, "--hub_model_id", "me/vit-digits", "--private", "--format", "vit_ft"],
        "default": [tiny_finetuned_dir, "--hub_model_id", "vit-digits-hf"],
    }
    with FakeHub() as hub:
        env = push_env(hub, tmp)
        procs = {
            name: subprocess.Popen(
                [sys.executable, script, *map(str, args)],
                cwd=tmp,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for name, args in runs.items()
        }
        outputs = {name: proc.communicate(timeout=300) for name, proc in procs.items()}
        for name, proc in procs.items():
            assert proc.returncode == 0, f"{name} push failed:\n{outputs[name][1][-4000:]}"
        yield hub, {name: out for name, (out, _) in outputs.items()}  # still serving: the repos load by id


def card_metadata(readme: bytes) -> tuple[dict, str]:
    _, front, body = readme.decode().split("---\n", 2)
    return yaml.safe_load(front), body


def test_push_sends_a_complete_vit_ft_repo(pushed, tiny_finetuned_dir):
    hub, stdout = pushed
    assert not hub.unexpected, f"calls the fake Hub does not know: {hub.unexpected}"
    created = {c["name"]: c for c in hub.created}
    assert created["vit-digits"]["organization"] == "me" and created["vit-digits"]["visibility"] == "private"
    files = hub.repos["me/vit-digits"]
    assert {
        "README.md",
        "config.json",
        "model.safetensors",
        "preprocessor_config.json",
    } | CODE_FILES | RECORD_FILES <= set(files)
    assert not [f for f in files if f.startswith("checkpoint-") or f.endswith((".bin", ".pt", ".pth"))]

    config = json.loads(files["config.json"])
    assert config["model_type"] == "vit_ft" and config["image_size"] == [32, 32]
    assert (
        config["auto_map"]["AutoModelForImageClassification"] == "modeling_vit_ft.ViTFTForImageClassification"
    )
    assert config["id2label"] == {str(i): str(i) for i in range(10)} and config["label2id"]["7"] == 7
    processor = json.loads(files["preprocessor_config.json"])
    # resize the shorter side and centre-crop, as our evaluation does (`hub.evaluation_image_processor`)
    assert processor["size"] == {"shortest_edge": 32} and processor["crop_size"] == {"height": 32, "width": 32}
    assert processor["resample"] == 3  # bicubic
    assert files["model.safetensors"] == (tiny_finetuned_dir / "model.safetensors").read_bytes()
    # the fine-tune's example images, which the demo offers when it loads the repo by id
    examples = sorted((tiny_finetuned_dir / "examples").iterdir())
    assert examples and all(files[f"examples/{e.name}"] == e.read_bytes() for e in examples)

    # the commit went to main and its URL (printed by the script) points at the server that took it
    commit = next(c for c in hub.commits if c["repo_id"] == "me/vit-digits")
    assert commit["revision"] == "main"
    assert f"{hub.url}/me/vit-digits/commit/{commit['oid']}" in stdout["vit_ft"]

    # the model card: YAML metadata the Hub validated, and a body that states the run
    assert files["README.md"].decode() in hub.validated
    meta, body = card_metadata(files["README.md"])
    run = json.loads((tiny_finetuned_dir / "vit_ft_run.json").read_text())
    assert meta["license"] == "apache-2.0" and meta["library_name"] == "transformers"
    assert meta["pipeline_tag"] == "image-classification"
    assert {"vit_ft", "image-classification", "full-fine-tuning", "custom_code"} <= set(meta["tags"])
    assert "base_model" not in meta  # the base was a local checkpoint: nothing the Hub could link to
    (index,) = meta["model-index"]
    assert index["name"] == "me/vit-digits"
    results = {m["type"]: m["value"] for m in index["results"][0]["metrics"]}
    assert results["accuracy"] == pytest.approx(run["metrics"]["test_accuracy"])
    assert index["results"][0]["dataset"]["split"] == "test"
    assert "Recipe: `tiny`" in body and "32x32" in body and "Fine-tuning: full" in body
    assert f"| test | {run['metrics']['test_accuracy']:.4f} |" in body
    assert 'model="me/vit-digits", trust_remote_code=True)' in body
    assert "- Format: vit_ft" in body and "asked for with `--format vit_ft`" in body


def test_default_push_of_a_plain_vit_sends_transformers_own_class(pushed):
    hub, stdout = pushed
    created = {c["name"]: c for c in hub.created}
    assert created["vit-digits-hf"]["organization"] is None and "visibility" not in created["vit-digits-hf"]
    files = hub.repos["tester/vit-digits-hf"]  # no namespace given: the token's user
    assert {
        "README.md",
        "config.json",
        "model.safetensors",
        "preprocessor_config.json",
    } | RECORD_FILES <= set(files)
    assert not [f for f in files if f.endswith(".py")]
    config = json.loads(files["config.json"])
    assert config["model_type"] == "vit" and "auto_map" not in config and config["image_size"] == 32
    assert config["architectures"] == ["ViTForImageClassification"]
    assert json.loads(files["preprocessor_config.json"])["crop_size"] == {"height": 32, "width": 32}
    meta, body = card_metadata(files["README.md"])
    assert "custom_code" not in meta["tags"] and meta["model-index"][0]["name"] == "vit-digits-hf"
    assert (
        'pipeline("image-classification", model="vit-digits-hf")' in body and "trust_remote_code" not in body
    )
    assert "- Format: transformers, no remote code" in body
    assert "the model is exactly transformers' `ViTForImageClassification`" in body
    assert f"{hub.url}/tester/vit-digits-hf/commit/" in stdout["default"]
    assert "in the transformers format" in stdout["default"]  # the log says which format, and why


def test_received_repos_load_in_a_clean_process(pushed, tiny_finetuned_dir, tmp_path):
    """The pushed repos load by id without vit_ft: ours with its code, the default push with none, through
    AutoModelForImageClassification and pipeline(); same logits, and the same top-5 as vit-ft's predict."""
    hub, _ = pushed
    pixels = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    torch.save(pixels, tmp_path / "pixels.pt")
    # square images, resized (40x40) or not (the fine-tune's 32x32 examples); non-square ones: test_folded_calibration
    images = [tmp_path / "noise.png", *sorted((tiny_finetuned_dir / "examples").iterdir())[:2]]
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(images[0])
    result = subprocess.run(
        [sys.executable, "-c", CLEAN_PROCESS, "me/vit-digits", "tester/vit-digits-hf",
         str(tmp_path / "pixels.pt"), str(tmp_path / "out.json"), *map(str, images)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env=push_env(hub, tmp_path),  # the token reads the private repo; an empty cache: everything downloads
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    assert not hub.unexpected, f"calls the fake Hub does not know: {hub.unexpected}"
    assert hub.downloaded() == {"me/vit-digits", "tester/vit-digits-hf"}
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["remote_cls"].startswith("transformers_modules.")
    assert out["plain_cls"] == "transformers.models.vit.modeling_vit.ViTForImageClassification"
    with torch.no_grad():
        expected = ViTFTForImageClassification.from_pretrained(tiny_finetuned_dir).eval()(pixels).logits
    assert (torch.tensor(out["remote"]) - expected).abs().max().item() <= 1e-5
    # the default push has the calibration temperature folded into its head: its logits are ours / T
    trained = load_trained(tiny_finetuned_dir, device="cpu")
    assert trained.temperature != 1.0
    assert (torch.tensor(out["plain"]) - expected / trained.temperature).abs().max().item() <= 1e-5
    # pipeline() on the default push gives vit-ft's own predictions: the same top-5 labels and predict's
    # calibrated scores
    ours = list(predict_files(trained, images, progress=False))
    for theirs, prediction in zip(out["pipeline"], ours, strict=True):
        assert [e["label"] for e in theirs] == prediction.labels
        assert np.allclose([e["score"] for e in theirs], prediction.scores, atol=1e-5), (theirs, prediction)


# vit-ft's own reader on a Hub id: the temperature it divides by, and predict's top label and scores on the images
HUB_READER = textwrap.dedent(
    """
    import json, sys
    from vit_ft.tools.predict.run import predict_files
    from vit_ft.tools.trained import load_trained
    out = {}
    for repo in sys.argv[1:3]:
        trained = load_trained(repo, device="cpu")
        found = predict_files(trained, sys.argv[4:], progress=False)
        out[repo] = [trained.temperature, [[p.labels[0], p.scores[0]] for p in found]]
    json.dump(out, open(sys.argv[3], "w"))
    """
)


def test_both_formats_read_from_the_hub_predict_calibrated_as_the_folder(pushed, tiny_finetuned_dir, tmp_path):
    """`--format vit_ft` carries the run record, whose calibration temperature the reader takes from the Hub (the
    default push folds it into the head): predict on either Hub id gives the folder's calibrated scores."""
    hub, _ = pushed
    images = sorted(map(str, (tiny_finetuned_dir / "examples").iterdir()))[:3]
    result = subprocess.run(
        [sys.executable, "-c", HUB_READER, "me/vit-digits", "tester/vit-digits-hf", str(tmp_path / "out.json"),
         *images],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env=push_env(hub, tmp_path),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    assert not hub.unexpected, f"calls the fake Hub does not know: {hub.unexpected}"
    out = json.loads((tmp_path / "out.json").read_text())
    trained = load_trained(tiny_finetuned_dir, device="cpu")
    expected = [[p.labels[0], p.scores[0]] for p in predict_files(trained, images, progress=False)]
    assert trained.temperature != 1.0
    assert out["me/vit-digits"][0] == pytest.approx(trained.temperature)  # read from the pushed run record
    assert out["tester/vit-digits-hf"][0] == 1.0  # folded into the head
    for repo in out:
        assert [label for label, _ in out[repo][1]] == [label for label, _ in expected], repo
        assert np.allclose([s for _, s in out[repo][1]], [s for _, s in expected], atol=1e-5), (repo, out[repo])


def write_lora_run(base_checkpoint: str | Path, output_dir: Path) -> PeftModel:
    """An output folder as a LoRA fine-tune at 24x24 leaves it with merge_lora=False: only `adapter/`."""
    model = ViTFTForImageClassification.from_pretrained(str(base_checkpoint), image_size=24)
    peft_model = get_peft_model(
        model, LoraConfig(r=4, lora_alpha=8, target_modules=["qkv"], modules_to_save=["classifier"])
    )
    with torch.no_grad():  # non-zero B matrices, so that merging changes the weights
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5, generator=torch.Generator().manual_seed(len(name)))
    adapter = output_dir / "adapter"
    peft_model.save_pretrained(adapter)
    peft_model.base_model.model.config.save_pretrained(adapter)
    ViTImageProcessorPil(size={"height": 24, "width": 24}).save_pretrained(adapter)
    run = {"recipe": "lora-test", "base_model": "google/vit-base-patch16-224-in21k", "image_size": [24, 24],
           "lora": True, "data": {"dataset_name": "beans"}, "metrics": {"eval_accuracy": 0.5}}  # fmt: skip
    (output_dir / "vit_ft_run.json").write_text(json.dumps(run))
    return peft_model.eval()


def test_stage_lora_run_merges_the_adapter(hf_classifier_dir, tmp_path):
    """vit_ft format: the merged model with our code and the adapter itself; by default: transformers' ViT of the
    merged weights, and the card says where the adapter is."""
    peft_model = write_lora_run(hf_classifier_dir, tmp_path / "out")
    pixels = torch.randn(2, 3, 24, 24, generator=torch.Generator().manual_seed(1))
    plain = stage_for_hub(tmp_path / "out", tmp_path / "plain", "me/vit-lora")
    with torch.no_grad():
        logits = ViTForImageClassification.from_pretrained(plain).eval()(pixels).logits
        assert (logits - peft_model(pixel_values=pixels).logits).abs().max().item() <= 1e-5
    assert (
        not (plain / "adapter").exists()
        and "the adapter alone stays in the fine-tune's output" in (plain / "README.md").read_text()
    )

    staged = stage_for_hub(tmp_path / "out", tmp_path / "staged", "me/vit-lora", format="vit_ft")
    assert {"config.json", "model.safetensors", "preprocessor_config.json", "README.md"} | CODE_FILES <= {
        p.name for p in staged.iterdir()
    }
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {
        p.name for p in (staged / "adapter").iterdir()
    }
    merged = ViTFTForImageClassification.from_pretrained(staged).eval()
    with torch.no_grad():
        assert (merged(pixels).logits - peft_model(pixel_values=pixels).logits).abs().max().item() <= 1e-5
    assert json.loads((staged / "preprocessor_config.json").read_text())["crop_size"] == {
        "height": 24,
        "width": 24,
    }
    meta, body = card_metadata((staged / "README.md").read_bytes())
    assert "lora" in meta["tags"] and meta["base_model"] == "google/vit-base-patch16-224-in21k"
    assert meta["datasets"] == ["beans"]
    assert meta["model-index"][0]["results"][0]["dataset"]["split"] == "validation"
    assert "Fine-tuning: LoRA" in body and "24x24" in body and "adapter/" in body


def test_unshareable_folders_fail_before_any_request(tmp_path):
    with pytest.raises(ValueError, match="format='onnx' is not one of"):
        stage_for_hub(tmp_path, tmp_path / "staged", "me/x", format="onnx")
    # no server listens on this endpoint: a push that got as far as the network would fail differently
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        push_output_dir(tmp_path / "missing", "me/x")


def test_a_config_naming_fewer_labels_than_the_head_fails_in_our_words(tiny_finetuned_dir, tmp_path):
    """Before staging anything: the config and the weights disagree, said as one line naming both files."""
    folder = tmp_path / "run"
    shutil.copytree(tiny_finetuned_dir, folder, ignore=shutil.ignore_patterns("checkpoint-*"))
    config = json.loads((folder / "config.json").read_text())
    config["id2label"] = {k: v for k, v in config["id2label"].items() if k != "9"}
    config["label2id"] = {v: int(k) for k, v in config["id2label"].items()}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError) as raised:
        stage_for_hub(folder, tmp_path / "staged", "me/x")
    assert str(raised.value) == (
        f"{folder}/config.json: num_labels (entries in id2label) is 9, but {folder}/model.safetensors holds 10 "
        "(classifier.weight [10, 32]): the config does not describe these weights; restore the config.json the "
        "model was saved with, or save the model again."
    )
    assert not (tmp_path / "staged").exists()


def test_fake_hub_answers_downloads_as_the_hub_does():
    """The download side of the stand-in, request by request: what the clients read from each answer."""
    import urllib.error
    import urllib.request

    def call(hub, path, method="GET", data=None, **headers):
        request = urllib.request.Request(hub.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.headers, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.headers, error.read()

    assert git_blob_id(b"hello\n") == "ce013625030ba8dba906f756967f9e9ca394464a"  # `git hash-object`
    data = bytes(range(256)) * 4
    with FakeHub() as hub:
        head = hub.add_repo("org/model", {"config.json": b"{}", "weights/a.bin": data})
        status, headers, body = call(hub, "/org/model/resolve/main/weights/a.bin", method="HEAD")
        assert (status, body) == (200, b"") and headers["Content-Length"] == str(len(data))
        assert headers["X-Repo-Commit"] == head and headers["ETag"] == f'"{git_blob_id(data)}"'
        status, headers, body = call(hub, f"/org/model/resolve/{head}/weights/a.bin", Range="bytes=10-19")
        assert (status, body, headers["Content-Range"]) == (206, data[10:20], f"bytes 10-19/{len(data)}")
        assert call(hub, "/org/model/resolve/main/weights/a.bin", Range="bytes=1000-")[2] == data[1000:]
        status, headers, _ = call(hub, "/org/model/resolve/main/missing.json", method="HEAD")
        assert (status, headers["X-Error-Code"], headers["X-Repo-Commit"]) == (404, "EntryNotFound", head)
        assert call(hub, "/org/model/resolve/v2/config.json")[1]["X-Error-Code"] == "RevisionNotFound"
        assert call(hub, "/org/other/resolve/main/config.json")[1]["X-Error-Code"] == "RepoNotFound"

        info = json.loads(call(hub, "/api/models/org/model/revision/main")[2])
        assert info["sha"] == head and [s["rfilename"] for s in info["siblings"]] == [
            "config.json",
            "weights/a.bin",
        ]
        top = json.loads(call(hub, "/api/models/org/model/tree/main")[2])
        assert [(e["type"], e["path"]) for e in top] == [("file", "config.json"), ("directory", "weights")]
        every = json.loads(call(hub, "/api/models/org/model/tree/main?recursive=true")[2])
        assert [e["path"] for e in every] == ["config.json", "weights", "weights/a.bin"]
        form = b"paths=weights%2Fa.bin&paths=nope&expand=false"
        (entry,) = json.loads(call(hub, "/api/models/org/model/paths-info/main", method="POST", data=form)[2])
        assert (entry["path"], entry["size"], entry["oid"]) == ("weights/a.bin", len(data), git_blob_id(data))
        assert hub.downloaded() == {"org/model"} and not hub.unexpected
        call(hub, "/api/models/org/model/discussions")
        assert hub.unexpected == [("GET", "/api/models/org/model/discussions (no token)")]

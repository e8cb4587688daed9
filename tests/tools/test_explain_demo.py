"""The demo's class picker (demo/app.py): the map for a picked class is the gradient-weighted rollout's, the first
choice the class-agnostic rollout, and the app exposes it as `/explain`. Long: importing gradio costs seconds."""

import importlib.util

import numpy as np
import pytest
from PIL import Image

from vit_ft.tools.explain.methods import explain
from vit_ft.tools.explain.rollout import overlay_heatmap

from ..conftest import REPO

pytestmark = pytest.mark.long


@pytest.fixture(scope="module")
def demo_app():
    spec = importlib.util.spec_from_file_location("vit_ft_demo_app_explain", REPO / "demo" / "app.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_picking_a_class_draws_its_gradient_weighted_rollout(demo_app, hf_classifier_dir, tmp_path):
    path = tmp_path / "x.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (24, 24, 3), dtype=np.uint8)).save(path)
    classifier = demo_app.Classifier(hf_classifier_dir)
    image = classifier.open(str(path))
    pixels = classifier.pixel_values(image)
    for index, name in classifier.labels.items():
        heat = explain(classifier.model, pixels, "grad_rollout", target=index)[0].reshape(4, 4)
        shown = demo_app.display_view(image, classifier.display_size, classifier.resample)
        expected = np.asarray(overlay_heatmap(shown, heat))
        assert np.array_equal(np.asarray(classifier.explanation(str(path), name)), expected), name
    every = np.asarray(classifier.explanation(str(path), demo_app.ALL_CLASSES))
    assert np.array_equal(every, np.asarray(classifier.rollout(str(path))))
    with pytest.raises(demo_app.gr.Error, match="not a class"):
        classifier.explanation(str(path), "moth")
    config = demo_app.build_demo(classifier).get_config_file()
    assert any(dependency.get("api_name") == "explain" for dependency in config["dependencies"])

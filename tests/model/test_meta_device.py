"""Large models load lean: the model builds on the meta device and loads with `device_map` and accelerate's empty
init, as transformers' common model tests check its own models (meta-device construction, every tensor a parameter
or buffer, `_init_weights` reaching every tensor, buffers included). One tiny config per family (FAMILY_CONFIGS)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from vit_ft import ViTFTConfig, ViTFTForImageClassification, ViTFTModel

from ..conftest import randomize
from .conftest import FAMILY_CONFIGS

CLASSES = [ViTFTModel, ViTFTForImageClassification]


def family_config(family: str) -> ViTFTConfig:
    """The family's tiny config with stochastic depth on (the rates are what broke meta-device construction)."""
    return ViTFTConfig(**FAMILY_CONFIGS[family], drop_path_rate=0.1, num_labels=3)


def logits(model: nn.Module) -> torch.Tensor:
    pixels = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model.eval()(pixels)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def tensors_of(model: nn.Module) -> dict[str, torch.Tensor]:
    return dict(model.state_dict(keep_vars=True))


def plain_tensors(model: nn.Module) -> list[str]:
    """Tensors held as plain module attributes (also in a list, tuple or dict), neither parameter nor buffer:
    `.to()`, `device_map`, FSDP and the meta device would all leave them behind (transformers'
    `test_all_tensors_are_parameter_or_buffer`)."""
    found = []
    for module_name, module in model.named_modules():
        for attr, value in vars(module).items():
            if attr in ("_parameters", "_buffers", "_modules"):
                continue
            values = value.values() if isinstance(value, dict) else value if isinstance(value, list | tuple) else [value]
            if any(isinstance(v, torch.Tensor) for v in values):
                found.append(f"{module_name}.{attr}".lstrip("."))
    return found


# 1. construction on the meta device ---------------------------------------------------------------------------


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("family", list(FAMILY_CONFIGS))
def test_builds_on_the_meta_device_as_on_the_cpu(cls, family):
    config = family_config(family)
    on_cpu = cls(config)
    with torch.device("meta"):
        on_meta = cls(config)
    assert {t.device.type for t in tensors_of(on_meta).values()} == {"meta"}
    assert {k: t.shape for k, t in tensors_of(on_meta).items()} == {k: t.shape for k, t in tensors_of(on_cpu).items()}
    rates = [layer.drop_path_rate for layer in (on_meta.vit if hasattr(on_meta, "vit") else on_meta).layers]
    cpu_rates = [layer.drop_path_rate for layer in (on_cpu.vit if hasattr(on_cpu, "vit") else on_cpu).layers]
    assert rates == cpu_rates and rates[-1] == pytest.approx(0.1) and all(isinstance(r, float) for r in rates)


@pytest.mark.parametrize("include_buffers", [False, True])
def test_builds_under_accelerate_init_empty_weights(include_buffers):
    accelerate = pytest.importorskip("accelerate")
    with accelerate.init_empty_weights(include_buffers=include_buffers):
        model = ViTFTForImageClassification(family_config("dinov2_registers"))
    assert {p.device.type for p in model.parameters()} == {"meta"}


# 2. every tensor a parameter or a buffer, and `_init_weights` reaches each ------------------------------------


@pytest.mark.parametrize("family", list(FAMILY_CONFIGS))
def test_every_tensor_is_a_parameter_or_buffer(family):
    model = ViTFTForImageClassification(family_config(family))
    assert plain_tensors(model) == []
    model.to("meta")  # what a plain tensor attribute would not follow
    assert {t.device.type for t in tensors_of(model).values()} == {"meta"}


def test_plain_tensors_finds_an_unregistered_tensor():
    """The check above can fail: a tensor kept as a plain attribute is found, in a list too."""
    model = ViTFTForImageClassification(family_config("vit"))
    model.vit.layers[0].scale = torch.ones(3)
    model.vit.embeddings.extra = [torch.zeros(1)]
    assert plain_tensors(model) == ["vit.embeddings.extra", "vit.layers.0.scale"]


def reinitialised(model: nn.Module, seed: int = 0) -> nn.Module:
    """`model` with every parameter and buffer (persistent or not) overwritten by NaN, then initialised by its
    `_init_weights` alone (transformers' `initialize_weights`, as `from_pretrained` does for missing keys)."""
    with torch.no_grad():
        for tensor in tensors_of(model).values():
            tensor.fill_(float("nan"))
    for module in model.modules():
        module.__dict__.pop("_is_hf_initialized", None)
    torch.manual_seed(seed)
    model.initialize_weights()
    return model


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("family", list(FAMILY_CONFIGS))
def test_init_weights_reaches_every_tensor_of_a_model_built_on_meta(cls, family):
    """Built on meta and materialised empty (what `from_pretrained` does with a key the checkpoint lacks),
    `_init_weights` leaves no tensor uninitialised (buffers included) and gives what it gives a CPU-built model."""
    config = family_config(family)
    with torch.device("meta"):
        model = cls(config)
    model = reinitialised(model.to_empty(device="cpu"))
    reference = reinitialised(cls(config))
    for key, tensor in tensors_of(model).items():
        assert not tensor.isnan().any(), f"{key} is not initialised by _init_weights"
        torch.testing.assert_close(tensor, tensors_of(reference)[key], rtol=0, atol=0, msg=key)


def test_reinitialised_catches_a_tensor_init_weights_misses():
    """The check above can fail: a buffer `_init_weights` does not know stays NaN."""
    model = ViTFTForImageClassification(family_config("vit"))
    model.vit.layers[0].register_buffer("unknown", torch.zeros(2))
    assert reinitialised(model).vit.layers[0].unknown.isnan().all()


# 3. lean loading of a saved vit_ft folder gives the same logits -----------------------------------------------


@pytest.fixture(scope="module", params=["vit", "dinov2_registers", "siglip"])
def saved(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"saved_{request.param}")
    randomize(ViTFTForImageClassification(family_config(request.param))).save_pretrained(folder)
    return folder


@pytest.mark.parametrize(
    "kwargs", [{"device_map": "cpu"}, {"device_map": "auto"}, {"device_map": {"": "cpu"}}, {"low_cpu_mem_usage": True}]
)
def test_from_pretrained_lean_keywords_give_the_same_logits(saved, kwargs):
    if "device_map" in kwargs:
        pytest.importorskip("accelerate")
    model = ViTFTForImageClassification.from_pretrained(saved, **kwargs)
    assert {t.device.type for t in tensors_of(model).values()} == {"cpu"}
    torch.testing.assert_close(logits(model), logits(ViTFTForImageClassification.from_pretrained(saved)), rtol=0, atol=0)


def test_from_pretrained_with_a_layer_offloaded_to_disk(saved, tmp_path):
    """A device map that puts the last layer and the head on disk (accelerate's offload hooks) runs the same."""
    pytest.importorskip("accelerate")
    with torch.device("meta"):
        names = [name for name, _ in ViTFTForImageClassification(ViTFTConfig.from_pretrained(saved)).named_modules()]
    device_map = {name: "cpu" for name in names if name.count(".") == 1 and not name.startswith("vit.layers")}
    device_map |= {"vit.layers.0": "cpu", "vit.layers.1": "disk", "classifier": "disk"}
    model = ViTFTForImageClassification.from_pretrained(saved, device_map=device_map, offload_folder=tmp_path)
    assert model.vit.layers[1].mlp.fc1.weight.is_meta and sorted(p.name for p in tmp_path.iterdir())  # offloaded
    torch.testing.assert_close(logits(model), logits(ViTFTForImageClassification.from_pretrained(saved)), rtol=0, atol=0)


def test_accelerate_empty_init_then_load_checkpoint_and_dispatch(saved):
    accelerate = pytest.importorskip("accelerate")
    config = ViTFTConfig.from_pretrained(saved)
    with accelerate.init_empty_weights():
        model = ViTFTForImageClassification(config)
    model = accelerate.load_checkpoint_and_dispatch(
        model, str(saved), device_map="auto", no_split_module_classes=model._no_split_modules
    )
    assert not any(t.is_meta for t in tensors_of(model).values())
    torch.testing.assert_close(logits(model), logits(ViTFTForImageClassification.from_pretrained(saved)), rtol=0, atol=0)

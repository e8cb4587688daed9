"""The CPU kernels against the plain torch path they replace, forward and backward, and the switch."""

import threading
import warnings

import pytest
import torch
import torch.nn.functional as F
from peft import LoraConfig, get_peft_model
from transformers import ViTForImageClassification

from vit_ft import ViTFTForImageClassification, kernels
from vit_ft.kernels import onednn_attention, onednn_linear
from vit_ft.utils import hardware

from ..conftest import randomize, tiny_ft_config, tiny_hf_config

# every combination of what requires grad; frozen weight + trainable bias is peft's bias="lora_only"
GRAD_CASES = {
    "input only": (True, False, False),
    "weight only": (False, True, False),
    "bias only": (False, False, True),
    "all": (True, True, True),
}


@pytest.fixture
def kernels_on(monkeypatch):
    """Force the kernels on (wherever oneDNN exists) and count the oneDNN products that ran."""
    monkeypatch.setenv(kernels.KERNELS_ENV, "1")
    calls = []
    real = onednn_linear._onednn_matmul
    monkeypatch.setattr(onednn_linear, "_onednn_matmul", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def set_kernels(monkeypatch, on: bool) -> None:
    monkeypatch.setenv(kernels.KERNELS_ENV, "1" if on else "0")


needs_onednn = pytest.mark.skipif(
    onednn_linear._onednn_linear is None, reason="this torch build has no oneDNN"
)


def linear_run(requires: tuple[bool, bool, bool], bf16: bool, activation: str | None = None):
    """Output and the gradients of (input, weight, bias) of `kernels.linear` on fixed random tensors."""
    generator = torch.Generator().manual_seed(0)
    x, weight, bias = (torch.randn(shape, generator=generator) for shape in ((2, 5, 24), (12, 24), (12,)))
    leaves = [t.requires_grad_(r) for t, r in zip((x, weight, bias), requires, strict=True)]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out = kernels.linear(*leaves, activation=activation)
    if any(requires):
        out.float().square().sum().backward()
    return out.detach().float(), [None if t.grad is None else t.grad.clone() for t in leaves]


@needs_onednn
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", list(GRAD_CASES))
def test_linear_matches_plain_path_forward_and_backward(monkeypatch, kernels_on, case, bf16):
    requires = GRAD_CASES[case]
    out_fast, grads_fast = linear_run(requires, bf16)
    ran = len(kernels_on)
    set_kernels(monkeypatch, False)
    out_plain, grads_plain = linear_run(requires, bf16)
    assert len(kernels_on) == ran  # switched off: no oneDNN product ran
    if not bf16:
        assert ran > 0  # fp32 training takes oneDNN for every combination
    tolerance = {"rtol": 2e-2, "atol": 2e-2} if bf16 else {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close(out_fast, out_plain, **tolerance)
    for name, fast, plain, wanted in zip(
        ("input", "weight", "bias"), grads_fast, grads_plain, requires, strict=True
    ):
        assert (fast is not None) == wanted == (plain is not None), name  # the bias gradient is never lost
        if wanted:
            torch.testing.assert_close(fast, plain, **tolerance, msg=name)


@needs_onednn
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_fused_gelu_inference_matches_plain_path(monkeypatch, kernels_on, bf16):
    with torch.no_grad():
        fast, _ = linear_run((False, False, False), bf16, activation="gelu")
        # the inference path ran in oneDNN: fp32 always, bf16 where the CPU has native bf16 products
        assert bool(kernels_on) == (not bf16 or hardware.onednn_bf16_supported())
        set_kernels(monkeypatch, False)
        plain, _ = linear_run((False, False, False), bf16, activation="gelu")
    torch.testing.assert_close(fast, plain, **({"rtol": 2e-2, "atol": 2e-2} if bf16 else {}))


def lora_bias_gradients(monkeypatch, on: bool, bf16: bool) -> dict[str, torch.Tensor]:
    set_kernels(monkeypatch, on)
    torch.manual_seed(0)
    model = kernels.kernelize(randomize(ViTFTForImageClassification(tiny_ft_config(num_labels=3))))
    config = LoraConfig(r=4, lora_alpha=4, target_modules=["qkv", "fc1"], bias="lora_only", lora_dropout=0.0)
    peft_model = get_peft_model(model, config).train()
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.1, generator=torch.Generator().manual_seed(1))
    pixels = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = peft_model(pixel_values=pixels, labels=torch.tensor([0, 2])).loss
    loss.backward()
    return {n: p.grad for n, p in peft_model.named_parameters() if p.requires_grad}


@needs_onednn
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_lora_bias_only_gradients_match_plain_path(monkeypatch, kernels_on, bf16):
    """peft's bias="lora_only": frozen weights, trainable biases; every gradient is there and matches."""
    fast = lora_bias_gradients(monkeypatch, True, bf16)
    assert kernels_on or bf16
    plain = lora_bias_gradients(monkeypatch, False, bf16)
    biases = [n for n in fast if n.endswith("base_layer.bias")]
    assert len(biases) == 4  # qkv and fc1 of two layers
    for name in fast:
        assert fast[name] is not None and plain[name] is not None, name
        assert fast[name].abs().sum() > 0, name
        tolerance = {"rtol": 2e-2, "atol": 2e-3} if bf16 else {"rtol": 1e-4, "atol": 1e-6}
        torch.testing.assert_close(fast[name], plain[name], **tolerance, msg=name)


def test_model_with_kernels_off_matches_transformers(monkeypatch, tmp_path):
    set_kernels(monkeypatch, False)
    randomize(ViTForImageClassification(tiny_hf_config(num_labels=3))).save_pretrained(tmp_path)
    reference = ViTForImageClassification.from_pretrained(tmp_path, attn_implementation="eager").eval()
    ours = kernels.kernelize(ViTFTForImageClassification.from_pretrained(tmp_path))
    pixels = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        assert (ours(pixels).logits - reference(pixels).logits).abs().max() <= 1e-5


def test_switch_and_where_the_kernels_run(monkeypatch):
    monkeypatch.setenv(kernels.KERNELS_ENV, "0")
    assert not kernels.kernels_enabled()
    monkeypatch.setenv(kernels.KERNELS_ENV, "1")
    assert kernels.kernels_enabled() == torch.backends.mkldnn.enabled
    monkeypatch.setenv(kernels.KERNELS_ENV, "auto")
    assert kernels.kernels_enabled() == (
        torch.backends.mkldnn.enabled and hardware.cpu_vendor() == "AuthenticAMD"
    )
    with warnings.catch_warnings():  # flags() also sets oneDNN's TF32 switch, which warns on CPU builds
        warnings.simplefilter("ignore")
        with torch.backends.mkldnn.flags(enabled=False):
            assert not kernels.kernels_enabled()


def test_fp32_precision_flag_is_put_back_and_never_flipped_beside_another_thread():
    flags = torch.backends.mkldnn.matmul
    previous = flags.fp32_precision
    with pytest.raises(RuntimeError), onednn_attention._bf16_products_of_fp32():
        raise RuntimeError("inside")
    assert flags.fp32_precision == previous
    seen, release = [], threading.Event()
    other = threading.Thread(target=release.wait)
    other.start()
    try:
        with onednn_attention._bf16_products_of_fp32():
            seen.append(flags.fp32_precision)
    finally:
        release.set()
        other.join()
    assert seen == [previous]  # another thread could have seen a flipped flag: left alone


# ---- bf16 on CPU: oneDNN attention ----------------------------------------------------------------------

NO_NATIVE_BF16 = (
    "this CPU or torch build has no native bf16 products for oneDNN (needs avx512_bf16 or amx_bf16; CPU flags: "
    f"{' '.join(hardware.cpu_flags()) or 'none'}): the fallback is tested in test_capability.py"
)
needs_onednn_bf16 = pytest.mark.skipif(not onednn_attention._onednn_bf16_hardware(), reason=NO_NATIVE_BF16)


def mean_errors(outputs: list[torch.Tensor], references: list[torch.Tensor]) -> list[float]:
    return [(out.double() - ref).abs().mean().item() for out, ref in zip(outputs, references, strict=True)]


def attention_errors(attention, qkv: torch.Tensor, grad_out: torch.Tensor, reference) -> list[float]:
    """Mean |error| of the output and of the q, k, v gradients, against float64 reference values."""
    leaves = [t.detach().clone().requires_grad_() for t in qkv.unbind(2)]
    query, key, value = (t.transpose(1, 2) for t in leaves)  # the model's strided (B, heads, N, d) views
    attention(query, key, value).backward(grad_out)
    return mean_errors([attention(query, key, value)] + [t.grad.transpose(1, 2) for t in leaves], reference)


@needs_onednn_bf16
@pytest.mark.parametrize(
    ("batch", "heads", "seq_len", "head_dim"),
    [(2, 3, 17, 16), (2, 2, 50, 32), (1, 4, 197, 64)],  # scale 1/4 and 1/8 folded into q; 1/sqrt(32) not
)
def test_onednn_bf16_attention_is_as_accurate_as_torch_flash_attention(
    monkeypatch, batch, heads, seq_len, head_dim
):
    # two heads per chunk, so the chunk loop runs several times
    monkeypatch.setattr(onednn_attention, "_ATTENTION_CHUNK_BYTES", 2 * 4 * seq_len * seq_len)
    generator = torch.Generator().manual_seed(0)
    qkv = (1.5 * torch.randn(batch, seq_len, 3, heads, head_dim, generator=generator)).bfloat16()
    grad_out = torch.randn(batch, heads, seq_len, head_dim, generator=generator).bfloat16()
    scale = head_dim**-0.5

    exact = [t.double().transpose(1, 2).requires_grad_() for t in qkv.unbind(2)]
    out = F.softmax(exact[0] @ exact[1].transpose(-2, -1) * scale, dim=-1) @ exact[2]
    out.backward(grad_out.double())
    reference = [out.detach()] + [t.grad for t in exact]

    previous = torch.backends.mkldnn.matmul.fp32_precision
    ours = attention_errors(
        lambda q, k, v: onednn_attention._OneDNNBF16Attention.apply(q, k, v, scale), qkv, grad_out, reference
    )
    assert torch.backends.mkldnn.matmul.fp32_precision == previous  # the switch is put back
    flash = attention_errors(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=scale), qkv, grad_out, reference
    )
    for name, error, flash_error in zip(["output", "dq", "dk", "dv"], ours, flash, strict=True):
        assert error <= 1.5 * flash_error, (name, error, flash_error)


@needs_onednn_bf16
def test_bf16_autocast_matches_transformers_to_its_own_rounding(monkeypatch, tmp_path):
    """Under bf16 autocast our model (oneDNN attention) is as close to the fp32 model as transformers' ViT
    (torch's flash attention) is, for logits and gradients; and the oneDNN attention really ran."""
    monkeypatch.setenv(kernels.KERNELS_ENV, "1")  # on any CPU with oneDNN bf16 (auto takes it on AMD only)
    hf_config = tiny_hf_config(num_labels=5, num_attention_heads=2)  # head_dim 16
    randomize(ViTForImageClassification(hf_config)).save_pretrained(tmp_path)
    theirs = ViTForImageClassification.from_pretrained(tmp_path, attn_implementation="sdpa")
    ours = kernels.kernelize(ViTFTForImageClassification.from_pretrained(tmp_path))
    pixels = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([0, 1, 2, 3])
    calls = []
    real_apply = onednn_attention._OneDNNBF16Attention.apply
    monkeypatch.setattr(
        onednn_attention._OneDNNBF16Attention, "apply", lambda *args: calls.append(1) or real_apply(*args)
    )

    def run(model, bf16: bool) -> list[torch.Tensor]:
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            output = model(pixel_values=pixels, labels=labels)
        output.loss.backward()
        grads = [param.grad.double() for param in model.parameters()]
        return [output.logits.double().detach()] + grads

    errors = {}
    for name, model in (("ours", ours), ("theirs", theirs)):
        exact = run(model, bf16=False)
        approx = run(model, bf16=True)
        errors[name] = sum(mean_errors(approx, exact)) / sum(t.abs().mean().item() for t in exact)
    assert len(calls) == 2  # two layers, one forward each
    assert errors["ours"] <= 1.25 * errors["theirs"], errors
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):  # inference takes it too
        ours.eval()(pixel_values=pixels)
    assert len(calls) == 4


@needs_onednn_bf16
def test_progress_bar_monitor_thread_does_not_count_as_computing():
    """tqdm's monitor (alive after any progress bar, e.g. from_pretrained's) runs no torch code."""

    class TMonitor(threading.Thread):  # the class name tqdm's monitor thread has
        pass

    if onednn_attention._another_thread_may_compute():
        pytest.skip("another thread runs in this test process")
    flags = torch.backends.mkldnn.matmul
    previous, release = flags.fp32_precision, threading.Event()
    monitor = TMonitor(target=release.wait, daemon=True)
    monitor.start()
    try:
        with onednn_attention._bf16_products_of_fp32():
            seen = flags.fp32_precision
    finally:
        release.set()
        monitor.join()
    assert seen == "bf16" and flags.fp32_precision == previous


@pytest.mark.parametrize("setting", ["auto", "1", "0"])
def test_torch_compile_traces_the_whole_forward_in_one_graph(monkeypatch, setting):
    """No graph break with the kernels on or off: inference in fp32 and bf16 autocast, and training with loss
    (a break would split the compiled model and lose its fusions; reading /proc/cpuinfo while tracing did)."""
    monkeypatch.setenv(kernels.KERNELS_ENV, setting)
    torch._dynamo.reset()
    model = kernels.kernelize(randomize(ViTFTForImageClassification(tiny_ft_config(num_labels=3)))).eval()
    pixels = torch.randn(2, 3, 32, 32)
    for autocast in (False, True):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            explained = torch._dynamo.explain(model)(pixel_values=pixels)
        assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    model.train()
    explained = torch._dynamo.explain(model)(pixel_values=pixels, labels=torch.tensor([0, 2]))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


def test_kernelize_swaps_classes_in_place_and_keeps_every_parameter():
    """One call swaps the kernels in: the same parameter tensors (nothing copied), the same state-dict keys, still
    nn.Linear for peft; twice changes nothing more; transformers' own ViT keeps its "sdpa"."""
    model = randomize(ViTFTForImageClassification(tiny_ft_config(num_labels=3)))
    before = {name: param.data_ptr() for name, param in model.named_parameters()}
    keys = list(model.state_dict())
    pixels = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        expected = model(pixels).logits
    assert kernels.kernelize(model) is model
    assert {name: param.data_ptr() for name, param in model.named_parameters()} == before
    assert list(model.state_dict()) == keys
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 9 and all(
        type(m) is kernels.Linear for m in linears
    )  # qkv, proj, fc1, fc2 x2, head
    assert model.config._attn_implementation == kernels.ATTENTION_IMPLEMENTATION
    mlp_class = type(model.vit.layers[0].mlp)
    kernels.kernelize(model)
    assert type(model.vit.layers[0].mlp) is mlp_class
    with torch.no_grad():
        torch.testing.assert_close(model(pixels).logits, expected, rtol=1e-5, atol=1e-5)
    assert ViTForImageClassification(tiny_hf_config()).config._attn_implementation == "sdpa"

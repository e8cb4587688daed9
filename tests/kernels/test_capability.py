"""The kernels read one capability answer, `utils.hardware.onednn_bf16_supported`: forced both ways here, so that
every CPU class tests both branches' decisions (an AVX2-only host the native one, a bf16 host the fallback), and
the fallback (torch's bf16 autocast) is checked numerically on every CPU. The native kernel's own numerics are
in test_kernels.py, skipped with their reason where the CPU has no native bf16 products."""

import pytest
import torch
import torch.nn.functional as F

from vit_ft import ViTFTForImageClassification, kernels
from vit_ft.kernels import onednn_attention, onednn_linear
from vit_ft.utils import hardware

from ..conftest import randomize, tiny_ft_config

needs_onednn = pytest.mark.skipif(
    onednn_linear._onednn_linear is None, reason="this torch build has no oneDNN"
)


@pytest.fixture
def onednn_calls(monkeypatch):
    """Kernels switched on; the oneDNN products (by dtype) and the oneDNN attention counted, each run as plain
    torch code, so that the decision is tested on any CPU: a real oneDNN bf16 product fails where the CPU has no
    native bf16 ("could not create a primitive descriptor")."""
    monkeypatch.setenv(kernels.KERNELS_ENV, "1")
    calls = {torch.float32: 0, torch.bfloat16: 0, "attention": 0}

    def matmul(x, weight, bias, act="none"):
        calls[x.dtype] += 1
        out = F.linear(x, weight, bias)
        return F.gelu(out) if act == "gelu" else out

    def attention(query, key, value, scale):
        calls["attention"] += 1
        return F.scaled_dot_product_attention(query, key, value, scale=scale)

    monkeypatch.setattr(onednn_linear, "_onednn_matmul", matmul)
    monkeypatch.setattr(onednn_attention._OneDNNBF16Attention, "apply", attention)
    return calls


def tiny_model() -> ViTFTForImageClassification:
    torch.manual_seed(0)
    return kernels.kernelize(randomize(ViTFTForImageClassification(tiny_ft_config(num_labels=3))))


PIXELS = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))


@needs_onednn
@pytest.mark.parametrize("native", [True, False], ids=["native bf16", "no native bf16"])
def test_bf16_takes_the_onednn_kernels_only_where_the_cpu_has_native_bf16(monkeypatch, onednn_calls, native):
    monkeypatch.setattr(hardware, "onednn_bf16_supported", lambda: native)
    model = tiny_model()
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(pixel_values=PIXELS).logits
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits).all()
    assert (onednn_calls[torch.bfloat16] > 0) == native  # else torch's autocast ran every product
    attention_possible = hasattr(torch.backends.mkldnn, "matmul")  # the fp32_precision switch it needs
    assert (onednn_calls["attention"] > 0) == (native and attention_possible)
    with torch.inference_mode():
        model(pixel_values=PIXELS)
    assert onednn_calls[torch.float32] > 0  # float32 keeps oneDNN whatever the answer: it is about bf16 only


def test_no_native_bf16_runs_torchs_autocast_and_matches_the_plain_path(monkeypatch):
    """The fallback on every CPU (VIT_FT_NO_NATIVE_BF16=1 is the AVX2-only host's answer): with the kernels on,
    bf16 inference and a bf16 training step are exactly the kernels-off computation, and close to float32."""
    monkeypatch.setenv(hardware.NO_NATIVE_BF16_ENV, "1")
    assert not hardware.onednn_bf16_supported()
    model = tiny_model()
    labels = torch.tensor([0, 2])

    def run(kernels_on: bool, bf16: bool) -> list[torch.Tensor]:
        monkeypatch.setenv(kernels.KERNELS_ENV, "1" if kernels_on else "0")
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            output = model(pixel_values=PIXELS, labels=labels)
        output.loss.backward()
        return [output.logits.detach().float()] + [p.grad.clone() for p in model.parameters()]

    fallback, plain, fp32 = run(True, True), run(False, True), run(False, False)
    for ours, theirs in zip(fallback, plain, strict=True):
        assert torch.equal(ours, theirs)
    torch.testing.assert_close(fallback[0], fp32[0], rtol=0.05, atol=0.05)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        monkeypatch.setenv(kernels.KERNELS_ENV, "1")
        inferred = model.eval()(pixel_values=PIXELS).logits.float()
    torch.testing.assert_close(inferred, fallback[0], rtol=0.02, atol=0.02)


@needs_onednn
def test_the_answer_is_read_at_each_call(monkeypatch, onednn_calls):
    """No cached copy in the kernels: the environment's answer (or a test's) is the kernels' answer."""
    x, weight = torch.randn(3, 8), torch.randn(4, 8)
    monkeypatch.setattr(hardware, "_onednn_reports_bf16", lambda: True)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        kernels.linear(x, weight)
        monkeypatch.setenv(hardware.NO_NATIVE_BF16_ENV, "1")
        kernels.linear(x, weight)
    assert onednn_calls[torch.bfloat16] == 1

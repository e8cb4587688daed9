"""The hardware policy (vit_ft.utils.hardware): one answer for the kernels, the tools and the fine-tune."""

import torch

from vit_ft.utils import hardware


def test_cpu_vendor_is_read_from_proc_cpuinfo_once(monkeypatch):
    assert hardware.cpu_vendor() == hardware.cpuinfo("vendor_id")
    assert hardware.cpuinfo("no such field") == ""
    monkeypatch.setattr(hardware, "cpuinfo", lambda field: {"vendor_id": "AuthenticAMD"}.get(field, ""))
    assert hardware.is_amd_cpu()
    monkeypatch.setattr(hardware, "cpuinfo", lambda field: "GenuineIntel")
    assert not hardware.is_amd_cpu()


def test_bf16_helps_only_where_measured(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(hardware, "cpu_vendor", lambda: "AuthenticAMD")
    monkeypatch.setattr(hardware, "onednn_bf16_supported", lambda: True)
    assert hardware.bf16_helps(cpu)
    monkeypatch.setattr(hardware, "onednn_bf16_supported", lambda: False)
    assert not hardware.bf16_helps(cpu)  # no native bf16 products: emulated bf16 is slower
    monkeypatch.setattr(hardware, "onednn_bf16_supported", lambda: True)
    monkeypatch.setattr(hardware, "cpu_vendor", lambda: "GenuineIntel")
    assert not hardware.bf16_helps(cpu)  # measured slower on an Intel Xeon with AVX512_BF16
    assert not hardware.bf16_helps(torch.device("meta"))


def test_devices_follow_what_torch_finds():
    accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    assert hardware.accelerator_type() == (accelerator.type if accelerator is not None else "cpu")
    assert hardware.default_device().type == ("cuda" if torch.cuda.is_available() else "cpu")

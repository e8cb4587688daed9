"""The hardware policy (vit_ft.utils.hardware): one answer for the kernels, the tools and the fine-tune."""

import pytest
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


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("nope", "--device 'nope' is not a device name; pass cpu, cuda"),
        ("cuda:", "--device 'cuda:' is not a device name"),
        ("cuda", "--device cuda: this machine (torch "),
        ("cuda:7", "--device cuda:7: this machine"),
        ("mps", "--device mps: this machine"),
    ],
)
def test_a_device_this_machine_lacks_is_one_line(device, message, monkeypatch):
    """torch's own errors (a RuntimeError listing every backend, an AssertionError from a CPU build) become
    a line that names the flag and the fix; a GPU that exists is taken, an index past the last one is not."""
    if device in ("cuda", "cuda:7") and torch.cuda.is_available():
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
        if device == "cuda":
            pytest.skip("this machine has a GPU: cuda is a valid device here")
    with pytest.raises(ValueError) as raised:
        hardware.inference_device(device)
    assert str(raised.value).startswith(message) and "\n" not in str(raised.value)


def test_devices_that_exist_are_taken(monkeypatch):
    assert hardware.inference_device("cpu") == torch.device("cpu")
    assert hardware.inference_device(None) == hardware.default_device()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert hardware.inference_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(ValueError, match=r"has 2 cuda device\(s\)"):
        hardware.inference_device("cuda:2")


def test_free_shared_memory_is_what_the_file_system_says_and_none_where_there_is_none(monkeypatch, tmp_path):
    import shutil

    assert hardware.free_shared_memory(str(tmp_path)) == shutil.disk_usage(tmp_path).free
    assert hardware.free_shared_memory(str(tmp_path / "no such folder")) is None  # macOS has no /dev/shm


@pytest.mark.parametrize("value", ["", "x", "0", "-2"])
def test_a_launcher_variable_that_is_no_process_count_means_one_process(monkeypatch, value):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", value)
    assert hardware.local_processes() == 1

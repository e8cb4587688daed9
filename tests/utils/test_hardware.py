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


# ---- the capability answer and the compute decision (issue 53: the CPUs users have) -------------------------


def test_cpu_flags_are_those_that_decide_the_kernels(monkeypatch):
    flags = "fpu sse avx2 avx512f avx512bw"
    monkeypatch.setattr(hardware, "cpuinfo", lambda field: flags if field == "flags" else "")
    assert hardware.cpu_flags() == ("avx2", "avx512f")
    monkeypatch.setattr(hardware, "cpuinfo", lambda field: "")
    assert hardware.cpu_flags() == ()  # no /proc/cpuinfo (macOS)


def test_native_bf16_is_one_answer_that_the_environment_can_deny(monkeypatch):
    monkeypatch.setattr(hardware, "_onednn_reports_bf16", lambda: True)
    assert hardware.onednn_bf16_supported()
    for value in ("1", "true", " YES "):
        monkeypatch.setenv(hardware.NO_NATIVE_BF16_ENV, value)
        assert not hardware.onednn_bf16_supported()
    monkeypatch.setenv(hardware.NO_NATIVE_BF16_ENV, "0")
    assert hardware.onednn_bf16_supported()
    monkeypatch.setattr(hardware, "_onednn_reports_bf16", lambda: False)
    assert not hardware.onednn_bf16_supported()  # the environment can only deny


@pytest.fixture
def amd_cpu(monkeypatch):
    """An AMD CPU with the kernels' default switch, whatever this machine is."""
    monkeypatch.setattr(hardware, "cpu_vendor", lambda: "AuthenticAMD")
    monkeypatch.delenv(hardware.KERNELS_ENV, raising=False)
    monkeypatch.delenv(hardware.NO_NATIVE_BF16_ENV, raising=False)


@pytest.mark.parametrize("native", [True, False], ids=["native bf16", "no native bf16"])
def test_bf16_on_cpu_takes_onednn_with_native_bf16_and_torchs_emulation_without(monkeypatch, amd_cpu, native):
    monkeypatch.setattr(hardware, "_onednn_reports_bf16", lambda: native)
    compute = hardware.compute_for("cpu", "bf16")
    assert compute.emulated_bf16 is (not native)
    assert compute.kernels == ("oneDNN" if native else hardware.EMULATED_BF16)
    line = compute.line()
    assert line.startswith("Compute: bf16 on cpu; kernels: ") and "\n" not in line and "CPU flags: " in line
    # the cost and the fix, where it is emulated; nothing of them where it is not
    assert (f"about {hardware.EMULATED_BF16_SLOWDOWN} slower than float32" in line) is (not native)
    assert ("--bf16 false" in line) is (not native)
    float32 = hardware.compute_for("cpu", "float32")
    assert (float32.kernels, float32.emulated_bf16) == ("oneDNN", False)  # fp32 does not depend on the answer


def test_the_kernels_switch_and_the_vendor_are_the_reason_where_onednn_does_not_run(monkeypatch, amd_cpu):
    monkeypatch.setattr(hardware, "_onednn_reports_bf16", lambda: True)
    monkeypatch.setenv(hardware.KERNELS_ENV, "0")
    compute = hardware.compute_for(torch.device("cpu"), "bf16")
    assert (compute.kernels, compute.reason, compute.emulated_bf16) == ("torch", "VIT_FT_KERNELS=0", False)
    monkeypatch.setenv(hardware.KERNELS_ENV, "auto")
    monkeypatch.setattr(hardware, "cpu_vendor", lambda: "GenuineIntel")
    compute = hardware.compute_for("cpu", "float32")
    assert compute.kernels == "torch" and "AMD CPUs only, this one is GenuineIntel" in compute.reason
    monkeypatch.setenv(hardware.NO_NATIVE_BF16_ENV, "1")  # emulated whatever the switch says
    compute = hardware.compute_for("cpu", "bf16")
    assert compute.emulated_bf16 and "VIT_FT_NO_NATIVE_BF16=1" in compute.reason


def test_a_gpu_run_takes_torchs_kernels_and_states_no_cpu_flags():
    compute = hardware.compute_for("cuda", "bf16")
    assert (compute.device, compute.kernels, compute.flags) == ("cuda", "torch", ())
    assert not compute.emulated_bf16
    assert "CPU flags" not in compute.line()


@pytest.mark.parametrize("native", [True, False], ids=["native bf16", "no native bf16"])
def test_the_decision_is_one_logged_line_and_a_json_record(monkeypatch, caplog, amd_cpu, native):
    import json
    import logging

    monkeypatch.setattr(hardware, "_onednn_reports_bf16", lambda: native)
    compute = hardware.compute_for("cpu", "bf16")
    with caplog.at_level(logging.INFO, logger="vit_ft"):
        compute.log()
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO if native else logging.WARNING, compute.line())
    ]
    record = json.loads(json.dumps(compute.record()))
    assert record["emulated_bf16"] is (not native) and record["kernels"] == compute.kernels
    assert record["flags"] == list(hardware.cpu_flags())

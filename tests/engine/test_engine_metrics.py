import mmap

import pytest
import torch
from torch import nn

from precision_nb.engine import metrics
from precision_nb.engine.memory_probe import MemoryProbe, host_rss
from precision_nb.engine.metrics import (
    calibrate_cpu_peak,
    count_step_flops,
    gpu_table_key,
    peak_flops,
)


def test_flops_of_a_linear_layer_follow_the_matmul_count():
    b, i, o = 16, 32, 24
    model = nn.Linear(i, o, bias=False)
    x = torch.randn(b, i)
    flops = count_step_flops(model, ("lin-test", b, i, o), lambda: model(x).sum())
    # forward x@W^T (2*b*i*o) + weight gradient (2*b*i*o); no input gradient is needed
    assert flops == 4 * b * i * o
    assert model.weight.grad is None  # counting leaves no gradient behind


def test_flop_counting_restores_buffers_and_rng():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.5))
    x = torch.randn(8, 4) * 10
    before = model[1].running_mean.clone()
    rng = torch.get_rng_state()
    count_step_flops(model, ("bn-test",), lambda: model(x).sum())
    assert torch.equal(model[1].running_mean, before)
    assert torch.equal(torch.get_rng_state(), rng)


def test_flops_cached_per_shape(monkeypatch):
    model = nn.Linear(3, 3)
    calls = []

    def step():
        calls.append(1)
        return model(torch.randn(2, 3)).sum()

    sig = ("cache-test",)
    count_step_flops(model, sig, step)
    count_step_flops(model, sig, step)
    assert len(calls) == 1


@pytest.mark.parametrize(
    "name,key",
    [
        ("NVIDIA H100 80GB HBM3", "h100 sxm"),
        ("NVIDIA H100 PCIe", "h100 pcie"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA L4", "l4"),
        ("Tesla T4", "t4"),
        ("NVIDIA GeForce RTX 4090", "rtx 4090"),
        ("NVIDIA GeForce RTX 3090", "rtx 3090"),
        ("NVIDIA GeForce GTX 1080", None),
        # near misses: another product of the same chip or number is another row, or none
        ("NVIDIA H100 NVL", "h100 nvl"),
        ("NVIDIA H200 NVL", "h200 nvl"),
        ("NVIDIA H100 PCIe", "h100 pcie"),
        ("NVIDIA H100 80GB HBM2e", "h100 pcie"),
        ("NVIDIA GeForce RTX 3090 Ti", "rtx 3090 ti"),
        ("NVIDIA GeForce RTX 4090 D", None),
        ("NVIDIA GeForce RTX 4090 Laptop GPU", None),
        ("NVIDIA A10", None),
        ("NVIDIA L40S", None),
        ("NVIDIA GH200 480GB", None),
        ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", None),
        ("NVIDIA A100 80GB PCIe", "a100"),
    ],
)
def test_gpu_names_map_to_table_rows(name, key):
    assert gpu_table_key(name) == key


def test_h100_nvl_and_3090_ti_get_their_own_datasheet_peaks(monkeypatch):
    for name, fp32, bf16 in (
        ("NVIDIA H100 NVL", 60.0, 835.5),
        ("NVIDIA H100 80GB HBM3", 67.0, 989.5),
        ("NVIDIA GeForce RTX 3090 Ti", 40.0, 80.0),
        ("NVIDIA GeForce RTX 3090", 35.6, 71.0),
    ):
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None, n=name: n)
        cuda = torch.device("cuda")
        assert peak_flops(cuda, torch.float32).flops_per_s == fp32 * 1e12, name
        peak = peak_flops(cuda, torch.bfloat16)
        assert peak.flops_per_s == bf16 * 1e12 and peak.source.startswith("datasheet: "), name


def test_datasheet_peak_is_labelled(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "Tesla T4")
    peak = peak_flops(torch.device("cuda"), torch.float16)
    assert peak.flops_per_s == 65e12 and peak.source.startswith("datasheet: t4")
    assert peak_flops(torch.device("cuda"), torch.bfloat16) is None  # T4 has no bf16 row


def test_cpu_peak_is_measured_once_per_dtype(monkeypatch):
    metrics._CPU_PEAKS.pop("float32", None)
    first = calibrate_cpu_peak(torch.float32, seconds=0.02)
    assert first.flops_per_s > 1e8 and first.source.startswith("measured: CPU float32")
    monkeypatch.setattr(torch, "mm", lambda *a: (_ for _ in ()).throw(AssertionError("re-ran")))
    assert calibrate_cpu_peak(torch.float32) is first
    assert peak_flops(torch.device("mps"), torch.float32) is None


def _fresh_pages(nbytes: int) -> mmap.mmap:
    """``nbytes`` of new anonymous memory, every page touched: resident whatever the process's
    allocator already holds (a tensor of this size may reuse a free region of the heap that is
    resident already, and then the resident set does not grow: it did not in a full suite run)."""
    pages = mmap.mmap(-1, nbytes)
    for offset in range(0, nbytes, mmap.PAGESIZE):
        pages[offset] = 1
    return pages


def test_host_memory_probe_tracks_a_peak():
    probe = MemoryProbe(torch.device("cpu"))
    probe.reset()
    a = probe.read()
    blob = _fresh_pages(64 * 2**20)
    b = probe.read()
    blob.close()
    c = probe.read()
    assert a.kind == "host_rss" and a.reserved is None
    assert b.current > a.current + 32 * 2**20
    assert c.peak >= b.current


def test_host_rss_is_psutils_rss_of_this_process():
    import psutil

    before = host_rss()
    blob = _fresh_pages(64 * 2**20)
    grown = host_rss()
    blob.close()
    assert abs(before - psutil.Process().memory_info().rss) < 16 * 2**20
    assert grown > before + 32 * 2**20  # it follows this process's memory


def test_cuda_memory_probe_reads_allocator_stats(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d=None: calls.append("reset"))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d=None: 100)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d=None: 300)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda d=None: 512)
    probe = MemoryProbe(torch.device("cuda"))
    probe.reset()
    reading = probe.read()
    assert calls == ["reset"]
    assert (reading.kind, reading.current, reading.peak, reading.reserved) == (
        "cuda_allocated",
        100,
        300,
        512,
    )


def test_host_rss_is_psutil_rss_in_this_process_and_in_a_forked_child():
    import os

    import psutil

    from precision_nb.engine.memory_probe import host_rss

    grow = bytearray(64 * 2**20)  # 64 MiB touched: RSS moves far more than between two reads
    grow[::4096] = b"x" * len(grow[::4096])
    assert abs(host_rss() - psutil.Process().memory_info().rss) < 8 * 2**20
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child must read its own statm, not the parent's fd
        del grow
        ok = abs(host_rss() - psutil.Process().memory_info().rss) < 8 * 2**20
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 1) == b"1"

"""benchmarks/bf16_projection.py measures what it says: its bf16 rounding is round-to-nearest-
even (against torch's bfloat16), and its C tiles compute x W^T (the bf16 ones, AVX512_BF16
and AMX, exactly the product of the rounded inputs, up to float32 accumulation), so its
speed ratios compare correct products."""
from __future__ import annotations

import importlib.util
import json
import os
import platform
import shutil

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("bf16_projection", os.path.join(HERE, "..", "benchmarks",
                                                                              "bf16_projection.py"))
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def needs_cpu(flag: str | None = None):
    """Skip unless on x86-64 with a C compiler and, when given, this /proc/cpuinfo flag."""
    missing = (platform.machine() not in ("x86_64", "AMD64") or shutil.which(os.environ.get("CC", "cc")) is None
               or (flag is not None and flag not in bench.cpu_flags()))
    return pytest.mark.skipif(missing, reason=f"needs x86-64{f' with {flag}' if flag else ''} and a C compiler")


def test_rounding_is_torchs_bfloat16():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(10000).astype(np.float32) * 10.0 ** rng.integers(-6, 6, 10000),
                        np.array([0.0, -0.0, 1.0, 1.00390625, 1.01171875, 3.0e38, -1.5e-39], np.float32)])
    want = torch.from_numpy(x).to(torch.bfloat16).to(torch.float32).numpy()
    np.testing.assert_array_equal(bench.to_bf16(x), want)


@needs_cpu("avx512_bf16")
def test_both_tiles_compute_the_projection(tmp_path):
    dll = bench.build(str(tmp_path))
    rng = np.random.default_rng(1)
    N, d, m = 24, 64, 64
    x = rng.standard_normal((N, d)).astype(np.float32)
    w = rng.standard_normal((m, d)).astype(np.float32)
    u32, ubf = np.empty((N, m), np.float32), np.empty((N, m), np.float32)
    x2, w2 = np.empty(N * d, np.uint16), np.empty((d // 2) * m, np.uint32)
    wt = np.ascontiguousarray(w.T)
    assert dll.fp32_projection(u32.ctypes.data, x.ctypes.data, wt.ctypes.data, N, d, m) == 0
    dll.frequencies_to_bf16_pairs(w2.ctypes.data, w.ctypes.data, m, d)
    dll.fp32_to_bf16_rows(x2.ctypes.data, x.ctypes.data, N * d)
    assert dll.bf16_projection(ubf.ctypes.data, x2.ctypes.data, w2.ctypes.data, N, d, m) == 0
    exact = x.astype(np.float64) @ w.T.astype(np.float64)
    scale = np.abs(x).astype(np.float64) @ np.abs(w.T).astype(np.float64)
    assert (np.abs(u32 - exact) / scale).max() < 1e-6
    rounded = bench.to_bf16(x).astype(np.float64) @ bench.to_bf16(w).T.astype(np.float64)
    assert (np.abs(ubf - rounded) / scale).max() < 1e-6          # the rounded inputs' product
    assert 1e-4 < (np.abs(ubf - exact) / scale).max() <= bench.BF16_BOUND
    assert dll.fp32_projection(u32.ctypes.data, x.ctypes.data, wt.ctypes.data, N + 1, d, m) == 1  # refused sizes


@needs_cpu("amx_bf16")
def test_amx_tiles_compute_the_projection(tmp_path):
    dll = bench.build(str(tmp_path))
    if not bench.amx_available(dll):
        pytest.skip("the kernel does not grant this process AMX's tile state")
    rng = np.random.default_rng(2)
    N, d, m = 64, 64, 96
    x = rng.standard_normal((N, d)).astype(np.float32)
    w = rng.standard_normal((m, d)).astype(np.float32)
    uamx = np.full((N, m), np.nan, np.float32)
    x2, w2 = np.empty(N * d, np.uint16), np.empty((d // 2) * m, np.uint32)
    dll.frequencies_to_bf16_pairs(w2.ctypes.data, w.ctypes.data, m, d)
    dll.fp32_to_bf16_rows(x2.ctypes.data, x.ctypes.data, N * d)
    assert dll.amx_projection(uamx.ctypes.data, x2.ctypes.data, w2.ctypes.data, N, d, m) == 0
    scale = np.abs(x).astype(np.float64) @ np.abs(w.T).astype(np.float64)
    rounded = bench.to_bf16(x).astype(np.float64) @ bench.to_bf16(w).T.astype(np.float64)
    assert (np.abs(uamx - rounded) / scale).max() < 1e-6          # every block written, the rounded product
    exact = x.astype(np.float64) @ w.T.astype(np.float64)
    assert 1e-4 < (np.abs(uamx - exact) / scale).max() <= bench.BF16_BOUND
    assert dll.amx_projection(uamx.ctypes.data, x2.ctypes.data, w2.ctypes.data, N - 8, d, m) == 1  # refused sizes


@needs_cpu()
def test_amx_tile_refuses_before_the_tile_state_is_granted(tmp_path):
    """Without a granted amx_request (on any CPU, AMX or not) the AMX tile returns 3 instead of
    running a tile instruction, which kills the process where the CPU or Linux says no."""
    dll = bench.build(str(tmp_path))
    N = d = m = 32
    u = np.full((N, m), np.nan, np.float32)
    x2, w2 = np.zeros(N * d, np.uint16), np.zeros((d // 2) * m, np.uint32)
    assert dll.amx_projection(u.ctypes.data, x2.ctypes.data, w2.ctypes.data, N, d, m) in (2, 3)  # 2: built without AMX
    assert np.isnan(u).all()


@needs_cpu("avx512_bf16")
def test_the_benchmark_runs_on_this_cpu(tmp_path):
    """The whole command at a small size, as CI runs it: the AMX columns only where granted."""
    out = tmp_path / "bf16.json"
    assert bench.main(["--seq-len", "64", "--features", "32", "--rounds", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    has_amx_rows = any(name.startswith("AMX") for name in result["speed"]["32"])
    assert has_amx_rows == result["amx"]
    assert result["speed"]["32"]["error"]["bf16 tile"] <= bench.BF16_BOUND

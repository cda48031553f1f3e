"""The hardware catalog (podkit.sim.hardware): the published values, the pods a spec names
(standard slice shapes, which dimensions wrap around), user hardware in TOML, and the errors
that name the bad value and the fix."""

import math

import pytest

from podkit import hardware as mfu
from podkit.errors import ConfigError
from podkit.sim import hardware as hw

GIB = 1 << 30


def test_tpu_values_are_the_published_ones():
    # cloud.google.com/tpu/docs/v4, v5p, v5e, v6e, v3; ICI per link one-way and the ~1 us hop
    # from the JAX scaling book (docs/sim-hardware.md has each source).
    v4, v5p, v5e, v6e, v3 = (hw.BUILTIN[k] for k in ("tpu-v4", "tpu-v5p", "tpu-v5e", "tpu-v6e",
                                                     "tpu-v3"))
    assert (v4.peak_flops, v4.hbm_bytes, v4.hbm_bandwidth) == (275e12, 32 * GIB, 1200e9)
    assert (v4.ici_links, v4.ici_bandwidth, v4.torus_dims) == (6, 4.5e10, 3)
    assert (v5p.peak_flops, v5p.hbm_bytes, v5p.hbm_bandwidth) == (459e12, 95 * GIB, 2765e9)
    assert (v5p.ici_links, v5p.ici_bandwidth) == (6, 9e10)
    assert (v5e.peak_flops, v5e.hbm_bytes, v5e.hbm_bandwidth) == (197e12, 16 * GIB, 819e9)
    assert (v5e.ici_links, v5e.ici_bandwidth, v5e.torus_dims) == (4, 4.5e10, 2)
    assert (v6e.peak_flops, v6e.hbm_bytes, v6e.hbm_bandwidth) == (918e12, 32 * GIB, 1638e9)
    assert (v6e.ici_links, v6e.ici_bandwidth) == (4, 9e10)
    assert (v3.peak_flops, v3.hbm_bytes, v3.hbm_bandwidth, v3.ici_bandwidth) == (
        123e12, 32 * GIB, 900e9, 1e11)
    assert all(c.hop_latency == 1e-6 and c.source for c in (v4, v5p, v5e, v6e, v3))


def test_gpu_values_are_the_published_ones_per_direction():
    # NVIDIA counts NVLink both ways (600 GB/s A100, 900 GB/s H100/H200): one way is half.
    # One NIC per GPU: HDR 200 Gb/s (DGX A100) = 25 GB/s, NDR 400 Gb/s (DGX H100) = 50 GB/s.
    a100, h100, h200 = hw.BUILTIN["a100"], hw.BUILTIN["h100"], hw.BUILTIN["h200"]
    assert (a100.peak_flops, a100.hbm_bandwidth, a100.domain_bandwidth * 2,
            a100.network_bandwidth * 8) == (312e12, 2039e9, 600e9, 200e9)
    assert (h100.peak_flops, h100.hbm_bandwidth, h100.domain_bandwidth * 2,
            h100.network_bandwidth * 8) == (989e12, 3.35e12, 900e9, 400e9)
    assert (h200.peak_flops, h200.hbm_bytes, h200.hbm_bandwidth) == (989e12, 141 * GIB, 4.8e12)
    assert all(g.domain_size == 8 and g.family == "gpu" for g in (a100, h100, h200))


def test_peaks_are_podkits_mfu_table():
    """One table for MFU and the simulator: a change to podkit.hardware reaches both."""
    pairs = {"tpu-v3": "TPU v3", "tpu-v4": "TPU v4", "tpu-v5e": "TPU v5e", "tpu-v5p": "TPU v5p",
             "tpu-v6e": "TPU v6e", "a100": "NVIDIA A100", "h100": "NVIDIA H100",
             "h200": "NVIDIA H200"}
    assert {k: hw.BUILTIN[k].peak_flops for k in pairs} == {
        k: mfu.PEAK_BF16[v] for k, v in pairs.items()}


def test_cpu_defaults_are_flagged_uncalibrated():
    cpu = hw.BUILTIN["cpu"]
    assert cpu.family == "cpu" and cpu.calibrated is False and "calibration" in cpu.source


@pytest.mark.parametrize("spec, shape, wrap", [
    ("tpu-v4:2048", (8, 16, 16), (True,) * 3),  # the most cube-like 2048-chip slice
    ("tpu-v4:4096", (16, 16, 16), (True,) * 3),
    ("tpu-v5p:128", (4, 4, 8), (True,) * 3),  # whole 4x4x4 cubes: every dim wraps
    ("tpu-v4:1024", (8, 8, 16), (True,) * 3),
    ("tpu-v4:32", (2, 4, 4), (False,) * 3),  # below a cube: no optical wraparound at all
    ("tpu-v5p:2x2x4", (2, 2, 4), (False,) * 3),  # the scaling book's example: 2x2x4 no wraps
    ("tpu-v5e:16x16", (16, 16), (True, True)),  # a full v5e pod is a 2D torus
    ("tpu-v5e:4x8", (4, 8), (False, False)),  # dims below 16 do not wrap
    ("tpu-v6e:128", (8, 16), (False, True)),  # 8x16 wraps on its long axis only
    ("tpu-v5e:1", (1, 1), (False, False)),
    ("v5e:256", (16, 16), (True, True)),  # "tpu-" may be left out
    ("tpu-v3:1024", (32, 32), (True, True)),  # the v3 pod, 32x32
    ("tpu-v3:512", (16, 32), (False, True)),
])
def test_tpu_pods_take_the_standard_slice_and_wrap_as_documented(spec, shape, wrap):
    p = hw.pod(spec)
    assert (p.shape, p.wrap, p.chips) == (shape, wrap, math.prod(shape))
    assert p.chip.torus and p.spec.endswith("x".join(map(str, shape)))


@pytest.mark.parametrize("spec, shape", [
    ("h100:8", (1, 8)), ("h100:4", (1, 4)), ("a100:2048", (256, 8)), ("h200:2x8", (2, 8)),
    ("cpu:4", (1, 4)), ("cpu:2x2", (2, 2)),
])
def test_switched_pods_are_domains_of_devices(spec, shape):
    p = hw.pod(spec)
    assert (p.shape, p.wrap, p.domains) == (shape, (), shape[0])


@pytest.mark.parametrize("spec, names", [
    ("tpu-v9:8", ["'tpu-v9'", "tpu-v4", "h100", "cpu", "TOML"]),  # unknown kind: the known ones
    ("tpu-v4:100", ["100 chips", "valid counts", "64", "128", "4096"]),  # no such slice
    ("tpu-v5e:8x4", ["8x4", "4x8"]),  # a shape that is not a slice: the same-count shapes
    ("tpu-v5p:4x4x6", ["4x4x6", "valid shapes"]),
    ("h100:12", ["12", "whole domains of 8", "16"]),  # GPUs above a node: whole nodes
    ("h100:2x16", ["2x16", "at most 8"]),
    ("tpu-v4", ["KIND:CHIPS", "tpu-v4:2048"]),  # no colon
    ("tpu-v4:lots", ["'lots'", "chip count"]),
    ("tpu-v4:0", ["'0'", "positive"]),
])
def test_bad_pod_specs_name_the_value_and_the_fix(spec, names):
    with pytest.raises(ConfigError) as e:
        hw.pod(spec)
    assert all(n in str(e.value) for n in names), str(e.value)


USER = """
[chip.tpu-v5e-fast]            # a what-if: v5e with v6e's links
base = "tpu-v5e"
ici_bandwidth = 9e10
source = "what-if"

[chip.my-gpu]
family = "gpu"
peak_flops = 5e14
hbm_bytes = "48GiB"
hbm_bandwidth = 2e12
domain_size = 4
domain_bandwidth = 2e11
network_bandwidth = 2.5e10
source = "vendor sheet"

[chip.my-tpu]
family = "tpu"
peak_flops = 1e14
hbm_bytes = 8e9
hbm_bandwidth = 5e11
ici_links = 4
ici_bandwidth = 2e10
torus_dims = 2
wrap = "all"
shapes = ["4x4", [8, 8]]

[chip.cpu]                     # what calibration writes: the measured cpu
base = "cpu"
calibrated = true
peak_flops = 1.2e11
"""


def test_user_hardware_loads_from_toml(tmp_path):
    path = tmp_path / "hw.toml"
    path.write_text(USER)
    chips = hw.load_catalog(path)
    fast = chips["tpu-v5e-fast"]
    assert fast.ici_bandwidth == 9e10 and fast.peak_flops == 197e12 and fast.source == "what-if"
    assert fast.shapes == hw.BUILTIN["tpu-v5e"].shapes  # inherited from its base
    mine = chips["my-gpu"]
    assert (mine.hbm_bytes, mine.domain_size, mine.network_latency) == (48 * GIB, 4, 0.0)
    assert hw.pod("my-gpu:8", chips).shape == (2, 4)
    tpu = hw.pod("my-tpu:8x8", chips)
    assert tpu.shape == (8, 8) and tpu.wrap == (True, True)
    assert chips["cpu"].calibrated and chips["cpu"].peak_flops == 1.2e11
    assert chips["h100"] == hw.BUILTIN["h100"]  # the built-ins stay


def test_user_hardware_from_the_environment(tmp_path, monkeypatch):
    path = tmp_path / "hw.toml"
    path.write_text(USER)
    monkeypatch.setenv(hw.ENV_HARDWARE, str(path))
    assert hw.pod("tpu-v5e-fast:16x16").chip.ici_bandwidth == 9e10
    monkeypatch.delenv(hw.ENV_HARDWARE)
    with pytest.raises(ConfigError, match="tpu-v5e-fast"):
        hw.pod("tpu-v5e-fast:16x16")


@pytest.mark.parametrize("text, names", [
    ("[chip.x\nfamily = 'gpu'", ["not valid TOML", "docs/sim-hardware.md"]),
    ("[chip.x]\nbase = 'h100'\nnvlink = 1e11", ["'nvlink'", "valid keys", "domain_bandwidth"]),
    ("[chip.x]\nbase = 'h100'\npeak_flops = 'fast'", ["peak_flops = 'fast'", "4.5e10"]),
    ("[chip.x]\nbase = 'h100'\nhbm_bytes = '16 lots'", ["hbm_bytes = '16 lots'", "GiB"]),
    ("[chip.x]\nbase = 'h100'\ndomain_size = 8.5", ["domain_size = 8.5", "integer"]),
    ("[chip.x]\nbase = 'h900'", ["base = 'h900'", "known", "h100"]),
    ("[chip.x]\nfamily = 'fpga'", ["family = 'fpga'", "'tpu'", "'gpu'"]),
    ("[chip.x]\nfamily = 'gpu'\npeak_flops = 1e15", ["needs", "hbm_bytes", "domain_bandwidth"]),
    ("[chip.x]\nbase = 'h100'\nhbm_bandwidth = -1.0", ["hbm_bandwidth = -1.0", "positive"]),
    ("[chip.x]\nbase = 'tpu-v4'\nwrap = 'sometimes'", ["wrap = 'sometimes'", "'cubes'"]),
    ("[chip.x]\nbase = 'tpu-v4'\nshapes = ['4x4']", ["(4, 4)", "torus_dims = 3"]),
    ("[chip.x]\nbase = 'tpu-v4'\nshapes = ['4xfour']", ["'4xfour'", "AxB"]),
    ("[system.x]\nchips = 4", ["'system'", "[chip.NAME]"]),
])
def test_bad_toml_names_the_file_the_key_and_the_fix(tmp_path, text, names):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        hw.load_catalog(path)
    assert str(path) in str(e.value) and all(n in str(e.value) for n in names), str(e.value)


def test_a_missing_hardware_file_names_the_path(tmp_path):
    with pytest.raises(ConfigError, match="cannot be read.*PODKIT_SIM_HARDWARE"):
        hw.load_catalog(tmp_path / "none.toml")

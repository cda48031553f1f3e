"""What a device can do: its peak FLOP/s (what MFU divides by) and its memory.

    peak = hardware.peak_flops(jax.devices()[0])   # Peak(flops_per_s=1.97e14, source=...)
    hardware.memory_capacity(device)                # bytes, or None where not reported

Accelerators: the vendors' dense bf16 peaks per chip (sources in docs/observability.md; the
TPU benchmark, bench/tpu.py, reads the same table). CPUs have no spec sheet worth trusting:
the peak is a float32 matmul measured once on this machine and kept under `$PODKIT_CACHE`
(default ~/.cache/podkit), keyed by the processor, the core count and the JAX version, and
shared by the process's virtual CPU devices (`connect(cpu_devices=N)` splits one host).
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import threading
import time
from pathlib import Path
from typing import Any

# Dense bf16 FLOP/s per chip, by device_kind prefix (longest prefix wins).
PEAK_BF16 = {
    "TPU v2": 45e12, "TPU v3": 123e12, "TPU v4": 275e12, "TPU v5 lite": 197e12,
    "TPU v5e": 197e12, "TPU v5p": 459e12, "TPU v5": 459e12, "TPU v6 lite": 918e12,
    "TPU v6e": 918e12, "NVIDIA A100": 312e12, "NVIDIA H100": 989e12, "NVIDIA H200": 989e12,
}
# Memory per chip where a platform does not report it (bytes).
HBM_BYTES = {"TPU v4": 32 << 30, "TPU v5 lite": 16 << 30, "TPU v5e": 16 << 30,
             "TPU v5p": 95 << 30, "TPU v6 lite": 32 << 30, "TPU v6e": 32 << 30}

CPU_MATMUL_N = 1024


@dataclasses.dataclass(frozen=True)
class Peak:
    flops_per_s: float  # one device's
    source: str  # "spec sheet (TPU v5 lite, bf16)" or "measured float32 matmul, cached"


def _by_kind(table: dict[str, Any], kind: str) -> Any:
    for name, value in sorted(table.items(), key=lambda kv: -len(kv[0])):
        if kind.startswith(name):
            return value
    return None


def spec_peak(device: Any) -> float | None:
    """The device kind's dense bf16 peak from the table, or None."""
    return _by_kind(PEAK_BF16, device.device_kind)


_cpu_peak: float | None = None
_lock = threading.Lock()


def peak_flops(device: Any) -> Peak | None:
    """One device's peak FLOP/s: the spec table for accelerators, a cached measurement on
    CPUs; None for an accelerator the table does not know."""
    if device.platform != "cpu":
        peak = spec_peak(device)
        return None if peak is None else Peak(peak, f"spec sheet ({device.device_kind}, bf16)")
    import jax

    devices = max(len([d for d in jax.local_devices() if d.platform == "cpu"]), 1)
    return Peak(cpu_peak() / devices, f"measured float32 matmul on this host, / {devices} "
                "virtual devices")


def _cache_file() -> Path:
    import jax

    from podkit.paths import cache_root

    root = cache_root()
    key = f"{platform.processor() or platform.machine()}-{os.cpu_count()}-jax{jax.__version__}"
    return root / "peak" / (key.replace("/", "_").replace(" ", "_") + ".json")


def cpu_peak() -> float:
    """The host's float32 matmul FLOP/s (all cores), measured once and cached on disk."""
    global _cpu_peak
    with _lock:
        if _cpu_peak is not None:
            return _cpu_peak
        path = _cache_file()
        try:
            _cpu_peak = float(json.loads(path.read_text())["flops_per_s"])
            return _cpu_peak
        except (OSError, ValueError, KeyError):
            pass
        _cpu_peak = _measure_cpu()
        _write_cache(path, _cpu_peak)
        return _cpu_peak


def observed(device: Any, flops_per_s: float) -> bool:
    """A step ran at `flops_per_s` on `device`. On a CPU, a rate above the cached peak means
    the peak was measured while something else loaded the machine: the rate replaces it
    (here and in the cache), so MFU never reads above 1. Returns whether the peak changed."""
    global _cpu_peak
    if device.platform != "cpu":
        return False
    import jax

    flops_per_s *= max(len([d for d in jax.local_devices() if d.platform == "cpu"]), 1)
    current = cpu_peak()
    with _lock:
        if flops_per_s <= current:
            return False
        _cpu_peak = flops_per_s
        _write_cache(_cache_file(), flops_per_s)
        return True


def _write_cache(path: Path, flops_per_s: float) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"flops_per_s": flops_per_s, "n": CPU_MATMUL_N}))
        tmp.replace(path)
    except OSError:
        pass  # a read-only home: measured again by the next process


def _measure_cpu() -> float:
    import jax
    import jax.numpy as jnp

    cpu = jax.local_devices(backend="cpu")[0]
    n = CPU_MATMUL_N
    a = jax.device_put(jnp.ones((n, n), jnp.float32), cpu)
    mm = jax.jit(lambda a: a @ a)
    mm(a).block_until_ready()
    best = 0.0  # the best of several rounds: a round another process slowed is noise
    for _ in range(8):
        start = time.perf_counter()
        for _ in range(4):
            out = mm(a)
        out.block_until_ready()
        best = max(best, 4 * 2 * n**3 / (time.perf_counter() - start))
    return best


ENV_DEVICE_MEMORY = "PODKIT_DEVICE_MEMORY"
"""A declared capacity per device ("16GiB", "512MiB", bytes): what the memory check before
the first step compares with, in place of what the device reports (on CPU, which reports
nothing, the only way to check a step against a target accelerator's memory)."""

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 10**6,
          "mib": 1 << 20, "g": 1 << 30, "gb": 10**9, "gib": 1 << 30, "t": 1 << 40,
          "tb": 10**12, "tib": 1 << 40}


def parse_bytes(text: str) -> int:
    """"16GiB" -> 17179869184; ValueError naming the forms otherwise."""
    import re

    match = re.fullmatch(r"\s*([\d.]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(f"{text!r} is not a size: write bytes, or a number with KiB, MiB, "
                         "GiB, TiB (or KB, MB, GB, TB)")
    return int(float(match.group(1)) * _UNITS[unit])


def format_bytes(n: float) -> str:
    """1.62 GiB, 2.0 MiB, 512 B."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def declared_memory() -> int | None:
    """The capacity PODKIT_DEVICE_MEMORY declares, if set."""
    text = os.environ.get(ENV_DEVICE_MEMORY)
    if not text:
        return None
    try:
        return parse_bytes(text)
    except ValueError as e:
        from podkit.errors import ConfigError

        raise ConfigError(f"{ENV_DEVICE_MEMORY}={text!r}: {e}.") from None


def memory_capacity(device: Any) -> int | None:
    """The bytes a device can hold: a declared capacity (PODKIT_DEVICE_MEMORY), else what
    it reports (TPU, GPU), else the table; None on CPU (host memory, shared)."""
    declared = declared_memory()
    if declared is not None:
        return declared
    stats = memory_stats(device)
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    if device.platform == "cpu":
        return None
    return _by_kind(HBM_BYTES, device.device_kind)


def memory_stats(device: Any) -> dict | None:
    """`device.memory_stats()` where the platform reports it (TPU and GPU do), else None."""
    try:
        return device.memory_stats() or None
    except Exception:  # platforms without it raise various errors
        return None

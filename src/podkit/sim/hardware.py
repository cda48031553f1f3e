"""The hardware catalog: what a chip can do and how a pod's chips are wired.

    sim.hardware.pod("tpu-v4:2048")    # Pod(tpu-v4, shape=(8, 16, 16), wrap=(True, True, True))
    sim.hardware.pod("tpu-v5e:4x8")    # an explicit slice shape; no dim of 16, so no wraparound
    sim.hardware.pod("h100:64")        # 8 NVLink domains of 8 GPUs on a fat-tree
    sim.hardware.pod("cpu:2x2")        # 2 processes of 2 virtual devices

A `Chip` is one device: its dense bf16 peak, its HBM, and its links: for TPUs the ICI torus
(links per chip, one-direction bandwidth per link, latency per hop, when a dimension wraps
around, the valid slice shapes); for GPUs the switched fabric (an NVLink domain of 8 GPUs, one
InfiniBand NIC per GPU); for the CPU the same two tiers (virtual devices of one process, and
gloo between processes), with numbers that calibration measures. Every value names its public
source (`Chip.source`, and in full in docs/sim-hardware.md).

A `Pod` is a chip kind and a physical shape: a TPU slice's torus (with a wrap flag per
dimension), or (domains, devices per domain) for a switched fabric. Users add hardware in TOML
(`load_catalog`, `$PODKIT_SIM_HARDWARE`); the format is in docs/sim-hardware.md.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from podkit.errors import ConfigError
from podkit.hardware import HBM_BYTES, PEAK_BF16, parse_bytes
from podkit.topology import TPU_KINDS, TpuKind

ENV_HARDWARE = "PODKIT_SIM_HARDWARE"
"""TOML files of user hardware (os.pathsep-separated), read after the built-ins."""

CALIBRATION = Path(__file__).with_name("calibration.toml")
"""Written by calibration (the `cpu` entry, measured on this machine); read when present."""

FAMILIES = ("tpu", "gpu", "cpu")
WRAPS = ("cubes", "side", "all", "none")
GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Chip:
    """One device. Bandwidths are bytes/s in one direction, latencies seconds, sizes bytes."""

    name: str  # what a pod spec names: tpu-v4, h100, cpu
    family: str  # "tpu" (ICI torus), "gpu" or "cpu" (switched: domain + network)
    peak_flops: float  # dense bf16 FLOP/s (cpu: float32 matmul, measured)
    hbm_bytes: float
    hbm_bandwidth: float
    # -- TPU: the ICI torus --------------------------------------------------------------------
    ici_links: int = 0  # per chip: 2 per torus dimension
    ici_bandwidth: float = 0.0  # per link, one direction
    hop_latency: float = 0.0  # per ICI hop
    # Multislice: slices of a pod meet over the data-center network (DCN), each host on its
    # own NICs. Per chip: the host's DCN egress over its chips (one direction), and a step's
    # latency. 0: no multislice figure for this chip.
    dcn_bandwidth: float = 0.0
    dcn_latency: float = 0.0
    torus_dims: int = 0  # 2 or 3
    # When a slice's dimension has wraparound links: "cubes" = every dimension, when all are
    # multiples of `wrap_size` (v4, v5p: optical links close whole 4x4x4 cubes); "side" = a
    # dimension whose length is `wrap_size` (v5e, v6e: 16; v3: 32 - the full pod side);
    # "all" / "none" for user hardware.
    wrap: str = ""
    wrap_size: int = 0
    shapes: tuple[tuple[int, ...], ...] = ()  # valid slice shapes (chip grids)
    # -- GPU / CPU: a switched fabric of two tiers ---------------------------------------------
    domain_size: int = 0  # devices that share the fast tier (8 per NVLink domain); 0: any
    domain_bandwidth: float = 0.0  # per device: NVLink (GPU), in-process copies (CPU)
    domain_latency: float = 0.0  # per collective step
    network_bandwidth: float = 0.0  # per device: its InfiniBand NIC (GPU), gloo (CPU)
    network_latency: float = 0.0
    calibrated: bool = True  # False: defaults not yet measured (the cpu entry before calibration)
    source: str = ""  # where the numbers come from (each value's source: docs/sim-hardware.md)

    @property
    def torus(self) -> bool:
        return self.family == "tpu"

    def wraps(self, shape: tuple[int, ...]) -> tuple[bool, ...]:
        """Which dimensions of a slice of this shape have wraparound links."""
        if self.wrap == "cubes":
            whole = all(d % self.wrap_size == 0 for d in shape)
            return tuple(whole for _ in shape)
        if self.wrap == "side":
            return tuple(d == self.wrap_size for d in shape)
        return tuple(self.wrap == "all" and d > 2 for d in shape)


@dataclasses.dataclass(frozen=True)
class Pod:
    """A chip kind and its physical shape: a TPU slice's torus, or (domains, per domain)."""

    chip: Chip
    shape: tuple[int, ...]
    wrap: tuple[bool, ...] = ()  # per torus dimension; () for a switched fabric
    slices: int = 1  # TPU slices of this shape joined by the data-center network

    @property
    def chips(self) -> int:
        return math.prod(self.shape) * self.slices

    @property
    def slice_chips(self) -> int:
        """Chips of one slice (the ICI-connected part)."""
        return math.prod(self.shape)

    def one_slice(self) -> Pod:
        """The same pod with one slice."""
        return dataclasses.replace(self, slices=1)

    @property
    def domains(self) -> int:
        """NVLink domains (GPU), processes (CPU); 1 for a TPU slice."""
        return 1 if self.chip.torus else self.shape[0]

    @property
    def spec(self) -> str:
        one = f"{self.chip.name}:{'x'.join(map(str, self.shape))}"
        return one if self.slices == 1 else f"{self.slices} x {one}"

    def __str__(self) -> str:
        return self.spec


# -- the built-in catalog ----------------------------------------------------------------------
# Sources (URLs and what each says): docs/sim-hardware.md. Peaks and TPU HBM sizes are podkit's
# MFU table (podkit.hardware), one place for both.
_BOOK = "jax-ml.github.io/scaling-book/tpus (ICI per link one-way, ~1 us per hop)"
_NCCL = "NCCL src/graph/tuning.cc hwLat ring/LL (0.6 us NVLink, 2.7 us network per step)"

TPU_V3 = TpuKind("v3", "", 2, 4, ((2, 2),), (), 1024)
"""v3 slices (not in podkit.topology, which serves GKE, where v3 is not offered): 4-chip hosts,
2x2 up to the 32x32 pod in power-of-two grids (v3-8 .. v3-2048 count TensorCores, 2 a chip)."""


# DCN per chip, one direction (docs/sim-hardware.md): the scaling book's per-chip egress for
# v5e (3.125e9 B/s), v5p (6.25e9) and v6e (12.5e9), which Cloud TPU's pages state as 25, 50
# and 100 Gb/s per chip; v4 from what PaLM's two pods reached (Chowdhery et al. 2022, section
# 4: 81 Tb/s across 1,536 hosts of 4 chips for the cross-pod gradient transfer: 1.65e9 B/s a
# chip; the PaLM case of bench/sim_validate.py hides it behind compute, so it does not move
# that case's figure). Latency per step: 10 us, a stated assumption (a data-center network
# round trip is tens of microseconds; at gradient sizes the bandwidth term dominates).
_DCN_LATENCY = 10e-6
_DCN_SOURCE = ("DCN: scaling book per-chip egress (v5e, v5p, v6e); v4 from PaLM's 81 Tb/s "
               "over 1,536 hosts")


def _tpu(name: str, kind: TpuKind, device_kind: str, hbm_bandwidth: float, links: int,
         link_bandwidth: float, wrap: str, wrap_size: int, source: str,
         hbm_bytes: float | None = None, dcn_bandwidth: float = 0.0) -> Chip:
    return Chip(name, "tpu", PEAK_BF16[device_kind],
                hbm_bytes if hbm_bytes is not None else HBM_BYTES[device_kind], hbm_bandwidth,
                ici_links=links, ici_bandwidth=link_bandwidth, hop_latency=1e-6,
                dcn_bandwidth=dcn_bandwidth, dcn_latency=_DCN_LATENCY if dcn_bandwidth else 0.0,
                torus_dims=kind.dims, wrap=wrap, wrap_size=wrap_size,
                shapes=tuple(kind.topologies()),
                source=f"{source}; {_BOOK}" + (f"; {_DCN_SOURCE}" if dcn_bandwidth else ""))


def _gpu(name: str, device_kind: str, hbm_bytes: float, hbm_bandwidth: float,
         nvlink: float, nic: float, source: str) -> Chip:
    return Chip(name, "gpu", PEAK_BF16[device_kind], hbm_bytes, hbm_bandwidth,
                domain_size=8, domain_bandwidth=nvlink, domain_latency=0.6e-6,
                network_bandwidth=nic, network_latency=2.7e-6, source=f"{source}; {_NCCL}")


BUILTIN: Mapping[str, Chip] = {c.name: c for c in (
    _tpu("tpu-v3", TPU_V3, "TPU v3", 900e9, 4, 1e11, "side", 32,
         "cloud.google.com/tpu/docs/v3", hbm_bytes=32 * GIB),
    _tpu("tpu-v4", TPU_KINDS["v4"], "TPU v4", 1200e9, 6, 4.5e10, "cubes", 4,
         "cloud.google.com/tpu/docs/v4", dcn_bandwidth=81e12 / 8 / 1536 / 4),
    _tpu("tpu-v5e", TPU_KINDS["v5e"], "TPU v5e", 819e9, 4, 4.5e10, "side", 16,
         "cloud.google.com/tpu/docs/v5e", dcn_bandwidth=3.125e9),
    _tpu("tpu-v5p", TPU_KINDS["v5p"], "TPU v5p", 2765e9, 6, 9e10, "cubes", 4,
         "cloud.google.com/tpu/docs/v5p", dcn_bandwidth=6.25e9),
    _tpu("tpu-v6e", TPU_KINDS["v6e"], "TPU v6e", 1638e9, 4, 9e10, "side", 16,
         "cloud.google.com/tpu/docs/v6e", dcn_bandwidth=12.5e9),
    # NVLink: per GPU, one direction (NVIDIA's 600 / 900 GB/s count both). NIC: one per GPU,
    # HDR 200 Gb/s on DGX A100, NDR 400 Gb/s on DGX H100/H200.
    _gpu("a100", "NVIDIA A100", 80 * GIB, 2039e9, 300e9, 25e9,
         "NVIDIA A100 datasheet (SXM 80GB); DGX A100 user guide (8x ConnectX-6 HDR)"),
    _gpu("h100", "NVIDIA H100", 80 * GIB, 3.35e12, 450e9, 50e9,
         "NVIDIA H100 datasheet (SXM); DGX H100 (8x ConnectX-7 NDR 400 Gb/s)"),
    _gpu("h200", "NVIDIA H200", 141 * GIB, 4.8e12, 450e9, 50e9,
         "NVIDIA H200 datasheet (SXM); DGX H200 (8x ConnectX-7 NDR 400 Gb/s)"),
    # Placeholders until calibration writes calibration.toml (calibrated = true there): a
    # process's virtual devices share host memory (domain), processes talk over gloo (network).
    Chip("cpu", "cpu", 5e10, 16 * GIB, 1e10, domain_size=0, domain_bandwidth=5e9,
         domain_latency=5e-6, network_bandwidth=1e9, network_latency=5e-5, calibrated=False,
         source="uncalibrated defaults: run calibration to measure this machine"),
)}


# -- user hardware in TOML -------------------------------------------------------------------
_FIELDS = {f.name: f for f in dataclasses.fields(Chip)}
_FLOATS = {"peak_flops", "hbm_bandwidth", "ici_bandwidth", "hop_latency", "dcn_bandwidth",
           "dcn_latency", "domain_bandwidth",
           "domain_latency", "network_bandwidth", "network_latency"}
_INTS = {"ici_links", "torus_dims", "wrap_size", "domain_size"}
_REQUIRED = {"tpu": ("peak_flops", "hbm_bytes", "hbm_bandwidth", "ici_links", "ici_bandwidth",
                     "torus_dims", "wrap", "shapes"),
             "gpu": ("peak_flops", "hbm_bytes", "hbm_bandwidth", "domain_size",
                     "domain_bandwidth", "network_bandwidth"),
             "cpu": ("peak_flops", "hbm_bytes", "hbm_bandwidth", "domain_bandwidth",
                     "network_bandwidth")}


def read_file(path: str | os.PathLike) -> dict[str, Any]:
    """A hardware file's TOML; ConfigError naming the file if it cannot be read or parsed."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"hardware file {str(path)!r} cannot be read ({e.strerror}); check "
                          f"the path (given directly or in ${ENV_HARDWARE}).") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"hardware file {str(path)!r} is not valid TOML: {e}. The format is "
                          "in docs/sim-hardware.md.") from None


def file_version(path: str | os.PathLike) -> tuple[str, int, int]:
    """(absolute path, mtime, size) of a hardware file: the key of a cache of what was read
    from it, so that a file edited since is read again."""
    try:
        stat = os.stat(path)
    except OSError:
        read_file(path)  # raises the error that names the file and the fix
        raise
    return os.path.abspath(path), stat.st_mtime_ns, stat.st_size


def load_catalog(path: str | os.PathLike, into: Mapping[str, Chip] | None = None
                 ) -> dict[str, Chip]:
    """The catalog `into` (default: the built-ins) with the chips of the TOML file at `path`
    added or replaced. A `[chip.NAME]` table defines one chip; `base = "tpu-v5e"` starts from
    an existing one (of `into`, or earlier in the file) and changes only the keys given."""
    catalog = dict(BUILTIN if into is None else into)
    where = str(path)
    data = read_file(path)
    # [efficiency.NAME] tables are podkit.sim.step's (efficiency_for reads them), the
    # [collectives.NAME] tables podkit.sim.cpu's (checked here, with the rest of the file).
    unknown = [k for k in data if k not in ("chip", "efficiency", "collectives")]
    if unknown or not isinstance(data.get("chip", {}), dict):
        key = unknown[0] if unknown else "chip"
        raise ConfigError(f"hardware file {where!r}: top-level {key!r} is not a [chip.NAME], "
                          "[efficiency.NAME] or [collectives.NAME] table; define each chip as "
                          "[chip.NAME] (docs/sim-hardware.md).")
    measured_collectives(data, where)
    for name, table in data.get("chip", {}).items():
        if not isinstance(table, dict):
            raise ConfigError(f"hardware file {where!r}: chip.{name} = {table!r} is not a table; "
                              f"write it as [chip.{name}] with its keys below.")
        catalog[name] = _chip_from_table(name, table, catalog, where)
    return catalog


MEASURED_KINDS = ("all-reduce", "all-gather")
MEASURED_TERMS = ("latency", "bandwidth", "beyond_cache_bandwidth")
CACHE_BYTES = 32 << 20
"""The last-level cache a [collectives.NAME] table without `cache_bytes` assumes."""


def measured_collectives(data: Mapping[str, Any], where: str
                         ) -> dict[str, tuple[dict[str, dict[str, dict[str, float]]], float]]:
    """{chip: ({"PxD": {kind: {term: value}}}, cache bytes)} of a hardware file's
    `[collectives.NAME]` tables (what calibration measured of a cpu chip's job shapes:
    podkit.sim.cpu), checked; ConfigError naming the file, the table and the fix."""
    tables = data.get("collectives", {})
    fix = ("the format is in docs/sim-hardware.md; calibration writes it: python "
           "bench/sim_calibrate.py fit-cpu MEASUREMENTS --write")
    if not isinstance(tables, dict):
        raise ConfigError(f"hardware file {where!r}: collectives = {tables!r} is not a table; "
                          f"write [collectives.NAME] tables ({fix}).")
    out = {}
    for chip_name, table in tables.items():
        at = f"hardware file {where!r}, [collectives.{chip_name}]"
        if not isinstance(table, dict):
            raise ConfigError(f"{at} = {table!r} is not a table ({fix}).")
        cache = table.get("cache_bytes", CACHE_BYTES)
        if isinstance(cache, bool) or not isinstance(cache, int) or cache <= 0:
            raise ConfigError(f"{at}: cache_bytes = {cache!r}; write the last-level cache's "
                              "size in bytes, a positive integer (e.g. 33554432).")
        shapes: dict[str, dict[str, dict[str, float]]] = {}
        for shape, kinds in table.items():
            if shape == "cache_bytes":
                continue
            procs, _, devices = shape.partition("x")
            if not (procs.isdigit() and devices.isdigit() and int(procs) and int(devices)):
                raise ConfigError(f"{at}: {shape!r} is not a job shape; write PxD (processes x "
                                  f"devices per process, e.g. \"2x2\") or cache_bytes ({fix}).")
            if not isinstance(kinds, dict):
                raise ConfigError(f"{at}: {shape} = {kinds!r} is not a table of kinds ({fix}).")
            for kind, terms in kinds.items():
                if kind not in MEASURED_KINDS:
                    raise ConfigError(f"{at}: {shape}.{kind} is not a measured kind; write one "
                                      f"of {', '.join(MEASURED_KINDS)}.")
                if not isinstance(terms, dict) or set(terms) != set(MEASURED_TERMS) or not all(
                        isinstance(v, int | float) and not isinstance(v, bool)
                        and 0 < v < math.inf for v in terms.values()):
                    raise ConfigError(f"{at}: {shape}.{kind} = {terms!r}; it needs "
                                      f"{', '.join(MEASURED_TERMS)}, each a positive number "
                                      f"({fix}).")
            shapes[shape] = kinds
        out[chip_name] = (shapes, float(cache))
    return out


def _chip_from_table(name: str, table: dict[str, Any], catalog: Mapping[str, Chip],
                     where: str) -> Chip:
    at = f"hardware file {where!r}, [chip.{name}]"
    values: dict[str, Any] = {}
    base_name = table.get("base")
    if base_name is not None:
        if base_name not in catalog:
            raise ConfigError(f"{at}: base = {base_name!r} is not a known chip; known: "
                              f"{', '.join(sorted(catalog))}.")
        values = dataclasses.asdict(catalog[base_name])
        values["shapes"] = catalog[base_name].shapes
    for key, raw in table.items():
        if key == "base":
            continue
        if key not in _FIELDS or key == "name":
            valid = sorted(k for k in _FIELDS if k != "name") + ["base"]
            raise ConfigError(f"{at}: unknown key {key!r}; valid keys: {', '.join(valid)}.")
        values[key] = _coerce(key, raw, at)
    values["name"] = name
    family = values.get("family")
    if family not in FAMILIES:
        raise ConfigError(f"{at}: family = {family!r}; write family = one of "
                          f"{', '.join(map(repr, FAMILIES))} (or base = an existing chip).")
    missing = [k for k in _REQUIRED[family] if k not in values]
    if missing:
        raise ConfigError(f"{at}: a {family} chip needs {', '.join(missing)} (or base = an "
                          "existing chip to start from).")
    chip = Chip(**values)
    _check(chip, at)
    return chip


def _coerce(key: str, raw: Any, at: str) -> Any:
    bad = ConfigError  # one message shape for every key
    if key == "hbm_bytes":
        if isinstance(raw, str):
            try:
                return float(parse_bytes(raw))
            except ValueError as e:
                raise bad(f"{at}: hbm_bytes = {raw!r}: {e}.") from None
        key_type = "number"
    elif key in _FLOATS:
        key_type = "number"
    elif key in _INTS:
        if isinstance(raw, int) and not isinstance(raw, bool):
            return raw
        raise bad(f"{at}: {key} = {raw!r} is not an integer; write e.g. {key} = 4.")
    elif key == "calibrated":
        if isinstance(raw, bool):
            return raw
        raise bad(f"{at}: calibrated = {raw!r}; write true or false.")
    elif key == "shapes":
        return _shapes(raw, at)
    else:  # family, wrap, source
        if isinstance(raw, str):
            return raw
        raise bad(f"{at}: {key} = {raw!r} is not a string; write {key} = \"...\".")
    if isinstance(raw, (int, float)) and not isinstance(raw, bool) and math.isfinite(raw):
        return float(raw)
    raise bad(f"{at}: {key} = {raw!r} is not a {key_type}; write e.g. {key} = 4.5e10"
              + (" or \"16GiB\"" if key == "hbm_bytes" else "") + ".")


def _shapes(raw: Any, at: str) -> tuple[tuple[int, ...], ...]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{at}: shapes = {raw!r}; write a list of slice shapes, e.g. "
                          "shapes = [\"4x4\", \"8x8\"].")
    out = []
    for s in raw:
        shape = _parse_shape(s) if isinstance(s, str) else (
            tuple(s) if isinstance(s, list) and all(isinstance(d, int) for d in s) else None)
        if not shape or any(d < 1 for d in shape):
            raise ConfigError(f"{at}: shapes entry {s!r} is not a shape; write \"AxB\" or "
                              "\"AxBxC\" with positive integers.")
        out.append(shape)
    return tuple(out)


def _check(chip: Chip, at: str) -> None:
    """Values a chip cannot have, each named with the fix."""
    for key in ("peak_flops", "hbm_bytes", "hbm_bandwidth"):
        if getattr(chip, key) <= 0:
            raise ConfigError(f"{at}: {key} = {getattr(chip, key)!r} must be positive.")
    for key in ("hop_latency", "domain_latency", "network_latency", "dcn_latency",
                "dcn_bandwidth"):
        if getattr(chip, key) < 0:
            raise ConfigError(f"{at}: {key} = {getattr(chip, key)!r} must be >= 0.")
    if chip.family == "tpu":
        if chip.torus_dims not in (1, 2, 3):
            raise ConfigError(f"{at}: torus_dims = {chip.torus_dims}; write 2 or 3.")
        if chip.ici_links < 1 or chip.ici_bandwidth <= 0:
            raise ConfigError(f"{at}: ici_links = {chip.ici_links}, ici_bandwidth = "
                              f"{chip.ici_bandwidth}: both must be positive.")
        if chip.wrap not in WRAPS:
            raise ConfigError(f"{at}: wrap = {chip.wrap!r}; write one of "
                              f"{', '.join(map(repr, WRAPS))} (docs/sim-hardware.md).")
        if chip.wrap in ("cubes", "side") and chip.wrap_size < 1:
            raise ConfigError(f"{at}: wrap = {chip.wrap!r} needs wrap_size (the cube side, or "
                              "the side at which a dimension wraps), e.g. wrap_size = 16.")
        wrong = [s for s in chip.shapes if len(s) != chip.torus_dims]
        if not chip.shapes or wrong:
            raise ConfigError(f"{at}: shapes {wrong or chip.shapes!r} do not have torus_dims = "
                              f"{chip.torus_dims} dimensions each.")
    else:
        if chip.domain_size < 0 or chip.domain_bandwidth <= 0 or chip.network_bandwidth <= 0:
            raise ConfigError(f"{at}: domain_size = {chip.domain_size}, domain_bandwidth = "
                              f"{chip.domain_bandwidth}, network_bandwidth = "
                              f"{chip.network_bandwidth}: the bandwidths must be positive and "
                              "domain_size >= 0 (0: any number of devices share the domain).")


def catalog(paths: Iterable[str | os.PathLike] = ()) -> dict[str, Chip]:
    """The built-ins, then calibration.toml (if written), then $PODKIT_SIM_HARDWARE's files,
    then `paths`: a later file's chip replaces an earlier one of the same name."""
    chips = dict(BUILTIN)
    for path in catalog_files(paths):
        chips = load_catalog(path, chips)
    return chips


def catalog_files(paths: Iterable[str | os.PathLike] = ()) -> list[str | os.PathLike]:
    """The hardware files read, in order: calibration.toml (if written), $PODKIT_SIM_HARDWARE's,
    then `paths`."""
    files: list[str | os.PathLike] = [CALIBRATION] if CALIBRATION.exists() else []
    files += [p for p in os.environ.get(ENV_HARDWARE, "").split(os.pathsep) if p]
    return files + list(paths)


def chip(name: str, chips: Mapping[str, Chip] | None = None) -> Chip:
    """A chip by name (`tpu-v4`, or `v4` for short); errors list the known ones."""
    chips = catalog() if chips is None else chips
    key = name.strip().lower()
    found = chips.get(name.strip()) or chips.get(key) or chips.get(f"tpu-{key}")
    if found is None:
        raise ConfigError(f"unknown hardware {name!r}; known: {', '.join(chips)}. Add your own "
                          f"in a TOML file (${ENV_HARDWARE}; format in docs/sim-hardware.md).")
    return found


# -- pods ------------------------------------------------------------------------------------


def pod(spec: str, chips: Mapping[str, Chip] | None = None, slices: int = 1) -> Pod:
    """A pod from KIND:CHIPS or KIND:SHAPE: tpu-v4:2048 (the standard slice of that many
    chips, the most cube-like), tpu-v5e:16x16, h100:64 (domains of 8), cpu:2x2 (processes x
    devices). `slices` > 1: that many TPU slices of that shape joined by the data-center
    network (multislice; the chip needs its DCN figures)."""
    if isinstance(slices, bool) or not isinstance(slices, int) or slices < 1:
        raise ConfigError(f"slices={slices!r}; the number of TPU slices, a positive int.")
    one = _one_pod(spec, chips)
    if slices == 1:
        return one
    if not one.chip.torus:
        raise ConfigError(f"slices={slices} is for TPU pods (slices joined by the data-center "
                          f"network); a {one.chip.name} pod of {one.chip.family.upper()}s is "
                          f"already one switched network: ask for {one.chip.name}:"
                          f"{one.chips * slices}.")
    if not one.chip.dcn_bandwidth:
        raise ConfigError(f"slices={slices}: {one.chip.name} has no data-center network figure "
                          "(dcn_bandwidth) in the hardware catalog; add one in a hardware file "
                          "(docs/sim-hardware.md) or plan one slice.")
    return dataclasses.replace(one, slices=slices)


def _one_pod(spec: str, chips: Mapping[str, Chip] | None) -> Pod:
    kind, colon, size = str(spec).strip().partition(":")
    if not colon or not size:
        raise ConfigError(f"pod {spec!r} is not KIND:CHIPS or KIND:SHAPE; write e.g. "
                          "tpu-v4:2048, tpu-v5e:16x16, h100:64 or cpu:4.")
    found = chip(kind, chips)
    shape = _parse_shape(size)
    if shape is None or any(d < 1 for d in shape):
        raise ConfigError(f"pod {spec!r}: {size!r} is neither a chip count nor a shape; write a "
                          "positive count (tpu-v4:2048) or a shape (tpu-v5e:16x16).")
    if found.torus:
        return _tpu_pod(spec, found, shape)
    return _switched_pod(spec, found, shape)


def _tpu_pod(spec: str, chip: Chip, shape: tuple[int, ...]) -> Pod:
    if len(shape) == 1:
        same = [s for s in chip.shapes if math.prod(s) == shape[0]]
        if not same:
            counts = sorted({math.prod(s) for s in chip.shapes})
            listed = ", ".join(map(str, counts[:24])) + (f" ... {counts[-1]}" if len(counts) > 24
                                                        else "")
            raise ConfigError(f"pod {spec!r}: no {chip.name} slice has {shape[0]} "
                              f"chip{'' if shape[0] == 1 else 's'}; valid "
                              f"counts: {listed}.")
        # The most cube-like: the shortest longest side, then the longest shortest side.
        shape = min(same, key=lambda s: (max(s), -min(s), s))
    elif shape not in chip.shapes:
        same = [s for s in chip.shapes if math.prod(s) == math.prod(shape)]
        listed = ", ".join("x".join(map(str, s)) for s in (same or chip.shapes[:16]))
        raise ConfigError(f"pod {spec!r}: {'x'.join(map(str, shape))} is not a {chip.name} "
                          f"slice shape ({chip.torus_dims}D); "
                          + (f"with {math.prod(shape)} chips use {listed}." if same else
                             f"valid shapes include {listed}."))
    return Pod(chip, shape, chip.wraps(shape))


def _switched_pod(spec: str, chip: Chip, shape: tuple[int, ...]) -> Pod:
    per = chip.domain_size
    noun = "GPUs per NVLink domain" if chip.family == "gpu" else "devices per process"
    if len(shape) == 1:
        n = shape[0]
        if per == 0 or n <= per:
            return Pod(chip, (1, n))
        if n % per:
            raise ConfigError(f"pod {spec!r}: {n} {chip.name} devices are not whole domains of "
                              f"{per} {noun}; use up to {per} (one domain) or a multiple of {per}"
                              f" ({', '.join(str(per * k) for k in (1, 2, 4, 8))}, ...).")
        return Pod(chip, (n // per, per))
    if len(shape) != 2 or (per and shape[1] > per):
        raise ConfigError(f"pod {spec!r}: a {chip.name} shape is DOMAINSxPER_DOMAIN with at most "
                          f"{per or 'any number of'} {noun}, e.g. {chip.name}:4x{per or 2}.")
    return Pod(chip, shape)


def _parse_shape(text: str) -> tuple[int, ...] | None:
    try:
        return tuple(int(d) for d in text.strip().lower().split("x"))
    except ValueError:
        return None

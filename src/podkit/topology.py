"""TPU slices as GKE and Cloud TPU name them: kinds, topologies, chips per host.

    slice = topology.tpu_slice("v5p-2x2x4")   # TpuSlice(kind=v5p, shape=(2, 2, 4))
    slice.chips, slice.hosts, slice.chips_per_host   # 16, 4, 4

Shared by `podkit submit k8s` (node selectors, `google.com/tpu` limits, pods per slice) and,
later, the pod simulator. The table follows Google's public pages (sources in
docs/clusters.md): v4 and v5p slices are 3D tori of 4-chip hosts (`AxBxC`, A <= B <= C; up to
64 chips the shapes 2x2x1 .. 4x4x4, above that every dimension a multiple of 4); v5e and v6e
slices are 2D (`AxB`) of 4-chip hosts, except the single-host machines of 1, 4 and 8 chips
(1x1, 2x2, 2x4).
"""

from __future__ import annotations

import dataclasses
import math

from podkit.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class TpuKind:
    name: str  # what users write: v4, v5e, v5p, v6e
    accelerator: str  # GKE's cloud.google.com/gke-tpu-accelerator label
    dims: int  # 2 or 3
    chips_per_host: int  # on multi-host slices
    single_host: tuple[tuple[int, ...], ...]  # topologies on one machine (all chips there)
    small: tuple[tuple[int, ...], ...]  # the listed shapes below the regular ones
    max_chips: int

    def topologies(self, up_to: int | None = None) -> list[tuple[int, ...]]:
        """Every valid topology, by chip count (up to `up_to` chips)."""
        limit = min(up_to or self.max_chips, self.max_chips)
        found = set(self.single_host) | set(self.small)
        step = 4
        sides = range(step, int(round(limit ** (1 / self.dims))) * 4 + 1, step)
        if self.dims == 3:
            found |= {(a, b, c) for a in sides for b in sides for c in sides
                      if a <= b <= c and a * b * c <= limit}
        else:
            # 2D slices: powers of two from 4x4 up (4x4, 4x8, 8x8, 8x16, 16x16).
            side = 4
            while side * side <= limit:
                found |= {(side, side)}
                if side * side * 2 <= limit:
                    found |= {(side, side * 2)}
                side *= 2
        return sorted((t for t in found if math.prod(t) <= limit),
                      key=lambda t: (math.prod(t), t))


TPU_KINDS: dict[str, TpuKind] = {
    "v4": TpuKind("v4", "tpu-v4-podslice", 3, 4, ((2, 2, 1),),
                  ((2, 2, 2), (2, 2, 4), (2, 4, 4)), 4096),
    "v5p": TpuKind("v5p", "tpu-v5p-slice", 3, 4, ((2, 2, 1),),
                   ((2, 2, 2), (2, 2, 4), (2, 4, 4)), 8960),
    "v5e": TpuKind("v5e", "tpu-v5-lite-podslice", 2, 4, ((1, 1), (2, 2), (2, 4)), (), 256),
    "v6e": TpuKind("v6e", "tpu-v6e-slice", 2, 4, ((1, 1), (2, 2), (2, 4)), (), 256),
}


# Cloud TPU's own names of the kinds (v5litepod-16, v6e-8); v4 and v5p count TensorCores.
ALIASES = {"v5litepod": "v5e", "v5lite": "v5e", "v6lite": "v6e"}
CORE_COUNTED = ("v4", "v5p")


@dataclasses.dataclass(frozen=True)
class TpuSlice:
    kind: TpuKind
    shape: tuple[int, ...]

    @property
    def topology(self) -> str:
        return "x".join(str(d) for d in self.shape)

    @property
    def chips(self) -> int:
        return math.prod(self.shape)

    @property
    def chips_per_host(self) -> int:
        return self.chips if self.shape in self.kind.single_host else self.kind.chips_per_host

    @property
    def hosts(self) -> int:
        return self.chips // self.chips_per_host

    def __str__(self) -> str:
        return f"{self.kind.name}-{self.topology}"


def tpu_slice(spec: str) -> TpuSlice:
    """A TPU slice from TYPE-TOPOLOGY (v5p-2x2x4, v5e-4x8); errors name the valid values."""
    kind_name, dash, topo = spec.strip().lower().partition("-")
    kind_name = ALIASES.get(kind_name, kind_name)
    kind = TPU_KINDS.get(kind_name)
    if kind is None or not dash:
        raise ConfigError(f"--tpu {spec!r} is not TYPE-TOPOLOGY; TYPE is one of "
                          f"{', '.join(TPU_KINDS)} and TOPOLOGY its chip grid, e.g. "
                          "v5p-2x2x4 or v5e-4x8.")
    try:
        shape = tuple(int(d) for d in topo.split("x"))
    except ValueError:
        shape = ()
    valid = kind.topologies()
    if len(shape) == 1 and shape[0] > 0:  # Cloud TPU's accelerator type, e.g. v5p-8
        chips = shape[0] // (2 if kind.name in CORE_COUNTED else 1)
        same = ["x".join(map(str, t)) for t in valid if math.prod(t) == chips]
        raise ConfigError(
            f"--tpu {spec!r} is Cloud TPU's name (a count of "
            f"{'TensorCores, 2 per chip' if kind.name in CORE_COUNTED else 'chips'}); podkit "
            f"takes the topology, as GKE's node pools do: "
            + (" or ".join(f"--tpu {kind.name}-{t}" for t in same) + f" ({chips} chips)."
               if same else f"no {kind.name} topology has {chips} chips."))
    if shape not in valid:
        listed = ", ".join("x".join(map(str, t)) for t in valid[:14])
        more = f" ... up to {kind.max_chips} chips" if len(valid) > 14 else ""
        raise ConfigError(f"--tpu {spec!r}: {topo!r} is not a {kind.name} topology. Valid "
                          f"{kind.name} topologies ({kind.dims}D): {listed}{more}.")
    return TpuSlice(kind, shape)

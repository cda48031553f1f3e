"""Logical axis names and their resolution to mesh axes.

Models name the dims of their parameters with logical axes (`embed`, `mlp`, `vocab`, ...);
a strategy's rules map each logical axis to zero, one or several mesh axes. A rule whose mesh
axes are absent from the mesh, or of size 1, resolves to replication, so one model runs under
every strategy unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from podkit.errors import ConfigError

Rules = tuple[tuple[str, tuple[str, ...]], ...]


def normalize_rules(rules: Sequence[tuple[str, Any]], mesh_axes: Sequence[str]) -> Rules:
    """Validate `[(logical, mesh_axis | (mesh_axes...) | None), ...]` into a canonical tuple."""
    out = []
    for rule in rules:
        if not (isinstance(rule, tuple | list) and len(rule) == 2 and isinstance(rule[0], str)):
            raise ConfigError(
                f"sharding rule {rule!r} is not (logical_axis, mesh_axis); e.g. ('embed', 'fsdp')."
            )
        name, target = rule
        targets = () if target is None else (target,) if isinstance(target, str) else tuple(target)
        for t in targets:
            if t not in mesh_axes:
                raise ConfigError(
                    f"sharding rule {rule!r} names mesh axis {t!r}; valid axes: "
                    f"{', '.join(mesh_axes)}."
                )
        out.append((name, targets))
    return tuple(out)


def resolve_spec(logical: Sequence[str | None], rules: Rules, mesh: Mesh) -> P:
    """PartitionSpec for a tensor whose dims are named `logical`, under `rules` on `mesh`.

    The first rule for a logical axis wins; a mesh axis is used by at most one dim.
    """
    table: dict[str, tuple[str, ...]] = {}
    for name, targets in rules:
        table.setdefault(name, targets)
    used: set[str] = set()
    spec: list[Any] = []
    for name in logical:
        candidates = table.get(name, ()) if name is not None else ()
        axes = tuple(a for a in candidates if mesh.shape.get(a, 1) > 1 and a not in used)
        used.update(axes)
        spec.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    while spec and spec[-1] is None:
        spec.pop()
    return P(*spec)


def _annotation(variable: Any) -> Any:
    if not hasattr(variable, "get_metadata"):
        return None
    meta = variable.get_metadata()
    return meta.get("out_sharding") or meta.get("sharding_names") or meta.get("sharding")


def logical_axes_of(variable: Any, ndim: int) -> tuple[str | None, ...]:
    """Logical axis names a Flax NNX variable was annotated with (`nnx.with_partitioning`)."""
    names = _annotation(variable)
    if not names:
        return (None,) * ndim
    names = tuple(names)
    if len(names) != ndim:
        raise ConfigError(
            f"a variable of rank {ndim} is annotated with {len(names)} logical axes {names}; "
            "give one name (or None) per dim."
        )
    return names


FSDP_AXIS = "fsdp"


def default_fsdp_spec(shape: Sequence[int], mesh: Mesh) -> P | None:
    """The layout FSDP gives a parameter that names no logical axes (as PyTorch's FSDP2
    shards every parameter without being told): its largest dim that the `fsdp` axis divides
    (the first of equals), split over it; None without an fsdp axis of 2+ devices or such a
    dim."""
    n = mesh.shape.get(FSDP_AXIS, 1)
    dims = [i for i, d in enumerate(shape) if d >= n and d % n == 0]
    if n <= 1 or not dims:
        return None
    best = max(dims, key=lambda i: (shape[i], -i))
    return P(*([None] * best), FSDP_AXIS)


def state_shardings(abstract_state: Any, rules: Rules, mesh: Mesh,
                    seen: set[str] | None = None, defaulted: list[str] | None = None
                    ) -> dict:
    """NamedShardings for an NNX State of abstract Variables, as a pure nested dict.

    The result has the structure `nnx.to_pure_dict(abstract_state)` has, so it can be passed as
    `out_shardings` for the pure state the compiled steps carry. Every split dim is checked to
    divide evenly; the logical axes met are added to `seen` (for `check_rules_match`). With
    `defaulted` (a list), a variable with no annotation at all (not even None per dim, which
    says "not split") gets FSDP's default layout
    (`default_fsdp_spec`) where the mesh has an fsdp axis, and its path is appended.
    """
    import flax.nnx as nnx

    out: dict = {}
    for path, variable in nnx.to_flat_state(abstract_state):
        shape = tuple(getattr(variable.get_value(), "shape", ()))
        logical = logical_axes_of(variable, len(shape))
        if seen is not None:
            seen.update(n for n in logical if n is not None)
        spec = resolve_spec(logical, rules, mesh)
        check_divisible("/".join(map(str, path)), shape, logical, spec, mesh)
        if defaulted is not None and not _annotation(variable) and len(shape) >= 1:
            # No logical axes at all: FSDP's default layout rather than a silent replica.
            fallback = default_fsdp_spec(shape, mesh)
            if fallback is not None:
                spec = fallback
                defaulted.append("/".join(map(str, path)))
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = NamedSharding(mesh, spec)
    return out


def _axes(entry: Any) -> tuple[str, ...]:
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def parts_of(entry: Any, mesh: Mesh) -> int:
    """How many pieces one PartitionSpec entry (None, an axis, or a tuple of axes) splits its
    dim into on `mesh`."""
    return math.prod(mesh.shape[a] for a in _axes(entry))


def check_divisible(name: str, shape: Sequence[int], logical: Sequence[str | None], spec: P,
                    mesh: Mesh) -> None:
    """A dim split over mesh axes must divide evenly; the error names the numbers and fixes."""
    padded = tuple(spec) + (None,) * len(shape)
    for dim, (size, entry) in enumerate(zip(shape, padded, strict=False)):
        axes, parts = _axes(entry), parts_of(entry, mesh)
        if parts > 1 and size % parts:
            where = " x ".join(f"{a!r} ({mesh.shape[a]})" for a in axes)
            raise ConfigError(
                f"parameter {name} of shape {tuple(shape)}: dim {dim} (logical axis "
                f"{logical[dim]!r}) of size {size} is split over mesh axis {where} = {parts} "
                f"parts, and {size} is not divisible by {parts}. Make that dim a multiple of "
                f"{parts}, choose a mesh whose axis divides {size}, or add a rule that leaves "
                f"{logical[dim]!r} unsplit, e.g. ({logical[dim]!r}, None).")


def check_rules_match(required: Rules, seen: set[str]) -> None:
    """Each rule the user gave must name a logical axis the model has (or the batch): a rule
    that matches nothing is almost always a typo, and silently replicating is the bug."""
    for name, targets in required:
        if name != "batch" and name not in seen:
            raise ConfigError(
                f"sharding rule ({name!r}, {list(targets)}) matches no parameter: this "
                f"model's logical axes are {sorted(seen)} (and 'batch'). Fix the name or drop "
                "the rule.")

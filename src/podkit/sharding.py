"""Logical axis names and their resolution to mesh axes.

Models name the dims of their parameters with logical axes (`embed`, `mlp`, `vocab`, ...);
a strategy's rules map each logical axis to zero, one or several mesh axes. A rule whose mesh
axes are absent from the mesh, or of size 1, resolves to replication, so one model runs under
every strategy unchanged.
"""

from __future__ import annotations

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


def logical_axes_of(variable: Any, ndim: int) -> tuple[str | None, ...]:
    """Logical axis names a Flax NNX variable was annotated with (`nnx.with_partitioning`)."""
    names = None
    if hasattr(variable, "get_metadata"):
        meta = variable.get_metadata()
        names = meta.get("out_sharding") or meta.get("sharding_names") or meta.get("sharding")
    if not names:
        return (None,) * ndim
    names = tuple(names)
    if len(names) != ndim:
        raise ConfigError(
            f"a variable of rank {ndim} is annotated with {len(names)} logical axes {names}; "
            "give one name (or None) per dim."
        )
    return names


def state_shardings(abstract_state: Any, rules: Rules, mesh: Mesh) -> dict:
    """NamedShardings for an NNX State of abstract Variables, as a pure nested dict.

    The result has the structure `nnx.to_pure_dict(abstract_state)` has, so it can be passed as
    `out_shardings` for the pure state the compiled steps carry.
    """
    import flax.nnx as nnx

    out: dict = {}
    for path, variable in nnx.to_flat_state(abstract_state):
        shape = getattr(variable.get_value(), "shape", ())
        spec = resolve_spec(logical_axes_of(variable, len(shape)), rules, mesh)
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = NamedSharding(mesh, spec)
    return out

"""Strategy: a device mesh with named axes plus a rule table from logical axes to mesh axes.

DataParallel, FSDP and TensorParallel are the same class with different meshes and rules; the
step and the loop never branch on which strategy is active. Models name logical axes (`embed`,
`mlp`, `heads`, `kv`, `vocab`, `table`) on their parameters, never mesh axes.

    DataParallel()           mesh {data: -1}            every parameter replicated
    FSDP()                   mesh {fsdp: -1}            `embed` dims split (ZeRO-3: parameters,
                                                        gradients, optimizer state)
    TensorParallel(model=k)  mesh {data: -1, model: k}  Megatron: `mlp`, `heads`, `vocab` split
    Strategy(mesh, rules)    anything else

Every strategy also has the default rules: the batch over `dcn`, `data` and `fsdp`, and the
rows of sharded embedding tables (`table`) over data, fsdp and model. `slices=N` (any of them)
adds the `dcn` axis, outermost: N TPU slices joined by the data-center network, data parallel
across them (the process is the slice off TPU).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from podkit.cluster import current_cluster
from podkit.errors import ConfigError
from podkit.sharding import Rules, normalize_rules, resolve_spec

DCN = "dcn"  # data parallel across TPU slices, over the data-center network (outermost)
MESH_AXES = (DCN, "data", "fsdp", "model")

# The batch dim is split over every axis that holds a replica of the data; models never name
# mesh axes, so the batch reaches them only through this rule. Rows of a sharded embedding
# table spread over the whole mesh (the parameter-server layout of CTR models).
DEFAULT_RULES: Rules = (("batch", (DCN, "data", "fsdp")),
                        ("table", ("data", "fsdp", "model")))

_CURRENT: contextvars.ContextVar[Strategy | None] = contextvars.ContextVar(
    "podkit_strategy", default=None
)


class Strategy:
    """A mesh over the cluster's devices and the rules that place tensors on it.

    Example::

        strategy = pk.Strategy(mesh={"data": -1}, rules=[("embed", "fsdp")])
        with strategy.scope():
            model = pk.Sequential([...]); model.compile(...)
    """

    def __init__(
        self,
        mesh: Mapping[str, int] | None = None,
        rules: Sequence[tuple[str, Any]] = (),
        devices: Sequence[Any] | None = None,
        slices: int = 1,
    ) -> None:
        mesh = dict(mesh if mesh is not None else {"data": -1})
        if not mesh:
            raise ConfigError("mesh={} has no axes; use e.g. mesh={'data': -1}.")
        _check_size(type(self).__name__, "slices", slices)
        if slices > 1:
            if DCN in mesh:
                raise ConfigError(f"mesh={mesh} names the dcn axis and slices={slices} "
                                  "makes it: give one of the two.")
            mesh = {DCN: slices, **mesh}
        #: TPU slices the mesh spans (its `dcn` axis, laid out by jax's hybrid-mesh helper)
        self.slices = slices
        for axis, size in mesh.items():
            if axis not in MESH_AXES:
                raise ConfigError(
                    f"unknown strategy axis {axis!r} in mesh={mesh}; valid axes: "
                    f"{', '.join(MESH_AXES)}."
                )
            if not isinstance(size, int) or (size < 1 and size != -1):
                raise ConfigError(
                    f"mesh axis {axis!r} has size {size!r}; use a positive int or -1 (fill)."
                )
        if sum(1 for s in mesh.values() if s == -1) > 1:
            raise ConfigError(f"mesh={mesh} has more than one -1; only one axis can fill.")
        # Axes in a fixed order, `model` innermost: the axis with the most traffic per step
        # gets neighbouring devices (mesh_utils lays the last axes on the fastest links).
        self._axis_sizes = {a: mesh[a] for a in MESH_AXES if a in mesh}
        user_rules = normalize_rules(rules, MESH_AXES)
        for name, targets in user_rules:
            missing = [t for t in targets if t not in mesh]
            if missing:
                raise ConfigError(
                    f"sharding rule ({name!r}, {targets if len(targets) > 1 else targets[0]!r}) "
                    f"names mesh axis {missing[0]!r}, which mesh={mesh} does not have; add the "
                    "axis to the mesh or drop the rule.")
        user_names = {name for name, _ in user_rules}
        #: rules given by the user: each must match a parameter or the batch (checked when a
        #: model's state is laid out); built-in rules apply where they match.
        self.user_rules: Rules = user_rules
        self.rules: Rules = user_rules + tuple(r for r in DEFAULT_RULES if r[0] not in user_names)
        self._devices = tuple(devices) if devices is not None else None
        self._mesh: Mesh | None = None

    # -- the mesh ---------------------------------------------------------------------------
    @property
    def mesh(self) -> Mesh:
        if self._mesh is None:
            self._mesh = self._build_mesh()
        return self._mesh

    def _build_mesh(self) -> Mesh:
        devices = self._devices if self._devices is not None else current_cluster().devices
        if self.slices > 1:
            return self._hybrid_mesh(list(devices))
        n = len(devices)
        fixed = math.prod(s for s in self._axis_sizes.values() if s != -1)
        shape = []
        for size in self._axis_sizes.values():
            if size == -1:
                if n % fixed:
                    raise ConfigError(
                        f"mesh={self._axis_sizes}: the fixed axes multiply to {fixed}, which does "
                        f"not divide the {n} devices; choose sizes whose product divides {n}."
                    )
                size = n // fixed
            shape.append(size)
        if math.prod(shape) != n:
            raise ConfigError(
                f"mesh={self._axis_sizes} asks for {math.prod(shape)} devices but the cluster "
                f"has {n}; make the product {n} or use -1 on one axis to fill."
            )
        names = tuple(self._axis_sizes)
        types = (AxisType.Auto,) * len(names)
        if self._devices is not None:
            return Mesh(np.asarray(self._devices, dtype=object).reshape(shape), names, types)
        return jax.make_mesh(tuple(shape), names, types, devices=list(devices))

    def _hybrid_mesh(self, devices: list[Any]) -> Mesh:
        """The `dcn` axis over the slices, the other axes inside each (MaxText's
        `create_hybrid_device_mesh` use): a slice is the devices of one `slice_index` on a
        multislice TPU job, else of one process (each host its own "slice": how a CPU or GPU
        job runs the same layout)."""
        from jax.experimental import mesh_utils

        n, slices = len(devices), self.slices
        by_slice = devices[0].platform == "tpu" and hasattr(devices[0], "slice_index")
        granules = len({d.slice_index if by_slice else d.process_index for d in devices})
        if granules != slices:
            what = "slices (slice_index)" if by_slice else "processes"
            raise ConfigError(
                f"slices={slices} but the {n} devices are in {granules} {what}: each slice is "
                f"a TPU slice (MEGASCALE_NUM_SLICES) or, off TPU, a process. Start {slices} "
                f"slices/processes, or set slices = {granules}.")
        inner = {a: s for a, s in self._axis_sizes.items() if a != DCN}
        per = n // slices
        fixed = math.prod(s for s in inner.values() if s != -1)
        sizes = [per // fixed if s == -1 else s for s in inner.values()]
        if per % fixed or math.prod(sizes) != per:
            raise ConfigError(
                f"mesh={inner} does not fill a slice of {per} devices (slices={slices} of "
                f"{n}): the axes inside a slice must multiply to {per}, or use -1 on one.")
        array = mesh_utils.create_hybrid_device_mesh(
            [1, *sizes], [slices, *([1] * len(sizes))], devices,
            process_is_granule=not by_slice)
        names = (DCN, *inner)
        return Mesh(array, names, (AxisType.Auto,) * len(names))

    @property
    def axis_sizes(self) -> dict[str, int]:
        return dict(self.mesh.shape)

    # -- placement --------------------------------------------------------------------------
    @property
    def batch_axes(self) -> tuple[str, ...]:
        spec = resolve_spec(("batch",), self.rules, self.mesh)
        axes = spec[0] if len(spec) else None
        if axes is None:
            return ()
        return axes if isinstance(axes, tuple) else (axes,)

    @property
    def data_parallel_size(self) -> int:
        return math.prod(self.mesh.shape[a] for a in self.batch_axes)

    def sharding(self, logical_axes: Sequence[str | None]) -> NamedSharding:
        """The sharding of a tensor whose dims carry these logical axis names."""
        return NamedSharding(self.mesh, resolve_spec(tuple(logical_axes), self.rules, self.mesh))

    def batch_sharding(self, leading: int = 0) -> NamedSharding:
        """Batch dim sharded on the data axes, after `leading` unsharded dims (e.g. steps)."""
        axes = self.batch_axes
        spec = (None,) * leading + ((axes if len(axes) > 1 else axes[0]) if axes else None,)
        return NamedSharding(self.mesh, P(*spec))

    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, P())

    # -- scope ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def scope(self) -> Iterator[Strategy]:
        """Models built and compiled inside get their state created in this strategy's mesh."""
        token = _CURRENT.set(self)
        try:
            yield self
        finally:
            _CURRENT.reset(token)

    def __repr__(self) -> str:
        mesh = self._axis_sizes if self._mesh is None else dict(self._mesh.shape)
        return f"{type(self).__name__}(mesh={mesh}, rules={list(self.rules)})"


class DataParallel(Strategy):
    """Every device holds a replica of the model; the global batch is split on axis `data`."""

    def __init__(self, devices: Sequence[Any] | None = None, slices: int = 1) -> None:
        super().__init__(mesh={"data": -1}, rules=(), devices=devices, slices=slices)


# Built-in rule tables. They are not checked for matching: a model without attention simply
# has no `heads` dim.
FSDP_RULES: Rules = (("embed", ("fsdp",)),)
TENSOR_PARALLEL_RULES: Rules = (("mlp", ("model",)), ("heads", ("model",)),
                                ("vocab", ("model",)), ("activation_embed", ("model",)))


class FSDP(Strategy):
    """Fully sharded data parallel (ZeRO-3): parameters, gradients and optimizer state split
    over the `fsdp` axis along their `embed` dim; XLA gathers each weight where it is used
    and reduce-scatters its gradient. The batch is split over `data` and `fsdp`.

    `data=k` keeps k replicas of the sharded model (hybrid sharding: the `fsdp` axis fills the
    rest), for when one all-gather over every device costs more than k copies."""

    def __init__(self, data: int = 1, fsdp: int = -1,
                 devices: Sequence[Any] | None = None, slices: int = 1) -> None:
        _check_size("FSDP", "data", data)
        _check_size("FSDP", "fsdp", fsdp, fill=True)
        mesh = {"fsdp": fsdp} if data == 1 else {"data": data, "fsdp": fsdp}
        super().__init__(mesh=mesh, rules=(), devices=devices, slices=slices)
        self.rules = FSDP_RULES + self.rules


class TensorParallel(Strategy):
    """Megatron-style tensor parallelism on a data x model mesh: the `model` axis (k devices)
    splits MLP hidden units (column- then row-parallel), attention heads, and the vocabulary
    of embeddings and output layers; the `data` axis (the rest) splits the batch."""

    def __init__(self, model: int = 2, data: int = -1,
                 devices: Sequence[Any] | None = None, slices: int = 1) -> None:
        _check_size("TensorParallel", "model", model)
        _check_size("TensorParallel", "data", data, fill=True)
        super().__init__(mesh={"data": data, "model": model}, rules=(), devices=devices,
                         slices=slices)
        self.rules = TENSOR_PARALLEL_RULES + self.rules


def _check_size(owner: str, what: str, value: Any, fill: bool = False) -> None:
    """A mesh axis size: a positive int, or -1 (the devices left) where `fill`."""
    if isinstance(value, bool) or not isinstance(value, int) or not (
            value >= 1 or (fill and value == -1)):
        also = " or -1 (the devices the other axes leave)" if fill else ""
        raise ConfigError(f"{owner}({what}={value!r}): {what} must be a positive int (devices "
                          f"on that axis){also}.")


def scoped_strategy() -> Strategy | None:
    """The strategy of the innermost `scope()`, or None outside any."""
    return _CURRENT.get()


def current_strategy() -> Strategy:
    """The strategy of the innermost `scope()`, or a one-device default (as tf.distribute)."""
    strategy = _CURRENT.get()
    if strategy is None:
        strategy = Strategy(mesh={"data": 1}, devices=current_cluster().local_devices[:1])
    return strategy


def constrain(x: Any, logical_axes: Sequence[str | None]) -> Any:
    """`x` laid out as its dims' logical axes say under the scoped strategy's rules (a dim
    named None is whole on every device), inside a compiled function: a sharding the model
    states where XLA's propagation would pick one that costs a full rematerialization. A
    no-op outside a strategy scope."""
    strategy = scoped_strategy()
    if strategy is None:
        return x
    spec = resolve_spec(tuple(logical_axes), strategy.rules, strategy.mesh)
    return jax.lax.with_sharding_constraint(x, NamedSharding(strategy.mesh, spec))

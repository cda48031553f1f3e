"""Restore from the newer of the two tiers: the local tier's newest complete step or the
persistent tier's newest valid one.

    restored = restore_newest(manager, abstract, optional=...)

A local step is usable when the job has the process count (and, per process, the shards)
it was written with, and every process's part is whole somewhere: in its own directory, or as
the copy its peer, process (i + 1) % n, keeps. The processes say what they hold and all take
the same step: the newest usable local step when it is at least as new as the persistent
tier's newest (a local step is read from this machine's disk; the persistent one from storage,
downloaded and checked), else the persistent one. A process whose part is gone gets it from
its peer by the reverse transfer (`peer.shift(..., -1)`); then every process rebuilds its
arrays on the current shardings. What was restored, from which tier and why, is printed by
process 0.
"""

from __future__ import annotations

import json
from typing import Any

import jax
import numpy as np

from podkit import agree
from podkit.checkpoint import arrays, peer, shards
from podkit.checkpoint.local_tier import LocalDamage, LocalTier
from podkit.checkpoint.manager import CheckpointManager, Restored


def restore_newest(manager: CheckpointManager, abstract: Any,
                   optional: tuple[str, ...] = ()) -> tuple[Restored | None, str]:
    """(the newest step of `manager`'s tiers read into `abstract`, or None when neither holds
    one; "local" or "persistent", the tier it came from). See the module docstring. Every
    process calls it."""
    local: LocalTier | None = manager.local
    if local is None:
        return manager.restore(abstract, optional=optional), "persistent"
    manager.wait()
    n, i = jax.process_count(), jax.process_index()
    newest = manager.latest() if i == 0 else None
    persistent = agree.process0_decides(-1 if newest is None else newest)
    persistent = None if persistent < 0 else persistent
    held = sorted(set().union(*gather(local.steps())), reverse=True)
    targets, _ = arrays.abstract_targets(abstract)
    why = []
    for step in held:
        if persistent is not None and step < persistent:
            why.append(f"the persistent tier's step {persistent} is newer than the local "
                       f"tier's step {step}")
            break
        mine = _inspect(local, step, targets, optional)
        everyone = gather({str(p): v[0] for p, v in mine.items()})
        sources, reason = _sources(everyone, n)
        if reason is not None:
            why.append(f"local step {step} is not usable: {reason}")
            continue
        try:
            record, data = _part_for_me(mine, everyone, sources, n, i)
            flat = shards.rebuild(targets, record, data)
            failure = None
        except (LocalDamage, KeyError, ValueError) as e:
            failure = f"process {i}: {e}"
        if not agree.all_true(failure is None):  # every process takes the same step, or none
            why.append(f"local step {step} could not be read ({failure or 'another process'})")
            continue
        del data
        states = gather(record.get("data_state"))
        _say(f"restoring step {step} from the local tier ("
             + (f"the persistent tier's newest is step {persistent}" if persistent is not None
                else "the persistent tier holds none")
             + "".join(f"; process {p}'s shards from process {q}'s copy"
                       for p, q in enumerate(sources) if q != p) + ")", why)
        return Restored(step, arrays.unflatten(abstract, flat), record["meta"], states), "local"
    restored = manager.restore(abstract, optional=optional)
    if held or why:
        _say(f"restoring from the persistent tier ({manager.directory}"
             + (f", step {restored.step})" if restored is not None else ": none there)"), why)
    return restored, "persistent"


def _say(what: str, why: list[str]) -> None:
    if jax.process_index() == 0:
        print("podkit: " + what + "".join(f"\npodkit:   {w}" for w in why), flush=True)


def _inspect(local: LocalTier, step: int, targets: dict, optional: tuple[str, ...]
             ) -> dict[int, tuple[Any, Any]]:
    """What this process holds of `step`: {part: (summary, (record, bytes) or None)}; a
    summary is [record + bytes length] when the part is whole and fits this job, else the
    reason it cannot be used."""
    n, i = jax.process_count(), jax.process_index()
    out: dict[int, tuple[Any, Any]] = {}
    for part in sorted({i, (i - 1) % n}):
        try:
            record, data = local.read_part(step, part)
        except LocalDamage as e:
            out[part] = (str(e), None)
            continue
        if record.get("processes") != n:
            out[part] = (f"written by {record.get('processes')} processes, this job has {n}",
                         None)
            continue
        reason = shards.check(targets, record, part, optional)
        if reason is not None:
            out[part] = (f"it holds {reason}", None)
            continue
        body = json.dumps(record).encode()
        out[part] = ([8 + len(body) + len(data)], (record, data))
    return out


def _sources(everyone: list[dict], n: int) -> tuple[list[int], str | None]:
    """Which process gives each process its part (itself or its peer), or why none can."""
    sources = []
    for p in range(n):
        own = everyone[p].get(str(p))
        copy = everyone[(p + 1) % n].get(str(p)) if n > 1 else None
        if isinstance(own, list):
            sources.append(p)
        elif isinstance(copy, list):
            sources.append((p + 1) % n)
        else:
            said = [r for r in (own, copy) if isinstance(r, str)] or ["not there"]
            return [], f"process {p}'s shards: {'; '.join(dict.fromkeys(said))}"
    return sources, None


def _part_for_me(mine: dict, everyone: list[dict], sources: list[int], n: int, i: int
                 ) -> tuple[dict, bytes]:
    """This process's (record, bytes): its own, or its peer's copy sent back to it (every
    process joins that transfer when any process needs it)."""
    needy = [p for p in range(n) if sources[p] != p]
    if not needy:
        return mine[i][1]
    length = peer.padded(max(everyone[sources[p]][str(p)][0] for p in needy))
    send = np.zeros(length, np.uint8)
    j = (i - 1) % n
    if j in needy and sources[j] == i:  # this process holds the copy process j needs
        record, data = mine[j][1]
        body = json.dumps(record).encode()
        send[:8] = np.frombuffer(len(body).to_bytes(8, "little"), np.uint8)
        send[8:8 + len(body)] = np.frombuffer(body, np.uint8)
        send[8 + len(body):8 + len(body) + len(data)] = np.frombuffer(data, np.uint8)
    got = np.asarray(peer.shift(send, -1))
    if sources[i] == i:
        return mine[i][1]
    size = int.from_bytes(got[:8].tobytes(), "little")
    record = json.loads(got[8:8 + size].tobytes())
    return record, got[8 + size:8 + size + record["length"]].tobytes()


def gather(value: Any) -> list[Any]:
    """Every process's JSON-able `value`, index = process (host round trips: for restores,
    not for the loop)."""
    if jax.process_count() == 1:
        return [value]
    from jax.experimental import multihost_utils

    body = np.frombuffer(json.dumps(value).encode(), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.asarray(body.size, np.int64)))
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[:body.size] = body
    rows = np.asarray(multihost_utils.process_allgather(padded))
    return [json.loads(rows[p, :int(sizes[p])].tobytes()) for p in range(len(sizes))]


"""What every op test asks of a node: its elements by index, as its own stream, and through
the public iterator, compared leaf by leaf."""

import numpy as np

import podkit as pk
from podkit.data.stream import Context


def plain(element):
    return pk.data.structure.map_structure(
        lambda a: a if isinstance(a, bytes) else np.asarray(a).tolist(), element)


def drain(stream):
    out = []
    try:
        while True:
            out.append(plain(stream.next()))
    except StopIteration:
        return out
    finally:
        stream.close()


def by_index(node, path=(0,)):
    """The node's random-access form, read element by element."""
    ds = node.build(Context(workers=False), path)
    return [plain(ds[i]) for i in range(len(ds))]


def by_own_stream(node, path=(0,)):
    """The op as a stream over its parents (even where it has random access)."""
    return drain(node.own_stream(Context(workers=False), path))


def by_iterator(ds):
    return [plain(e) for e in ds._iterator(workers=False)]


def flat(elements):
    return [pk.data.structure.leaves(e) for e in elements]

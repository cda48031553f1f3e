"""podkit.layers.symbolic: pk.Input and layers called on symbolic tensors, without functional."""

import jax.numpy as jnp
import pytest

import podkit as pk
from podkit.layers import symbolic


def test_input_is_one_function_under_every_name():
    import podkit.functional

    assert pk.Input is pk.layers.Input is symbolic.Input is podkit.functional.Input


def test_input_records_shape_dtype_and_name():
    x = symbolic.Input((4, 2), dtype="int32", name="ids")
    assert (x.shape, x.dtype, x.name, x.layer, x.inputs) == ((None, 4, 2), jnp.int32, "ids",
                                                              None, ())
    assert symbolic.Input(3).shape == (None, 3)
    with pytest.raises(pk.ConfigError, match=r"Input\(shape=\(0,\)\)"):
        symbolic.Input((0,))


def test_a_layer_call_computes_the_output_shape_now():
    x = symbolic.Input((8,), name="x")
    h = pk.layers.Dense(5, name="d")(x)
    assert isinstance(h, symbolic.SymbolicTensor)
    assert (h.shape, h.dtype, h.name, h.inputs) == ((None, 5), jnp.float32, "d", (x,))
    ids = symbolic.Input((3,), dtype="int32")
    assert pk.layers.Embedding(10, 4)(ids).dtype == jnp.float32  # ids in, floats out
    both = pk.layers.Concatenate()([h, pk.layers.Dense(2)(x)])
    assert both.shape == (None, 7)


def test_a_wrong_call_is_a_config_error_naming_the_layer():
    dense = pk.layers.Dense(5, name="d")
    with pytest.raises(pk.ConfigError, match="layer 'd' was called on ndarray"):
        dense(jnp.zeros((2, 8)).__array__())
    with pytest.raises(pk.ConfigError, match="takes one tensor, not a list"):
        dense([symbolic.Input((8,)), symbolic.Input((8,))])
    with pytest.raises(pk.ConfigError, match="takes a list of tensors, not one tensor"):
        pk.layers.Add()(symbolic.Input((8,)))

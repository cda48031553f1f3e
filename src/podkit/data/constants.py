"""The numbers tf.data's API gives names to, below every module of podkit.data that uses them."""

AUTOTUNE = -1
INFINITE_CARDINALITY = -1
UNKNOWN_CARDINALITY = -2

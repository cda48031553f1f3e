"""`TextVectorization`, Keras 3's, on the host: strings to token ids or bag-of-words vectors.

    vectorize = pk.layers.TextVectorization(max_tokens=20000, output_sequence_length=200)
    vectorize.adapt(train_texts)                 # a list, an array or a pk.data Dataset
    ds = ds.map(lambda text, label: (vectorize(text), label), num_parallel_calls=4)

Keras's layer runs TensorFlow string ops; this one runs the same steps in Python on bytes, so
no TensorFlow is needed and strings never reach XLA: standardize (ASCII lowercasing, as
`tf.strings.lower`; Keras's punctuation class `DEFAULT_STRIP_REGEX`), split (ASCII whitespace,
as `tf.strings.split`; or Unicode characters), ngrams (`tf.strings.ngrams`' order: every
width in turn, joined by a space), then the lookup of `StringLookup(mask_token="")`: in "int"
mode "" is 0 and "[UNK]" 1, in the other modes "[UNK]" is 0 and "" is dropped. An adapted
vocabulary is sorted as Keras's `IndexLookup.finalize_state` sorts it: by count, high to low,
ties by the token's bytes, high to low. Outputs are numpy arrays with the dtypes Keras's layer
returns under TensorFlow: int64 for "int", "multi_hot" and "count", float32 for "tf_idf".

Where podkit's differs from Keras's (docs/keras.md): it is host preprocessing only, so a model
that holds it is an error naming `ds.map(vectorize)` (Keras on JAX fails there too, with
"Invalid dtype: str"); `sparse=True` is an error; `ragged=True` gives a list of 1-D arrays;
a callable `split` gets a 1-D numpy array of str and returns one token list per string;
`get_config()` holds the vocabulary (and idf weights) however it was set, so
`from_config(get_config())` is the same layer (Keras keeps an adapted one in the `.keras`
file's assets); `adapt` on no data is an error (Keras keeps the old vocabulary).
"""

from __future__ import annotations

import codecs
import math
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import flax.nnx as nnx
import jax
import numpy as np

from podkit import paths
from podkit.errors import ConfigError, InputError
from podkit.layers.base import Layer, Shape
from podkit.layers.symbolic import SymbolicTensor

#: Keras's punctuation class (keras/src/layers/preprocessing/text_vectorization.py), which
#: "lower_and_strip_punctuation" and "strip_punctuation" delete: ASCII punctuation only.
DEFAULT_STRIP_REGEX = r'[!"#$%&()\*\+,-\./:;<=>?@\[\\\]^_`{|}~\']'
# The class matches only ASCII bytes, so deleting them with bytes.translate is the regex.
_PUNCTUATION = bytes(c for c in range(128) if re.fullmatch(DEFAULT_STRIP_REGEX, chr(c)))

MASK_TOKEN = ""
OOV_TOKEN = "[UNK]"
STANDARDIZE = ("lower_and_strip_punctuation", "lower", "strip_punctuation")
SPLIT = ("whitespace", "character")
OUTPUT_MODES = ("int", "multi_hot", "count", "tf_idf")
ROWS, ONE, DENSE = "rows", "one", "dense"  # what preprocessing gives (see _preprocess)
_DEPRECATED_MODES = {"binary": "multi_hot", "tf-idf": "tf_idf"}  # Keras still reads them
HOST_ONLY = ("TextVectorization runs on the host (strings never enter XLA), so it cannot be "
             "a layer of a model: vectorize the strings in the input pipeline, "
             "`ds.map(lambda x, y: (vectorizer(x), y))`, and start the model at the ids "
             "(pk.Input(shape=(output_sequence_length,), dtype='int32')).")


class TextVectorization(Layer):
    """Keras 3's `TextVectorization(max_tokens=None, standardize="lower_and_strip_punctuation",
    split="whitespace", ngrams=None, output_mode="int", output_sequence_length=None,
    pad_to_max_tokens=False, vocabulary=None, idf_weights=None, sparse=False, ragged=False,
    encoding="utf-8", name=None)`, called on a string or a batch of strings (a list, a numpy
    array of str or bytes, a pk.data batch) to give a numpy array."""

    weight_order = ()
    input_kind = "string"
    #: why the layer cannot be in a model, and the fix (Sequential reads it)
    host_only = HOST_ONLY

    def __init__(self, max_tokens: int | None = None,
                 standardize: str | Callable | None = "lower_and_strip_punctuation",
                 split: str | Callable | None = "whitespace",
                 ngrams: int | Sequence[int] | None = None, output_mode: str = "int",
                 output_sequence_length: int | None = None, pad_to_max_tokens: bool = False,
                 vocabulary: Any = None, idf_weights: Any = None, sparse: bool = False,
                 ragged: bool = False, encoding: str = "utf-8", name: str | None = None,
                 **kwargs: Any) -> None:
        # Keys of a Keras config that are not constructor arguments of Keras's layer either.
        vocabulary_size = kwargs.pop("vocabulary_size", None)
        has_input_vocabulary = kwargs.pop("has_input_vocabulary", vocabulary is not None)
        _check_dtype(kwargs.pop("dtype", None))
        super().__init__(name=name, **kwargs)
        self.max_tokens = _max_tokens(max_tokens)
        self.standardize = _choice("standardize", standardize, STANDARDIZE)
        self.split = _choice("split", split, SPLIT)
        self.ngrams = _ngrams(ngrams)
        self.ngrams_arg = tuple(ngrams) if isinstance(ngrams, list) else ngrams  # as given
        if isinstance(output_mode, str):
            output_mode = _DEPRECATED_MODES.get(output_mode, output_mode)
        if output_mode not in OUTPUT_MODES:
            raise ConfigError(f"TextVectorization(output_mode={output_mode!r}); valid values: "
                              f"{', '.join(map(repr, OUTPUT_MODES))}.")
        self.output_mode = output_mode
        self.output_sequence_length = _sequence_length(output_sequence_length, output_mode)
        self.pad_to_max_tokens = _flag("pad_to_max_tokens", pad_to_max_tokens)
        if self.pad_to_max_tokens and self.max_tokens is None:
            raise ConfigError("TextVectorization(pad_to_max_tokens=True) pads the output to "
                              "max_tokens: set max_tokens too.")
        if _flag("sparse", sparse):
            raise ConfigError("TextVectorization(sparse=True): podkit's outputs are dense "
                              "numpy arrays (Keras gives sparse ones only with the TensorFlow "
                              "backend); leave sparse=False.")
        self.ragged = _flag("ragged", ragged)
        if self.ragged and output_mode != "int":
            raise ConfigError(f"TextVectorization(ragged=True) needs output_mode='int'; got "
                              f"output_mode={output_mode!r}.")
        try:
            codecs.lookup(encoding)
        except (LookupError, TypeError):
            raise ConfigError(f"TextVectorization(encoding={encoding!r}) is not a codec Python "
                              "knows; Keras's default is 'utf-8'.") from None
        self.encoding = encoding
        if idf_weights is not None and output_mode != "tf_idf":
            raise ConfigError(f"TextVectorization(idf_weights=...) is for output_mode='tf_idf' "
                              f"only; got output_mode={output_mode!r}.")
        if output_mode == "tf_idf" and vocabulary is not None and idf_weights is None:
            raise ConfigError("TextVectorization(output_mode='tf_idf', vocabulary=...) needs "
                              "idf_weights= too (one per vocabulary term), as Keras's.")
        self.has_input_vocabulary = _flag("has_input_vocabulary", has_input_vocabulary)
        self.tokens: list[bytes] = []  # the learned or given terms, special tokens not included
        self.index: dict[bytes, int] = {}
        self.idf: np.ndarray | None = None  # float32, one per output index (tf_idf)
        self.vocabulary_known = False  # Keras's frozen vocabulary size: set, adapted or loaded
        if vocabulary is not None:
            self.set_vocabulary(vocabulary, idf_weights)
            if vocabulary_size is not None and vocabulary_size != self.vocabulary_size():
                raise ConfigError(f"TextVectorization config: vocabulary_size={vocabulary_size}"
                                  f" but its vocabulary has {self.vocabulary_size()} terms.")

    # -- the vocabulary ------------------------------------------------------------------------
    def token_start(self) -> int:
        """The index of the first learned term: after "" and "[UNK]" in "int" mode, after
        "[UNK]" in the others (Keras's `_token_start_index`)."""
        return 2 if self.output_mode == "int" else 1

    def vocabulary_size(self) -> int:
        """The size of the vocabulary, special tokens included (Keras's)."""
        return self.token_start() + len(self.tokens)

    def get_vocabulary(self, include_special_tokens: bool = True) -> list[str]:
        """The vocabulary in index order: a term's index is its id in "int" mode and its
        column in the others; `include_special_tokens=False` leaves out "" and "[UNK]"."""
        words = [t.decode(self.encoding, "replace") for t in self.tokens]
        if not include_special_tokens:
            return words
        return [*self._special_tokens(), *words]

    def _special_tokens(self) -> list[str]:
        return [MASK_TOKEN, OOV_TOKEN] if self.output_mode == "int" else [OOV_TOKEN]

    def set_vocabulary(self, vocabulary: Any, idf_weights: Any = None) -> None:
        """Set the vocabulary (a list or array of terms, or a text file of one term per
        line, local or a gs:// / s3:// URL) and, in "tf_idf" mode, its idf weights, as
        Keras's: the special tokens may lead the list (then the weights include theirs),
        terms must be unique, and "" cannot be a term."""
        if self.output_mode == "tf_idf" and idf_weights is None:
            raise ConfigError("TextVectorization.set_vocabulary: output_mode='tf_idf' needs "
                              "idf_weights= (one per vocabulary term).")
        if self.output_mode != "tf_idf" and idf_weights is not None:
            raise ConfigError(f"TextVectorization.set_vocabulary(idf_weights=...) is for "
                              f"output_mode='tf_idf' only; this layer's is "
                              f"{self.output_mode!r}.")
        if isinstance(vocabulary, str | os.PathLike):
            vocabulary = _read_vocabulary_file(os.fspath(vocabulary))
        terms = [self._to_bytes(t, "vocabulary") for t in _as_list(vocabulary, "vocabulary")]
        if not terms:
            raise ConfigError("TextVectorization: cannot set an empty vocabulary.")
        special = [s.encode() for s in self._special_tokens()]
        found_special = terms[:len(special)] == special
        tokens = terms[len(special):] if found_special else terms
        repeated = sorted(t for t, n in Counter(tokens).items() if n > 1)
        if repeated:
            raise ConfigError(f"TextVectorization vocabulary repeats terms "
                              f"{[t.decode(self.encoding, 'replace') for t in repeated]}; "
                              "each term once.")
        if b"" in tokens:
            raise ConfigError(
                f"TextVectorization vocabulary has the mask token '' at index "
                f"{len(terms) - 1 - terms[::-1].index(b'')}: leave the special tokens out, or "
                f"put them first in this order: {self._special_tokens()}.")
        size = self.token_start() + len(tokens)
        if self.max_tokens is not None and size > self.max_tokens:
            raise ConfigError(f"TextVectorization vocabulary of {size} terms (special tokens "
                              f"included) is larger than max_tokens={self.max_tokens}.")
        idf = None
        if idf_weights is not None:
            weights = np.asarray(idf_weights, np.float64)
            if weights.ndim != 1 or len(weights) != len(terms):
                raise ConfigError(f"TextVectorization: idf_weights of shape {weights.shape} for "
                                  f"a vocabulary of {len(terms)} terms; give one weight per "
                                  "term.")
            # Keras's: without the special tokens, they get the mean weight; with
            # pad_to_max_tokens the columns past the vocabulary weigh 0.
            front = [] if found_special else [np.average(weights)] * self.token_start()
            back = [0.0] * ((self.max_tokens or 0) - len(front) - len(weights)) \
                if self.pad_to_max_tokens else []
            idf = np.concatenate([front, weights, back]).astype(np.float32)
        self._set_tokens(tokens, idf)

    def _set_tokens(self, tokens: list[bytes], idf: np.ndarray | None) -> None:
        start = self.token_start()
        self.tokens = tokens
        self.index = {t: start + i for i, t in enumerate(tokens)}
        self.idf = idf
        self.vocabulary_known = True

    # -- adapt ---------------------------------------------------------------------------------
    def adapt(self, data: Any, batch_size: int | None = None, steps: int | None = None) -> None:
        """Learn the vocabulary (and in "tf_idf" mode the idf weights) from `data`: a list or
        numpy array of strings, or an iterable of batches (a pk.data Dataset: of (x, y)
        elements x is read), `steps` batches of it if given, as Keras's adapt."""
        if self.has_input_vocabulary:
            raise ConfigError(f"TextVectorization {self.name!r} was given its vocabulary; "
                              "adapt() learns one, so create the layer without vocabulary= "
                              "to adapt it.")
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int)
                                  or steps < 1):
            raise ConfigError(f"TextVectorization.adapt(steps={steps!r}) must be a positive int.")
        if batch_size is not None and (isinstance(batch_size, bool)
                                       or not isinstance(batch_size, int) or batch_size < 1):
            raise ConfigError(f"TextVectorization.adapt(batch_size={batch_size!r}) must be a "
                              "positive int.")
        counts: Counter[bytes] = Counter()
        document_counts: Counter[bytes] = Counter()
        documents = 0
        for batch in _adapt_batches(data, batch_size, steps):
            for row in self._documents(*self._preprocess(batch)):
                counts.update(row)
                if self.output_mode == "tf_idf":
                    document_counts.update(set(row))
                    documents += 1
        if not counts:
            raise ConfigError(f"TextVectorization.adapt got no tokens from {type(data).__name__}"
                              "; give it strings (a list, an array or a Dataset of them).")
        counts.pop(b"", None)
        counts.pop(OOV_TOKEN.encode(), None)
        # Keras's order: np.lexsort((tokens, counts))[::-1], count then bytes, both descending.
        ranked = sorted(counts, key=lambda t: (counts[t], t), reverse=True)
        if self.max_tokens is not None:
            ranked = ranked[:self.max_tokens - self.token_start()]
        idf = None
        if self.output_mode == "tf_idf":
            # Keras's IndexLookup: log(1 + num_documents / (1 + document_count)), in float64,
            # then float32; the special tokens get the mean, columns past the vocabulary 0.
            learned = np.array([math.log(1 + documents / (1 + document_counts[t]))
                                for t in ranked], np.float64).astype(np.float32)
            mean = learned.mean(dtype=np.float64) if len(learned) else np.nan  # rounded once
            front = np.full(self.token_start(), mean, np.float32)
            back = np.zeros(max(0, (self.max_tokens or 0) - self.token_start() - len(learned))
                            if self.pad_to_max_tokens else 0, np.float32)
            idf = np.concatenate([front, learned, back])
        self._set_tokens(ranked, idf)

    @staticmethod
    def _documents(data: Any, kind: str) -> list[list[bytes]]:
        """The documents of a preprocessed batch, as Keras's `update_state` counts them: each
        row of a batch of rank 2; a batch of rank 0 or 1 is one document."""
        if kind == ROWS:
            return data
        if kind == ONE:
            return [data]
        if data.ndim <= 1:
            return [list(data.reshape(-1))]
        return [list(r) for r in data.reshape(data.shape[0], -1)]

    # -- the call ------------------------------------------------------------------------------
    def __call__(self, inputs: Any, *extra: Any, training: bool | None = None,
                 mask: Any = None) -> Any:
        """Vectorize a string or a batch of strings: a numpy array (int64 ids of shape
        (batch, length) in "int" mode; (batch, vocabulary_size or max_tokens) counts or
        weights in the others), or in "int" mode with ragged=True a list of 1-D arrays."""
        if isinstance(inputs, SymbolicTensor) or any(isinstance(x, SymbolicTensor)
                                                     for x in extra):
            raise ConfigError(f"TextVectorization {self.name!r} called on a pk.Input: "
                              + HOST_ONLY)
        if isinstance(inputs, jax.Array):  # inside a model's step (a subclass's call())
            raise ConfigError(f"TextVectorization {self.name!r} called inside a model: "
                              + HOST_ONLY)
        if extra:
            raise ConfigError(f"TextVectorization {self.name!r} takes one string or batch of "
                              f"strings; got {1 + len(extra)} positional arguments (a dataset "
                              "of (text, label) elements calls its map function with both): "
                              "map `lambda x, y: (vectorizer(x), y)`.")
        if self.output_mode == "int" and not self.vocabulary_known:
            # Keras errs here too ("Table not initialized"): every id would be [UNK], and a
            # model would train on a constant.
            raise ConfigError(f"TextVectorization {self.name!r} has no vocabulary yet: "
                              "adapt(data) it first, or pass vocabulary=.")
        if self.output_mode != "int" and not self.pad_to_max_tokens \
                and not self.vocabulary_known:
            raise ConfigError(f"TextVectorization {self.name!r} (output_mode="
                              f"{self.output_mode!r}) has no vocabulary yet, so its output "
                              "width is unknown: adapt(data) it, or pass vocabulary=.")
        data, kind = self._preprocess(inputs)
        if self.output_mode == "int":
            return self._ids(data, kind)
        return self._encode(data, kind)

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        raise ConfigError(f"TextVectorization {self.name!r} is a layer of a model: " + HOST_ONLY)

    def output_shape(self, input_shape: Shape) -> Shape:
        raise ConfigError(f"TextVectorization {self.name!r} is a layer of a model: " + HOST_ONLY)

    def _lookup(self, tokens: Iterable[bytes]) -> list[int]:
        get = self.index.get  # "" is never a term (set_vocabulary refuses it)
        if self.output_mode == "int":  # "" -> 0 (the mask), anything unknown -> 1
            return [get(t, 1) if t else 0 for t in tokens]
        return [get(t, 0) if t else -1 for t in tokens]  # "" dropped, unknown -> 0

    def _ids(self, data: Any, kind: str) -> Any:
        length = self.output_sequence_length
        if kind == ROWS:
            ids = [self._lookup(row) for row in data]
            if self.ragged:
                return [np.asarray(r[:length], np.int64) for r in ids]
            # Keras pads the ragged ids with 0 to the longest row, or cuts and pads them to
            # output_sequence_length.
            width = length if length is not None else max(map(len, ids), default=0)
            out = np.zeros((len(ids), width), np.int64)
            for i, r in enumerate(ids):
                r = r[:width]
                out[i, :len(r)] = r
            return out
        if kind == ONE:  # one string, split: its ids
            out = np.asarray(self._lookup(data), np.int64)
        else:
            out = np.asarray(self._lookup(data.reshape(-1)), np.int64).reshape(data.shape)
        if length is None:
            return out
        if out.ndim == 0:
            raise InputError("TextVectorization(split=None, output_sequence_length=...) got one "
                             "string; give a batch of them.")
        out = out[..., :length]  # Keras cuts and pads the last axis, whatever it is
        if self.ragged:
            return out
        return np.pad(out, [(0, 0)] * (out.ndim - 1) + [(0, length - out.shape[-1])])

    def _encode(self, data: Any, kind: str) -> np.ndarray:
        single = kind == ONE or (kind == DENSE and data.ndim <= 1)  # Keras: one sample
        if kind == DENSE and data.ndim > 2:
            raise InputError(f"TextVectorization(output_mode={self.output_mode!r}, split=None) "
                             f"takes batches of rank 1 or 2; got shape {data.shape}.")
        if kind == ROWS:
            samples = [self._lookup(row) for row in data]
        elif kind == ONE:
            samples = [self._lookup(data)]
        else:
            samples = [self._lookup(data.reshape(-1))] if single else \
                [self._lookup(r) for r in data]
        depth = self.max_tokens if self.pad_to_max_tokens else self.vocabulary_size()
        # One bincount over (sample, id) pairs; the dropped "" (-1) counts nowhere.
        ids = np.fromiter((i for sample in samples for i in sample), np.int64)
        rows = np.repeat(np.arange(len(samples)), [len(sample) for sample in samples])
        keep = ids >= 0
        counts = np.bincount(rows[keep] * depth + ids[keep], minlength=len(samples) * depth)
        counts = counts.reshape(len(samples), depth)
        if self.output_mode == "multi_hot":
            out = np.minimum(counts, 1, out=counts)
        elif self.output_mode == "count":
            out = counts
        else:
            out = counts.astype(np.float32) * self.idf[:depth]
        return out[0] if single else out

    # -- preprocessing: standardize, split, ngrams ----------------------------------------------
    def _to_bytes(self, value: Any, what: str) -> bytes:
        if isinstance(value, bytes):
            return value
        if isinstance(value, str):
            return value.encode(self.encoding)
        raise InputError(f"TextVectorization {self.name!r}: {what} holds "
                         f"{type(value).__name__} {value!r}; it takes strings (str or bytes).")

    def _strings(self, inputs: Any) -> np.ndarray:
        """`inputs` as an object array of bytes, of the input's shape."""
        if isinstance(inputs, str | bytes):
            return np.array(self._to_bytes(inputs, "the input"), dtype=object)
        if isinstance(inputs, np.ndarray) and inputs.dtype.kind not in "USO":
            raise InputError(f"TextVectorization {self.name!r} takes strings; got an array of "
                             f"dtype {inputs.dtype} (vectorize the text before it becomes "
                             "numbers).")
        if not isinstance(inputs, np.ndarray | list | tuple):
            raise InputError(f"TextVectorization {self.name!r} takes a string or a batch of "
                             f"strings (a list or a numpy array); got {type(inputs).__name__}.")
        try:
            array = np.array(inputs, dtype=object)
        except ValueError:
            raise InputError(f"TextVectorization {self.name!r}: a batch of strings must be "
                             "rectangular (a list of strings, or of 1-string lists).") from None
        flat = [self._to_bytes(v, "the input") for v in array.reshape(-1)]
        out = np.empty(len(flat), dtype=object)
        out[:] = flat
        return out.reshape(array.shape)

    def _preprocess(self, inputs: Any) -> tuple[Any, str]:
        """Standardized, split and ngrammed tokens, and their kind: ROWS (a token list per
        string of a batch), ONE (the token list of one string) or DENSE (without split: an
        object array of the input's shape, or with ngrams of its last axis ngrammed)."""
        strings = self._strings(inputs)
        strings = self._standardized(strings)
        if self.split is None:
            if self.ngrams is None:
                return strings, DENSE
            if strings.ndim == 0:
                raise InputError("TextVectorization(split=None, ngrams=...) got one string; "
                                 "give a batch of them.")
            # tf.strings.ngrams along the last axis of a dense batch: all rows equal length.
            flat = strings.reshape(-1, strings.shape[-1])
            grams = [self._ngrams_of(list(r)) for r in flat]
            out = np.empty((len(grams), len(grams[0]) if grams else 0), dtype=object)
            for i, g in enumerate(grams):
                out[i, :] = g
            return out.reshape(*strings.shape[:-1], out.shape[-1]), DENSE
        if strings.ndim > 1:
            if strings.ndim > 2 or strings.shape[-1] != 1:
                raise InputError(
                    f"TextVectorization {self.name!r} splits strings, so a batch must be of "
                    f"rank 1, or rank 2 with a last dimension of 1 (as Keras's); got shape "
                    f"{strings.shape}.")
            strings = strings[:, 0]
        if strings.ndim == 0:
            return self._ngrams_of(self._split_one(strings.item())), ONE
        rows = self._split_many(strings)
        return [self._ngrams_of(r) for r in rows], ROWS

    def _standardized(self, strings: np.ndarray) -> np.ndarray:
        mode = self.standardize
        if mode is None:
            return strings
        if callable(mode):
            # As Keras on a backend other than TensorFlow: a numpy array of str in, one of the
            # same shape out.
            text = np.vectorize(lambda b: b.decode(self.encoding), otypes=[object])(strings) \
                if strings.size else strings
            result = np.asarray(mode(np.asarray(text, dtype=str) if strings.size else text))
            if result.shape != strings.shape:
                raise InputError(f"TextVectorization standardize={getattr(mode, '__name__', mode)}"
                                 f" returned shape {result.shape} for inputs of shape "
                                 f"{strings.shape}; it must keep the shape.")
            return self._strings(result)
        lower = mode in ("lower", "lower_and_strip_punctuation")
        strip = mode in ("strip_punctuation", "lower_and_strip_punctuation")
        out = np.empty(strings.size, dtype=object)
        # bytes.lower() lowercases ASCII only, as tf.strings.lower without an encoding.
        texts = [s.lower() for s in strings.reshape(-1)] if lower else list(strings.reshape(-1))
        out[:] = [s.translate(None, _PUNCTUATION) for s in texts] if strip else texts
        return out.reshape(strings.shape)

    def _split_one(self, s: bytes) -> list[bytes]:
        if self.split == "whitespace":
            return s.split()  # ASCII whitespace, runs as one, ends stripped: tf.strings.split
        if self.split == "character":
            # tf.strings.unicode_split: code points, invalid bytes as U+FFFD
            return [c.encode(self.encoding) for c in s.decode(self.encoding, "replace")]
        return self._split_many(np.array([s], dtype=object))[0]

    def _split_many(self, strings: np.ndarray) -> list[list[bytes]]:
        if not callable(self.split):
            return [self._split_one(s) for s in strings]
        text = np.array([s.decode(self.encoding) for s in strings], dtype=str)
        result = self.split(text)
        rows = [[self._to_bytes(t.item() if isinstance(t, np.generic) else t,
                                "the split function's output") for t in row]
                for row in _as_list(result, "the split function's output")]
        if len(rows) != len(strings):
            raise InputError(f"TextVectorization split={getattr(self.split, '__name__', '')} "
                             f"returned {len(rows)} token lists for {len(strings)} strings; "
                             "it must return one list per string.")
        return rows

    def _ngrams_of(self, tokens: list[bytes]) -> list[bytes]:
        if self.ngrams is None:
            return tokens
        return [b" ".join(tokens[i:i + n]) for n in self.ngrams
                for i in range(len(tokens) - n + 1)]

    # -- config --------------------------------------------------------------------------------
    def get_config(self) -> dict:
        """Keras's keys; `vocabulary` (special tokens first) and `idf_weights` as the layer
        has them now, adapted or given, so that `from_config` rebuilds the same layer."""
        vocabulary = self.get_vocabulary() if self.vocabulary_known else None
        idf = None
        if self.idf is not None and vocabulary is not None:
            idf = [float(w) for w in self.idf[:len(vocabulary)]]
        return {**super().get_config(),
                "max_tokens": self.max_tokens, "standardize": self.standardize,
                "split": self.split,
                "ngrams": list(self.ngrams_arg) if isinstance(self.ngrams_arg, tuple)
                else self.ngrams_arg,
                "output_mode": self.output_mode,
                "output_sequence_length": self.output_sequence_length,
                "pad_to_max_tokens": self.pad_to_max_tokens, "sparse": False,
                "ragged": self.ragged, "vocabulary": vocabulary, "idf_weights": idf,
                "encoding": self.encoding, "vocabulary_size": self.vocabulary_size(),
                "has_input_vocabulary": self.has_input_vocabulary}

    @classmethod
    def from_config(cls, config: dict) -> TextVectorization:
        config = dict(config)
        for key in ("standardize", "split"):
            if config.get(key) is not None and not isinstance(config[key], str):
                raise ConfigError(f"TextVectorization config: {key}={config[key]!r} is a "
                                  "serialized function; podkit never runs code from a config, "
                                  f"so build the layer in code with {key}=your_function.")
        return cls(**config)


def _check_dtype(dtype: Any) -> None:
    """Keras's configs carry a dtype policy; strings have none, so only the defaults pass."""
    name = dtype.get("config", {}).get("name") if isinstance(dtype, dict) else dtype
    if name not in (None, "float32", "string"):
        raise ConfigError(f"TextVectorization(dtype={dtype!r}): it takes and gives no floats "
                          "to cast; leave dtype out.")


def _flag(what: str, value: Any) -> bool:
    if not isinstance(value, bool | np.bool_):
        raise ConfigError(f"TextVectorization({what}={value!r}) must be True or False.")
    return bool(value)


def _max_tokens(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value <= 1:
        raise ConfigError(f"TextVectorization(max_tokens={value!r}) must be None or an int "
                          "greater than 1 (it counts the special tokens too).")
    return int(value)


def _choice(what: str, value: Any, names: tuple[str, ...]) -> Any:
    if value is None or callable(value) or value in names:
        return value
    raise ConfigError(f"TextVectorization({what}={value!r}); valid values: "
                      f"{', '.join(map(repr, names))}, None or a function.")


def _ngrams(value: Any) -> tuple[int, ...] | None:
    """Keras's ngrams: an int n means widths 1..n, a tuple the widths listed."""
    if value is None:
        return None
    if isinstance(value, int | np.integer) and not isinstance(value, bool) and value >= 1:
        return tuple(range(1, int(value) + 1))
    if isinstance(value, tuple | list) and value and all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in value):
        return tuple(value)
    raise ConfigError(f"TextVectorization(ngrams={value!r}) must be None, a positive int (all "
                      "widths up to it) or a tuple of positive ints (those widths).")


def _sequence_length(value: Any, output_mode: str) -> int | None:
    if value is None:
        return None
    if output_mode != "int":
        raise ConfigError(f"TextVectorization(output_sequence_length={value!r}) is for "
                          f"output_mode='int' only; got output_mode={output_mode!r}, whose "
                          "output is one vector per string.")
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ConfigError(f"TextVectorization(output_sequence_length={value!r}) must be None "
                          "or a positive int.")
    return int(value)


def _as_list(value: Any, what: str) -> list:
    if isinstance(value, np.ndarray):
        if value.ndim != 1:
            raise ConfigError(f"TextVectorization: {what} must be 1-D; got shape {value.shape}.")
        return value.tolist()
    if isinstance(value, list | tuple):
        return list(value)
    raise ConfigError(f"TextVectorization: {what} must be a list, a tuple, a 1-D array or a "
                      f"file path; got {type(value).__name__}.")


def _read_vocabulary_file(path: str) -> list[bytes]:
    """One term per line, as TF's TextFileInitializer reads a Keras vocabulary file."""
    if not paths.exists(path):
        raise ConfigError(f"TextVectorization vocabulary file {path!r} does not exist.")
    with paths.open(path, "rb") as f:
        lines = f.read().split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the final newline ends the last line
    return [line[:-1] if line.endswith(b"\r") else line for line in lines]


def _adapt_batches(data: Any, batch_size: int | None, steps: int | None) -> Iterable[Any]:
    """What Keras's adapt hands update_state: a list or array whole (a rank-1 one as a
    column, one document per string), batch_size strings at a time when given; anything else
    iterated, batch by batch, `steps` of them."""
    if isinstance(data, str | bytes):
        raise ConfigError("TextVectorization.adapt got one string; give a list of them.")
    if isinstance(data, list | tuple | np.ndarray):
        array = np.array(data, dtype=object)
        if array.ndim == 1:
            array = array[:, None]
        size = batch_size or max(len(array), 1)
        for i in range(0, len(array), size):
            yield array[i:i + size]
        return
    if not hasattr(data, "__iter__"):
        raise ConfigError(f"TextVectorization.adapt takes a list or array of strings or an "
                          f"iterable of batches (a pk.data Dataset); got {type(data).__name__}.")
    for i, batch in enumerate(data):
        if steps is not None and i >= steps:
            break
        if isinstance(batch, tuple) or (isinstance(batch, list) and batch
                                        and isinstance(batch[0], np.ndarray)):
            batch = batch[0]  # (x, y) elements: the strings are x
        yield batch

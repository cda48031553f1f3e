"""pk.io: tf.io without TensorFlow — TFRecord files, tf.train.Example parsing and writing,
image codecs, and tf.image.resize on the host.

    with pk.io.TFRecordWriter("data.tfrecord") as w:
        w.write(pk.io.serialize_example({"image": pk.io.encode_jpeg(img), "label": 3}))
    spec = {"image": pk.io.FixedLenFeature([], "string"),
            "label": pk.io.FixedLenFeature([], "int64")}
    ds = pk.data.TFRecordDataset("data.tfrecord").map(
        lambda r: pk.io.parse_single_example(r, spec))
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from podkit import _lazy

# Names load on first use (PEP 562): pk.data reads TFRecords through podkit.io.tfrecord and
# should not pay for protobuf or the codecs at `import podkit.data`.
_MODULES = {
    "podkit.io.example": ("make_example", "parse_example", "parse_single_example",
                          "parse_single_sequence_example", "serialize_example",
                          "serialize_sequence_example"),
    "podkit.io.features": ("FixedLenFeature", "FixedLenSequenceFeature", "VarLenFeature"),
    "podkit.io.image": ("decode_and_crop_jpeg", "decode_image", "decode_jpeg", "decode_png",
                        "decode_raw", "encode_jpeg", "encode_png", "extract_jpeg_shape"),
    "podkit.io.resizing": ("ResizeMethod", "resize"),
    "podkit.io.crops": ("decode_crop_resize", "sample_crop_window"),
    "podkit.io.protos": ("BytesList", "Example", "Feature", "FeatureList", "FeatureLists",
                         "Features", "FloatList", "Int64List", "SequenceExample"),
    "podkit.io.tfrecord": ("TFRecordOptions", "TFRecordWriter", "masked_crc32c",
                           "tf_record_iterator"),
}
_WHERE = {name: (module, name) for module, names in _MODULES.items() for name in names}

__all__ = [
    "BytesList", "Example", "Feature", "FeatureList", "FeatureLists", "Features",
    "FixedLenFeature", "FixedLenSequenceFeature", "FloatList", "Int64List", "ResizeMethod",
    "SequenceExample", "TFRecordOptions", "TFRecordWriter", "VarLenFeature",
    "decode_and_crop_jpeg", "decode_crop_resize", "decode_image", "decode_jpeg", "decode_png",
    "decode_raw", "encode_jpeg", "encode_png", "extract_jpeg_shape", "make_example",
    "masked_crc32c", "parse_example", "parse_single_example", "parse_single_sequence_example",
    "resize", "sample_crop_window", "serialize_example", "serialize_sequence_example",
    "tf_record_iterator",
]


__getattr__, __dir__ = _lazy.attributes(__name__, _WHERE, globals())


if TYPE_CHECKING:  # what static tools see: the same names, imported eagerly
    from podkit.io.crops import decode_crop_resize, sample_crop_window
    from podkit.io.example import (
        make_example,
        parse_example,
        parse_single_example,
        parse_single_sequence_example,
        serialize_example,
        serialize_sequence_example,
    )
    from podkit.io.features import FixedLenFeature, FixedLenSequenceFeature, VarLenFeature
    from podkit.io.image import (
        decode_and_crop_jpeg,
        decode_image,
        decode_jpeg,
        decode_png,
        decode_raw,
        encode_jpeg,
        encode_png,
        extract_jpeg_shape,
    )
    from podkit.io.protos import (
        BytesList,
        Example,
        Feature,
        FeatureList,
        FeatureLists,
        Features,
        FloatList,
        Int64List,
        SequenceExample,
    )
    from podkit.io.resizing import ResizeMethod, resize
    from podkit.io.tfrecord import (
        TFRecordOptions,
        TFRecordWriter,
        masked_crc32c,
        tf_record_iterator,
    )

"""tf.train.Example and its parts as protobuf message classes, built from a descriptor written
here (tensorflow/core/example/example.proto and feature.proto, field for field), so neither
TensorFlow nor protoc-generated files are needed. The protobuf runtime (upb) parses them in C.

    ex = pk.io.Example()
    ex.features.feature["label"].int64_list.value.append(3)
    ex.SerializeToString()
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto


def _file() -> descriptor_pb2.FileDescriptorProto:
    f = descriptor_pb2.FileDescriptorProto(name="podkit/tensorflow_example.proto",
                                           package="tensorflow", syntax="proto3")

    def message(name: str, *fields: tuple) -> descriptor_pb2.DescriptorProto:
        m = f.message_type.add(name=name)
        for fname, number, ftype, label, type_name, oneof in fields:
            field = m.field.add(name=fname, number=number, type=ftype, label=label,
                                json_name=_camel(fname))
            if type_name:
                field.type_name = type_name
            if oneof is not None:
                field.oneof_index = oneof
        return m

    def map_field(m: descriptor_pb2.DescriptorProto, fname: str, value_type: str) -> None:
        entry = m.nested_type.add(name=_camel(fname, upper=True) + "Entry")
        entry.options.map_entry = True
        entry.field.add(name="key", number=1, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL,
                        json_name="key")
        entry.field.add(name="value", number=2, type=_F.TYPE_MESSAGE, label=_F.LABEL_OPTIONAL,
                        type_name=value_type, json_name="value")
        m.field.add(name=fname, number=1, type=_F.TYPE_MESSAGE, label=_F.LABEL_REPEATED,
                    type_name=f".tensorflow.{m.name}.{entry.name}", json_name=_camel(fname))

    rep, opt = _F.LABEL_REPEATED, _F.LABEL_OPTIONAL
    message("BytesList", ("value", 1, _F.TYPE_BYTES, rep, None, None))
    # proto3 packs repeated scalars by default, as TF's files do ([packed = true]).
    message("FloatList", ("value", 1, _F.TYPE_FLOAT, rep, None, None))
    message("Int64List", ("value", 1, _F.TYPE_INT64, rep, None, None))
    feature = message("Feature",
                      ("bytes_list", 1, _F.TYPE_MESSAGE, opt, ".tensorflow.BytesList", 0),
                      ("float_list", 2, _F.TYPE_MESSAGE, opt, ".tensorflow.FloatList", 0),
                      ("int64_list", 3, _F.TYPE_MESSAGE, opt, ".tensorflow.Int64List", 0))
    feature.oneof_decl.add(name="kind")
    map_field(message("Features"), "feature", ".tensorflow.Feature")
    message("FeatureList", ("feature", 1, _F.TYPE_MESSAGE, rep, ".tensorflow.Feature", None))
    map_field(message("FeatureLists"), "feature_list", ".tensorflow.FeatureList")
    message("Example", ("features", 1, _F.TYPE_MESSAGE, opt, ".tensorflow.Features", None))
    message("SequenceExample",
            ("context", 1, _F.TYPE_MESSAGE, opt, ".tensorflow.Features", None),
            ("feature_lists", 2, _F.TYPE_MESSAGE, opt, ".tensorflow.FeatureLists", None))
    return f


def _camel(name: str, upper: bool = False) -> str:
    head, *rest = name.split("_")
    out = head + "".join(p.title() for p in rest)
    return out[:1].upper() + out[1:] if upper else out


# A pool of our own: TensorFlow's generated classes, if TF is imported in the same process,
# register the same names in the default pool, and the two must not collide.
_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_file())


def _cls(name: str) -> type:
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"tensorflow.{name}"))


BytesList = _cls("BytesList")
FloatList = _cls("FloatList")
Int64List = _cls("Int64List")
Feature = _cls("Feature")
Features = _cls("Features")
FeatureList = _cls("FeatureList")
FeatureLists = _cls("FeatureLists")
Example = _cls("Example")
SequenceExample = _cls("SequenceExample")

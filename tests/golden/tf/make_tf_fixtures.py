"""Write the TensorFlow golden files that tests/io and tests/test_tfrecord_dataset.py read
without TensorFlow: TFRecord files written by `tf.io.TFRecordWriter`, `tf.train.Example`s of
every feature kind with what `tf.io.parse_*` returns for them, damaged files with what
`tf.data` does on them, and images encoded and decoded by `tf.io`.

    .venv/bin/python tests/golden/tf/make_tf_fixtures.py     # needs tensorflow-cpu (bench extra)

Not collected by pytest (no test_ prefix): it imports tensorflow, which CI does not have.
Everything is deterministic (seeded), so running it again rewrites the same files.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf

HERE = Path(__file__).resolve().parent
rng = np.random.default_rng(38)


# -- helpers -------------------------------------------------------------------------------------
def feature(values) -> tf.train.Feature:
    if isinstance(values, np.ndarray) and values.dtype.kind == "f":
        return tf.train.Feature(float_list=tf.train.FloatList(value=values.tolist()))
    if isinstance(values, np.ndarray) and values.dtype.kind == "S":
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=values.tolist()))
    values = list(values) if isinstance(values, list | tuple | np.ndarray) else [values]
    if values and isinstance(values[0], bytes | str):
        return tf.train.Feature(bytes_list=tf.train.BytesList(
            value=[v.encode() if isinstance(v, str) else v for v in values]))
    if values and isinstance(values[0], float | np.floating):
        return tf.train.Feature(float_list=tf.train.FloatList(value=values))
    return tf.train.Feature(int64_list=tf.train.Int64List(value=values))


def example(**features) -> bytes:
    return tf.train.Example(features=tf.train.Features(
        feature={k: feature(v) if not isinstance(v, tf.train.Feature) else v
                 for k, v in features.items()})).SerializeToString(deterministic=True)


def plain(value) -> dict:
    """A parsed value as JSON: dtype, shape, flat values (bytes as hex)."""
    if isinstance(value, tf.SparseTensor):
        value = tf.sparse.to_dense(value)
    arr = value.numpy() if hasattr(value, "numpy") else value
    arr = np.asarray(arr, dtype=object) if isinstance(arr, bytes) else np.asarray(arr)
    flat = np.asarray(arr).reshape(-1).tolist()
    if arr.dtype == object:
        return {"dtype": "string", "shape": list(arr.shape), "values": [v.hex() for v in flat]}
    return {"dtype": arr.dtype.name, "shape": list(arr.shape), "values": flat}


def spec_json(spec) -> dict:
    """A tf.io feature spec as JSON that the tests turn into pk.io specs."""
    if isinstance(spec, tf.io.FixedLenFeature):
        d = spec.default_value
        return {"kind": "FixedLenFeature", "shape": list(spec.shape), "dtype": spec.dtype.name,
                "default_value": _json_default(d)}
    if isinstance(spec, tf.io.VarLenFeature):
        return {"kind": "VarLenFeature", "dtype": spec.dtype.name}
    return {"kind": "FixedLenSequenceFeature", "shape": list(spec.shape),
            "dtype": spec.dtype.name, "allow_missing": spec.allow_missing,
            "default_value": _json_default(spec.default_value)}


def _json_default(d):
    if d is None:
        return None
    d = np.asarray(d).tolist()
    if isinstance(d, bytes):
        return {"hex": d.hex()}
    if isinstance(d, list) and d and isinstance(d[0], bytes):
        return {"hex": [v.hex() for v in d]}
    return d


def write_records(path: Path, records: list[bytes], compression: str = "") -> None:
    with tf.io.TFRecordWriter(str(path), tf.io.TFRecordOptions(compression_type=compression)) as w:
        for r in records:
            w.write(r)


def tf_read(path: Path, compression: str = "", ignore_errors: bool = False) -> dict:
    """What tf.data gives for a file: the records before an error, and the error."""
    ds = tf.data.TFRecordDataset(str(path), compression_type=compression)
    if ignore_errors:
        ds = ds.ignore_errors()
    got, error = [], None
    try:
        for r in ds.as_numpy_iterator():
            got.append(r.hex())
    except tf.errors.OpError as e:
        error = f"{type(e).__name__}: {e.message}"
    return {"records": got, "error": error}


# -- Examples of every feature kind ------------------------------------------------------------
def examples() -> None:
    exs = [
        example(i=7, f=0.25, b=b"\x00bytes\xff", il=[1, -2, 3, 2**40, -(2**62), 5],
                fl=[0.5, -1.5, 3.25e-3, 1e30], bl=[b"a", b"", b"ccc"], seq=[1, 2, 3, 4],
                fseq=[0.5, 1.5, 2.5, 3.5, 4.5, 5.5], s="h\u00e9llo"),
        example(i=-3, f=-1e-8, b=b"", il=[0, 0, 0, 0, 0, 0], fl=np.zeros(0, np.float32),
                bl=[b"x"], seq=[9, 8], fseq=np.zeros(0, np.float32), s="z",
                nokind=tf.train.Feature()),
        example(i=2**63 - 1, f=3.0, b=b"q" * 300, il=list(range(6)), bl=np.zeros(0, "S1"),
                s="", nokind=tf.train.Feature(int64_list=tf.train.Int64List(value=[11]))),
    ]
    specs = {
        "i": tf.io.FixedLenFeature([], tf.int64),
        "f": tf.io.FixedLenFeature([], tf.float32),
        "b": tf.io.FixedLenFeature([], tf.string),
        "s": tf.io.FixedLenFeature([], tf.string),
        "il": tf.io.FixedLenFeature([2, 3], tf.int64),
        "fl": tf.io.VarLenFeature(tf.float32),
        "bl": tf.io.VarLenFeature(tf.string),
        "seq": tf.io.FixedLenSequenceFeature([2], tf.int64, allow_missing=True),
        "fseq": tf.io.FixedLenSequenceFeature([3], tf.float32, allow_missing=True,
                                              default_value=-1.0),
        "missing_i": tf.io.FixedLenFeature([], tf.int64, default_value=42),
        "missing_f2": tf.io.FixedLenFeature([2], tf.float32, default_value=[1.5, 2.5]),
        "missing_b": tf.io.FixedLenFeature([], tf.string, default_value=b"dflt"),
        "missing_vl": tf.io.VarLenFeature(tf.int64),
        "nokind": tf.io.FixedLenFeature([], tf.int64, default_value=5),
    }
    write_records(HERE / "examples.tfrecord", exs)
    single = []
    for s in exs:
        parsed = tf.io.parse_single_example(s, specs)
        single.append({k: plain(v) for k, v in parsed.items()})
    batched = tf.io.parse_example(tf.constant(exs), specs)
    # TF's errors where TF errs: each a spec that one of the examples fails.
    bad = {
        "missing_without_default": {"k": tf.io.FixedLenFeature([], tf.int64)},
        "wrong_count": {"il": tf.io.FixedLenFeature([4], tf.int64)},
        "wrong_type": {"i": tf.io.FixedLenFeature([], tf.float32)},
        "wrong_type_varlen": {"fl": tf.io.VarLenFeature(tf.int64)},
        "scalar_two_values": {"seq": tf.io.FixedLenFeature([], tf.int64)},
        "sequence_not_multiple": {"fl": tf.io.FixedLenSequenceFeature([3], tf.float32,
                                                                      allow_missing=True)},
    }
    errors = {}
    for name, spec in bad.items():
        try:
            tf.io.parse_single_example(exs[0], spec)
            errors[name] = {"spec": {k: spec_json(v) for k, v in spec.items()}, "error": None}
        except (tf.errors.OpError, ValueError) as e:
            errors[name] = {"spec": {k: spec_json(v) for k, v in spec.items()},
                            "error": f"{type(e).__name__}: {getattr(e, 'message', str(e))}"}
    (HERE / "examples.json").write_text(json.dumps({
        "specs": {k: spec_json(v) for k, v in specs.items()},
        "single": single,
        "batched": {k: plain(v) for k, v in batched.items()},
        "errors": errors,
    }, indent=1))


def sequence_examples() -> None:
    def seq_ex(context, lists):
        return tf.train.SequenceExample(
            context=tf.train.Features(feature={k: feature(v) for k, v in context.items()}),
            feature_lists=tf.train.FeatureLists(feature_list={
                k: tf.train.FeatureList(feature=[feature(s) for s in steps])
                for k, steps in lists.items()})).SerializeToString(deterministic=True)

    exs = [
        seq_ex({"length": 3, "name": b"first"},
               {"tokens": [[1], [2], [3]], "vecs": [[0.5, 1.0], [1.5, 2.0], [2.5, 3.0]],
                "words": [[b"a", b"b"], [b"c"], np.zeros(0, "S1")],
                "ragged": [[1, 2, 3], [4], []]}),
        seq_ex({"length": 1, "name": b"second"},
               {"tokens": [[7]], "vecs": [[9.0, 8.0]], "words": [[b"zz"]], "ragged": [[5, 6]]}),
    ]
    context = {"length": tf.io.FixedLenFeature([], tf.int64),
               "name": tf.io.FixedLenFeature([], tf.string),
               "absent": tf.io.FixedLenFeature([], tf.int64, default_value=-1)}
    sequence = {"tokens": tf.io.FixedLenSequenceFeature([], tf.int64),
                "vecs": tf.io.FixedLenSequenceFeature([2], tf.float32),
                "words": tf.io.VarLenFeature(tf.string),
                "ragged": tf.io.VarLenFeature(tf.int64),
                "none": tf.io.FixedLenSequenceFeature([], tf.int64, allow_missing=True)}
    write_records(HERE / "sequence_examples.tfrecord", exs)
    out = []
    for s in exs:
        c, q = tf.io.parse_single_sequence_example(s, context, sequence)
        out.append({"context": {k: plain(v) for k, v in c.items()},
                    "sequence": {k: plain(v) for k, v in q.items()}})
    (HERE / "sequence_examples.json").write_text(json.dumps({
        "context": {k: spec_json(v) for k, v in context.items()},
        "sequence": {k: spec_json(v) for k, v in sequence.items()},
        "parsed": out}, indent=1))


# -- TFRecord files: compressions, shards, damage ------------------------------------------------
def records() -> None:
    recs = [b"", b"x", bytes(range(256)), rng.bytes(5000), b"last record"] + [
        f"record {i}".encode() for i in range(20)]
    info = {"records": [r.hex() for r in recs]}
    for name, comp in (("plain.tfrecord", ""), ("gzip.tfrecord.gz", "GZIP"),
                       ("zlib.tfrecord.z", "ZLIB")):
        write_records(HERE / name, recs, comp)
        assert tf_read(HERE / name, comp)["records"] == info["records"]
    shards = []
    for s in range(3):
        name = f"shard-{s:05d}-of-00003.tfrecord"
        write_records(HERE / name, [f"shard {s} record {i}".encode() for i in range(4 + s)])
        shards.append(name)
    ds = tf.data.TFRecordDataset(sorted(str(HERE / n) for n in shards))
    info["shards"] = [r.hex() for r in ds.as_numpy_iterator()]
    ds = tf.data.TFRecordDataset(sorted(str(HERE / n) for n in shards), num_parallel_reads=3)
    info["shards_parallel_3"] = [r.hex() for r in ds.as_numpy_iterator()]
    ds = tf.data.TFRecordDataset(sorted(str(HERE / n) for n in shards), num_parallel_reads=2)
    info["shards_parallel_2"] = [r.hex() for r in ds.as_numpy_iterator()]

    # A data CRC broken in record 2 (of 5) and a file cut inside its last record.
    small = [f"small record {i}".encode() for i in range(5)]
    write_records(HERE / "corrupt.tfrecord", small)
    data = bytearray((HERE / "corrupt.tfrecord").read_bytes())
    offsets, off = [], 0
    for r in small:
        offsets.append(off)
        off += 16 + len(r)
    data[offsets[2] + 12 + 3] ^= 0x20  # a byte of record 2's data
    (HERE / "corrupt.tfrecord").write_bytes(bytes(data))
    write_records(HERE / "truncated.tfrecord", small)
    whole = (HERE / "truncated.tfrecord").read_bytes()
    (HERE / "truncated.tfrecord").write_bytes(whole[:offsets[4] + 12 + 5])
    # A broken length CRC (record 1): nothing after it can be framed.
    write_records(HERE / "bad_length.tfrecord", small)
    data = bytearray((HERE / "bad_length.tfrecord").read_bytes())
    data[offsets[1] + 8] ^= 0x01
    (HERE / "bad_length.tfrecord").write_bytes(bytes(data))
    info["small"] = [r.hex() for r in small]
    info["small_offsets"] = offsets
    for name in ("corrupt", "truncated", "bad_length"):
        info[name] = tf_read(HERE / f"{name}.tfrecord")
        info[name + "_ignore_errors"] = tf_read(HERE / f"{name}.tfrecord", ignore_errors=True)
    (HERE / "records.json").write_text(json.dumps(info, indent=1))


# -- images --------------------------------------------------------------------------------------
def smooth_image(h: int, w: int, c: int) -> np.ndarray:
    """A photo-like image: smooth gradients plus noise (JPEG's DCT and chroma both matter)."""
    y, x = np.mgrid[:h, :w]
    chans = [np.sin(x / (5 + 3 * k)) * 70 + np.cos(y / (7 + 2 * k)) * 50 + 128 for k in range(c)]
    return (np.stack(chans, 2) + rng.normal(0, 5, (h, w, c))).clip(0, 255).astype(np.uint8)


def digest(arr: np.ndarray) -> dict:
    """An array as its shape, dtype and the SHA-256 of its C-order bytes: what an exact
    comparison needs, in a few bytes (noisy pixels do not compress)."""
    import hashlib

    arr = np.ascontiguousarray(arr)
    return {"shape": list(arr.shape), "dtype": arr.dtype.name,
            "sha256": hashlib.sha256(arr.tobytes()).hexdigest()}


class Arrays(dict):
    """Outputs kept whole for the smallest images (diagnosable), as digests for the rest."""

    def __init__(self) -> None:
        super().__init__()
        self.digests: dict[str, dict] = {}

    def __setitem__(self, key: str, arr: np.ndarray) -> None:
        self.digests[key] = digest(arr)
        if key.endswith(("/source", "/first_frame")) or "17x23" in key or \
                "/encode_jpeg" in key or key.startswith(("raw/", "png16")):
            super().__setitem__(key, arr)


def images() -> None:
    arrays = Arrays()
    files: dict[str, dict] = {}
    for h, w in ((17, 23), (64, 48), (96, 128)):
        for c in (1, 3):
            img = smooth_image(h, w, c)
            for chroma in ((True, False) if c == 3 else (True,)):
                sub = "420" if chroma else "444"
                name = f"jpeg_{h}x{w}_c{c}" + (f"_{sub}" if c == 3 else "")
                data = tf.io.encode_jpeg(img, quality=90, chroma_downsampling=chroma).numpy()
                (HERE / f"{name}.jpg").write_bytes(data)
                arrays[f"{name}/source"] = img
                arrays[f"{name}/encode_jpeg_q90"] = np.frombuffer(data, np.uint8)
                arrays[f"{name}/decode"] = tf.io.decode_jpeg(data).numpy()
                arrays[f"{name}/accurate"] = tf.io.decode_jpeg(
                    data, dct_method="INTEGER_ACCURATE").numpy()
                arrays[f"{name}/no_fancy"] = tf.io.decode_jpeg(
                    data, fancy_upscaling=False).numpy()
                arrays[f"{name}/ratio2"] = tf.io.decode_jpeg(data, ratio=2).numpy()
                arrays[f"{name}/ratio8"] = tf.io.decode_jpeg(data, ratio=8).numpy()
                arrays[f"{name}/channels1"] = tf.io.decode_jpeg(data, channels=1).numpy()
                arrays[f"{name}/channels3"] = tf.io.decode_jpeg(data, channels=3).numpy()
                if h == 17:
                    arrays[f"{name}/decode_image_f32"] = tf.io.decode_image(
                        data, dtype=tf.float32).numpy()
                arrays[f"{name}/encode_jpeg_default"] = np.frombuffer(
                    tf.io.encode_jpeg(img).numpy(), np.uint8)
                files[name] = {"file": f"{name}.jpg", "shape": [h, w, c]}
        for c in (1, 2, 3, 4) if h < 96 else ():
            img = smooth_image(h, w, c)
            name = f"png_{h}x{w}_c{c}"
            data = tf.io.encode_png(img).numpy()
            (HERE / f"{name}.png").write_bytes(data)
            arrays[f"{name}/source"] = img  # lossless: TF's decode_png gives it back
            assert (tf.io.decode_png(data).numpy() == img).all()
            for ch in (1, 3, 4):
                arrays[f"{name}/channels{ch}"] = tf.io.decode_png(data, channels=ch).numpy()
            arrays[f"{name}/uint16"] = tf.io.decode_png(data, dtype=tf.uint16).numpy()
            assert (tf.io.decode_image(data).numpy() == img).all()
            files[name] = {"file": f"{name}.png", "shape": [h, w, c]}
    for c in (1, 3, 4):  # decode_image to float reads a PNG at 16 bits
        png = (HERE / f"png_17x23_c{c}.png").read_bytes()
        arrays[f"png_17x23_c{c}/decode_image_f32"] = tf.io.decode_image(
            png, dtype=tf.float32).numpy()
    # GIF (animated), BMP and WebP, written by Pillow (TF writes none of them), read by TF.
    import io

    from PIL import Image

    frames = [Image.fromarray(smooth_image(12, 15, 3)).convert("P") for _ in range(3)]
    others = {}
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:])
    others["anim_12x15.gif"] = buf.getvalue()
    buf = io.BytesIO()
    Image.fromarray(smooth_image(12, 15, 3)).save(buf, "BMP")
    others["rgb_12x15.bmp"] = buf.getvalue()
    buf = io.BytesIO()
    Image.fromarray(smooth_image(12, 15, 3)).save(buf, "WEBP", lossless=True)
    others["rgb_12x15.webp"] = buf.getvalue()
    for name, data in others.items():
        (HERE / name).write_bytes(data)
        arrays[f"{name}/source"] = tf.io.decode_image(data).numpy()  # kept whole
        arrays[f"{name}/first_frame"] = tf.io.decode_image(data, expand_animations=False).numpy()
        files[name] = {"file": name, "shape": list(arrays[f"{name}/source"].shape)}
    g16 = (rng.integers(0, 65536, (20, 30, 1))).astype(np.uint16)
    data = tf.io.encode_png(g16).numpy()
    (HERE / "png16_20x30_c1.png").write_bytes(data)
    arrays["png16_20x30_c1/source"] = g16
    arrays["png16_20x30_c1/uint16"] = tf.io.decode_png(data, dtype=tf.uint16).numpy()
    arrays["png16_20x30_c1/decode"] = tf.io.decode_png(data).numpy()
    files["png16_20x30_c1"] = {"file": "png16_20x30_c1.png", "shape": [20, 30, 1]}
    raw = np.arange(-6, 6, dtype=np.int32).tobytes()
    arrays["raw/int32_le"] = tf.io.decode_raw(raw, tf.int32).numpy()
    arrays["raw/int32_be"] = tf.io.decode_raw(raw, tf.int32, little_endian=False).numpy()
    arrays["raw/float16"] = tf.io.decode_raw(raw, tf.float16).numpy()
    arrays["raw/bytes"] = np.frombuffer(raw, np.uint8)
    np.savez_compressed(HERE / "images.npz", **arrays)
    (HERE / "images.json").write_text(json.dumps({"files": files, "digests": arrays.digests},
                                                 indent=1))


def main() -> None:
    for p in HERE.iterdir():
        if p.name not in ("make_tf_fixtures.py", "README.md") and p.is_file():
            p.unlink()
        elif p.is_dir() and p.name == "__pycache__":
            shutil.rmtree(p)
    examples()
    sequence_examples()
    records()
    images()
    (HERE / "VERSION").write_text(f"tensorflow {tf.__version__}\n")
    total = sum(p.stat().st_size for p in HERE.iterdir() if p.is_file())
    print(f"wrote {len(list(HERE.iterdir()))} files, {total / 1e3:.0f} KB, with TF "
          f"{tf.__version__}")


if __name__ == "__main__":
    main()

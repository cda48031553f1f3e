"""The benchmark scripts refuse what they do not understand, before anything runs (issue 41):
a contestant setting that is no key of the model's config is an error naming it, not a run of
the defaults under another label. And their peers are on the terms they print (issue 50):
Keras at podkit's steps per call from data on the device, bench/tfrecord.py's count of the
pixels each side decodes."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


def bench_module(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("argv, said", [
    (["tpu.py", "--only", "podkit:vocab_chunks=0"], "vocab_chunks: not a key of GPTConfig"),
    (["tpu.py", "--model", "llama", "--only", "expert:batch=x"], "batch takes a positive int"),
    (["tpu.py", "--only", "podkit:grad_norm=1"], "grad_norm takes bool"),
    # podkit and the expert both run the config's 10 steps per call: whole calls only
    (["tpu.py", "--only", "expert", "--steps", "15"], "give a multiple of 10"),
    (["gpt.py", "--settings", "3:dp"], "choose from"),
])
def test_an_unknown_setting_is_refused_by_name(argv, said):
    out = subprocess.run([sys.executable, str(BENCH / argv[0]), *argv[1:]],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0, out.stdout[-500:]
    assert said in out.stdout + out.stderr, (out.stdout + out.stderr)[-800:]


def test_the_seed_mlps_keras_peer_runs_k_steps_per_execution_from_the_device():
    os.environ.setdefault("KERAS_BACKEND", "jax")  # before Keras is first imported
    pytest.importorskip("keras")
    import jax

    seed = bench_module("seed_mlp")
    x, y = seed.make_data()
    n, k = 3 * seed.B - 20, 3  # 3 batches, the last one filled: one execution per epoch
    peer = seed.Keras(x[:n], y[:n], 1, k)
    assert peer.model.steps_per_execution == k
    xb, yb = peer.data[0]
    assert isinstance(xb, jax.Array) and xb.shape == (seed.B, seed.D) and yb.shape == (seed.B,)
    assert sorted(set(peer.data.rows.ravel().tolist())) == list(range(n))  # every sample
    calls = []
    train = peer.model.train_function  # Keras's execution: k jitted steps per call of it

    def counted(state, iterator):
        calls.append(1)
        return train(state, iterator)

    peer.model.train_function = counted
    assert peer.run(2) > 0 and len(calls) == 2  # one execution of k steps per epoch


def test_tfrecord_bench_counts_what_each_side_decodes(tmp_path):
    # podkit decodes the whole image (scaled down when the crop is twice the output or
    # more), tf.data the crop window: on the bench's 200-500 px images podkit decodes more;
    # on large ones its scaled decodes show as fewer pixels.
    from podkit.datasets import imagenet_tfrecord as inet

    tfrecord = bench_module("tfrecord")
    small = tfrecord.decode_work(inet.write_shards(str(tmp_path / "small"), 6, 1, workers=1))
    assert small["images"] == 6 and small["scaled"] == 0
    assert small["podkit_pixels"] > small["tf_pixels"]
    large = tfrecord.decode_work(inet.write_shards(str(tmp_path / "large"), 6, 1, workers=1,
                                                   min_side=1800, max_side=2000))
    assert large["scaled"] >= 4 and large["podkit_pixels"] < large["tf_pixels"]

"""Hugging Face directories out (pk.models.save_hf), read back by transformers itself with
`AutoModelForCausalLM.from_pretrained`: the same logits as podkit's, each family, sharded
past the shard size, a Llama trained by podkit, tokenizer files transformers reads."""

import json

import numpy as np
import pytest

import podkit as pk
from podkit.config import LlamaConfig
from podkit.models import build_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_hf_in import FAMILIES, VOCAB, hf_model, logits_of  # noqa: E402


@pytest.fixture(scope="module")
def tokens():
    return np.random.default_rng(1).integers(0, VOCAB, (2, 40)).astype(np.int32)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_transformers_reads_back_what_it_wrote_through_podkit(family, tokens, tmp_path):
    hf = hf_model(family, seed=1)
    hf.save_pretrained(tmp_path / "in")
    with pk.DataParallel().scope():
        model = pk.models.from_hf(tmp_path / "in")
    pk.models.save_hf(model, tmp_path / "out", max_shard_bytes=40_000)
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1  # sharded, as transformers shards
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert type(back) is type(hf)
    # Every tensor the same, so the logits are transformers' own bit for bit.
    np.testing.assert_array_equal(logits_of(back, tokens), logits_of(hf, tokens))


@pytest.mark.parametrize("scan_layers", [True, False])
def test_a_llama_trained_by_podkit_gives_transformers_its_logits(scan_layers, tokens,
                                                                 tmp_path):
    config = LlamaConfig(layers=2, heads=4, kv_heads=2, embed=32, mlp=48, qk_norm=True,
                         head_dim=16, rope_theta=50000.0, rope_scaling="llama3",
                         rope_original_context=16, scan_layers=scan_layers,
                         sample_tokens=0, vocab_chunk=40)
    with pk.FSDP().scope():
        model = build_model(config, {"vocab_size": VOCAB, "seq_len": 40}, seed=2)
        model.compile(optimizer=pk.optimizers.Adam(1e-2),
                      loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.random.default_rng(0).integers(0, VOCAB, (16, 41)).astype(np.int32)
    model.fit(x[:, :-1], x[:, 1:], batch_size=8, epochs=1, verbose=0)  # 2 updates
    pk.models.save_hf(model, tmp_path / "out", dtype="float32")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["model_type"] == "qwen3"
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    np.testing.assert_allclose(logits_of(back, tokens), model.predict(tokens, verbose=0),
                               rtol=1e-4, atol=1e-4)


def test_bfloat16_out_and_the_tokenizer_transformers_reads(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    hf = hf_model("llama_gqa_rope_scaling", seed=3)
    hf.save_pretrained(tmp_path / "in")
    with pk.DataParallel().scope():
        model = pk.models.from_hf(tmp_path / "in")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    tok.train_from_iterator(["a llama goes back out to transformers"] * 20,
                            trainers.BpeTrainer(vocab_size=70,
                                                special_tokens=["<unk>", "</s>"]))
    pk.models.save_hf(model, tmp_path / "out", tokenizer=tok, eos_token="</s>",
                      dtype="bfloat16")
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert back.config.eos_token_id == tok.token_to_id("</s>")
    assert next(back.parameters()).dtype == torch.bfloat16
    # Each tensor rounded to bfloat16 once, as torch rounds it (to nearest, ties to even).
    # (Logits are no check here: a bfloat16 model cast by .to() keeps RoPE's frequencies in
    # bfloat16 too, one loaded as bfloat16 computes them in float32.)
    theirs = hf.state_dict()
    for name, value in back.state_dict().items():
        assert torch.equal(value, theirs[name].to(torch.bfloat16)), name
    text = "goes back out"
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "out")(text)["input_ids"] == \
        tok.encode(text).ids
    with pytest.raises(pk.ConfigError, match="eos_token '<eos>' is not in the tokenizer"):
        pk.models.save_hf(model, tmp_path / "bad", tokenizer=tok, eos_token="<eos>")
    with pytest.raises(pk.ConfigError, match="dtype = 'int8'; use 'float32', 'bfloat16'"):
        pk.models.save_hf(model, tmp_path / "bad", dtype="int8")


def test_only_decoders_go_out_as_hugging_face_directories(tmp_path):
    model = pk.Sequential([pk.layers.Dense(2)])
    model.build((3,))
    with pytest.raises(pk.ConfigError, match="save_hf writes podkit's Llama-family and GPT"):
        pk.models.save_hf(model, tmp_path / "x")
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("family", ["gpt2_scaled_by_layer", "qwen2_bias_tied"])
def test_a_model_read_at_a_shorter_context_goes_out_with_the_sources(family, tmp_path):
    # from_hf(seq_len=16) of a model made for 64 positions: the export is still that model
    # (max_position_embeddings / n_positions 64; GPT-2's whole position table, rows 16..63
    # included), with its attention options and token ids, not a 16-token one.
    hf = hf_model(family, seed=5)
    hf.save_pretrained(tmp_path / "in")
    with pk.DataParallel().scope():
        model = pk.models.from_hf(tmp_path / "in", seq_len=16)
    pk.models.save_hf(model, tmp_path / "out")
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    source = json.loads((tmp_path / "in" / "config.json").read_text())
    assert written.get("max_position_embeddings", written.get("n_positions")) == 64
    for key in ("bos_token_id", "eos_token_id", "scale_attn_by_inverse_layer_idx"):
        assert written.get(key) == source.get(key), key
    theirs = hf.state_dict()
    for name, value in back.state_dict().items():
        assert torch.equal(value, theirs[name]), name

"""Hugging Face directories in (podkit.models.hf, pk.models.from_hf), against transformers
itself: tiny random models of each family written by `save_pretrained`, read by podkit, and
the logits compared with transformers' own forward pass in float32."""

import json

import numpy as np
import pytest

import podkit as pk
from podkit.interop.safetensors_files import SafetensorsDir

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VOCAB = 101
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16}

# family -> (what it exercises, the transformers model)
FAMILIES = {
    "llama_gqa_rope_scaling": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        **COMMON, rope_theta=500000.0, rope_scaling=LLAMA3_ROPE, rms_norm_eps=1e-5)),
    "llama_mqa_tied": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        **{**COMMON, "num_key_value_heads": 1}, tie_word_embeddings=True)),
    "mistral": lambda: transformers.MistralForCausalLM(transformers.MistralConfig(
        **COMMON, sliding_window=None)),
    "qwen2_bias_tied": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        **COMMON, tie_word_embeddings=True)),
    "qwen3_qk_norm_head_dim": lambda: transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
        **COMMON, head_dim=32)),
    "gpt2": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64,
        bos_token_id=0, eos_token_id=0)),
    # Scores scaled by 1 / (layer + 1) too (Mistral's GPT-2 runs), in float32 either way.
    "gpt2_scaled_by_layer": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=64, n_layer=3, n_head=4, n_positions=64,
        scale_attn_by_inverse_layer_idx=True, reorder_and_upcast_attn=True,
        bos_token_id=0, eos_token_id=0)),
}


def hf_model(family, seed=0, sharpen=1.0):
    """A random transformers model of `family`, its 1-d weights (norms, biases) moved off their
    initial ones and zeros, so that a weight read into the wrong place shows in the logits.
    `sharpen`: its matrices scaled by it. At transformers' init (std 0.02) attention is
    nearly uniform, so the logits hardly depend on the context: positions, attention scales
    and the attention itself change them by 1e-4 or less and a greedy continuation repeats a
    token or two; at 8x they move the logits by units and the continuation follows the
    context."""
    torch.manual_seed(seed)
    model = FAMILIES[family]()
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(torch.randn_like(p) * 0.1)
            else:
                p.mul_(sharpen)
    return model.eval()


def logits_of(model, tokens):
    with torch.no_grad():
        return model(torch.tensor(tokens)).logits.float().numpy()


@pytest.fixture(scope="module")
def tokens():
    return np.random.default_rng(0).integers(0, VOCAB, (2, 40)).astype(np.int32)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_family_gives_transformers_logits(family, tokens, tmp_path):
    hf = hf_model(family)
    hf.save_pretrained(tmp_path)
    with pk.DataParallel().scope():
        model = pk.models.from_hf(tmp_path)
    ours = model.predict(tokens, verbose=0)
    np.testing.assert_allclose(ours, logits_of(hf, tokens), rtol=1e-4, atol=1e-4)
    assert model.name == ("gpt" if family.startswith("gpt2") else "llama")


def test_a_config_json_of_the_hubs_older_form_reads_alike(tokens, tmp_path):
    # Most checkpoints on the Hub predate transformers 5: `rope_theta` and `rope_scaling` at
    # the top level (Llama 3.1's "rope_type": "llama3" there), no `rope_parameters`.
    hf = hf_model("llama_gqa_rope_scaling")
    hf.save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    config = json.loads(path.read_text())
    rope = config.pop("rope_parameters")
    config["rope_theta"] = rope.pop("rope_theta")
    config["rope_scaling"] = rope
    assert config["rope_scaling"]["rope_type"] == "llama3"
    path.write_text(json.dumps(config))
    with pk.DataParallel().scope():
        model = pk.models.from_hf(tmp_path)
    np.testing.assert_allclose(model.predict(tokens, verbose=0), logits_of(hf, tokens),
                               rtol=1e-4, atol=1e-4)


def test_a_sharded_bfloat16_checkpoint_streams_to_fsdp_shards(tokens, tmp_path):
    # save_pretrained past max_shard_size writes several files and their index; bfloat16
    # tensors (numpy's safetensors cannot hand them over: podkit maps the files itself).
    hf = hf_model("llama_gqa_rope_scaling").to(torch.bfloat16)
    hf.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 2
    with pk.FSDP().scope():
        model = pk.models.from_hf(tmp_path)
    q = model.state.params["blocks"]["attn"]["q"]  # (layers, embed, heads, head_dim)
    assert q.dtype == np.float32 and len(q.sharding.device_set) == 8
    assert not q.sharding.is_fully_replicated  # embed split over fsdp, read shard by shard
    expected = logits_of(hf.float(), tokens)
    np.testing.assert_allclose(model.predict(tokens, verbose=0), expected, rtol=1e-4,
                               atol=1e-4)


def test_the_tokenizer_comes_along(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    hf_model("mistral").save_pretrained(tmp_path)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    tok.train_from_iterator(["podkit reads a hugging face directory"] * 20,
                            trainers.BpeTrainer(vocab_size=80, special_tokens=["<unk>"]))
    tok.save(str(tmp_path / "tokenizer.json"))
    with pk.DataParallel().scope():
        model = pk.models.from_hf(tmp_path)
    text = "a hugging face directory"
    assert model.tokenizer.encode(text).ids == tok.encode(text).ids
    hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    assert model.tokenizer.encode(text).ids == hf_tok(text)["input_ids"]


def _write(tmp_path, family="mistral", **config_changes):
    hf_model(family).save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    config = json.loads(path.read_text())
    config.update(config_changes)
    path.write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize("changes,pattern", [
    ({"model_type": "falcon"}, r"model_type = 'falcon': podkit reads llama, mistral"),
    ({"hidden_act": "gelu"}, r"hidden_act = 'gelu'.*SwiGLU"),
    ({"sliding_window": 16}, r"sliding_window = 16 \(below the context of 64, on layers"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}},
     r"rope_type = 'yarn'"),
    ({"num_hidden_layers": 3}, r"model.layers.2.input_layernorm.weight"),
    ({"intermediate_size": 80}, r"mlp.gate_proj.weight is \(64, 96\) in podkit's layout; "
                                r"the model from config.json needs \(64, 80\)"),
])
def test_what_podkit_lacks_or_the_files_contradict_is_named(tmp_path, changes, pattern):
    _write(tmp_path, **changes)
    with pytest.raises((pk.ConfigError, pk.InputError), match=pattern):
        pk.models.from_hf(tmp_path)


@pytest.mark.parametrize("family", ["mistral", "gpt2"])
def test_a_seq_len_past_the_context_is_refused_as_the_cli_does(tmp_path, family):
    """from_hf(seq_len=) past config.json's context is an error, as `init_from` with such
    a data.seq_len is: those positions were never trained (GPT-2 has no rows for them)."""
    _write(tmp_path, family)
    context = hf_model(family).config.max_position_embeddings
    for bad in (context + 1, 0, 2.5):
        with pytest.raises(pk.ConfigError, match=rf"from_hf\(seq_len={bad!r}\): the model's "
                                                 rf"context is {context} tokens"):
            pk.models.from_hf(tmp_path, seq_len=bad)


def test_a_directory_without_the_files_says_what_is_missing(tmp_path):
    with pytest.raises(pk.InputError, match="no config.json: not a Hugging Face model"):
        pk.models.from_hf(tmp_path)
    _write(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(pk.InputError, match="neither model.safetensors nor "
                                            "model.safetensors.index.json"):
        pk.models.from_hf(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(pk.InputError, match="not a readable safetensors file"):
        SafetensorsDir(tmp_path)


@pytest.mark.parametrize("family", ["llama_gqa_rope_scaling", "qwen2_bias_tied",
                                    "qwen3_qk_norm_head_dim", "gpt2", "gpt2_scaled_by_layer"])
def test_greedy_generation_is_transformers_own(family, tmp_path):
    # podkit's KV-cache loop (temperature 0: the likeliest token each time) against
    # transformers' generate(do_sample=False), 20 new tokens after a prompt of 7, on weights
    # sharp enough (hf_model's sharpen) that the continuation follows the context: it is no
    # token repeated, and another prompt ending in the same token continues otherwise, so a
    # podkit that lost its attention, positions or cache would not match.
    from podkit.models.gpt import generate

    hf = hf_model(family, seed=4, sharpen=8.0)
    hf.save_pretrained(tmp_path)
    with pk.DataParallel().scope():
        model = pk.models.from_hf(tmp_path)
    rng = np.random.default_rng(5)
    prompt = [int(t) for t in rng.integers(0, VOCAB, 7)]
    other = [int(t) for t in rng.integers(0, VOCAB, 6)] + prompt[-1:]

    def theirs_of(prompt):
        with torch.no_grad():
            return hf.generate(torch.tensor([prompt]), max_new_tokens=20, min_new_tokens=20,
                               do_sample=False, pad_token_id=0)[0, len(prompt):].tolist()

    theirs = theirs_of(prompt)
    assert len(set(theirs)) > 5, theirs  # not one token (or two) over and over
    assert theirs_of(other) != theirs  # the context decides, not the last token alone
    ours = generate(model, prompt, 20, temperature=0.0)
    assert ours == theirs
    assert generate(model, prompt, 20, top_k=1) == ours  # the same, by sampling's top 1
    # Told a stop token, it ends after it (transformers' generate with that eos_token_id).
    stop = ours[5]
    cut = generate(model, prompt, 20, temperature=0.0, stop=stop)
    assert cut == ours[:ours.index(stop) + 1]
    with pytest.raises(pk.ConfigError, match=r"stop=101 must be a token id in \[0, 101\)"):
        generate(model, prompt, 20, stop=VOCAB)
    with pytest.raises(pk.ConfigError, match=r"temperature=-1.0 must be a number >= 0"):
        generate(model, prompt, 20, temperature=-1.0)


def test_gpt2_dropout_rates_are_config_jsons_unless_written(tmp_path):
    # transformers fine-tunes GPT-2 with config.json's resid/embd/attn_pdrop (0.1 by
    # default): so does podkit, unless [model] writes its own rate.
    from podkit.config import Config, GPTConfig, TextDataConfig
    from podkit.models import hf as hf_lib

    hf = hf_model("gpt2")
    hf.config.attn_pdrop = 0.25
    hf.save_pretrained(tmp_path)
    with pk.DataParallel().scope():
        model = pk.models.from_hf(tmp_path, seq_len=16)
    assert (model.model_config.dropout, model.model_config.attn_dropout) == (0.1, 0.25)
    module = model.module()
    tokens = np.random.default_rng(0).integers(0, VOCAB, (2, 16)).astype(np.int32)
    module.eval()
    quiet = np.asarray(module(tokens))
    np.testing.assert_array_equal(np.asarray(module(tokens)), quiet)  # no dropout in eval
    module.train()
    assert not np.allclose(np.asarray(module(tokens)), quiet)  # the probabilities dropped
    module.eval()
    user = Config(model=GPTConfig(dropout=0.0),
                  data=TextDataConfig(files="x.txt", seq_len=16, tokenizer="t.json"))
    assert hf_lib.run_config(user, tmp_path, written=set())[0].model.dropout == 0.1
    assert hf_lib.run_config(user, tmp_path, written={"dropout"})[0].model.dropout == 0.0
    (tmp_path / "config.json").write_text(
        (tmp_path / "config.json").read_text().replace('"embd_pdrop": 0.1', '"embd_pdrop": 0.2'))
    with pytest.raises(pk.ConfigError, match=r"embd_pdrop = 0.2 and resid_pdrop = 0.1"):
        pk.models.from_hf(tmp_path)

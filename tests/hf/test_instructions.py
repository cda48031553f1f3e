"""Instruction tuning (`[data] name = "instructions"`): conversations rendered, tokenized and
masked as transformers' own `apply_chat_template(..., return_assistant_tokens_mask=True)`
does; prompt/completion pairs; a packed batch whose loss and gradients are its examples'
unpacked ones; bad records named; and a real `podkit train` from a Hugging Face directory to
`generate --chat` and an export transformers reads with its chat template."""

import json
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import podkit as pk
from helpers import fast_xla_env, finish, start_cli
from podkit.config import InstructionsDataConfig, LlamaConfig
from podkit.datasets import instructions as sft
from podkit.errors import ConfigError, InputError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TEXT = Path(sys.modules["textwrap"].__file__).read_text()
SPECIALS = ["<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>",
            "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
# ChatML (Qwen's), the assistant's text marked for transformers' assistant mask.
CHATML = ("{% for m in messages %}{% if m['role'] == 'assistant' %}"
          "{{ '<|im_start|>assistant\\n' }}{% generation %}{{ m['content'] + '<|im_end|>\\n' }}"
          "{% endgeneration %}{% else %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
          "'<|im_end|>\\n' }}{% endif %}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
# Llama 3's shape: a BOS from bos_token, headers, trimmed contents, raise_exception.
LLAMA3 = ("{{ bos_token }}{% for m in messages %}"
          "{% if m['role'] not in ['system', 'user', 'assistant'] %}"
          "{{ raise_exception('unknown role ' + m['role']) }}{% endif %}"
          "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' }}"
          "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] | trim + "
          "'<|eot_id|>' }}{% endgeneration %}{% else %}{{ m['content'] | trim + '<|eot_id|>' }}"
          "{% endif %}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")
TEMPLATES = {"chatml": (CHATML, "<|im_end|>", None),
             "llama3": (LLAMA3, "<|eot_id|>", "<|begin_of_text|>")}
CONVERSATIONS = [
    [{"role": "user", "content": "Sort: pear apple fig"},
     {"role": "assistant", "content": "apple fig pear"}],
    [{"role": "system", "content": "You sort words."},
     {"role": "user", "content": "b a"}, {"role": "assistant", "content": "a b"},
     {"role": "user", "content": "now z y x"}, {"role": "assistant", "content": " x y z "}],
]


def tokenizer_dir(where: Path, template: str) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    text, eos, bos = TEMPLATES[template]
    where.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([TEXT], trainers.BpeTrainer(
        vocab_size=300, special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(where / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos,
              "chat_template": text}
    if bos:
        config["bos_token"] = bos
    (where / "tokenizer_config.json").write_text(json.dumps(config))
    return where


@pytest.fixture(scope="module", params=list(TEMPLATES))
def template_dir(request, tmp_path_factory):
    return request.param, tokenizer_dir(tmp_path_factory.mktemp(request.param), request.param)


def encoder(folder: Path) -> sft.Encoder:
    return sft.Encoder(InstructionsDataConfig(tokenizer=str(folder / "tokenizer.json")))


def test_conversations_render_tokenize_and_mask_as_transformers(template_dir):
    name, folder = template_dir
    hf = transformers.AutoTokenizer.from_pretrained(folder)
    enc = encoder(folder)
    for messages in CONVERSATIONS:
        assert enc.template.render(messages, add_generation_prompt=True) == \
            hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        want = hf.apply_chat_template(messages, tokenize=True, return_dict=True,
                                      return_assistant_tokens_mask=True)
        ids, learned = enc.encode({"messages": messages}, "a record")
        assert ids == list(want["input_ids"])
        assert [int(v) for v in learned] == list(want["assistant_masks"])
        # the learned tokens are the replies and their end-of-turn markers, nothing else
        replies = [m["content"] for m in messages if m["role"] == "assistant"]
        text = hf.decode([i for i, keep in zip(ids, learned, strict=True) if keep])
        eot = TEMPLATES[name][1]
        assert text.replace("\n", "") == "".join(
            (r.strip() if name == "llama3" else r) + eot for r in replies)


def test_prompt_completion_pairs_learn_the_completion_and_its_end(tmp_path):
    folder = tokenizer_dir(tmp_path, "chatml")
    hf = transformers.AutoTokenizer.from_pretrained(folder)
    ids, learned = encoder(folder).encode({"prompt": "Sort: b a\n", "completion": "a b"}, "r")
    head = hf("Sort: b a\n")["input_ids"]
    tail = hf("a b", add_special_tokens=False)["input_ids"] + [hf.convert_tokens_to_ids(
        "<|im_end|>")]
    assert ids == head + tail
    assert learned == [False] * len(head) + [True] * len(tail)


def test_a_packed_batch_has_its_examples_unpacked_loss_and_gradients(tmp_path):
    """Three examples packed into one sequence (segment ids, positions from 0) and the same
    three as sequences of their own: the loss (the mean over reply tokens,
    ignore_class=-100) and every parameter's gradient are equal."""
    from podkit.models.llama import build_llama

    enc = encoder(tokenizer_dir(tmp_path, "chatml"))
    examples = [enc.encode({"messages": m}, "r") for m in CONVERSATIONS] + [
        enc.encode({"prompt": "q", "completion": "a short one"}, "r")]
    seq = sum(len(ids) - 1 for ids, _ in examples) + 5  # one packed row, some padding
    packed, packed_y, _ = sft.sequences(examples, seq, True, 1)
    alone, alone_y, _ = sft.sequences(examples, seq, False, 1)
    assert len(packed_y) == 1 and len(alone_y) == len(examples)
    assert (packed_y != sft.IGNORE).sum() == (alone_y != sft.IGNORE).sum() > 0
    starts = np.flatnonzero(packed["positions"][0] == 0)[:4]  # then the padding's, 0
    assert list(packed["segment_ids"][0, starts]) == [1, 2, 3, 0]
    # each example's positions restart at 0 and count its tokens, as it has them alone
    segments, positions = packed["segment_ids"][0], packed["positions"][0]
    for s, (ids, _) in enumerate(examples, 1):
        assert list(positions[segments == s]) == list(range(len(ids) - 1))

    config = LlamaConfig(layers=2, heads=4, kv_heads=2, embed=32, mlp=48, scan_layers=False,
                         vocab_chunk=0, sample_tokens=0)
    model = build_llama(config, {"vocab_size": 320, "seq_len": seq})
    model.build({k: (seq,) for k in packed}, dtype="int32")
    loss = pk.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=sft.IGNORE)
    import flax.nnx as nnx

    graph, params, rest = nnx.split(model.module(), nnx.Param, ...)

    def loss_of(params, x, y):
        return loss(y, nnx.merge(graph, params, rest)(x))

    both = jax.jit(jax.value_and_grad(loss_of))
    packed_loss, packed_grads = both(params, {k: jnp.asarray(v) for k, v in packed.items()},
                                     jnp.asarray(packed_y))
    alone_loss, alone_grads = both(params, jnp.asarray(alone["tokens"]), jnp.asarray(alone_y))
    np.testing.assert_allclose(packed_loss, alone_loss, rtol=1e-6)
    for got, want in zip(jax.tree.leaves(packed_grads), jax.tree.leaves(alone_grads),
                         strict=True):
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=1e-6)
    # without the segment ids the examples would see each other: the loss differs
    mixed = loss_of(params, {"tokens": jnp.asarray(packed["tokens"])}, jnp.asarray(packed_y))
    assert abs(float(mixed) - float(packed_loss)) > 1e-4
    # The model reads `positions`. (RoPE is relative: positions shifted by a constant within
    # an example, as 0..T-1 is of each packed example's, give the same scores, so the loss
    # above cannot tell whether they were read; positions that are not a shift can.)
    # Its matrices scaled 8x: at init (std 0.02) attention is near uniform, positions or not.
    sharp = jax.tree.map(lambda p: p * 8 if p.ndim > 1 else p, params)
    stopped = {**packed, "positions": np.zeros_like(packed["positions"])}
    read, frozen = (loss_of(sharp, {k: jnp.asarray(v) for k, v in x.items()},
                            jnp.asarray(packed_y)) for x in (packed, stopped))
    assert abs(float(frozen) - float(read)) > 1e-2


def test_bad_records_and_settings_are_named(tmp_path):
    folder = tokenizer_dir(tmp_path / "tok", "chatml")
    enc = encoder(folder)
    with pytest.raises(ConfigError, match=r"f.jsonl:3: no assistant message"):
        enc.encode({"messages": [{"role": "user", "content": "hi"}]}, "f.jsonl:3")
    with pytest.raises(ConfigError, match=r"r has the keys \['text'\]; an example has"):
        enc.encode({"text": "hi"}, "r")
    with pytest.raises(ConfigError, match=r"message 0 is 'hi'"):
        enc.encode({"messages": ["hi"]}, "r")
    files = tmp_path / "bad.jsonl"
    files.write_text('{"prompt": "a", "completion": "b"}\n{oops\n')
    config = InstructionsDataConfig(tokenizer=str(folder / "tokenizer.json"),
                                    files=str(files), batch_size=1, seq_len=16)
    with pytest.raises(InputError, match=r"bad.jsonl:2 is not JSON"):
        sft.load_instructions(config)
    with pytest.raises(ConfigError, match=r"needs data.tokenizer"):
        sft.load_instructions(InstructionsDataConfig(files=str(files)))
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "tokenizer.json").write_text((folder / "tokenizer.json").read_text())
    with pytest.raises(ConfigError, match=r"the tokenizer has no chat template"):
        encoder(plain).encode({"messages": CONVERSATIONS[0]}, "r")
    with pytest.raises(ConfigError, match=r"refused the messages: unknown role tool"):
        encoder(tokenizer_dir(tmp_path / "l3", "llama3")).encode(
            {"messages": [{"role": "tool", "content": "x"},
                          {"role": "assistant", "content": "y"}]}, "r")


def test_fine_tune_generate_chat_and_export_with_the_template(tmp_path):
    """`podkit train` from a Hugging Face Llama directory on conversations, with LoRA: the
    loss falls; `podkit generate --chat` answers; `podkit export --format hf` merges the
    adapters and keeps the chat template: transformers' tokenizer renders with it and its
    model gives the run's logits."""
    where = tokenizer_dir(tmp_path / "tiny", "chatml")
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    ).save_pretrained(where)
    rng = np.random.default_rng(0)
    words = ["pear", "apple", "fig", "kiwi", "plum", "lime"]
    with open(tmp_path / "chats.jsonl", "w") as f:
        for _ in range(64):
            q = list(rng.choice(words, 3, replace=False))
            f.write(json.dumps({"messages": [{"role": "user", "content": " ".join(q)},
                                             {"role": "assistant",
                                              "content": " ".join(sorted(q))}]}) + "\n")
    (tmp_path / "sft.toml").write_text(textwrap.dedent(f"""
        [model]
        init_from = "{where}"
        sample_tokens = 0
        lora_rank = 8
        lora_targets = ["q", "k", "v", "o", "gate", "up", "down"]

        [data]
        name = "instructions"
        files = "{tmp_path}/chats.jsonl"
        seq_len = 64
        batch_size = 8
        validation_fraction = 0

        [train]
        steps = 24
        optimizer = "adamw"
        learning_rate = 0.01
        steps_per_execution = 4
        log_every = 4

        [strategy]
        kind = "fsdp"
        mesh = {{ fsdp = -1 }}
        """))
    env = dict(PODKIT_CACHE=str(tmp_path / "cache"), **fast_xla_env())
    (run,) = finish(start_cli("train", "sft.toml", "--cpu-devices", "2", cwd=tmp_path, **env))
    assert run.returncode == 0, run.stderr[-3000:]
    losses = [json.loads(line)["loss"] for line in
              (tmp_path / "runs" / "run" / "metrics.jsonl").read_text().splitlines()
              if '"loss"' in line and '"step"' in line]
    assert len(losses) >= 3 and losses[-1] < losses[0] * 0.95, losses  # adapters alone
    (reply,) = finish(start_cli("generate", "runs/run", "--chat", "--prompt", "fig pear kiwi",
                                "--max-tokens", "12", "--cpu-devices", "1", cwd=tmp_path,
                                **env))
    assert reply.returncode == 0, reply.stderr[-3000:]
    # the reply alone: neither the rendered prompt nor the template's markers
    assert reply.stdout.endswith("\n") and "fig pear kiwi" not in reply.stdout
    assert "<|im_start|>" not in reply.stdout and "<|im_end|>" not in reply.stdout
    (export,) = finish(start_cli("export", "runs/run", "--format", "hf", "--out", "hf",
                                 "--cpu-devices", "1", cwd=tmp_path, **env))
    assert export.returncode == 0, export.stderr[-3000:]
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    chat = [{"role": "user", "content": "fig pear"}]
    assert hf_tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == \
        "<|im_start|>user\nfig pear<|im_end|>\n<|im_start|>assistant\n"
    assert hf_tok.eos_token == "<|im_end|>"
    ids = hf_tok.apply_chat_template(chat, add_generation_prompt=True, return_dict=True
                                     )["input_ids"]
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    ours = pk.models.from_run(tmp_path / "runs" / "run")  # adapters unmerged
    with torch.no_grad():
        want = hf_model(torch.tensor([ids])).logits.numpy()
    n = len(ids)  # the run's model takes packed examples: one, padded to its context
    packed = {"tokens": np.zeros((1, 64), np.int32), "positions": np.zeros((1, 64), np.int32),
              "segment_ids": np.zeros((1, 64), np.int32)}
    packed["tokens"][0, :n], packed["positions"][0, :n] = ids, np.arange(n)
    packed["segment_ids"][0, :n] = 1
    got = np.asarray(ours.predict(packed, verbose=0))[:, :n]
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_the_planner_reads_a_hugging_face_start_as_the_run_does(tmp_path):
    """`podkit plan` of a config that starts from a Hugging Face directory plans that model
    (config.json's architecture and vocabulary), with instruction data's packed inputs."""
    from podkit.sim import plan
    from podkit.sim import program as prog

    where = tokenizer_dir(tmp_path / "tiny", "chatml")
    transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=128)
    ).save_pretrained(where)
    (tmp_path / "chats.jsonl").write_text(json.dumps({"messages": CONVERSATIONS[0]}) + "\n")
    (tmp_path / "sft.toml").write_text(textwrap.dedent(f"""
        [model]
        init_from = "{where}"
        [data]
        name = "instructions"
        files = "{tmp_path}/chats.jsonl"
        seq_len = 64
        """))
    config = prog.load_config(tmp_path / "sft.toml")
    twin = plan.Transformer.of_config(config, "tpu")
    assert (twin.layers, twin.d_model, twin.heads, twin.kv_heads, twin.ff, twin.vocab) == \
        (3, 64, 4, 1, 96, 320)
    assert dict(twin.extra)["qkv_bias"]  # Qwen2's
    info, x, y = prog._example(config, 4)
    assert sorted(x) == ["positions", "segment_ids", "tokens"] and info["ignore_class"] == -100


def test_what_a_newcomer_tried_is_named_or_works(tmp_path, capsys):
    """Found by a newcomer's trial: packed data with the GPT is refused naming
    data.packing; `--init-from DIR` takes a `[model]` of LoRA keys without a name (the
    directory's family); `--chat` with `--prompt-ids` is refused, and a chat prompt past the
    context; pk.models.save_hf writes a chat template and the bos token's own id."""
    from podkit import cli
    from podkit.config import GPTConfig, load
    from podkit.models.gpt import build_gpt

    with pytest.raises(ConfigError, match=r"set data.packing = false"):
        build_gpt(GPTConfig(), {"vocab_size": 64, "seq_len": 8, "packed": True})
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    (hf_dir / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    (tmp_path / "lora.toml").write_text("[model]\nlora_rank = 4\n")
    assert load(tmp_path / "lora.toml", init_from=str(hf_dir)).model.lora_rank == 4
    assert cli.main(["generate", str(tmp_path), "--chat", "--prompt-ids", "1,2"]) == 2
    assert "--chat renders a text prompt" in capsys.readouterr().err
    # A chat prompt past the context is refused (cut, it would lose the system message); one
    # whose reply may run past it is warned about.
    import argparse

    with pytest.raises(ConfigError, match=r"the chat prompt is 64 tokens .* the model's "
                                          r"context is 64 tokens.*Shorten --prompt"):
        cli._check_chat_fits(list(range(64)), argparse.Namespace(max_tokens=8), 64)
    cli._check_chat_fits(list(range(60)), argparse.Namespace(max_tokens=8), 64)
    assert "--max-tokens 8 runs past the model's context of 64" in capsys.readouterr().err
    assert cli.main(["generate", str(tmp_path), "--prompt", "x", "--temperature", "-1"]) == 2
    assert "--temperature -1.0; give a number >= 0 (0: greedy" in capsys.readouterr().err

    from podkit.models.llama import build_llama

    folder = tokenizer_dir(tmp_path / "tok", "llama3")
    tok = sft.Encoder(InstructionsDataConfig(tokenizer=str(folder / "tokenizer.json")))
    model = build_llama(LlamaConfig(layers=1, heads=2, embed=16, mlp=24, lora_rank=2),
                        {"vocab_size": 320, "seq_len": 16})
    model.build((16,), dtype="int32")
    pk.models.save_hf(model, tmp_path / "out", tokenizer=tok.tokenizer,
                      eos_token="<|eot_id|>", bos_token="<|begin_of_text|>",
                      chat_template=tok.template.source)
    back = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    assert back.chat_template == tok.template.source
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["bos_token_id"] == tok.tokenizer.token_to_id("<|begin_of_text|>")
    assert written["eos_token_id"] == tok.tokenizer.token_to_id("<|eot_id|>")

"""Hugging Face directories on object storage (moto's S3 and the GCS emulator, as
tests/storage_servers.py starts them): pk.models.from_hf reads a sharded bfloat16 checkpoint
and its tokenizer from gs:// and s3:// by ranged reads, save_hf writes there, the planner and
a run's config read a remote directory, and what cannot be read is a podkit error naming the
URL and the cause."""

import json
import shutil
import uuid

import numpy as np
import pytest

import podkit as pk
from podkit import paths
from podkit.errors import InputError, StorageError
from storage_servers import (
    ACCESS_DENIED,
    BUCKET,
    GCS_DENIED,
    FaultProxy,
    environ,
    gcs_env,
    s3_env,
)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_hf_in import VOCAB, hf_model, logits_of  # noqa: E402

STORES = {"s3": ("s3_endpoint", s3_env, (ACCESS_DENIED, "application/xml")),
          "gs": ("gcs_endpoint", gcs_env, (GCS_DENIED, "application/json"))}


def tokenizer_files(folder):
    """A byte-level BPE with pad and end-of-text tokens, and the tokenizer_config.json that
    names them."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    tok.train_from_iterator(["a checkpoint read from object storage"] * 20,
                            trainers.BpeTrainer(vocab_size=80,
                                                special_tokens=["<unk>", "<pad>", "</s>"]))
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "<pad>",
         "eos_token": "</s>", "model_max_length": 64}))
    return tok


@pytest.fixture(params=sorted(STORES))
def store(request):
    """A fresh directory URL on each kind of store, the server's env set."""
    request.getfixturevalue("s3" if request.param == "s3" else "gcs")
    return request.param, f"{request.param}://{BUCKET}/hf-{uuid.uuid4().hex[:10]}"


def upload(local, url):
    with paths.staged(url) as there:
        shutil.copytree(local, there)


def test_a_sharded_checkpoint_and_its_tokenizer_come_from_object_storage_and_go_back(
        store, tmp_path):
    scheme, root = store
    hf = hf_model("llama_gqa_rope_scaling", seed=2).to(torch.bfloat16)
    hf.save_pretrained(tmp_path / "tiny", max_shard_size="20KB")
    tok = tokenizer_files(tmp_path / "tiny")
    upload(tmp_path / "tiny", f"{root}/tiny")
    assert paths.exists(f"{root}/tiny/model.safetensors.index.json")
    tokens = np.random.default_rng(0).integers(0, VOCAB, (2, 24)).astype(np.int32)
    with pk.FSDP().scope():
        model = pk.models.from_hf(f"{root}/tiny")
    np.testing.assert_allclose(model.predict(tokens, verbose=0), logits_of(hf.float(), tokens),
                               rtol=1e-4, atol=1e-4)
    assert model.tokenizer.encode("object storage").ids == tok.encode("object storage").ids
    # ... and back out there: the source's dtype (bfloat16), pad token and context kept.
    pk.models.save_hf(model, f"{root}/out")
    with paths.local_copy(f"{root}/out") as out:
        back = transformers.AutoModelForCausalLM.from_pretrained(out)
        hf_tok = transformers.AutoTokenizer.from_pretrained(out)
        assert next(back.parameters()).dtype == torch.bfloat16
        assert hf_tok.pad_token == "<pad>" and hf_tok.eos_token == "</s>"
        assert hf_tok(["a", "object storage read"], padding=True)["input_ids"][0][-1] == \
            tok.token_to_id("<pad>")
        theirs = hf.state_dict()
        for name, value in back.state_dict().items():
            assert torch.equal(value, theirs[name]), name


def test_the_planner_and_a_run_read_a_remote_directory(store, tmp_path):
    from podkit.models import hf as hf_lib
    from podkit.sim import plan
    from podkit.sim import program as prog

    scheme, root = store
    transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=128)
    ).save_pretrained(tmp_path / "q")
    tokenizer_files(tmp_path / "q")
    upload(tmp_path / "q", f"{root}/q")
    assert hf_lib.is_directory(f"{root}/q") and not hf_lib.is_directory(f"{root}/nothing")
    (tmp_path / "docs.txt").write_text("a checkpoint read from object storage\n" * 50)
    (tmp_path / "ft.toml").write_text(
        f'[model]\ninit_from = "{root}/q"\n[data]\nname = "text"\n'
        f'files = "{tmp_path}/docs.txt"\nseq_len = 16\nbatch_size = 2\n'
        'validation_fraction = 0\neos_token = "</s>"\n')
    config = prog.load_config(tmp_path / "ft.toml")
    assert config.model.name == "llama" and config.model.kv_heads == 1
    assert config.data.tokenizer == f"{root}/q/tokenizer.json"  # the URL, as written
    twin = plan.Transformer.of_config(config, "tpu")
    assert (twin.layers, twin.d_model, twin.vocab) == (3, 64, VOCAB)
    from podkit import datasets

    data = datasets.load(config.data, seed=0)  # the text read with the remote tokenizer
    assert data.info["tokenizer"].token_to_id("<pad>") == 1


def test_what_cannot_be_read_names_the_url_and_the_cause(store, tmp_path, request):
    scheme, root = store
    with pytest.raises(InputError, match=f"{root}/none has no config.json"):
        pk.models.from_hf(f"{root}/none")
    hf_model("mistral").save_pretrained(tmp_path / "m", max_shard_size="20KB")
    index = json.loads((tmp_path / "m" / "model.safetensors.index.json").read_text())
    shard = sorted(set(index["weight_map"].values()))[0]
    (tmp_path / "m" / shard).unlink()
    upload(tmp_path / "m", f"{root}/m")
    with pytest.raises(InputError, match=f"names a shard that is not there.*{root}/m/{shard}"):
        pk.models.from_hf(f"{root}/m")
    # Access denied on every read: a StorageError naming the URL and the server's cause.
    fixture, env, (body, content_type) = STORES[scheme]
    proxy = FaultProxy(request.getfixturevalue(fixture), fail=10**6, status=403, body=body,
                       content_type=content_type, when=lambda method, path: method == "GET")
    try:
        with environ(**env(proxy.url)), pytest.raises(StorageError) as e:
            pk.models.from_hf(f"{root}/m")
    finally:
        proxy.close()
    assert f"{root}/m/config.json" in str(e.value)
    assert "AccessDenied" in str(e.value) or "403" in str(e.value)

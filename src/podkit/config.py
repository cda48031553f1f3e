"""The typed config tree of a training job: dataclasses, loaded from TOML, validated on load.

Unknown sections or keys, wrong types and values outside a field's choices are errors that name
the key and the allowed values. `--set section.key=value` overrides use the same checks.
"""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from pathlib import Path
from typing import Any

from podkit.errors import ConfigError


def _choice(default: Any, choices: tuple) -> Any:
    kw = {"default_factory": lambda: list(default)} if isinstance(default, list) else {
        "default": default
    }
    return dataclasses.field(metadata={"choices": choices}, **kw)


@dataclasses.dataclass
class RunConfig:
    """`[run]`: the run's name and directory (`dir/name`), its seed, and `compile_cache`: where
    compiled programs are kept for restarts ("": `dir/name/compile_cache`, or
    $JAX_COMPILATION_CACHE_DIR where that is set; "none": off; a path: a cache several runs or
    jobs share)."""

    name: str = "run"
    dir: str = "runs"
    seed: int = 0
    compile_cache: str = ""


@dataclasses.dataclass
class DataConfig:
    """`[data] name = "digits"`: the bundled UCI digits (8x8 images, 10 classes)."""

    name: str = "digits"
    batch_size: int = 32
    validation_fraction: float = 0.2


@dataclasses.dataclass
class TextDataConfig(DataConfig):
    """`[data] name = "text"`: a language model's token stream, packed into windows of
    `seq_len + 1` tokens (inputs and next-token labels).

    Without `files`: the Python standard library's own source on this machine (`max_bytes`
    of it, files in sorted order), tokenized by a byte-level BPE trained locally. With
    `files` (a glob, or several separated by commas): your documents, read as a stream, as
    `format` says: "text" (a file is a document), "jsonl" (a line is a document, its `field`
    the text), "arrayrecord" (a record is a document's token ids, little-endian int32), or
    "auto" by the file ending. `tokenizer` is "train" (a byte-level BPE of `vocab_size`
    tokens trained on the files) or a Hugging Face tokenizer.json; documents are joined with
    `eos_token` between them. `validation_files` holds validation out by file; else a
    `validation_fraction` of the windows, drawn by the run's seed."""

    name: str = "text"
    batch_size: int = 32
    validation_fraction: float = 0.05
    seq_len: int = 128
    vocab_size: int = 2048
    max_bytes: int = 4_000_000
    files: str = ""
    validation_files: str = ""
    format: str = "auto"
    field: str = "text"
    tokenizer: str = "train"
    eos_token: str = "<|endoftext|>"


@dataclasses.dataclass
class InstructionsDataConfig(DataConfig):
    """`[data] name = "instructions"`: supervised fine-tuning examples, JSONL `files` of
    {"messages": [...]} (rendered by the tokenizer's chat template) or {"prompt", "completion"}
    lines; the loss on the replies only, examples packed into `seq_len` tokens with segment
    ids (`packing`). `tokenizer`: the model's tokenizer.json (a Hugging Face `init_from`
    directory sets it); `chat_template`: a .jinja file (default: tokenizer_config.json's
    beside the tokenizer); `eos_token`: ends a completion (default: tokenizer_config.json's).
    See podkit.datasets.instructions."""

    name: str = "instructions"
    batch_size: int = 8
    validation_fraction: float = 0.05
    seq_len: int = 512
    files: str = ""
    validation_files: str = ""
    tokenizer: str = ""
    chat_template: str = ""
    eos_token: str = ""
    packing: bool = True


@dataclasses.dataclass
class ImagesDataConfig(DataConfig):
    """`[data] name = "images"`: CIFAR-shaped synthetic images (`image_size` square, 3
    channels) with a learnable class signal; for throughput, not accuracy."""

    name: str = "images"
    batch_size: int = 128
    validation_fraction: float = 0.1
    samples: int = 8192
    image_size: int = 32
    classes: int = 10


@dataclasses.dataclass
class CriteoDataConfig(DataConfig):
    """`[data] name = "criteo"`: click logs in the Criteo layout. Generated (`samples` rows):
    dense features, categorical ones with power-law ids (`zipf` exponent) into tables of
    `table_sizes` rows (one per feature; empty: `table_rows` each), up to `multi_hot` ids per
    feature (1: one id each), and a click label that depends on both (learnable). With
    `files`: real logs in Criteo's TSV format (label, 13 integer features, 26 hexadecimal
    categorical values), the values hashed into `table_sizes` tables, or, with no
    `table_sizes`, numbered per feature by the distinct values the files hold (a feature with
    more than `table_rows` of them hashed into `table_rows` rows)."""

    name: str = "criteo"
    batch_size: int = 256
    validation_fraction: float = 0.1
    samples: int = 200_000
    dense_features: int = 13
    sparse_features: int = 26
    table_rows: int = 100_000
    table_sizes: list[int] = dataclasses.field(default_factory=list)
    multi_hot: int = 1
    zipf: float = 1.1
    files: str = ""


IMAGE_DTYPES = ("bfloat16", "float32", "uint8")


@dataclasses.dataclass
class ImageNetTFRecordDataConfig(DataConfig):
    """`[data] name = "imagenet_tfrecord"`: ImageNet-style TFRecord shards (tf.train.Examples
    with `image/encoded` JPEGs and `image/class/label`), decoded and augmented in pk.data's
    workers (podkit/datasets/imagenet_tfrecord.py). `files` (a glob, or several separated by
    commas, local or gs:// / s3://) and optional `validation_files`; or `generate` synthetic
    images (`min_side`-`max_side` px, `classes` classes) written once into the cache as
    `shards` files, with `validation_fraction` x generate more for validation. Images come
    out `image_size` square, normalised, as `image_dtype` ("uint8": the pixels as decoded,
    normalised by the model on the device: half a bfloat16 batch's bytes to the device and
    no normalising on the host); labels are `image/class/label`
    minus `label_offset` (1: ImageNet's conversion writes 1..1000). `scaled_decode`: crops
    twice the output size or more are decoded at 1/2-1/8 scale by libjpeg-turbo. `parallel`:
    the images are computed in pk.data's worker "processes" (random access: each process of
    a multi-host job computes only its share) or on "threads" of the training process (one
    per core; no hand-off between processes)."""

    name: str = "imagenet_tfrecord"
    batch_size: int = 128
    validation_fraction: float = 0.0
    files: str = ""
    validation_files: str = ""
    generate: int = 0
    shards: int = 16
    classes: int = 1000
    label_offset: int = 1
    image_size: int = 224
    image_dtype: str = _choice("bfloat16", IMAGE_DTYPES)
    scaled_decode: bool = True
    parallel: str = _choice("processes", ("processes", "threads"))
    min_side: int = 200
    max_side: int = 500


@dataclasses.dataclass
class ModelConfig:
    """`[model] name = "mlp"`: Dense layers (the seed model)."""

    name: str = "mlp"
    hidden: list[int] = dataclasses.field(default_factory=lambda: [128])
    activation: str = "relu"
    dropout: float = 0.0
    outputs: int = 10
    output_activation: str = "softmax"


PRECISIONS = ("float32", "mixed_bfloat16")
REMAT_POLICIES = ("none", "full", "dots_saveable", "nothing_saveable")
# podkit.kernels.attention: "auto" is splash on a TPU and XLA elsewhere.
ATTENTION_IMPLEMENTATIONS = ("auto", "xla", "splash")
# MaxText's presets, by the names the GPT's block gives its matmul outputs (models/common.py).
GPT_REMAT_POLICIES = (*REMAT_POLICIES, "minimal", "save_qkv_proj")


@dataclasses.dataclass
class GPTConfig:
    """`[model] name = "gpt"`: a GPT-style decoder (pre-norm blocks, causal attention, learned
    positions). Vocabulary and context length come from the data.

    `context`: the learned position table's rows (a Hugging Face GPT-2's n_positions, which
    `init_from` sets); sequences of up to `context` tokens fit, the data's seq_len or fewer
    are trained on (0: the data's seq_len). `scale_attn`, `scale_attn_by_layer`: GPT-2's
    scale_attn_weights and scale_attn_by_inverse_layer_idx. `dropout`: on the embeddings and
    each residual branch (GPT-2's embd_pdrop and resid_pdrop), `attn_dropout` on the attention
    probabilities (its attn_pdrop: those are then computed by XLA, not splash), in training.
    `attention` picks the attention kernel: "auto" (splash on a TPU, XLA elsewhere), "xla" or
    "splash" (podkit.kernels.attention). `scan_layers`: the blocks' parameters stacked on a
    leading `layers` axis and run under one `nnx.scan` (one block compiled, not `layers`);
    false: a Python loop over separate blocks. `remat`: what the backward pass recomputes, per
    block (docs/sharding.md). `vocab_chunk`: the training loss reads the vocabulary this many
    entries at a time, so the (batch, time, vocab) logits never exist (0: whole logits).
    `vocab_multiple`: the token table's rows and the output layer's columns are padded to a
    multiple of it (the MXU's 128; under tensor parallelism a multiple of the model axis too,
    e.g. 1536 for model = 12); the padded ids are no tokens: their logits are cut off, never
    predicted (1: no padding)."""

    name: str = "gpt"
    layers: int = 4
    heads: int = 4
    embed: int = 128
    mlp: int = 512
    # Attention scores divided by sqrt(head_dim) (GPT-2's scale_attn_weights), and further by
    # the block's index + 1 (its scale_attn_by_inverse_layer_idx, Mistral's GPT-2 runs).
    scale_attn: bool = True
    scale_attn_by_layer: bool = False
    context: int = 0  # rows of the learned position table (GPT-2's n_positions); 0: seq_len
    dropout: float = 0.0
    attn_dropout: float = 0.0  # on the attention probabilities (GPT-2's attn_pdrop)
    attention: str = _choice("auto", ATTENTION_IMPLEMENTATIONS)
    precision: str = _choice("float32", PRECISIONS)
    remat: str = _choice("none", GPT_REMAT_POLICIES)
    scan_layers: bool = True
    vocab_chunk: int = 4096
    vocab_multiple: int = 128  # the token table and output layer padded to a multiple of this
    sample_tokens: int = 200  # generated after training (0: none)
    init_from: str = ""  # a podkit run or a Hugging Face directory to start from (see cli)


ROPE_SCALINGS = ("none", "llama3")


@dataclasses.dataclass
class LlamaConfig:
    """`[model] name = "llama"`: the Llama family of decoders (Llama 2/3, Mistral, Qwen2/3):
    pre-norm blocks of RMSNorm, causal attention with rotary positions (RoPE) and grouped-query
    heads, and a SwiGLU MLP. Vocabulary and context length come from the data.

    `context`: the context the model is made for (a Hugging Face model's
    max_position_embeddings, which `init_from` sets; RoPE has no table of positions, so it is
    what an export records; 0: the data's seq_len).
    `heads` query heads of `head_dim` dims (0: embed / heads), `kv_heads` key/value heads
    (0: as many as `heads`; 1: multi-query attention; a divisor of `heads`: grouped-query).
    `mlp`: the SwiGLU's hidden width. `rope_theta`: RoPE's base; `rope_scaling = "llama3"`
    with `rope_factor`, `rope_low_freq_factor`, `rope_high_freq_factor` and
    `rope_original_context`: Llama 3.1's frequency scaling. `norm_eps`: RMSNorm's epsilon.
    `tie_embeddings`: the output layer is the token table. `qkv_bias`: biases on the q, k, v
    projections (Qwen2). `qk_norm`: RMSNorm of each head's q and k before RoPE (Qwen3).
    `attention`, `precision`, `remat`, `scan_layers`, `vocab_chunk`, `vocab_multiple`,
    `sample_tokens`: as the GPT's. `lora_rank` > 0: LoRA, low-rank adapters (rank r, scaled
    by `lora_alpha` / r) on the projections `lora_targets` names (q, k, v, o, gate, up,
    down; or transformers' q_proj, ...); then only the adapters train and hold optimizer
    state."""

    name: str = "llama"
    layers: int = 4
    heads: int = 4
    kv_heads: int = 0
    head_dim: int = 0
    embed: int = 128
    mlp: int = 344
    context: int = 0  # the context it is made for (max_position_embeddings); 0: seq_len
    rope_theta: float = 10000.0
    rope_scaling: str = _choice("none", ROPE_SCALINGS)
    rope_factor: float = 8.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_context: int = 8192
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    attention: str = _choice("auto", ATTENTION_IMPLEMENTATIONS)
    precision: str = _choice("float32", PRECISIONS)
    remat: str = _choice("none", GPT_REMAT_POLICIES)
    scan_layers: bool = True
    vocab_chunk: int = 4096
    vocab_multiple: int = 128  # the token table and output layer padded to a multiple of this
    sample_tokens: int = 200  # generated after training (0: none)
    init_from: str = ""  # a podkit run or a Hugging Face directory to start from (see cli)
    lora_rank: int = 0  # 0: no adapters, every parameter trains
    lora_alpha: float = 16.0
    lora_targets: list[str] = dataclasses.field(default_factory=lambda: ["q", "v"])


@dataclasses.dataclass
class ResNetConfig:
    """`[model] name = "resnet"`: ResNet-18/34 (basic blocks) or 50 (bottlenecks), with
    `width` channels in the first stage; classes and image shape come from the data."""

    name: str = "resnet"
    depth: int = _choice(18, (18, 34, 50))
    width: int = 64
    precision: str = _choice("float32", PRECISIONS)
    remat: str = _choice("none", REMAT_POLICIES)


@dataclasses.dataclass
class DLRMConfig:
    """`[model] name = "dlrm"`: a CTR model: dense features through the `bottom` MLP, one
    embedding table per categorical feature (`sharded` splits rows over the mesh and updates
    only the rows a batch looks up; `sparse_updates = false` updates them densely), pairwise
    dot-product interactions, the `top` MLP to one click logit."""

    name: str = "dlrm"
    embed_dim: int = 16
    bottom: list[int] = dataclasses.field(default_factory=lambda: [64, 16])
    top: list[int] = dataclasses.field(default_factory=lambda: [64, 32])
    sharded: bool = True
    sparse_updates: bool = True
    pooling: str = "sum"  # a multi-hot feature's rows: "sum" or "mean"


# The section class for each `name`: a key of one model is an error under another.
MODEL_CONFIGS: dict[str, type] = {"mlp": ModelConfig, "gpt": GPTConfig,
                                  "llama": LlamaConfig, "resnet": ResNetConfig,
                                  "dlrm": DLRMConfig}
DATA_CONFIGS: dict[str, type] = {"digits": DataConfig, "text": TextDataConfig,
                                 "instructions": InstructionsDataConfig,
                                 "images": ImagesDataConfig, "criteo": CriteoDataConfig,
                                 "imagenet_tfrecord": ImageNetTFRecordDataConfig}


SCHEDULES = ("auto", "constant", "cosine", "linear")
TEXT_FORMATS = ("auto", "text", "jsonl", "arrayrecord")


@dataclasses.dataclass
class TrainConfig:
    """`[train]`. Length: `steps` optimizer steps over the data as one stream (it reshuffles
    when a pass ends, never restarts mid-way), or `epochs` passes when steps = 0. Validation
    every `eval_every` steps (0: after each pass) on `eval_steps` batches (0: all). The
    learning rate: `schedule` "constant", "cosine" or "linear" decay to `alpha` x
    learning_rate over the run's real length, after `warmup_steps` of linear warmup ("auto":
    cosine when warmup_steps > 0, else constant)."""

    epochs: int = 10
    optimizer: str = "adam"
    learning_rate: float = 1e-3
    schedule: str = _choice("auto", SCHEDULES)
    alpha: float = 0.1  # the final learning rate as a fraction of learning_rate (Keras's)
    adam_beta1: float = 0.9  # Adam-family optimizers (adam, adamw, nadam, adamax, lamb)
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-7
    # adam/adamw: "keras" (epsilon added before the bias correction, Keras's Adam) or
    # "pytorch" (after it, as torch.optim.AdamW, optax.adamw and MaxText)
    adam_epsilon_placement: str = _choice("keras", ("keras", "pytorch"))
    eval_every: int = 0  # > 0: validate every this many steps (0: after each pass)
    eval_steps: int = 0  # > 0: validate on this many batches (0: the whole split)
    loss: str = "sparse_categorical_crossentropy"
    from_logits: bool = False  # the model's last layer gives logits (output_activation linear)
    metrics: list[str] = dataclasses.field(default_factory=lambda: ["accuracy"])
    steps_per_execution: int = 1
    log_every: int = 10
    verbose: int = 1
    steps: int = 0  # > 0: train this many optimizer steps (epochs is then ignored)
    microbatches: int = 1  # gradient accumulation: each batch in this many sequential parts
    # Left out: the optimizer's own default (Keras's: no clipping; AdamW's decay 0.004).
    global_clipnorm: float | None = None  # > 0: clip the global gradient norm to this
    weight_decay: float | None = None  # Keras's `var -= var * weight_decay * lr` each step
    warmup_steps: int = 0  # > 0: linear warmup from 0 to learning_rate, then the schedule
    watchdog_s: float = 600.0  # no step for this long: every thread's stack to the run dir
    recompile_warning_after: int = 5  # a warning listing the recompiles after this many
    strict_recompiles: bool = False  # any recompile of a step is an error


STRATEGY_KINDS = ("data_parallel", "fsdp", "tensor_parallel", "custom")


@dataclasses.dataclass
class StrategyConfig:
    """`[strategy]`: `kind` picks the rule table; `mesh` sizes the axes (-1 fills; the default
    for each kind when empty); `rules` (custom only) maps logical axes to mesh axes, e.g.
    `[["embed", "fsdp"], ["mlp", "model"]]`. `slices` > 1: that many TPU slices joined by the
    data-center network, data parallel across them on a `dcn` mesh axis (outermost; the
    other axes lie inside each slice; MaxText's `dcn_data_parallelism`)."""

    kind: str = _choice("data_parallel", STRATEGY_KINDS)
    mesh: dict[str, int] = dataclasses.field(default_factory=dict)
    rules: list[list[Any]] = dataclasses.field(default_factory=list)
    slices: int = 1


@dataclasses.dataclass
class CheckpointConfig:
    """`[checkpoint]`: where and when the run saves. The run resumes from the newest valid
    checkpoint in `dir` (default RUN_DIR/checkpoints), else from --resume, else starts fresh.
    0 means "not by this criterion"; with neither every_* set, a save ends every epoch.
    `local_every_steps` > 0: also a local tier, saved that often to each process's own disk
    (`local_dir`, default under the temp dir) and copied to a peer process, `local_keep`
    steps kept; a restart takes the newer of the two tiers (docs/checkpoints.md)."""

    enabled: bool = True
    dir: str = ""
    every_steps: int = 0
    every_seconds: float = 0.0
    keep: int = 3
    keep_every: int = 0
    async_save: bool = True
    on_nan: str = _choice("stop", ("none", "stop", "rollback"))
    local_every_steps: int = 0
    local_dir: str = ""
    local_keep: int = 2


@dataclasses.dataclass
class Config:
    run: RunConfig = dataclasses.field(default_factory=RunConfig)
    data: Any = dataclasses.field(default_factory=DataConfig)  # one of DATA_CONFIGS
    model: Any = dataclasses.field(default_factory=ModelConfig)  # one of MODEL_CONFIGS
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    strategy: StrategyConfig = dataclasses.field(default_factory=StrategyConfig)
    checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)


def _check_value(where: str, value: Any, hint: Any) -> Any:
    origin = typing.get_origin(hint)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint in (int, float, str, bool):
        if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
            raise ConfigError(
                f"{where} = {value!r} should be of type {hint.__name__}, not "
                f"{type(value).__name__}."
            )
        return value
    if origin is list:
        (item,) = typing.get_args(hint)
        if not isinstance(value, list):
            raise ConfigError(f"{where} = {value!r} should be a list of {item.__name__}.")
        return [_check_value(f"{where}[{i}]", v, item) for i, v in enumerate(value)]
    if origin is dict:
        _, item = typing.get_args(hint)
        if not isinstance(value, dict):
            raise ConfigError(f"{where} = {value!r} should be a table of {item.__name__}.")
        return {k: _check_value(f"{where}.{k}", v, item) for k, v in value.items()}
    if origin in (types.UnionType, typing.Union):
        # `X | None`: a key left out is None (TOML has no null), a key written is an X
        kinds = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(kinds) == 1 and len(typing.get_args(hint)) == 2:
            return _check_value(where, value, kinds[0])
        raise ConfigError(f"{where}: unsupported config type {hint}.")
    return value


# Keys other frameworks use for what a podkit key holds (MaxText, torchtitan, Keras).
FRACTION = ", the final rate as a fraction of learning_rate"
RENAMED = {"end_learning_rate": ("alpha", FRACTION), "lr_min": ("alpha", FRACTION),
           "min_lr": ("alpha", FRACTION), "lr": ("learning_rate", ""),
           "warmup": ("warmup_steps", ""), "max_steps": ("steps", ""),
           "eval_interval": ("eval_every", ""), "eval_frequency": ("eval_every", ""),
           "global_batch_size": ("batch_size", ""), "max_target_length": ("seq_len", ""),
           "seq_length": ("seq_len", "")}


def _build(cls: type, table: dict, where: str) -> Any:
    if not isinstance(table, dict):
        raise ConfigError(f"[{where}] should be a table, got {table!r}.")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in table.items():
        if key not in fields:
            scope = f" in [{where}]" if where else ""
            renamed = RENAMED.get(key, ("", ""))
            said = f" (podkit's key for it: {renamed[0]!r}{renamed[1]})" \
                if renamed[0] in fields else ""
            raise ConfigError(
                f"unknown key {key!r}{scope}{said}; allowed keys{scope}: {', '.join(fields)}."
            )
        hint = hints[key]
        name = f"{where}.{key}" if where else key
        if cls is Config and key in _BY_NAME:
            hint = _section_class(key, value)
        if dataclasses.is_dataclass(hint):
            kwargs[key] = _build(hint, value, name)
            continue
        value = _check_value(name, value, hint)
        choices = fields[key].metadata.get("choices")
        if choices and value not in choices:
            allowed = ", ".join(map(str, choices))
            raise ConfigError(f"{name} = {value!r}; allowed values: {allowed}.")
        kwargs[key] = value
    return cls(**kwargs)


_BY_NAME = {"model": MODEL_CONFIGS, "data": DATA_CONFIGS}


def _init_from_family(directory: str) -> str:
    """`[model] init_from = DIR` without a name: "gpt" for a GPT-2 directory (config.json's
    model_type), else "llama" (a podkit run directory says its own name in config.toml)."""
    import json
    import tomllib

    from podkit import paths  # local, gs:// or s3://
    from podkit.errors import StorageError

    def unreadable(e: Exception) -> bool:  # a denied or failing store is its own error
        return isinstance(e, StorageError) and not e.missing

    try:
        with paths.open(paths.join(directory, "config.toml"), "rb") as f:  # a podkit run
            return str(tomllib.load(f).get("model", {}).get("name", "llama"))
    except (OSError, StorageError, ConfigError, tomllib.TOMLDecodeError) as e:
        if unreadable(e):
            raise
    try:
        with paths.open(paths.join(directory, "config.json")) as f:
            kind = json.load(f).get("model_type")
    except (OSError, StorageError, ConfigError, ValueError, AttributeError) as e:
        if unreadable(e):
            raise
        return "llama"
    return "gpt" if kind == "gpt2" else "llama"


def _section_class(section: str, table: Any) -> type:
    """The dataclass of a `[model]` or `[data]` section, chosen by its `name`."""
    classes = _BY_NAME[section]
    name = table.get("name", next(iter(classes))) if isinstance(table, dict) else None
    if section == "model" and isinstance(table, dict) and "name" not in table \
            and isinstance(table.get("init_from"), str):
        name = _init_from_family(table["init_from"])
    if name not in classes:
        raise ConfigError(f"{section}.name = {name!r}; allowed values: {', '.join(classes)}.")
    return classes[name]


def from_dict(table: dict) -> Config:
    config = _build(Config, table, "")
    validate(config)
    return config


_MAY_BE_ZERO = {"sample_tokens", "vocab_chunk", "lora_rank", "generate", "label_offset",
                "head_dim", "kv_heads",  # the Llama's 0: embed / heads, as many as heads
                "context"}  # the decoders' 0: the data's seq_len


def _check_sizes(section: str, table: Any) -> None:
    """Every int (and list of ints) in a model or data section is a size: >= 1."""
    for f in dataclasses.fields(table):
        value = getattr(table, f.name)
        values = value if isinstance(value, list) else [value]
        for v in values:
            if isinstance(v, int) and not isinstance(v, bool) and f.name not in _MAY_BE_ZERO \
                    and v < 1:
                raise ConfigError(f"{section}.{f.name} = {value}; it must be >= 1.")
            if isinstance(v, int) and v < 0:
                raise ConfigError(f"{section}.{f.name} = {value}; it must be >= 0.")


def validate(config: Config) -> None:
    """Checks that span fields or need ranges; types were checked on load."""
    _check_sizes("data", config.data)
    _check_sizes("model", config.model)
    t = config.train
    positive = {
        "train.epochs": t.epochs,
        "train.steps_per_execution": t.steps_per_execution,
        "train.log_every": t.log_every,
        "train.microbatches": t.microbatches,
    }
    for name, value in positive.items():
        if value < 1:
            raise ConfigError(f"{name} = {value}; it must be >= 1.")
    for name in ("steps", "global_clipnorm", "weight_decay", "warmup_steps", "watchdog_s",
                 "recompile_warning_after", "eval_every", "eval_steps"):
        if getattr(t, name) is not None and getattr(t, name) < 0:
            zero = "the whole split" if name == "eval_steps" else "off"
            raise ConfigError(f"train.{name} = {getattr(t, name)}; use 0 ({zero}) or more.")
    if t.schedule == "constant" and t.alpha != TrainConfig.alpha:
        raise ConfigError(f"train.alpha = {t.alpha} is the final rate of a decaying schedule; "
                          "train.schedule = \"constant\" does not decay. Set train.schedule = "
                          "\"cosine\" or \"linear\", or drop train.alpha.")
    k = t.steps_per_execution
    for name in ("steps", "eval_every"):
        if getattr(t, name) % k:
            raise ConfigError(f"train.{name} = {getattr(t, name)} is not a multiple of "
                              f"train.steps_per_execution = {k} (a call runs {k} steps); use "
                              f"{max(getattr(t, name) // k, 1) * k}.")
    if not 0.0 <= t.alpha <= 1.0:
        raise ConfigError(f"train.alpha = {t.alpha}: the final learning rate as a fraction of "
                          "train.learning_rate; use a number in [0, 1].")
    for name in ("adam_beta1", "adam_beta2"):
        if not 0.0 <= getattr(t, name) < 1.0:
            raise ConfigError(f"train.{name} = {getattr(t, name)}; use a number in [0, 1).")
    if t.adam_epsilon <= 0:
        raise ConfigError(f"train.adam_epsilon = {t.adam_epsilon}; must be > 0.")
    if config.data.batch_size % t.microbatches:
        raise ConfigError(f"data.batch_size = {config.data.batch_size} does not split into "
                          f"train.microbatches = {t.microbatches} equal parts; make the batch "
                          "size a multiple of it.")
    if not 0.0 <= config.data.validation_fraction < 1.0:
        raise ConfigError(
            f"data.validation_fraction = {config.data.validation_fraction}; use [0, 1)."
        )
    fmt = getattr(config.data, "format", "auto")
    if fmt not in TEXT_FORMATS:
        raise ConfigError(f"data.format = {fmt!r}; valid: {', '.join(TEXT_FORMATS)}.")
    dropout = getattr(config.model, "dropout", 0.0)
    if not 0.0 <= dropout < 1.0:
        raise ConfigError(f"model.dropout = {dropout}; use [0, 1).")
    if config.strategy.rules and config.strategy.kind != "custom":
        raise ConfigError(f"strategy.rules is set but strategy.kind = "
                          f"{config.strategy.kind!r}; rules apply to kind = \"custom\" (the "
                          "other kinds have their own).")
    c = config.checkpoint
    for name, value in (("every_steps", c.every_steps), ("every_seconds", c.every_seconds),
                        ("keep_every", c.keep_every), ("local_every_steps", c.local_every_steps)):
        if value < 0:
            raise ConfigError(f"checkpoint.{name} = {value}; use 0 (off) or a positive value.")
    if c.keep < 1:
        raise ConfigError(f"checkpoint.keep = {c.keep}; keep at least 1 checkpoint.")
    if c.local_keep < 1:
        raise ConfigError(f"checkpoint.local_keep = {c.local_keep}; keep at least 1 local "
                          "checkpoint.")
    if "://" in c.local_dir:
        raise ConfigError(f"checkpoint.local_dir = {c.local_dir!r}: the local tier is a "
                          "directory on each machine (e.g. /tmp/... or /dev/shm/...); URLs are "
                          "for checkpoint.dir, the persistent tier.")
    if c.on_nan == "rollback" and not c.enabled:
        raise ConfigError("checkpoint.on_nan = 'rollback' needs checkpoint.enabled = true.")
    if t.learning_rate <= 0:
        raise ConfigError(f"train.learning_rate = {t.learning_rate}; must be > 0.")


def parse_override(text: str) -> tuple[list[str], Any]:
    """'section.key=value' -> (['section', 'key'], value); value is read as TOML when it can be
    (numbers, booleans, lists, quoted strings), else as a bare string."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r} is not section.key=value; e.g. --set train.epochs=3.")
    path, raw = text.split("=", 1)
    keys = [k.strip() for k in path.split(".")]
    if not all(keys):
        raise ConfigError(f"--set {text!r}: the key {path!r} has an empty part.")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return keys, value


def load(path: str | Path, overrides: list[str] = (), init_from: str | None = None) -> Config:
    """Read a TOML config, apply `section.key=value` overrides, validate. `init_from`: the
    run starts from that directory (`--init-from`): a `[model]` without a name is its
    family's, as with `[model] init_from`."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist; pass a TOML file path.")
    try:
        table = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path} is not valid TOML: {e}.") from None
    for text in overrides:
        keys, value = parse_override(text)
        node = table
        for key in keys[:-1]:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {text!r}: {key!r} is a value, not a section.")
        node[keys[-1]] = value
    model = table.get("model")
    if init_from and (model is None or isinstance(model, dict) and "name" not in model):
        table.setdefault("model", {})["name"] = _init_from_family(init_from)
    return from_dict(table)


def to_toml(config: Config) -> str:
    """The resolved config as TOML (what the run dir keeps)."""
    lines = []
    for section in dataclasses.fields(config):
        lines.append(f"[{section.name}]")
        for key, value in dataclasses.asdict(getattr(config, section.name)).items():
            if value is not None:  # None: a key left out (its default is the optimizer's)
                lines.append(f"{key} = {toml_value(value)}")
        lines.append("")
    return "\n".join(lines)


def toml_value(value: Any) -> str:
    """`value` as TOML writes it (what --set takes)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise ConfigError(f"cannot write {value!r} as TOML.")

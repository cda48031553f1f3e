"""Models by name (`[model] name = "mlp"` in a config) and Keras's `load_model`.

Each builder takes `(model config, data info, seed)` and returns an uncompiled pk.Model sized
by the data (classes, vocabulary, table rows come from `info`).
"""

from __future__ import annotations

import importlib
from typing import Any

from podkit.errors import ConfigError

# name -> (module, builder); modules load on use (the GPT's imports cost nothing to an MLP).
REGISTRY: dict[str, tuple[str, str]] = {
    "mlp": ("podkit.models.mlp", "build_mlp"),
    "gpt": ("podkit.models.gpt", "build_gpt"),
    "llama": ("podkit.models.llama", "build_llama"),
    "resnet": ("podkit.models.resnet", "build_resnet"),
    "dlrm": ("podkit.models.dlrm", "build_dlrm"),
}

__all__ = ["REGISTRY", "build_model", "from_hf", "from_run", "load_model", "save_hf"]


def build_model(config: Any, info: dict, seed: int = 0) -> Any:
    """The model a `[model]` section names, sized by the data's `info`."""
    if config.name not in REGISTRY:
        raise ConfigError(f"model.name = {config.name!r}; valid names: {', '.join(REGISTRY)}.")
    module, builder = REGISTRY[config.name]
    return getattr(importlib.import_module(module), builder)(config, info, seed=seed)


def from_run(run_dir: Any, step: int | None = None, compile: bool = True) -> Any:
    """The model a `podkit train` run directory holds: built as its config.toml says (GPT,
    ResNet, DLRM and MLP runs alike), compiled as its [train] says, with the weights of its
    newest committed checkpoint step (or `step`), on the current strategy or the run's own
    [strategy] over the devices there are now (any device count). Compiled, it has the
    step's optimizer state and step count too; `compile=False`: the weights only, for
    predict()."""
    from podkit import runs
    from podkit.strategy import scoped_strategy

    checkpoints = runs.checkpoint_dir(run_dir)
    config = runs.read_config(run_dir)
    info = runs.data_info(run_dir, config)
    strategy = scoped_strategy()
    with strategy.scope() if strategy is not None else runs.default_scope(config):
        model = build_model(config.model, info, seed=config.run.seed)
        if compile:
            runs.compile_from_config(model, config.train, info.get("total_steps"),
                                     info.get("ignore_class"))
    if compile:  # the optimizer state and step count too: fit() continues from there
        from podkit.saving import load_training_state

        load_training_state(model, checkpoints, step)
    else:
        model.load_weights(checkpoints, step=step)
    return model


def from_hf(directory: Any, seq_len: int | None = None, seed: int = 0) -> Any:
    """The model a Hugging Face directory (local, gs:// or s3://) holds (config.json,
    model.safetensors or a sharded index, tokenizer.json): Llama, Mistral, Qwen2, Qwen3
    (podkit.models.llama) and GPT-2 (podkit.models.gpt), built on the current strategy with
    the checkpoint's weights streamed to their shardings; `model.tokenizer` is
    tokenizer.json's (None without one).
    See podkit.models.hf."""
    from podkit.models import hf

    return hf.from_hf(directory, seq_len=seq_len, seed=seed)


def save_hf(model: Any, directory: Any, tokenizer: Any = None, eos_token: str | None = None,
            dtype: str | None = None, max_shard_bytes: int | None = None,
            chat_template: str | None = None, bos_token: str | None = None,
            source: Any = None) -> str:
    """A Llama-family or GPT model as a Hugging Face directory (local, gs:// or s3://) that
    transformers' `AutoModelForCausalLM.from_pretrained` loads with the same logits (the GPT
    as GPT-2; LoRA adapters merged), keeping the source directory's tokenizer settings,
    context and dtype (`source`: default the one from_hf read). `chat_template` (a Jinja
    source) and `bos_token` go into tokenizer_config.json; `dtype` "float32", "bfloat16" or
    "float16" (default: the source's, else float32). See podkit.models.hf.save_hf."""
    from podkit.models import hf

    return hf.save_hf(model, directory, tokenizer=tokenizer, eos_token=eos_token, dtype=dtype,
                      max_shard_bytes=max_shard_bytes, chat_template=chat_template,
                      bos_token=bos_token, source=source)


def _from_config(config: dict) -> Any:
    """A Sequential or functional model from `{"class_name", "config"}`."""
    from podkit.model import Model
    from podkit.sequential import Sequential

    kind = Sequential if config.get("class_name") == "Sequential" else Model
    return kind.from_config(config)


def load_model(path: Any, compile: bool = True,  # Keras's name and arguments
               custom_objects: dict[str, Any] | None = None, safe_mode: bool = True) -> Any:
    """The model saved by `model.save(path)`, on the current strategy and devices; a Keras 3
    `.keras` file or a tf.keras `.h5` model file too (by suffix, as Keras dispatches), with
    `custom_objects` naming the user's registered classes. `safe_mode` is Keras's argument:
    podkit never runs code from a file, whatever its value."""
    del safe_mode
    from podkit import interop
    from podkit import model as _model  # noqa: F401 (Model and Sequential register the
    from podkit import sequential as _sequential  # noqa: F401 from_config a Keras file uses)
    if interop.suffix_format(path) is not None:
        return interop.load_model(path, compile=compile, custom_objects=custom_objects)
    from podkit.saving import load_model as load

    return load(path, _from_config, compile=compile)


def model_from_json(json_string: str) -> Any:  # Keras's name
    """A new (uncompiled) model from `model.to_json()`: the architecture, fresh weights."""
    import json

    try:
        config = json.loads(json_string)
    except (TypeError, json.JSONDecodeError) as e:
        raise ConfigError(f"model_from_json takes what model.to_json() returned; this is not "
                          f"JSON ({e}).") from None
    if not isinstance(config, dict) or "class_name" not in config:
        raise ConfigError("model_from_json takes what model.to_json() returned: a JSON object "
                          "with class_name and config.")
    return _from_config(config)


def clone_model(model: Any) -> Any:  # Keras's name
    """A new model of the same architecture with fresh weights and new layers (Keras's
    clone_model): Sequential and functional models from their config; a subclass through
    its get_config()/from_config."""
    from podkit.model import Model

    if not isinstance(model, Model):
        raise ConfigError(f"clone_model takes a pk.Model; got {type(model).__name__}.")
    if model.kind in ("Sequential", "Functional"):
        return _from_config({"class_name": model.kind, "config": model.get_config()})
    return type(model).from_config(model.get_config())

"""The `podkit` command.

    podkit train CONFIG.toml [--set section.key=value ...] [--cpu-devices N] [--resume PATH]
                 [--init-from RUN_OR_CHECKPOINT]
    podkit compile-report CONFIG.toml [--cpu-devices N] [--json]   what XLA did to the step
    podkit report RUN_DIR [--out FILE]        RUN_DIR/report.html: curves, time, memory
    podkit doctor RUN_DIR                     what held the run back, with advice
    podkit eval RUN_DIR [--step N] [--split S]  loss, metrics (perplexity) of a run's model
    podkit generate RUN_DIR --prompt TEXT | --prompt-ids IDS [--max-tokens N --temperature T
                    --top-k K]                  (--temperature 0: greedy)
    podkit export RUN_DIR [--format safetensors|npz|hf] [--out PATH] [--dtype D]   named
                    tensors, or a Hugging Face directory (D: bfloat16, float16, float32)
    podkit checkpoint ls RUN_DIR              steps and their state (valid/incomplete/corrupt)
    podkit checkpoint digest RUN_DIR [--step N]   one content hash (the last line)
    podkit launch --processes N [...] -- COMMAND...   a supervised multi-process job
    podkit submit slurm CONFIG --nodes N [...]        a SLURM batch job that requeues itself
    podkit submit k8s CONFIG --image I --tpu v5p-2x2x4   a JobSet for TPU slices
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from podkit.errors import PodkitError
from podkit.monitor.run_dir import RunDir, check_run_dir, local_run_dir


def _build(args: argparse.Namespace, quiet: bool = False, cache: bool = False,
           elastic: bool = False) -> tuple:
    """(config, cluster, data, strategy, model) of a config, the model compiled as [train]
    says. Imports wait until the flags are read: connect() must run before JAX starts.
    `cache`: keep compiled programs in the run's compilation cache (`[run] compile_cache`),
    set before anything compiles. `elastic`: on fewer processes than the launch's full count,
    the microbatches that keep the global batch and each device's part of it
    (podkit.elastic; the plan is `args.elastic_plan`)."""
    from podkit import config as config_lib
    from podkit.cluster import connect

    config = config_lib.load(args.config, args.set or [],
                             init_from=getattr(args, "init_from", None))
    hf_vocab = None
    if hasattr(args, "init_from"):
        # --init-from, or [model] init_from: a podkit run or a Hugging Face directory. The
        # key starts the run and is then part of its config: its resumes resume.
        args.init_from_key = not args.init_from and bool(getattr(config.model, "init_from", ""))
        args.init_from = args.init_from or getattr(config.model, "init_from", "") or None
    if getattr(args, "init_from", None):
        from podkit import paths
        from podkit.errors import ConfigError
        from podkit.models import hf

        if not paths.is_url(args.init_from) and not Path(args.init_from).exists():
            where = "[model] init_from" if args.init_from_key else "--init-from"
            raise ConfigError(f"{where} = {args.init_from!r}: no such directory (relative "
                              f"paths are from the current directory, {Path.cwd()}); give a "
                              "podkit run, a checkpoint or a Hugging Face model directory.")
        if hf.is_directory(args.init_from):
            config, hf_vocab = hf.run_config(config, args.init_from,
                                             written=_model_keys_written(args))
        else:
            config = _source_tokenizer(config, args.init_from)
    cluster = connect(cpu_devices=args.cpu_devices)
    if cache and config.run.compile_cache != "none":
        from podkit import compile_cache, paths

        where = paths.join(config.run.dir, config.run.name)
        default = paths.join(where, "compile_cache")  # in a bucket: kept in a local copy
        # JAX's own variable, where the user (or a test suite) set it, is a directory they
        # chose: it wins over the run's default, not over a compile_cache they wrote.
        default = os.environ.get("JAX_COMPILATION_CACHE_DIR") or default
        compile_cache.enable(config.run.compile_cache or default)

    from podkit import datasets, runs
    from podkit.models import build_model

    if cluster.process_index == 0 and not quiet:
        print(cluster)
    data = datasets.load(config.data, seed=config.run.seed)
    strategy = runs.strategy_from_config(config.strategy)
    if elastic:
        config = _elastic(args, config, strategy, cluster, quiet)
    # The schedule spans the run's real length: train.steps, or epochs of the data.
    length = runs.run_length(config.train, data.train_rows(), config.data.batch_size,
                             endless=data.streamed)
    if hf_vocab is not None:  # the embedding table is the checkpoint's, the tokenizer's ids in it
        if data.info["vocab_size"] > hf_vocab:
            from podkit.errors import ConfigError

            raise ConfigError(f"the tokenizer holds {data.info['vocab_size']} ids, past the "
                              f"{hf_vocab} rows of {args.init_from}'s embeddings.")
        data.info["vocab_size"] = hf_vocab
    with strategy.scope():
        model = build_model(config.model, data.info, seed=config.run.seed)
        runs.compile_from_config(model, config.train, total_steps=length.total,
                                 ignore_class=data.info.get("ignore_class"))
    return config, cluster, data, strategy, model


def _elastic(args: argparse.Namespace, config: object, strategy: object, cluster: object,
             quiet: bool) -> object:
    """The config with the microbatches podkit.elastic chooses for this start (logged on a
    shrunk start; the plan kept in `args.elastic_plan` for the run's records)."""
    import dataclasses

    from podkit import elastic

    t = config.train
    plan = elastic.plan(config.data.batch_size, t.microbatches, strategy.data_parallel_size,
                        cluster.process_count, elastic.full_processes(cluster.process_count))
    args.elastic_plan = plan if plan.shrunk else None
    if plan.shrunk and cluster.process_index == 0 and not quiet:
        print(f"podkit: {plan.note()}", flush=True)
    if plan.chosen == t.microbatches:
        return config
    return dataclasses.replace(config, train=dataclasses.replace(t, microbatches=plan.chosen))


def _model_keys_written(args: argparse.Namespace) -> set[str]:
    """The [model] keys the config file and --set name: a value written is the value used,
    and one not written leaves a Hugging Face config.json's (its dropout rates)."""
    import tomllib

    from podkit import config as config_lib

    with open(args.config, "rb") as f:
        model = tomllib.load(f).get("model", {})
    written = set(model) if isinstance(model, dict) else set()
    for text in args.set or []:
        keys, _ = config_lib.parse_override(text)
        if len(keys) == 2 and keys[0] == "model":
            written.add(keys[1])
    return written


def _source_tokenizer(config: object, source: str) -> object:
    """A run started --init-from another run reads its text with that run's tokenizer: a BPE
    trained again (data.tokenizer = "train") would give ids the loaded embeddings do not
    mean."""
    import dataclasses
    import os

    from podkit import paths, runs
    from podkit.errors import ConfigError

    d = config.data
    if not getattr(d, "files", "") or getattr(d, "tokenizer", "") != "train":
        return config
    # The run directory, its checkpoints or one checkpoint step (a path or a URL).
    folders = [source.rstrip("/")]
    for _ in range(2):
        folders.append(folders[-1].rpartition("/")[0] if paths.is_url(source)
                       else os.path.dirname(folders[-1]))
    for folder in folders:
        tokenizer = paths.join(folder, runs.TOKENIZER)
        if folder and paths.exists(tokenizer):
            if os.environ.get("PODKIT_PROCESS_ID", "0") == "0":  # before connect(): by env
                print(f"podkit: --init-from {source}: the text is read with its tokenizer "
                      f"({tokenizer}), not a new one trained on data.files")
            return dataclasses.replace(config, data=dataclasses.replace(d, tokenizer=tokenizer))
    raise ConfigError(f"--init-from {source} with data.tokenizer = \"train\" would train a new "
                      "tokenizer whose ids the loaded embeddings do not mean, and the source "
                      "keeps no tokenizer.json. Set data.tokenizer to the tokenizer the source "
                      "was trained with.")


def _ctrl_c_saves() -> None:
    """Ctrl-C in `podkit train` stops it as a scheduler's SIGTERM does: the steps in flight
    finish, every process saves a checkpoint at the same step and the run exits, ready to
    resume (outside training, the process just ends). A second Ctrl-C stops at once."""
    import os
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return  # a program (or test) that handles SIGINT itself keeps it

    def first(signum: int, frame: object) -> None:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        print("\npodkit: Ctrl-C: stopping at the next step with a checkpoint (Ctrl-C again "
              "stops at once, without one)", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGINT, first)


def jax_leaves(tree: object) -> list:
    import jax

    return jax.tree.leaves(tree)


def _compile_report(args: argparse.Namespace) -> int:
    config, _, data, _, model = _build(args, quiet=args.json)
    from podkit.monitor import compile_report

    n = min(data.train_rows(), config.data.batch_size * config.train.steps_per_execution)
    x, y = data.first(n)  # one execution's batches
    report = model.compile_report(x, y, batch_size=config.data.batch_size)
    print(compile_report.dumps(report) if args.json else report.text())
    return 0


def _report(args: argparse.Namespace) -> int:
    from podkit import paths, runs
    from podkit.monitor import doctor, records, report

    if args.command == "report":
        local = runs.local_dir(args.run_dir)  # a URL's local copy
        path = report.write(local, args.out)
        if args.out is None:  # report.html in the run directory: the bucket's too
            runs.push_copy(args.run_dir)
            path = paths.join(args.run_dir, Path(path).name)
        print(f"{doctor.summary_line(records.load(local))}\nwrote {path}")
        return 0
    run = records.load(runs.local_dir(args.run_dir))
    print(doctor.summary_line(run))
    for finding in doctor.diagnose(run):
        print(finding)
    return 0


def _train(args: argparse.Namespace) -> int:
    from podkit import config as config_lib
    from podkit import lifetime, paths

    lifetime.started_for_run()  # the run's account begins at this process's start

    config, cluster, data, strategy, model = _build(args, cache=True, elastic=True)
    where = paths.join(config.run.dir, config.run.name)  # a malformed URL: ConfigError
    check_run_dir(where)
    # The directory the run's files are written in: a URL's local copy (pulled by process 0,
    # so that a resumed run continues its records), pushed there by fit().
    run_dir, mirror = local_run_dir(where)
    lead = cluster.process_index == 0
    t = config.train
    if lead:
        print(strategy)
        if t.steps and t.warmup_steps >= t.steps:
            print(f"podkit: train.warmup_steps = {t.warmup_steps} is not below train.steps = "
                  f"{t.steps}: the run ends inside its warmup, below train.learning_rate "
                  "(lower train.warmup_steps for a run that reaches it).")
    have = data.validation_batches(config.data.batch_size)
    if t.eval_steps and data.validation is not None and t.eval_steps > have:
        from podkit.errors import ConfigError

        raise ConfigError(f"train.eval_steps = {t.eval_steps}, but the validation split holds "
                          f"{have} batches of data.batch_size = {config.data.batch_size}; set "
                          f"train.eval_steps to {have} or less (0: the whole split).")
    checkpoint = None
    c = config.checkpoint
    if c.enabled:
        from podkit.checkpoint import CheckpointManager

        checkpoint = CheckpointManager(
            c.dir or paths.join(where, "checkpoints"), every_steps=c.every_steps or None,
            every_seconds=c.every_seconds or None, keep=c.keep, keep_every=c.keep_every or None,
            async_save=c.async_save, local_every_steps=c.local_every_steps or None,
            local_dir=c.local_dir or None, local_keep=c.local_keep)
    from podkit import runs

    def total_of(train: object) -> int:  # the run's length in steps under a [train]
        return runs.run_length(train, data.train_rows(), config.data.batch_size,
                               endless=data.streamed).total

    length = runs.run_length(t, data.train_rows(), config.data.batch_size,
                             endless=data.streamed)
    # What a resume checks the data against: process 0's pulled copy; the other processes of
    # a run on a URL read a copy of their own (the machine's run copy is process 0's to pull).
    checked = run_dir if lead or mirror is None else runs.local_dir(where, must_exist=False)
    resumed = _resume_or_init(args, config, checkpoint, model, lead, length, data.info, checked,
                              total_of)
    if lead:  # what `podkit eval` and from_run build the model from (after the resume's check)
        runs.write_data_info(run_dir, data.info, length.total)
    if resumed is None:
        if lead:
            what = "train.steps" if t.steps else "train.epochs"
            print(f"podkit: {where} is complete: its checkpoint is at step {length.total} "
                  f"(the end of {what} = {t.steps or t.epochs}) or beyond. Raise {what} to "
                  "train on, or pick a new run.name.")
        return 0
    callbacks, start = resumed
    callbacks = length.callbacks() + callbacks
    if lead and t.verbose and t.steps:  # the bar counts the run's steps, not an interval's
        from podkit.monitor.progress import ProgbarLogger

        callbacks.append(ProgbarLogger(total_steps=length.total, initial_step=start))
    # Arrays go in with their batch size; a streamed Dataset is batched and endless already.
    x, y = data.train if not data.streamed else (data.train, None)
    history = model.fit(
        x, y,
        batch_size=None if data.streamed else config.data.batch_size,
        epochs=length.epochs,
        steps_per_epoch=length.steps_per_epoch,
        callbacks=callbacks,
        validation_data=data.validation,
        validation_steps=t.eval_steps or None,
        verbose=t.verbose if lead else 0,
        log_every=t.log_every,
        seed=config.run.seed,
        run_dir=RunDir(run_dir, config_toml=config_lib.to_toml(config), mirror=mirror,
                       elastic=args.elastic_plan.record() if args.elastic_plan else None),
        checkpoint=checkpoint, resume=args.resume,
        on_nan=None if c.on_nan == "none" else c.on_nan,
        watchdog=t.watchdog_s or None,
        profile_steps=args.profile_steps,
    )
    if lead:
        final = {k: v[-1] for k, v in history.history.items()}
        shown = ", ".join(f"{k} {v:.4f}" for k, v in final.items())
        print(f"done: {shown}; {model.count_params():,} parameters; run dir {where}")
        from podkit import compile_cache

        if compile_cache.directory():
            n = compile_cache.counts()
            print(f"compile cache: {n['hits']} programs loaded, {n['misses']} compiled "
                  f"({compile_cache.directory()})")
    _after_training(config, model, data, lead)
    return 0


def _resume_or_init(args: argparse.Namespace, config: object, checkpoint: object,
                    model: object, lead: bool, length: object, info: dict,
                    run_dir: Path, total_of: object) -> tuple[list, int] | None:
    """Before fit: a resume compares the checkpoint's config with this one (applies what it
    can, logged; refuses the rest with the fix); --init-from loads another run's weights
    only. Returns the callbacks that apply a changed constant learning rate and the step
    training starts from, or None when the checkpoint is the run's last step already.
    `total_of(train)`: a run's length in steps (what sizes its schedule)."""
    from podkit import paths, runs
    from podkit.errors import ConfigError

    found = checkpoint.meta() if checkpoint is not None else None
    if found is not None and getattr(args, "init_from_key", False):
        args.init_from = None  # [model] init_from started this run; it resumes now
    if args.init_from is not None:
        if found is not None:
            raise ConfigError(f"--init-from starts a new run, but {checkpoint.directory} holds "
                              f"this run's checkpoints (step {found[0]}): it would resume "
                              "instead. Pick a new run.name, or drop --init-from to resume.")
        source = args.init_from if paths.is_url(args.init_from) else Path(args.init_from)
        from podkit.models import hf

        if hf.is_directory(source):  # local, gs:// or s3://
            seq = (config.data.seq_len,)
            # Packed instruction data feeds tokens with positions and segment ids.
            packed = getattr(config.data, "packing", False)
            model.build({k: seq for k in ("tokens", "positions", "segment_ids")}
                        if packed else seq, dtype="int32")
            hf.load_weights(model, source)  # every tensor's name and shape checked first
            if lead:  # its tokenizer settings, context and dtype, for the run's export
                hf.keep_source(source, run_dir)
                print(f"podkit: initialized from {source}: a Hugging Face "
                      f"{hf.read_config(source).get('model_type')} model's weights (the "
                      "optimizer, the step count and the data start fresh)")
            return [], 0
        if paths.exists(paths.join(source, "config.toml")):  # a run directory (or its URL)
            kept = runs.local_dir(source) / hf.SOURCE_DIR
            if lead and kept.is_dir():  # a run from a Hugging Face model
                hf.keep_source(kept, run_dir)
            source = runs.checkpoint_dir(source)
        model.load_weights(source)  # every array's name and shape checked first
        if lead:
            print(f"podkit: initialized from {source}: its weights only (the optimizer, the "
                  "step count and the data position start fresh)")
        return [], 0
    if found is None and args.resume is not None:
        from podkit.checkpoint import CheckpointManager

        found = CheckpointManager(_checkpoint_dir(args.resume)).meta()
    if found is None:
        return [], 0
    step, meta = found
    runs.check_same_data(run_dir, info, step)
    if step >= length.total:
        return None  # the run is complete: nothing to resume
    if meta.get("config"):
        for note in runs.resume_changes(meta["config"], config, step, total_of):
            if lead:
                print(f"podkit: resume: {note}")
    rate = runs.schedule_from_config(config.train, 1)
    # A constant rate lives in the optimizer state the resume restores: set it again.
    return ([runs.SetLearningRate(rate)] if isinstance(rate, float) else []), step


def _after_training(config: object, model: object, data: object, lead: bool) -> None:
    """What a model shows when its run ends: a language model writes a text sample.

    The rule for work after training (here, and in fit()'s final evaluation, save and
    final.json): every process runs the same collective work in the same order (the sample is
    one program over the sharded model, called by every process with the same arguments), or
    one process works alone on data it holds entirely, with no collective (process 0 prints
    and writes files). Never a process's own array put onto the whole mesh, and never a
    collective that only some processes enter: either hangs a multi-process job. Under
    `podkit launch` this time is bounded by --exit-timeout, and `heartbeat.phase` names it in
    the launcher's report.
    """
    sample = getattr(config.model, "sample_tokens", 0)
    prompt = data.info.get("prompt")
    if not sample or not prompt or "decode" not in data.info:
        return
    from podkit import heartbeat
    from podkit.models.gpt import generate

    tokenizer = data.info.get("tokenizer")
    stop = _eos_id(config, tokenizer) if tokenizer is not None else None
    with heartbeat.phase("text sample"):
        tokens = generate(model, prompt, sample, seed=config.run.seed, stop=stop)
    if lead:
        print("--- sample ---")
        print(_printable(data.info["decode"](prompt + tokens)))
        print("--------------")


LANGUAGE_MODELS = ("gpt", "llama")  # [model] names `generate` and perplexity apply to


def _from_run(args: argparse.Namespace) -> tuple:
    """(config, cluster, model) of a run directory: the model at --step (newest committed
    step by default) on the devices there are now."""
    from podkit.cluster import connect

    cluster = connect(cpu_devices=args.cpu_devices)
    from podkit import runs
    from podkit.errors import ConfigError
    from podkit.models import from_run

    config = runs.read_config(args.run_dir)
    try:
        return config, cluster, from_run(args.run_dir, step=args.step)
    except ConfigError as e:
        if "divisible" not in str(e) or args.cpu_devices is None:
            raise
        raise ConfigError(f"{e} (The run's [strategy] lays its weights out over the "
                          f"--cpu-devices {args.cpu_devices} devices here: pick a count its "
                          "dims divide over, e.g. the run's own, 1, 2, 4 or 8.)") from None


def _eval(args: argparse.Namespace) -> int:
    """Loss and the run's metrics on its validation data (or --split train); perplexity for a
    language model (exp of the mean token loss)."""
    import json
    import math

    from podkit import datasets

    config, cluster, model = _from_run(args)
    data_config = config.data
    if getattr(data_config, "files", "") and getattr(data_config, "tokenizer", "") == "train":
        # The run's own tokenizer, not a BPE trained again on files that may have changed.
        import dataclasses

        from podkit import runs

        data_config = dataclasses.replace(data_config, tokenizer=str(
            runs.local_dir(args.run_dir) / runs.TOKENIZER))
    data = datasets.load(data_config, seed=config.run.seed)
    split = data.validation if args.split == "validation" else data.train
    if split is None:
        from podkit.errors import ConfigError

        raise ConfigError(f"{args.run_dir}: the run's data has no validation split "
                          f"(data.validation_fraction = {config.data.validation_fraction} "
                          "left no validation batch); use --split train.")
    if args.split == "validation" and args.batches:
        have = data.validation_batches(config.data.batch_size)
        if args.batches > have:
            from podkit.errors import ConfigError

            raise ConfigError(f"--batches {args.batches}: the validation split holds {have} "
                              f"batches of data.batch_size = {config.data.batch_size}; give "
                              f"--batches {have} or less (or leave it out: the whole split).")
    if data.streamed:
        # The training split streams without end: one pass of it unless --batches says.
        one_pass = data.train_rows() // config.data.batch_size
        results = model.evaluate(split, verbose=0, return_dict=True, steps=args.batches or (
            one_pass if args.split == "train" else None))
        rows = "streamed"
    else:
        x, y = split
        results = model.evaluate(x, y, batch_size=config.data.batch_size, verbose=0,
                                 return_dict=True, steps=args.batches or None)
        rows = f"{len(jax_leaves(y)[0]):,} rows"
    if config.model.name in LANGUAGE_MODELS:
        results["perplexity"] = math.exp(min(results["loss"], 700.0))
    if cluster.process_index == 0:
        if args.json:
            print(json.dumps({k: float(v) for k, v in results.items()}))
        else:
            shown = ", ".join(f"{k} {v:.4f}" for k, v in results.items())
            print(f"{args.run_dir} ({args.split}, {rows}): {shown}")
    return 0


def _generate(args: argparse.Namespace) -> int:
    from podkit import runs
    from podkit.errors import ConfigError
    from podkit.models.gpt import context_of, generate

    for flag, value, low in (("--max-tokens", args.max_tokens, 1), ("--top-k", args.top_k, 0)):
        if value < low:
            raise ConfigError(f"{flag} {value}; give an int >= {low}.")
    if args.prompt_ids is not None and args.chat:
        raise ConfigError("--chat renders a text prompt with the run's chat template; with "
                          "--prompt-ids the ids go in as they are: drop --chat, or give "
                          "--prompt.")
    if not args.temperature >= 0:
        raise ConfigError(f"--temperature {args.temperature}; give a number >= 0 (0: greedy "
                          "decoding, the likeliest token each time).")
    config, cluster, model = _from_run(args)
    if config.model.name not in LANGUAGE_MODELS:
        raise ConfigError(f"podkit generate needs a language-model run (model.name = \"gpt\" "
                          f"or \"llama\"); {args.run_dir} trained {config.model.name!r}.")
    if args.prompt_ids is not None:
        # A run on token ids (ArrayRecord) has no tokenizer: ids in, ids out.
        try:
            prompt = [int(v) for v in args.prompt_ids.replace(",", " ").split()]
        except ValueError:
            raise ConfigError(f"--prompt-ids {args.prompt_ids!r}; give token ids separated by "
                              "commas, e.g. --prompt-ids 12,7,301.") from None
        if not prompt:
            raise ConfigError("--prompt-ids is empty; give the token ids to continue.")
        tokens = generate(model, prompt, args.max_tokens, temperature=args.temperature,
                          top_k=args.top_k, seed=args.seed)
        if cluster.process_index == 0:
            print(",".join(str(t) for t in prompt + tokens))
        return 0
    local = runs.local_dir(args.run_dir)
    if not (local / runs.TOKENIZER).is_file() and (local / runs.DATA_INFO).is_file():
        raise ConfigError(f"{args.run_dir} trained on token ids without a tokenizer (it keeps "
                          "no tokenizer.json): pass the prompt as ids, --prompt-ids 12,7,301.")
    tokenizer = runs.load_tokenizer(args.run_dir)
    if not args.prompt:
        raise ConfigError("--prompt is empty; give the text to continue.")
    if args.system and not args.chat:
        raise ConfigError("--system is a system message for --chat; add --chat, or put the "
                          "text in --prompt.")
    eos = _eos_id(config, tokenizer)
    # The model's context: a Hugging Face source's, else data.seq_len (generate's window).
    context = context_of(model.module())
    if args.chat:
        prompt, eos = _chat_prompt(args, config, tokenizer)
        _check_chat_fits(prompt, args, context, cluster.process_index == 0)
    else:
        prompt = tokenizer.encode(args.prompt, add_special_tokens=False).ids  # as in training
        _note_long_prompt(prompt, context, cluster.process_index == 0)
    tokens = generate(model, prompt, args.max_tokens, temperature=args.temperature,
                      top_k=args.top_k, seed=args.seed, stop=None if args.no_stop else eos)
    if cluster.process_index == 0:
        if args.chat:  # the reply alone, without its end-of-turn marker
            reply = tokens[:-1] if tokens and tokens[-1] == eos and not args.no_stop else tokens
            print(_printable(tokenizer.decode(reply, skip_special_tokens=True)))
        else:
            print(_printable(tokenizer.decode(prompt + tokens,
                                              skip_special_tokens=args.skip_special_tokens)))
    return 0


def _chat_prompt(args: argparse.Namespace, config: object, tokenizer: object
                 ) -> tuple[list[int], int | None]:
    """(--prompt as the user's message, rendered by the run's chat template with the
    generation prompt, the end-of-turn token's id): `podkit generate --chat`."""
    from podkit import runs
    from podkit.datasets.chat import ChatTemplate
    from podkit.errors import ConfigError

    info = runs.data_info(args.run_dir, config)
    source = info.get("chat_template")
    if not source:
        raise ConfigError(f"--chat renders the prompt with the run's chat template, and "
                          f"{args.run_dir} has none (it did not train on [data] name = "
                          "\"instructions\" with a tokenizer that has one): drop --chat.")
    template = ChatTemplate(source, info.get("bos_token"), info.get("eos_token"),
                            f"{args.run_dir}'s chat template")
    messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
        {"role": "user", "content": args.prompt}]
    text = template.render(messages, add_generation_prompt=True)
    eos = info.get("eos_token")
    return (tokenizer.encode(text, add_special_tokens=False).ids,
            tokenizer.token_to_id(eos) if eos else None)


def _check_chat_fits(prompt: list[int], args: argparse.Namespace, context: int,
                     lead: bool = True) -> None:
    """A chat prompt that does not fit the context is refused: generate() would keep its
    last tokens only, dropping the system message and the template's header, and answer
    another conversation than the one rendered. (transformers' generate does not cut a
    prompt either; past a learned position table it fails.) One that fits but whose reply
    may run past the context gets a warning: from there the window slides past the start."""
    from podkit.errors import ConfigError

    if len(prompt) >= context:
        raise ConfigError(
            f"the chat prompt is {len(prompt)} tokens (the --system and --prompt messages "
            f"rendered by the chat template), and the model's context is {context} "
            "tokens: there is no room for a reply, and cutting the prompt would drop "
            "the system message and the template's header. Shorten --prompt or --system, or "
            "train with a longer data.seq_len.")
    if lead and len(prompt) + args.max_tokens > context:
        print(f"podkit: warning: the chat prompt is {len(prompt)} tokens and --max-tokens "
              f"{args.max_tokens} runs past the model's context of {context}: a reply longer "
              f"than {context - len(prompt)} tokens is generated with the start of the "
              "conversation (the system message) out of the window.", file=sys.stderr)


def _note_long_prompt(prompt: list[int], context: int, lead: bool) -> None:
    """A plain prompt past the context is continued from its last `context` tokens (what a
    sliding window does with any long text); said on stderr, not done silently."""
    if lead and len(prompt) > context:
        print(f"podkit: the prompt is {len(prompt)} tokens, past the model's context of "
              f"{context}: it is continued from its last {context} tokens.",
              file=sys.stderr)


def _eos_id(config: object, tokenizer: object) -> int | None:
    """The id of the text's end-of-text token (`data.eos_token`), where the tokenizer has it:
    what generation stops at."""
    eos = getattr(config.data, "eos_token", "") or ""
    return tokenizer.token_to_id(eos) if eos else None


def _printable(text: str) -> str:
    """Text for a terminal: control characters other than newline and tab escaped (\\x1b,
    \\x07, ...), so a sampled escape sequence cannot move the cursor or clear the screen."""
    return "".join(c if c in "\n\t" or c.isprintable() else repr(c)[1:-1] for c in text)


def _export(args: argparse.Namespace) -> int:
    from podkit import paths, runs
    from podkit.errors import ConfigError

    if args.dtype is not None and args.format != "hf":
        raise ConfigError(f"--dtype {args.dtype} applies to --format hf; --format "
                          f"{args.format} writes the weights as they are.")
    config, cluster, model = _from_run(args)
    if args.format == "hf":
        from podkit.models import hf

        out = args.out or paths.join(args.run_dir, "hf")
        tokenizer = (runs.load_tokenizer(args.run_dir)
                     if (runs.local_dir(args.run_dir) / runs.TOKENIZER).is_file() else None)
        # The end-of-text token between documents ([data] files; the built-in corpus has
        # none), or instruction data's (its chat template's) with that template.
        info = runs.data_info(args.run_dir, config)
        eos = getattr(config.data, "eos_token", None) or info.get("eos_token") or None
        if tokenizer is None or eos is None or tokenizer.token_to_id(eos) is None:
            eos = None
        # A run from a Hugging Face directory kept its tokenizer settings, context and dtype.
        kept = runs.local_dir(args.run_dir) / hf.SOURCE_DIR
        path = hf.save_hf(model, out, tokenizer=tokenizer, eos_token=eos,
                          chat_template=info.get("chat_template"),
                          bos_token=info.get("bos_token"), dtype=args.dtype,
                          source=kept if kept.is_dir() else None)
        if cluster.process_index == 0:
            print(f"wrote {path}: a Hugging Face directory (config.json, model.safetensors"
                  f"{', tokenizer.json' if tokenizer is not None else ''}) of "
                  f"{hf.exported_params(model):,} parameters; transformers' "
                  "AutoModelForCausalLM.from_pretrained reads it")
        return 0
    out = args.out or paths.join(args.run_dir, f"weights.{args.format}")
    path = runs.export(model, out, args.format)  # every process: the weights are gathered
    if cluster.process_index == 0:
        print(f"wrote {path}: the weights of {model.count_params():,} parameters, by name")
    return 0


def _checkpoint_dir(where: str) -> str:
    """A run directory's checkpoints (RUN_DIR/checkpoints) or a checkpoint directory."""
    from podkit import paths

    if paths.is_url(where):
        inside = paths.join(where, "checkpoints")
        return inside if paths.isdir(inside) else where
    if (Path(where) / "checkpoints").is_dir():
        return str(Path(where) / "checkpoints")
    if "://" not in where and not Path(where).is_dir():
        from podkit.errors import ConfigError

        raise ConfigError(f"{where!r} is not a directory; pass a run directory (runs/NAME) or "
                          "its checkpoint directory.")
    return where


def _checkpoint(args: argparse.Namespace) -> int:
    from podkit.checkpoint import CheckpointManager

    manager = CheckpointManager(_checkpoint_dir(args.run_dir))
    if args.action == "ls":
        infos = manager.steps(deep=True)
        if not infos:
            print(f"{manager.directory}: no checkpoints")
            return 0
        print(f"{'step':>10}  {'state':<10}  {'MB':>9}  note")
        for info in infos:
            print(f"{info.step:>10}  {info.status:<10}  {info.bytes / 2**20:>9.1f}  {info.reason}")
        valid = [i.step for i in infos if i.valid]
        print(f"{len(infos)} checkpoints in {manager.directory}; newest valid: "
              f"{valid[-1] if valid else 'none'}")
        return 0
    step, digest = manager.digest(args.step)
    print(f"step {step} of {manager.directory}: xxh3-128 of parameters and optimizer state")
    print(digest)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="podkit", description="Train models across a pod.")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train from a TOML config")
    train.add_argument("config", help="path to a TOML config, e.g. configs/seed_mlp.toml")
    train.add_argument(
        "--set", action="append", metavar="SECTION.KEY=VALUE",
        help="override one config value (repeatable), e.g. --set train.epochs=3",
    )
    train.add_argument(
        "--cpu-devices", type=int, default=None, metavar="N",
        help="run on N virtual CPU devices (as PODKIT_CPU_DEVICES=N)",
    )
    train.add_argument(
        "--resume", default=None, metavar="PATH",
        help="start from this checkpoint (a checkpoint directory or one step in it) when the "
             "run directory has none of its own",
    )
    train.add_argument(
        "--init-from", default=None, metavar="RUN_CHECKPOINT_OR_HF_DIR",
        help="start a new run from another run's weights only (fine-tuning): a run directory "
             "(its newest step), a checkpoint directory, or a Hugging Face model directory "
             "(config.json + safetensors: the architecture and tokenizer come along)",
    )
    train.add_argument(
        "--profile-steps", default=None, metavar="A:B",
        help="write a JAX profiler trace of steps A to B into RUN_DIR/profile (TensorBoard's "
             "profile tab or Perfetto open it)",
    )
    report = sub.add_parser("compile-report", help="what XLA does to a config's train step: "
                            "ops, fusions, FLOPs, collectives, memory per device")
    report.add_argument("config", help="path to a TOML config")
    report.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE",
                        help="override one config value (repeatable)")
    report.add_argument("--cpu-devices", type=int, default=None, metavar="N",
                        help="compile for N virtual CPU devices (as PODKIT_CPU_DEVICES=N)")
    report.add_argument("--json", action="store_true", help="one JSON object, for machines")
    rep = sub.add_parser("report", help="write RUN_DIR/report.html: curves, throughput, "
                         "where the time went, recompiles, memory")
    rep.add_argument("run_dir", help="a run directory (runs/NAME)")
    rep.add_argument("--out", default=None, help="where to write (default RUN_DIR/report.html)")
    doc = sub.add_parser("doctor", help="what held a run back, with advice")
    doc.add_argument("run_dir", help="a run directory (runs/NAME)")
    ckpt = sub.add_parser("checkpoint", help="inspect checkpoints")
    ckpt_sub = ckpt.add_subparsers(dest="action", required=True)
    ls = ckpt_sub.add_parser("ls", help="list steps: valid / incomplete / corrupt")
    ls.add_argument("run_dir", help="a run directory (runs/NAME) or a checkpoint directory")
    digest = ckpt_sub.add_parser("digest", help="content hash of parameters + optimizer state")
    digest.add_argument("run_dir", help="a run directory (runs/NAME) or a checkpoint directory")
    digest.add_argument("--step", type=int, default=None, help="default: the newest valid")
    for name, helptext in (("eval", "loss and metrics of a run's model on its validation "
                                     "data (perplexity for a language model)"),
                           ("generate", "continue a prompt with a language-model run"),
                           ("export", "a run's weights: named tensors (safetensors, npz) "
                                      "or a Hugging Face directory (hf)")):
        cmd = sub.add_parser(name, help=helptext)
        cmd.add_argument("run_dir", help="a run directory of `podkit train` (runs/NAME)")
        cmd.add_argument("--step", type=int, default=None,
                         help="a committed checkpoint step (default: the newest)")
        cmd.add_argument("--cpu-devices", type=int, default=None, metavar="N",
                         help="run on N virtual CPU devices (the weights reshard to any count "
                              "the run's [strategy] divides them over)")
        if name == "eval":
            cmd.add_argument("--split", choices=("validation", "train"), default="validation")
            cmd.add_argument("--json", action="store_true", help="one JSON object")
            cmd.add_argument("--batches", type=int, default=0, metavar="N",
                             help="evaluate on N batches (default: the whole split)")
        if name == "generate":
            given = cmd.add_mutually_exclusive_group(required=True)
            given.add_argument("--prompt", help="the text to continue")
            given.add_argument("--prompt-ids", metavar="IDS",
                               help="token ids to continue, e.g. 12,7,301 (a run on ids)")
            cmd.add_argument("--max-tokens", type=int, default=100, metavar="N")
            cmd.add_argument("--temperature", type=float, default=0.8, metavar="T",
                             help="sampling temperature; 0: greedy (the likeliest token)")
            cmd.add_argument("--top-k", type=int, default=0, metavar="K",
                             help="sample among the K likeliest tokens (0: all)")
            cmd.add_argument("--seed", type=int, default=0)
            cmd.add_argument("--no-stop", action="store_true",
                             help="go on past the end-of-text token (data.eos_token) to "
                                  "--max-tokens")
            cmd.add_argument("--skip-special-tokens", action="store_true",
                             help="leave special tokens (<|endoftext|>, ...) out of the text")
            cmd.add_argument("--chat", action="store_true",
                             help="--prompt is a user's message: rendered by the run's chat "
                                  "template (instruction tuning), the reply printed alone")
            cmd.add_argument("--system", default="",
                             help="with --chat: a system message before the user's")
        if name == "export":
            cmd.add_argument("--dtype", choices=("bfloat16", "float16", "float32"),
                             default=None,
                             help="hf: the weights' dtype (default: the Hugging Face "
                                  "source's, else float32)")
            cmd.add_argument("--format", choices=("safetensors", "npz", "hf"),
                             default="safetensors",
                             help="hf: a Hugging Face directory transformers loads (the GPT "
                                  "and Llama models)")
            cmd.add_argument("--out", default=None,
                             help="the file to write (default RUN_DIR/weights.FORMAT; for hf a "
                                  "directory, default RUN_DIR/hf)")
    from podkit.launch import cli as launch_cli
    from podkit.sim import cli as plan_cli
    from podkit.submit import cli as submit_cli

    launch_cli.add_parser(sub)
    submit_cli.add_parser(sub)
    plan_cli.add_parser(sub)
    argv, command = submit_cli.split_command(list(sys.argv[1:] if argv is None else argv))
    args = parser.parse_args(argv)
    try:
        if args.command == "train":
            _ctrl_c_saves()
            return _train(args)
        if args.command == "checkpoint":
            return _checkpoint(args)
        if args.command == "compile-report":
            return _compile_report(args)
        if args.command in ("report", "doctor"):
            return _report(args)
        if args.command == "launch":
            return launch_cli.run(args)
        if args.command == "submit":
            return submit_cli.run(args, command)
        if args.command == "plan":
            return plan_cli.run(args)
        if args.command == "eval":
            return _eval(args)
        if args.command == "generate":
            return _generate(args)
        if args.command == "export":
            return _export(args)
    except KeyboardInterrupt:
        print("podkit: interrupted", file=sys.stderr)
        return 130
    except PodkitError as e:
        # The Python argument an error names, as a config says it.
        hints = {"from_logits=True": " In a config: train.from_logits = true.",
                 "on_nan='rollback'": " In a config: checkpoint.on_nan = \"rollback\".",
                 "remainder='pad'": " In a config: make data.batch_size a multiple of the "
                                    "data-parallel size (remainder= is fit()'s argument)."}
        hint = "".join(h for key, h in hints.items() if key in str(e))
        print(f"podkit: error: {e}{hint}", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())

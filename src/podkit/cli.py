"""The `podkit` command.

    podkit train CONFIG.toml [--set section.key=value ...] [--cpu-devices N] [--resume PATH]
    podkit compile-report CONFIG.toml [--cpu-devices N] [--json]   what XLA did to the step
    podkit report RUN_DIR [--out FILE]        RUN_DIR/report.html: curves, time, memory
    podkit doctor RUN_DIR                     what held the run back, with advice
    podkit checkpoint ls RUN_DIR              steps and their state (valid/incomplete/corrupt)
    podkit checkpoint digest RUN_DIR [--step N]   one content hash (the last line)
    podkit launch --processes N [...] -- COMMAND...   a supervised multi-process job
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from podkit.errors import PodkitError
from podkit.monitor.run_dir import RunDir


def _build(args: argparse.Namespace, quiet: bool = False) -> tuple:
    """(config, cluster, data, strategy, model) of a config, the model compiled as [train]
    says. Imports wait until the flags are read: connect() must run before JAX starts."""
    from podkit import config as config_lib
    from podkit.cluster import connect

    config = config_lib.load(args.config, args.set or [])
    cluster = connect(cpu_devices=args.cpu_devices)

    from podkit import datasets
    from podkit.models import build_model

    if cluster.process_index == 0 and not quiet:
        print(cluster)
    data = datasets.load(config.data, seed=config.run.seed)
    strategy = make_strategy(config.strategy)
    t = config.train
    with strategy.scope():
        model = build_model(config.model, data.info, seed=config.run.seed)
        model.compile(
            optimizer=_optimizer(t),
            loss=_loss(t),
            metrics=t.metrics,
            steps_per_execution=t.steps_per_execution,
            microbatches=t.microbatches,
            recompile_warning_after=t.recompile_warning_after or None,
            strict_recompiles=t.strict_recompiles,
        )
    return config, cluster, data, strategy, model


def _compile_report(args: argparse.Namespace) -> int:
    config, _, data, _, model = _build(args, quiet=args.json)
    import jax

    from podkit.monitor import compile_report

    (x, y) = data.train
    n = min(len(jax.tree.leaves(y)[0]),
            config.data.batch_size * config.train.steps_per_execution)
    first = lambda tree: jax.tree.map(lambda a: a[:n], tree)  # one execution's batches
    report = model.compile_report(first(x), first(y), batch_size=config.data.batch_size)
    print(compile_report.dumps(report) if args.json else report.text())
    return 0


def _report(args: argparse.Namespace) -> int:
    from podkit.monitor import doctor, records, report

    if args.command == "report":
        path = report.write(args.run_dir, args.out)
        print(f"{doctor.summary_line(records.load(args.run_dir))}\nwrote {path}")
        return 0
    run = records.load(args.run_dir)
    print(doctor.summary_line(run))
    for finding in doctor.diagnose(run):
        print(finding)
    return 0


def _train(args: argparse.Namespace) -> int:
    from podkit import config as config_lib

    config, cluster, data, strategy, model = _build(args)
    run_dir = Path(config.run.dir) / config.run.name
    lead = cluster.process_index == 0
    t = config.train
    if lead:
        print(strategy)
    checkpoint = None
    c = config.checkpoint
    if c.enabled:
        from podkit.checkpoint import CheckpointManager

        checkpoint = CheckpointManager(
            c.dir or str(run_dir / "checkpoints"), every_steps=c.every_steps or None,
            every_seconds=c.every_seconds or None, keep=c.keep, keep_every=c.keep_every or None,
            async_save=c.async_save)
    (x, y), validation = data.train, data.validation
    epochs, steps_per_epoch = _schedule(t, len(y), config.data.batch_size)
    history = model.fit(
        x, y,
        batch_size=config.data.batch_size,
        epochs=epochs,
        steps_per_epoch=steps_per_epoch,
        validation_data=validation,
        verbose=t.verbose if lead else 0,
        log_every=t.log_every,
        seed=config.run.seed,
        run_dir=RunDir(run_dir, config_toml=config_lib.to_toml(config)),
        checkpoint=checkpoint, resume=args.resume,
        on_nan=None if c.on_nan == "none" else c.on_nan,
        watchdog=t.watchdog_s or None,
        profile_steps=args.profile_steps,
    )
    if lead:
        final = {k: v[-1] for k, v in history.history.items()}
        shown = ", ".join(f"{k} {v:.4f}" for k, v in final.items())
        print(f"done: {shown}; {model.count_params():,} parameters; run dir {run_dir}")
    _after_training(config, model, data, lead)
    return 0


def make_strategy(s: object) -> object:
    """The strategy a `[strategy]` section describes (kind, mesh, rules)."""
    from podkit import strategy as strategy_lib
    from podkit.errors import ConfigError

    mesh = dict(s.mesh)
    if s.kind == "custom":
        return strategy_lib.Strategy(mesh=mesh or None, rules=[tuple(r) for r in s.rules])
    allowed = {"data_parallel": {"data"}, "fsdp": {"data", "fsdp"},
               "tensor_parallel": {"data", "model"}}[s.kind]
    extra = set(mesh) - allowed
    if extra:
        raise ConfigError(f"strategy.mesh = {mesh} has axes {sorted(extra)} that kind = "
                          f"{s.kind!r} does not use (it uses {sorted(allowed)}); use kind = "
                          '"custom" with rules for other layouts.')
    if s.kind == "data_parallel":
        return strategy_lib.Strategy(mesh=mesh or {"data": -1})
    if s.kind == "fsdp":
        if mesh.get("data") == -1:
            raise ConfigError(
                f"strategy.kind = \"fsdp\" with strategy.mesh = {mesh}: under FSDP the fsdp "
                "axis takes the devices the data axis leaves, so data needs a size (data = 2 "
                "keeps two replicas) or no entry: --set 'strategy.mesh={ fsdp = -1 }'.")
        return strategy_lib.FSDP(data=mesh.get("data", 1), fsdp=mesh.get("fsdp", -1))
    return strategy_lib.TensorParallel(model=mesh.get("model", 2), data=mesh.get("data", -1))


def _schedule(t: object, rows: int, batch_size: int) -> tuple[int, int | None]:
    """(epochs, steps_per_epoch): `train.steps = N` trains N optimizer steps, in epochs of
    the data (the last one cut short)."""
    if not t.steps:
        return t.epochs, None
    per_epoch = max(rows // batch_size, 1)
    if t.steps <= per_epoch:
        return 1, t.steps
    epochs = -(-t.steps // per_epoch)
    if t.steps % per_epoch:
        # Equal epochs of ceil(N / epochs) steps: N rounded up to a multiple of the epochs.
        return epochs, -(-t.steps // epochs)
    return epochs, per_epoch


def _optimizer(t: object) -> object:
    """The optimizer named in [train] with its learning rate, warmup schedule, weight decay
    and global gradient clipping."""
    from podkit import optimizers

    rate: object = t.learning_rate
    if t.warmup_steps:
        total = t.steps or 10_000
        rate = optimizers.schedules.CosineDecay(
            0.0, decay_steps=max(total - t.warmup_steps, 1), alpha=0.1,
            warmup_target=t.learning_rate, warmup_steps=t.warmup_steps)
    extra = {"weight_decay": t.weight_decay or None, "global_clipnorm": t.global_clipnorm or None}
    cls = type(optimizers.get(t.optimizer))  # the name checked, with the valid ones listed
    return cls(learning_rate=rate, **{k: v for k, v in extra.items() if v is not None})


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
    if not sample or "encode" not in data.info:
        return
    from podkit import heartbeat
    from podkit.models.gpt import generate

    prompt = data.info["encode"]("def ")
    with heartbeat.phase("text sample"):
        tokens = generate(model, prompt, sample, seed=config.run.seed)
    if lead:
        print("--- sample ---")
        print(data.info["decode"](prompt + tokens))
        print("--------------")


def _loss(train: object) -> object:
    """The loss named in [train], taking logits when train.from_logits is set."""
    from podkit import losses
    from podkit.errors import ConfigError

    loss = losses.get(train.loss)
    if not train.from_logits:
        return loss
    if loss.expects is None:
        raise ConfigError(f"train.from_logits = true applies to cross-entropy losses, not "
                          f"{train.loss!r}.")
    return type(loss)(from_logits=True)


def _checkpoint_dir(where: str) -> str:
    """A run directory's checkpoints (RUN_DIR/checkpoints) or a checkpoint directory."""
    if "://" not in where and (Path(where) / "checkpoints").is_dir():
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
    from podkit.launch import cli as launch_cli

    launch_cli.add_parser(sub)
    args = parser.parse_args(argv)
    try:
        if args.command == "train":
            return _train(args)
        if args.command == "checkpoint":
            return _checkpoint(args)
        if args.command == "compile-report":
            return _compile_report(args)
        if args.command in ("report", "doctor"):
            return _report(args)
        if args.command == "launch":
            return launch_cli.run(args)
    except PodkitError as e:
        hint = (" In a config: train.from_logits = true." if "from_logits=True" in str(e)
                else "")
        print(f"podkit: error: {e}{hint}", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())

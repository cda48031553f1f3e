"""`podkit train CONFIG.toml [--set section.key=value ...] [--cpu-devices N]`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from podkit.errors import PodkitError
from podkit.monitor.run_dir import RunDir


def _train(args: argparse.Namespace) -> int:
    # Imports wait until the flags are read: connect() must run before JAX starts.
    from podkit import config as config_lib
    from podkit.cluster import connect

    config = config_lib.load(args.config, args.set or [])
    cluster = connect(cpu_devices=args.cpu_devices)

    from podkit.datasets import load_digits
    from podkit.models import REGISTRY
    from podkit.strategy import Strategy

    run_dir = Path(config.run.dir) / config.run.name
    lead = cluster.process_index == 0
    if lead:
        print(cluster)
    (x, y), (vx, vy) = load_digits(
        validation_fraction=config.data.validation_fraction, seed=config.run.seed
    )
    strategy = Strategy(mesh=config.strategy.mesh)
    with strategy.scope():
        model = REGISTRY[config.model.name](config.model, seed=config.run.seed)
        model.compile(
            optimizer=config.train.optimizer,
            learning_rate=config.train.learning_rate,
            loss=_loss(config.train),
            metrics=config.train.metrics,
            steps_per_execution=config.train.steps_per_execution,
        )
    history = model.fit(
        x, y,
        batch_size=config.data.batch_size,
        epochs=config.train.epochs,
        validation_data=(vx, vy) if len(vx) else None,
        verbose=config.train.verbose if lead else 0,
        log_every=config.train.log_every,
        seed=config.run.seed,
        run_dir=RunDir(run_dir, config_toml=config_lib.to_toml(config)),
    )
    if lead:
        final = {k: v[-1] for k, v in history.history.items()}
        shown = ", ".join(f"{k} {v:.4f}" for k, v in final.items())
        print(f"done: {shown}; run dir {run_dir}")
    return 0


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
    args = parser.parse_args(argv)
    try:
        if args.command == "train":
            return _train(args)
    except PodkitError as e:
        hint = (" In a config: train.from_logits = true." if "from_logits=True" in str(e)
                else "")
        print(f"podkit: error: {e}{hint}", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())

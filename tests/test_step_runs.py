"""Step-based training as LLM users expect it: `train.steps` optimizer steps over one data
stream, validation every `eval_every` steps, schedules sized by the real run, Adam's betas,
Adafactor, a log line for every window and a metrics.jsonl that a resumed run continues."""

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

import podkit as pk
from podkit import config as config_lib
from podkit import runs

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "configs" / "seed_mlp.toml"


def _train_config(**values):
    return config_lib.from_dict({"train": values}).train


def test_steps_per_epoch_continues_the_data_stream_across_epochs():
    """Keras 3 continues its iterator across epochs when steps_per_epoch is given; two epochs
    of half the batches each see every row once (not two random halves)."""
    n, batch = 64, 8
    ids = np.arange(n, dtype=np.int32)
    model = pk.Sequential([pk.Input((1,), dtype="int32"), pk.layers.Embedding(n, 1),
                           pk.layers.Flatten()])
    model.compile(optimizer=pk.optimizers.SGD(0.5), loss="mse")
    model.build((None, 1))
    before = model.get_weights()[0][:, 0]
    model.fit(ids[:, None], np.zeros((n, 1), np.float32), batch_size=batch, epochs=2,
              steps_per_epoch=n // batch // 2, verbose=0)
    after = model.get_weights()[0][:, 0]
    # mse over a batch of 8: each row seen once moves by the factor 1 - 2 * 0.5 / 8.
    np.testing.assert_allclose(after, before * (1 - 2 * 0.5 / batch), rtol=1e-5, atol=1e-7)


def test_run_length_lays_steps_out_as_validation_intervals():
    # 44 batches per pass; 45 steps: one interval of 44, then one step (no restart, no
    # rounding): the old layout ran 46 steps as 2 "epochs" of 23.
    length = runs.run_length(_train_config(steps=45), rows=44 * 32, batch_size=32)
    assert (length.total, length.epochs, length.steps_per_epoch) == (45, 2, 44)
    assert [type(c).__name__ for c in length.callbacks()] == ["StopAtStep"]
    length = runs.run_length(_train_config(steps=40, eval_every=20, steps_per_execution=10),
                             rows=1000, batch_size=32)
    assert (length.total, length.epochs, length.steps_per_epoch) == (40, 2, 20)
    assert length.callbacks() == []
    length = runs.run_length(_train_config(epochs=3), rows=100, batch_size=32)
    assert (length.total, length.epochs, length.steps_per_epoch) == (12, 3, None)
    with pytest.raises(pk.ConfigError, match=r"train.steps = 45 is not a multiple of "
                                             r"train.steps_per_execution = 10.*use 40"):
        _train_config(steps=45, steps_per_execution=10)


def test_schedules_span_the_real_run_and_end_at_alpha():
    t = _train_config(steps=100, warmup_steps=10, learning_rate=1.0, alpha=0.2)
    cosine = runs.schedule_from_config(t)
    assert float(cosine(0)) == 0.0 and float(cosine(10)) == pytest.approx(1.0)
    assert float(cosine(100)) == pytest.approx(0.2)  # the floor at the run's real end
    linear = runs.schedule_from_config(_train_config(steps=100, schedule="linear",
                                                     learning_rate=1.0, alpha=0.0))
    assert float(linear(50)) == pytest.approx(0.5) and float(linear(100)) == 0.0
    # Epochs and no steps: sized by the run's length in steps, not a fixed 10,000.
    epochs = runs.schedule_from_config(_train_config(epochs=2, schedule="cosine",
                                                     learning_rate=1.0), total_steps=40)
    assert float(epochs(40)) == pytest.approx(0.1)
    assert runs.schedule_from_config(_train_config(learning_rate=0.5)) == 0.5  # constant
    with pytest.raises(pk.ConfigError, match="train.schedule = 'cosine' needs the run's length"):
        runs.schedule_from_config(_train_config(schedule="cosine"))
    with pytest.raises(pk.ConfigError, match=r"train.alpha = 1.5"):
        _train_config(alpha=1.5)


def test_adam_betas_reach_the_optimizer_and_others_refuse_them():
    opt = runs.optimizer_from_config(_train_config(optimizer="adamw", adam_beta1=0.8,
                                                   adam_beta2=0.95, adam_epsilon=1e-8))
    assert (opt.beta_1, opt.beta_2, opt.epsilon) == (0.8, 0.95, 1e-8)
    with pytest.raises(pk.ConfigError, match=r"adam_beta1.*train.optimizer = 'sgd'"):
        runs.optimizer_from_config(_train_config(optimizer="sgd", adam_beta2=0.95))
    with pytest.raises(pk.ConfigError, match=r"train.adam_beta2 = 1.0"):
        _train_config(adam_beta2=1.0)


def test_the_weight_decay_and_clipping_written_are_the_ones_used():
    """`[train] weight_decay = 0.0` with AdamW is 0.0 (it was Keras's default 0.004: `or
    None`); left out, AdamW's own 0.004. global_clipnorm = 0.0 is kept (Keras: no clipping).
    The epsilon placement reaches Adam/AdamW only."""
    zero = runs.optimizer_from_config(_train_config(optimizer="adamw", weight_decay=0.0,
                                                    global_clipnorm=0.0))
    assert (zero.weight_decay, zero.global_clipnorm) == (0.0, 0.0)
    left_out = runs.optimizer_from_config(_train_config(optimizer="adamw"))
    assert (left_out.weight_decay, left_out.global_clipnorm) == (0.004, None)
    assert runs.optimizer_from_config(_train_config(optimizer="adam")).weight_decay is None
    config = config_lib.from_dict({"train": {"optimizer": "adamw", "weight_decay": 0.0,
                                             "adam_epsilon_placement": "pytorch"}})
    text = config_lib.to_toml(config)
    assert "weight_decay = 0.0" in text and "global_clipnorm" not in text  # left out stays so
    assert config_lib.from_dict(tomllib.loads(text)) == config
    assert runs.optimizer_from_config(config.train).epsilon_placement == "pytorch"
    with pytest.raises(pk.ConfigError, match=r"adam_epsilon_placement = 'pytorch' applies to "
                                             r"adam and adamw; train.optimizer = 'nadam'"):
        runs.optimizer_from_config(_train_config(optimizer="nadam",
                                                 adam_epsilon_placement="pytorch"))
    with pytest.raises(pk.ConfigError, match=r"adam_epsilon_placement = 'torch'"):
        _train_config(adam_epsilon_placement="torch")
    with pytest.raises(pk.ConfigError, match=r"train.weight_decay = -0.1"):
        config_lib.validate(config_lib.from_dict({"train": {"weight_decay": -0.1}}))
    # Turning clipping on at a resume adds no optimizer state now: applied.
    notes = runs.resume_changes(config_lib.to_toml(config_lib.from_dict({})),
                                config_lib.from_dict({"train": {"global_clipnorm": 1.0}}), 50,
                                lambda t: 100)
    assert "train.global_clipnorm: None -> 1.0 (applied from step 50)" in notes


def test_adafactor_trains_with_factored_second_moments():
    import jax

    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 256)).astype(np.float32)
    y = (x @ rng.normal(size=(256, 1)) * 0.1).astype(np.float32)
    sizes = {}
    for name in ("adam", "adafactor"):
        model = pk.Sequential([pk.Input((256,)), pk.layers.Dense(256), pk.layers.Dense(1)])
        model.compile(optimizer=runs.optimizer_from_config(
            _train_config(optimizer=name, learning_rate=0.01)), loss="mse")
        history = model.fit(x, y, batch_size=64, epochs=4, verbose=0)
        losses = history.history["loss"]
        assert losses[-1] < 0.5 * losses[0], (name, losses)
        sizes[name] = sum(a.size for a in jax.tree.leaves(model.state.opt_state))
    # The 256 x 256 kernel's second moment is two vectors, not a matrix (and no first one).
    assert sizes["adafactor"] < 0.3 * sizes["adam"], sizes
    restored = pk.optimizers.deserialize(pk.optimizers.serialize(pk.optimizers.Adafactor(
        clip_threshold=2.0)))
    assert restored.clip_threshold == 2.0
    with pytest.raises(pk.ConfigError, match=r"beta_2_decay=0.5"):
        pk.optimizers.Adafactor(beta_2_decay=0.5)


def test_a_resumed_run_continues_metrics_jsonl_from_its_restored_step(tmp_path):
    x = np.random.default_rng(1).normal(size=(256, 4)).astype(np.float32)
    y = x.sum(1, keepdims=True)

    def fit(epochs):
        model = pk.Sequential([pk.Input((4,)), pk.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        model.fit(x, y, batch_size=32, epochs=epochs, verbose=0, log_every=3,
                  run_dir=tmp_path / "run", checkpoint=tmp_path / "ck")

    fit(2)
    path = tmp_path / "run" / "metrics.jsonl"
    # What a process killed after the checkpoint leaves: steps it will train again, and a
    # line cut short.
    with path.open("a") as f:
        f.write(json.dumps({"step": 17, "epoch": 2, "loss": 1.0}) + "\n")
        f.write('{"step": 18, "epo')
    fit(3)
    steps = [json.loads(line)["step"] for line in path.read_text().splitlines()
             if "loss" in json.loads(line)]
    assert steps == sorted(set(steps)), steps  # each step once, in order
    # Every window has its line, the epochs' last partial ones included (8 steps, logs at 3).
    assert steps == [3, 6, 8, 9, 12, 15, 16, 18, 21, 24], steps


def cli(*args, cwd):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PODKIT_")}
    return subprocess.run([sys.executable, "-m", "podkit.cli", *args], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=300)


def test_cli_step_runs_resume_with_changes_and_init_from(tmp_path):
    base = ["train", str(SEED), "--cpu-devices", "1", "--set", "train.steps_per_execution=10",
            "--set", "train.log_every=10", "--set", f"run.dir={tmp_path}"]
    first = [*base, "--set", "run.name=a", "--set", "train.eval_every=20",
             "--set", "train.eval_steps=2"]
    # Exactly train.steps, validated every eval_every steps and at the end.
    out = cli(*first, "--set", "train.steps=50", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    records = [json.loads(line) for line in
               (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [10, 20, 30, 40, 50], records
    assert [r["step"] for r in records if "val_loss" in r] == [20, 40, 50], records
    # A larger batch: the position is in steps of the old batch size. Refused, with the fix.
    out = cli(*first, "--set", "data.batch_size=64", "--set", "train.steps=70", cwd=tmp_path)
    assert out.returncode == 2
    assert ("data.batch_size changed from 32 to 64 since checkpoint step 50" in out.stderr
            and "Resume with data.batch_size = 32" in out.stderr), out.stderr[-2000:]
    # A new constant learning rate and more steps: applied, and said; the run goes on from
    # step 50 (inside its third interval) to 70, and metrics.jsonl continues.
    out = cli(*first, "--set", "train.learning_rate=0.01", "--set", "train.steps=70",
              cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "resume: train.learning_rate: 0.001 -> 0.01 (applied from step 50)" in out.stdout
    assert "resume: train.steps: 50 -> 70" in out.stdout
    records = [json.loads(line) for line in
               (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [10, 20, 30, 40, 50, 60, 70]
    model = pk.models.from_run(tmp_path / "a")
    assert model.optimizer.learning_rate == pytest.approx(0.01)
    assert model.optimizer.iterations == 70
    # Run again as it is: complete, nothing trained.
    out = cli(*first, "--set", "train.learning_rate=0.01", "--set", "train.steps=70",
              cwd=tmp_path)
    assert out.returncode == 0 and "is complete" in out.stdout, out.stdout[-2000:]
    # --init-from: a new run from run a's weights only.
    out = cli(*base, "--set", "run.name=b", "--set", "train.steps=10", "--init-from",
              str(tmp_path / "a"), cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "initialized from" in out.stdout and "its weights only" in out.stdout
    assert pk.models.from_run(tmp_path / "b").optimizer.iterations == 10
    out = cli(*base, "--set", "run.name=c", "--set", "train.steps=10", "--set",
              "model.hidden=[64]", "--init-from", str(tmp_path / "a"), cwd=tmp_path)
    assert out.returncode == 2 and "has shape" in out.stderr, out.stderr[-2000:]
    out = cli(*base, "--set", "run.name=a", "--set", "train.steps=80", "--init-from",
              str(tmp_path / "b"), cwd=tmp_path)
    assert out.returncode == 2 and "--init-from starts a new run" in out.stderr


def _rates(run_dir, after):
    """{step: the learning rate its step used} of metrics.jsonl's lines past `after`."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["learning_rate"] for r in records
            if r["step"] > after and "learning_rate" in r}


def test_a_resume_continues_a_changed_schedule_warmup_or_length_from_its_step(tmp_path):
    """Keras and MaxText users extend a cosine decay by resuming with more steps: the new
    schedule (its kind, warmup and length) continues from the restored step count, logged;
    a constant rate may become a schedule (one optimizer-state tree for both)."""
    base = ["train", str(SEED), "--cpu-devices", "1", "--set", "train.steps_per_execution=10",
            "--set", "train.log_every=10", "--set", "train.eval_every=20",
            "--set", "train.eval_steps=2", "--set", "train.learning_rate=0.01",
            "--set", f"run.dir={tmp_path}", "--set", "run.name=a"]
    run = tmp_path / "a"
    out = cli(*base, "--set", "train.steps=40", cwd=tmp_path)  # a constant rate
    assert out.returncode == 0, out.stderr[-3000:]

    def resumed(after, settings, **train):
        """Resume with `settings`; the rates logged past step `after`, checked against the
        new schedule (`train`) at the step count each step used."""
        out = cli(*base, *[a for k, v in settings.items() for a in ("--set", f"train.{k}={v}")],
                  cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-3000:]
        new = runs.schedule_from_config(_train_config(learning_rate=0.01, **train))
        rates = _rates(run, after)
        assert len(rates) >= 2, rates  # the first log point and the intervals' ends
        for step, rate in rates.items():  # step s is the optimizer's count s - 1
            assert rate == pytest.approx(float(new(step - 1)), rel=1e-5), (step, rates)
        return out.stdout, new, rates

    # Constant -> cosine with a warmup of 50 steps, to step 80: the warmup goes on at step 40.
    stdout, new, rates = resumed(40, {"schedule": '"cosine"', "warmup_steps": 50, "steps": 80},
                                 schedule="cosine", warmup_steps=50, steps=80)
    assert rates[50] == pytest.approx(0.01 * 49 / 50, rel=1e-5)
    assert ("podkit: resume: learning rate: warmup 50 steps, then cosine decay from 0.01 to "
            "0.001 at step 80 (was: constant 0.01), continued from the optimizer's step 40: "
            f"the next step's rate is {float(new(40)):.4g} (0.01 before)") in stdout, stdout
    # The decay horizon extended: 80 -> 120 steps; the old schedule is at its floor there.
    old = new
    stdout, new, rates = resumed(80, {"schedule": '"cosine"', "warmup_steps": 50,
                                      "steps": 120},
                                 schedule="cosine", warmup_steps=50, steps=120)
    assert all(rates[step] > 2 * float(old(step - 1)) for step in (90, 100)), rates
    assert ("learning rate: warmup 50 steps, then cosine decay from 0.01 to 0.001 at step "
            "120 (was: warmup 50 steps, then cosine decay from 0.01 to 0.001 at step 80), "
            "continued from the optimizer's step 80: the next step's rate is "
            f"{float(new(80)):.4g} (0.001 before)") in stdout, stdout
    # A longer warmup: 50 -> 130 steps, to step 140; the rate climbs again from step 120.
    stdout, new, rates = resumed(120, {"schedule": '"cosine"', "warmup_steps": 130,
                                       "steps": 140},
                                 schedule="cosine", warmup_steps=130, steps=140)
    assert rates[130] == pytest.approx(0.01 * 129 / 130, rel=1e-5)
    assert "podkit: resume: train.warmup_steps: 50 -> 130 (applied from step 120)" in stdout
    assert ("the next step's rate is 0.009231 (0.001 before)") in stdout, stdout
    model = pk.models.from_run(run)
    assert model.optimizer.iterations == 140
    assert model.optimizer.learning_rate == pytest.approx(float(new(140)))


def test_a_schedule_checkpoint_of_an_older_podkit_resumes(tmp_path):
    """Before a constant rate and a schedule had one optimizer-state tree, a schedule's state
    held its own copy of the step count (optax's): such a checkpoint resumes, that copy left
    unread, and the schedule continues from the optimizer's count."""
    import optax

    from podkit.optimizers import apply

    x = np.random.default_rng(3).normal(size=(64, 4)).astype(np.float32)
    y = x.sum(1, keepdims=True)
    schedule = pk.optimizers.schedules.CosineDecay(0.1, decay_steps=20)

    def fit(optimizer, epochs):
        model = pk.Sequential([pk.Input((4,)), pk.layers.Dense(1)])
        model.compile(optimizer=optimizer, loss="mse")
        model.fit(x, y, batch_size=16, epochs=epochs, verbose=0, checkpoint=tmp_path / "ck")
        return model

    def adam(learning_rate):  # pk.optimizers.Adam's transformation, in optax's injection
        return apply.keras_transform(pk.optimizers.Adam(), learning_rate, apply.Options())

    fit(optax.inject_hyperparams(adam)(learning_rate=schedule), 2)  # 8 steps
    model = fit(pk.optimizers.Adam(schedule), 3)
    assert model.optimizer.iterations == 12
    assert model.optimizer.learning_rate == pytest.approx(float(schedule(12)))
    used = pk.optimizers.learning_rate_of(model.state.opt_state)  # by the last step: count 11
    assert used == pytest.approx(float(schedule(11)))


def test_an_optimizer_state_of_an_older_podkit_is_named_and_its_weights_load(tmp_path):
    """Before issue 50, pk.optimizers.Adam was optax's scale_by_adam (another state): its
    checkpoint does not resume under Keras's Adam, with an error that says why and what to
    do; its weights still load."""
    import optax

    x = np.random.default_rng(3).normal(size=(64, 4)).astype(np.float32)
    y = x.sum(1, keepdims=True)

    def model_with(optimizer):
        model = pk.Sequential([pk.Input((4,)), pk.layers.Dense(1)])
        model.compile(optimizer=optimizer, loss="mse")
        return model

    def adam(learning_rate):  # what pk.optimizers.Adam(0.1).transform() was
        return optax.chain(optax.scale_by_adam(0.9, 0.999, 1e-7),
                           optax.scale_by_learning_rate(learning_rate))

    old = model_with(optax.inject_hyperparams(adam)(learning_rate=0.1))
    old.fit(x, y, batch_size=16, epochs=2, verbose=0, checkpoint=tmp_path / "ck")
    new = model_with(pk.optimizers.Adam(0.1))
    with pytest.raises(pk.InputError, match=r"Only the optimizer state differs.*older "
                                            r"podkit.*load_weights"):
        new.fit(x, y, batch_size=16, epochs=3, verbose=0, checkpoint=tmp_path / "ck")
    fresh = model_with(pk.optimizers.Adam(0.1))
    fresh.load_weights(tmp_path / "ck")
    for a, b in zip(fresh.get_weights(), old.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_progress_bar_of_a_step_run_counts_to_train_steps(tmp_path):
    """`podkit train` with train.steps: the bar counts the run's steps to train.steps (one
    validation interval of 50 steps, then the 20 left), and a resume starts it at its step."""
    import pty

    def bar(steps):
        main, sub = pty.openpty()  # a terminal: the live bar
        env = {k: v for k, v in os.environ.items() if not k.startswith("PODKIT_")}
        proc = subprocess.Popen(
            [sys.executable, "-m", "podkit.cli", "train", str(SEED), "--cpu-devices", "1",
             "--set", "train.steps_per_execution=10", "--set", "train.log_every=10",
             "--set", f"train.steps={steps}", "--set", f"run.dir={tmp_path}"],
            stdout=sub, stderr=subprocess.PIPE, cwd=tmp_path, env=env)
        os.close(sub)
        chunks = []
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the terminal's other end closed
                break
            if not chunk:
                break
            chunks.append(chunk)
        os.close(main)
        assert proc.wait(timeout=300) == 0, proc.stderr.read()[-3000:]
        proc.stderr.close()
        return b"".join(chunks).decode()

    out = bar(70)  # 45 batches per pass: an interval of 50 steps, then 20
    assert "Epoch 1/2" in out and "\r0/70 [........................] compiling" in out, out
    for step in (10, 50, 60, 70):
        assert f"\r{step}/70 [" in out, out
    assert "/50 [" not in out and "/45 [" not in out, out
    assert "\r70/70 [========================]" in out, out
    out = bar(90)  # resumed at step 70
    assert "\r70/90 [........................] compiling" in out, out
    assert "\r90/90 [========================]" in out and "\r0/90" not in out, out


def test_a_resume_at_an_epochs_last_step_writes_its_validation_line_once(tmp_path):
    """The checkpoint taken at an epoch's last step holds the data position inside that epoch:
    a resume finishes the epoch again, validation included; metrics.jsonl keeps one line."""
    x = np.random.default_rng(2).normal(size=(256, 4)).astype(np.float32)
    y = x.sum(1, keepdims=True)

    def fit(epochs):
        model = pk.Sequential([pk.Input((4,)), pk.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        model.fit(x[:192], y[:192], batch_size=32, epochs=epochs, verbose=0, log_every=3,
                  validation_data=(x[192:], y[192:]), run_dir=tmp_path / "run",
                  checkpoint=pk.checkpoint.CheckpointManager(tmp_path / "ck", every_steps=6))

    fit(1)
    fit(2)
    records = [json.loads(line) for line in
               (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    validated = [r["step"] for r in records if "val_loss" in r]
    assert validated == [6, 12], validated

"""[run] compile_cache: a run's restart loads its compiled programs instead of compiling them
(JAX's persistent cache under the run directory), and a changed program compiles anew."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def train(run_dir: Path, *sets: str, jax_dir: str | None = None,
          env: dict | None = None) -> subprocess.CompletedProcess:
    # Every program is cached here (JAX caches only those that compile for >= 1 s by default;
    # on a CPU the seed MLP's compile in well under that).
    extra, env = env, {k: v for k, v in os.environ.items()
                       if not k.startswith("PODKIT_") and k != "JAX_COMPILATION_CACHE_DIR"}
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    if jax_dir is not None:
        env["JAX_COMPILATION_CACHE_DIR"] = jax_dir
    env.update(extra or {})
    cmd = [sys.executable, "-m", "podkit.cli", "train", str(ROOT / "configs/seed_mlp.toml"),
           "--set", f"run.dir={run_dir}", "--set", "train.verbose=0"]
    for s in sets:
        cmd += ["--set", s]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)


def cache_line(proc: subprocess.CompletedProcess) -> tuple[int, int]:
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = re.search(r"compile cache: (\d+) programs loaded, (\d+) compiled", proc.stdout)
    assert found, proc.stdout[-2000:]
    return int(found[1]), int(found[2])


def test_a_restart_loads_what_the_first_run_compiled_and_a_changed_program_compiles(tmp_path):
    loaded, compiled = cache_line(train(tmp_path, "train.epochs=1"))
    assert loaded == 0 and compiled > 0
    cache = tmp_path / "seed_mlp" / "compile_cache"
    assert len(list(cache.glob("*-cache"))) == compiled  # one executable a program
    # The resume to 2 epochs: its programs are the first run's (a restore may add one)
    loaded, again = cache_line(train(tmp_path, "train.epochs=2"))
    assert loaded >= compiled - 1 and again <= 1, (loaded, again, compiled)
    # Another model (a wider layer) is another program: its steps miss and compile
    wider = train(tmp_path, "train.epochs=1", "run.name=wider", "model.hidden=[48]",
                  f"run.compile_cache={cache}")
    _, fresh = cache_line(wider)
    assert fresh >= 2


def test_none_turns_it_off_and_a_url_is_refused(tmp_path):
    off = train(tmp_path, "train.epochs=1", "run.compile_cache=none")
    assert off.returncode == 0 and "compile cache" not in off.stdout
    assert not (tmp_path / "seed_mlp" / "compile_cache").exists()
    # Where programs are kept is no part of what a checkpoint holds: a resume may turn it on
    on = train(tmp_path, "train.epochs=2")
    assert on.returncode == 0, on.stderr[-3000:]
    assert "run.compile_cache: 'none' -> ''" in on.stdout + on.stderr
    assert (tmp_path / "seed_mlp" / "compile_cache").is_dir()
    # JAX's own variable, set by the user, is where the run's default goes
    shared = train(tmp_path, "train.epochs=1", "run.name=shared", jax_dir=str(tmp_path / "jx"))
    assert shared.returncode == 0, shared.stderr[-3000:]
    assert f"({tmp_path / 'jx'})" in shared.stdout
    assert not (tmp_path / "shared" / "compile_cache").exists()
    url = train(tmp_path, "train.epochs=1", "run.compile_cache=ftp://host/cache")
    assert url.returncode != 0
    assert "run.compile_cache = 'ftp://host/cache'" in url.stderr


def test_a_cache_in_a_bucket_serves_another_machine(gcs, tmp_path):
    """gs:// (the GCS emulator; s3:// goes through the same path layer): the first machine's
    compiled programs go up, a second machine (another $PODKIT_CACHE) loads them."""
    import uuid

    from podkit import paths
    from storage_servers import BUCKET

    url = f"gs://{BUCKET}/cache-{uuid.uuid4().hex[:8]}"
    first = train(tmp_path, "train.epochs=1", f"run.compile_cache={url}",
                  env={"PODKIT_CACHE": str(tmp_path / "a")})
    loaded, compiled = cache_line(first)
    assert loaded == 0 and compiled > 0
    assert f"({url})" in first.stdout
    assert len([k for k in paths.listdir(url) if k.endswith("-cache")]) == compiled
    second = train(tmp_path / "b-runs", "train.epochs=1", f"run.compile_cache={url}",
                   env={"PODKIT_CACHE": str(tmp_path / "b")})
    loaded, again = cache_line(second)
    assert loaded >= compiled - 1 and again <= 1, (loaded, again, compiled)

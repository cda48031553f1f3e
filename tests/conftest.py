"""Every in-process test runs on 8 virtual CPU devices; one-device runs pick devices[:1]."""

import atexit
import importlib.util
import os
import shutil
import tempfile

import jax
import pytest

os.environ.setdefault("PODKIT_STAGE_BYTES", str(2 << 30))
# Keras 3 on JAX wherever a test (or a library a test imports: transformers, TensorFlow)
# imports it first: its backend is fixed at that first import.
os.environ.setdefault("KERAS_BACKEND", "jax")

# The same programs recur across tests (the tiny GPT under each strategy, built by a dozen
# tests; the same config trained by several CLI runs): XLA's compilation cache, for compiles
# over 0.5 s, cuts the suite by minutes. One cache for this process and every subprocess
# (multi-process jobs, CLI runs, SLURM tasks), through the environment they inherit; under
# pytest-xdist (`make test`: two worker processes) the workers share the cache their
# controller made, and the controller removes it at its exit. A size bound turns on JAX's
# file lock around every read and write of the cache (jax/_src/lru_cache.py): without it a
# process could read an entry another is still writing.
if os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get("PK_TESTS_XLA_CACHE"):
    _XLA_CACHE = os.environ["PK_TESTS_XLA_CACHE"]
else:
    _XLA_CACHE = os.environ["PK_TESTS_XLA_CACHE"] = tempfile.mkdtemp(prefix="podkit-tests-xla-")
    atexit.register(shutil.rmtree, _XLA_CACHE, ignore_errors=True)
os.environ["JAX_COMPILATION_CACHE_DIR"] = _XLA_CACHE
os.environ["JAX_COMPILATION_CACHE_MAX_SIZE"] = str(8 << 30)
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.5"
jax.config.update("jax_compilation_cache_dir", _XLA_CACHE)
jax.config.update("jax_compilation_cache_max_size", 8 << 30)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)

# XLA:CPU's cheapest code generation for every test and every process it starts (FAST_XLA,
# tests/helpers.py): compiling is most of this suite's time (measured: 2.4x less time for
# the GPT scan, Keras and planner files), and what the tests compare is podkit's work
# (programs, numbers against Keras and transformers, memory between programs compiled
# alike), not how XLA optimized them. A TPU host (libtpu installed: tests/test_tpu.py) and
# PK_TESTS_XLA_DEFAULTS=1 keep XLA's defaults.
from helpers import FAST_XLA  # noqa: E402

if importlib.util.find_spec("libtpu") is None and not os.environ.get("PK_TESTS_XLA_DEFAULTS"):
    if FAST_XLA not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {FAST_XLA}".strip()

import podkit as pk  # noqa: E402

pk.connect(cpu_devices=8)


# The longest files first (measured alone with FAST_XLA on 2 shared cores: 40 s to 2 minutes
# each; test_slurm.py mostly waits on SLURM): pytest-xdist hands out whole files in collection
# order (the Makefile's --no-loadscope-reorder: by default it hands out the files with the
# most tests first, which left these, of few tests each, to the end of the run), so a long
# file begun last would leave one worker finishing it while the other idles. Within a file
# the order is unchanged.
_LONGEST_FIRST = ("test_slurm.py", "test_configs_launch.py", "test_sharding.py",
                  "test_run_dir_urls.py", "test_runs.py", "test_text_files.py",
                  "test_step_runs.py", "test_checkpoint_jobs.py", "test_checkpoint.py",
                  "test_cli.py", "test_hf_runs.py", "test_submit.py", "test_models_zoo.py",
                  "test_launch.py", "test_termination.py", "test_report_doctor.py",
                  "test_data_lifecycle.py", "test_keras.py", "test_gpt_scan.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(_LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture(scope="session")
def digits():
    return pk.datasets.load_digits()



# Real storage servers on loopback (moto's S3, a GCS emulator), started once per session by
# the tests that ask for them.
from storage_servers import gcs, gcs_endpoint, s3, s3_endpoint  # noqa: E402, F401

"""`podkit train` under `podkit launch` with a slot the test breaks (tests/test_elastic.py).

    python elastic_train.py CTL_DIR CHECKPOINT_DIR -- PODKIT TRAIN ARGS...

Slot 1 of the first start (PODKIT_RESTART=0) dies (exit 1) at step 10, once the checkpoint of
step 8 is committed: a failure after a checkpoint. Later, slot 1 exits 7 at once while
CTL_DIR/broken exists (a host that keeps failing). A start on one process removes that file
(the host is back) and sleeps 0.2 s after each step, so that the launcher's --grow-after
probe finds it training.
"""

import os
import sys
import time
from pathlib import Path

ctl, ckpt = Path(sys.argv[1]), Path(sys.argv[2])
args = sys.argv[sys.argv.index("--") + 1:]
slot = int(os.environ["PODKIT_LAUNCH_SLOT"])
restart = int(os.environ["PODKIT_RESTART"])
alone = os.environ["PODKIT_NUM_PROCESSES"] == "1"
with open(ctl / "starts.txt", "a") as f:
    f.write(f"{restart} {slot} {os.environ['PODKIT_NUM_PROCESSES']}\n")
if slot == 1 and restart > 0 and (ctl / "broken").exists():
    sys.exit(7)

from podkit import runs  # noqa: E402  (after the cheap exit: no JAX for a broken slot)
from podkit.train.hooks import Callback  # noqa: E402


class Fault(Callback):
    def on_train_batch_end(self, batch, logs=None):
        if alone:
            time.sleep(0.2)
            return
        if slot == 1 and restart == 0 and int(self.model.state.step) >= 10:
            commit = ckpt / "step_0000000008" / "COMMIT.json"
            deadline = time.monotonic() + 120
            while not commit.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            os._exit(1)


if alone:
    (ctl / "broken").unlink(missing_ok=True)
plain = runs.RunLength.callbacks
runs.RunLength.callbacks = lambda self: [*plain(self), Fault()]

from podkit.cli import main  # noqa: E402

sys.exit(main(args))

"""`podkit doctor RUN_DIR`: what held a run back, with the change that would help.

    for finding in doctor.diagnose(records.load("runs/gpt_small")):
        print(finding)

Each finding has a severity, what was measured, and advice. The checks, on the run's
records (podkit.monitor.records):

- input-bound: the devices waited for input (the timeline's input share of the wall time,
  or the loop's input_wait) -> more pipeline parallelism, prefetch, cache, or less per-element
  Python work;
- recompiles -> their causes, and one shape and dtype;
- compile-dominated: compiling took a large share of the run -> the persistent compilation
  cache, or a longer run;
- host-bound: the devices sat idle for reasons other than input, compiling or checkpoints
  (Python between steps) -> steps_per_execution;
- low MFU on an accelerator with busy devices -> a larger per-device batch;
- checkpoint stalls -> save less often;
- memory pressure (peak near the device's limit) -> FSDP, remat, a smaller batch;
- restarts -> their cost in time: the steps done again (lost), the time no process ran
  (down), and the new processes' startup and restore.

Shares are of the run's wall time across its restarts (podkit.monitor.wall_time): from its
first process's start to its last record.
"""

from __future__ import annotations

import dataclasses

from podkit.monitor.records import PARTS, RunRecords

INPUT_BOUND = 0.15  # share of the wall time the devices waited for input
COMPILE_HEAVY = 0.25
HOST_BOUND = 0.25
CHECKPOINT_HEAVY = 0.10
LOW_MFU = 0.30
MEMORY_PRESSURE = 0.90


@dataclasses.dataclass(frozen=True)
class Finding:
    severity: str  # "problem", "warning" or "ok"
    title: str  # "input-bound"
    measured: str
    advice: str

    def __str__(self) -> str:
        return f"[{self.severity}] {self.title}: {self.measured}\n    -> {self.advice}"


def diagnose(run: RunRecords) -> list[Finding]:
    """Findings, the most costly first; one "ok" finding when nothing stands out."""
    out: list[Finding] = []
    if not run.points:
        return [Finding("warning", "no log points", f"{run.path}/metrics.jsonl holds no "
                        "step records", "train at least one logged step (log_every)")]
    split = run.time_split()
    wall = sum(split.values()) or 1e-9
    share = {k: v / wall for k, v in split.items()}
    last = run.points[-1]
    waits = [p.get("input_wait", 0.0) for p in run.points[len(run.points) // 2:]]
    input_wait = sum(waits) / max(len(waits), 1)
    # The devices' idle time for input decides; the loop's own wait counts only for records
    # without the time split (the loop can wait while the devices still compute).
    timed = any("time/productive_s" in p for p in run.points)
    if share["input"] > INPUT_BOUND or (not timed and input_wait > INPUT_BOUND):
        out.append(Finding(
            "problem", "input-bound",
            f"the devices waited for input {share['input']:.0%} of the run's time (the loop "
            f"waited {input_wait:.0%} of the latest windows)",
            "feed faster: Dataset.map(fn, num_parallel_calls=pk.data.AUTOTUNE) and "
            ".prefetch(pk.data.AUTOTUNE), .cache() after expensive decoding, input worker "
            "processes for Python-heavy maps, or less Python per element (vectorize with "
            "a batched map)"))
    if run.recompiles:
        causes = "; ".join(f"{r.get('kind')} at {r.get('context')}: "
                           f"{', '.join(r.get('changes') or ['sharding or device'])}"
                           for r in run.recompiles[:3])
        if len(run.recompiles) > 3:
            causes += f"; and {len(run.recompiles) - 3} more (recompiles.json)"
        changes = " ".join(c for r in run.recompiles for c in r.get("changes") or [])
        advice = ("keep one shape and dtype per step: cast inputs once, pad or bucket "
                  "variable lengths (padded_batch, bucket_by_sequence_length), one batch "
                  "size; compile(strict_recompiles=True) turns the next one into an error at "
                  "its cause")
        if "steps_per_execution does not divide" in changes:
            advice = ("choose steps_per_execution to divide the steps of an epoch (or "
                      "fit(steps_per_epoch=...) a multiple of it): the short last execution "
                      "of each epoch is a second program; " + advice)
        out.append(Finding(
            "problem", "recompiles", f"{len(run.recompiles)} recompile(s) of a step: {causes}",
            advice))
    if share["compile"] > COMPILE_HEAVY:
        out.append(Finding(
            "warning", "compile-dominated",
            f"compiling took {share['compile']:.0%} of the run ({split['compile']:.1f} s)",
            "for repeated short runs, keep compiled programs across processes: "
            "jax.config.update('jax_compilation_cache_dir', PATH); a longer run amortizes it"))
    if share["other"] > HOST_BOUND:
        out.append(Finding(
            "problem", "host-bound",
            f"the devices sat idle {share['other']:.0%} of the run while the host did "
            "other work (Python between steps: callbacks, logging, dispatch)",
            "run more steps per device call: compile(steps_per_execution=k) (k = 10-100 "
            "for small models); fewer per-batch callbacks"))
    if share["checkpoint"] > CHECKPOINT_HEAVY:
        out.append(Finding(
            "warning", "checkpoint stalls",
            f"the loop waited on checkpoints {share['checkpoint']:.0%} of the run",
            "save less often (every_steps / every_seconds), keep async_save on"))
    mfu = last.get("mfu")
    accelerator = isinstance(last.get("memory_limit_gib"), int | float)
    if mfu is not None and accelerator and mfu < LOW_MFU and share["productive"] > 0.7:
        out.append(Finding(
            "warning", "low MFU",
            f"MFU {mfu:.0%} with the devices busy {share['productive']:.0%} of the time",
            "a larger per-device batch (raise the batch or use fewer data-parallel devices), "
            "bfloat16 compute (precision='mixed_bfloat16'), fused kernels (attention='splash' "
            "on TPU)"))
    peak, limit = last.get("memory_peak_gib"), last.get("memory_limit_gib")
    if isinstance(peak, int | float) and isinstance(limit, int | float) and limit > 0 and \
            peak / limit > MEMORY_PRESSURE:
        out.append(Finding(
            "warning", "memory pressure",
            f"peak device memory {peak:.2f} GiB of {limit:.2f} GiB ({peak / limit:.0%})",
            "shard parameters and optimizer state (strategy FSDP), recompute activations "
            "(remat), or a smaller per-device batch with compile(microbatches=m)"))
    restarts = run.restarts()
    account = run.wall_time()
    if restarts and account is not None:
        later = [f for a, f in zip(account.fits, account.fits[1:], strict=False)
                 if a.process != f.process]
        again = sum(f.parts.get("startup", 0.0) + f.parts["restore"] for f in later)
        cost = split["lost"] + split["down"] + again
        out.append(Finding(
            "warning", "restarts",
            f"{restarts} restart(s) cost {_s(cost)} ({cost / wall:.0%} of the run): "
            f"{_s(split['lost'])} of {account.lost_steps} steps done again, "
            f"{_s(split['down'])} with no process running, {_s(again)} of the new "
            "processes' startup and restore",
            "save more often (a local tier) to lose fewer steps, keep the compilation cache "
            "for a faster start, and look at what failed (the launcher's log in the run "
            "directory)"))
    elif split["down"] > 0:  # records without fits.jsonl: the gaps between fits
        out.append(Finding(
            "warning", "restarts",
            f"{restarts} restart(s) or resumed fit(s) cost {split['down']:.1f} s "
            f"({share['down']:.0%} of the run)",
            "save more often to lose fewer steps, and look at what failed (the launcher's "
            "log in the run directory)"))
    good = run.goodput()
    summary = ", ".join(f"{k} {share[k]:.0%}" for k in PARTS if share[k])
    if not out:
        out.append(Finding("ok", "nothing stands out",
                           f"goodput {good:.0%} ({summary})" if good is not None else summary,
                           "nothing to change"))
    return out


def _s(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds >= 1 else f"{seconds:.2f} s"


def summary_line(run: RunRecords) -> str:
    good = run.goodput()
    last = run.points[-1] if run.points else {}
    parts = [f"run {run.name}: step {last.get('step', 0)}"]
    account = run.wall_time()
    if good is not None and account is not None:  # the same figure as report.html's
        parts.append(f"goodput {good:.0%} of {account.wall:.0f} s of wall time across "
                     f"{account.restarts} restart(s)")
        # An elastic run's process count per start (podkit launch --min-processes).
        counts = [f.processes for i, f in enumerate(account.fits)
                  if not i or f.process != account.fits[i - 1].process]
        if len(set(counts)) > 1 and None not in counts:
            parts.append(f"processes per start {' -> '.join(map(str, counts))}")
    elif good is not None:
        parts.append(f"goodput {good:.0%}")
    if last.get("mfu") is not None:
        parts.append(f"MFU {last['mfu']:.1%}")
    if last.get("samples_per_s"):
        parts.append(f"{last['samples_per_s']:,.0f} samples/s")
    return ", ".join(parts)

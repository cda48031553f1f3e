"""`podkit report RUN_DIR`: one self-contained `report.html` of a run, plots embedded.

    path = report.write("runs/gpt_small")       # RUN_DIR/report.html

Sections: the run (model, strategy, devices, versions), the doctor's findings
(podkit.monitor.doctor), loss and metric curves (training windows and validation),
throughput (samples/s or tokens/s, MFU), where the time went (the run's wall time across its
restarts by part, as a bar, a table and one bar per process: startup, the loop's productive,
compile, restore, checkpoint, input, validation and other seconds, lost steps, down time; and
a stacked area of each log window's split), recompiles and their causes, device memory.
Plots are matplotlib PNGs inlined as data URIs: the file opens anywhere, offline, with
nothing beside it.
"""

from __future__ import annotations

import base64
import html
import io
import os
from pathlib import Path
from typing import Any

from podkit import paths
from podkit.monitor import doctor
from podkit.monitor.records import TIME_PARTS, RunRecords, load
from podkit.monitor.wall_time import PARTS, WallTime

COLORS = {"productive": "#2e7d32", "compile": "#6a1b9a", "restore": "#4e342e",
          "checkpoint": "#1565c0", "input": "#ef6c00", "validation": "#00838f",
          "other": "#9e9e9e", "startup": "#f9a825", "lost": "#ad1457", "down": "#c62828",
          "idle": "#e0e0e0"}
MEANING = {
    "productive": "the devices computing steps that were kept",
    "compile": "compiling (and waiting for the state's initialization)",
    "restore": "reading the checkpoint a process resumed from",
    "checkpoint": "the loop blocked on saves",
    "input": "the devices waiting for input",
    "validation": "validating",
    "other": "the host between steps (callbacks, logging, dispatch)",
    "startup": "process start to its loop: interpreter, imports, connect, data, model",
    "lost": "steps computed past the checkpoint a restart resumed from (done again)",
    "down": "from a failed process's last record to the next process's start",
    "idle": "a process between two of its fit() calls",
}
SKIP = {"step", "epoch", "time", "samples_per_s", "input_wait", "steps_in_epoch", "memory",
        "grad_norm", "learning_rate", "step_time_s", "tokens_per_s", "mfu", "device_idle",
        "goodput", "compiles", "compile_s", "recompiles", "checkpoint_s"}


def _figure(width: float = 7.0, height: float = 3.2) -> Any:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(width, height), dpi=100)
    ax.grid(alpha=0.3)
    return fig, ax


def _png(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _metric_keys(run: RunRecords) -> list[str]:
    keys: list[str] = []
    for p in run.points:
        for k, v in p.items():
            if k not in SKIP and not k.startswith("time/") and not k.startswith("memory_") \
                    and isinstance(v, int | float) and k not in keys:
                keys.append(k)
    return keys


def _curves(run: RunRecords) -> list[tuple[str, str]]:
    plots = []
    for key in _metric_keys(run):
        fig, ax = _figure()
        steps = [p["step"] for p in run.points if key in p]
        ax.plot(steps, [p[key] for p in run.points if key in p], label=f"train {key}",
                color="#1565c0")
        val = [(v["step"], v[f"val_{key}"]) for v in run.validations
               if f"val_{key}" in v and v.get("step") is not None]
        if val:
            ax.plot(*zip(*val, strict=True), "o-", label=f"validation {key}", color="#c62828")
        ax.set_xlabel("step")
        ax.set_ylabel(key)
        ax.legend()
        plots.append((key, _png(fig)))
    return plots


def _throughput(run: RunRecords) -> str | None:
    key = "tokens_per_s" if any("tokens_per_s" in p for p in run.points) else "samples_per_s"
    points = [p for p in run.points if key in p]
    if not points:
        return None
    fig, ax = _figure()
    ax.plot([p["step"] for p in points], [p[key] for p in points], color="#2e7d32")
    ax.set_xlabel("step")
    ax.set_ylabel(key.replace("_per_s", "/s"))
    mfu = [p for p in points if p.get("mfu") is not None]
    if mfu:
        right = ax.twinx()
        right.plot([p["step"] for p in mfu], [100 * p["mfu"] for p in mfu], color="#6a1b9a",
                   linestyle="--")
        right.set_ylabel("MFU %", color="#6a1b9a")
    return _png(fig)


def _breakdown(run: RunRecords) -> str | None:
    """A stacked area of each window's seconds by where they went."""
    rows = []
    for segment in run.segments():
        previous = dict.fromkeys(TIME_PARTS, 0.0)
        for p in segment:
            if "time/productive_s" not in p:
                continue
            now = {k: p.get(f"time/{k}_s", 0.0) for k in TIME_PARTS}
            rows.append((p["step"], {k: max(now[k] - previous[k], 0.0) for k in TIME_PARTS}))
            previous = now
    if not rows:
        return None
    fig, ax = _figure()
    steps = list(range(len(rows)))
    ax.stackplot(steps, *[[r[1][k] for r in rows] for k in TIME_PARTS], labels=TIME_PARTS,
                 colors=[COLORS[k] for k in TIME_PARTS], alpha=0.85)
    ticks = steps[:: max(len(steps) // 8, 1)]
    ax.set_xticks(ticks, [str(rows[i][0]) for i in ticks])
    ax.set_xlabel("log point (step)")
    ax.set_ylabel("seconds in the window")
    ax.legend(loc="upper right", fontsize=7, ncol=3)
    return _png(fig)


def _goodput(run: RunRecords) -> str | None:
    split = run.time_split()
    total = sum(split.values())
    if total <= 0:
        return None
    fig, ax = _figure(7.0, 2.0)
    left = 0.0
    for key, seconds in split.items():
        if seconds <= 0:
            continue
        ax.barh([0], [seconds / total * 100], left=left, color=COLORS[key], label=key)
        left += seconds / total * 100
    ax.set_xlim(0, 100)
    ax.set_yticks([])
    ax.set_xlabel("% of the run's wall time")
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.02), ncol=6, fontsize=7)
    return _png(fig)


def _per_process(wall: WallTime) -> str:
    """One bar per fit (a process's loop), its seconds by part, then the down time before
    the next process started."""
    fig, ax = _figure(7.0, 1.6 + 0.45 * len(wall.fits))
    order = ("startup", "idle", "restore", "compile", "productive", "checkpoint", "input",
             "validation", "other", "lost")
    seen: set[str] = set()
    for row, fit in enumerate(wall.fits):
        left = 0.0
        for key, seconds in [(k, fit.parts.get(k, 0.0)) for k in order] + [
                ("down", fit.down_after)]:
            if seconds <= 0:
                continue
            ax.barh([row], [seconds], left=left, color=COLORS[key],
                    label=None if key in seen else key)
            seen.add(key)
            left += seconds
    ax.set_yticks(range(len(wall.fits)),
                  [f"{f.process} from step {f.first_step}" for f in wall.fits], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.02), ncol=6, fontsize=7)
    return _png(fig)


def _restarts_table(wall: WallTime) -> str:
    """The run's parts (seconds and share of the wall time), and each fit's."""
    e = html.escape
    total = sum(wall.parts.values()) or 1e-9
    rows = "".join(
        f"<tr><th>{e(k)}</th><td>{wall.parts[k]:.2f} s</td><td>{wall.parts[k] / total:.1%}"
        f"</td><td class='note'>{e(MEANING[k])}</td></tr>" for k in PARTS if wall.parts[k] > 0)
    rows += (f"<tr><th>wall time</th><td>{wall.wall:.2f} s</td><td>100%</td><td class='note'>"
             "first process's start to the last record</td></tr>")
    head = ["process", "processes", "steps", "startup", "restore", "compile", "productive",
            "lost", "lost steps", "down after", "ended"]
    fits = "".join(
        "<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in (
            f.process, "?" if f.processes is None else f.processes,
            f"{f.first_step}-{f.last_step}",
            f"{f.parts.get('startup', 0.0) + f.parts.get('idle', 0.0):.2f}",
            f"{f.parts['restore']:.2f}", f"{f.parts['compile']:.2f}",
            f"{f.parts['productive']:.2f}", f"{f.parts['lost']:.2f}", f.lost_steps,
            f"{f.down_after:.2f}", "yes" if f.ended else "no (killed, or running)")) + "</tr>"
        for f in wall.fits)
    # Starts on fewer processes than the run was set for, and what they changed.
    notes = "".join(f"<li>{e(f.process)} from step {f.first_step}: {e(f.elastic)}</li>"
                    for f in wall.fits if f.elastic)
    return (f"<p>goodput {wall.goodput:.1%} over {wall.wall:.1f} s of wall time, "
            f"{wall.restarts} restart(s), {wall.lost_steps} step(s) done again</p>"
            f"<table>{rows}</table><h3>each process</h3><table><tr>"
            + "".join(f"<th>{e(h)}</th>" for h in head) + f"</tr>{fits}</table>"
            + (f"<h3>elastic starts</h3><ul>{notes}</ul>" if notes else ""))


def _memory(run: RunRecords) -> str | None:
    points = [p for p in run.points if isinstance(p.get("memory_in_use_gib"), int | float)]
    if not points:
        return None
    fig, ax = _figure()
    steps = [p["step"] for p in points]
    for key, color in (("memory_in_use_gib", "#1565c0"), ("memory_peak_gib", "#c62828"),
                       ("memory_limit_gib", "#000000")):
        if key in points[0]:
            ax.plot(steps, [p.get(key) for p in points], label=key.removeprefix("memory_"),
                    color=color)
    ax.set_xlabel("step")
    ax.set_ylabel("GiB per device")
    ax.legend()
    return _png(fig)


def _img(title: str, src: str | None, missing: str) -> str:
    if src is None:
        return f"<h3>{html.escape(title)}</h3><p class='note'>{html.escape(missing)}</p>"
    return (f"<h3>{html.escape(title)}</h3><img class='plot' alt='{html.escape(title)}' "
            f"src='{src}'>")


def render(run: RunRecords) -> str:
    """The report's HTML."""
    e = html.escape
    meta = run.meta
    last = run.points[-1] if run.points else {}
    facts = {
        "model": meta.get("model"), "strategy": meta.get("strategy"),
        "devices": meta.get("devices"), "processes": meta.get("processes"),
        "podkit": meta.get("podkit"), "jax": meta.get("jax"),
        "last step": last.get("step"), "goodput": f"{run.goodput():.1%}"
        if run.goodput() is not None else None,
        "MFU (last window)": f"{last['mfu']:.2%}" if last.get("mfu") is not None else None,
        "compiles": last.get("compiles"),
        "compile seconds": f"{last['compile_s']:.1f}" if isinstance(last.get("compile_s"),
                                                                     int | float) else None,
        "memory": last.get("memory"),
    }
    facts_html = "".join(f"<tr><th>{e(k)}</th><td>{e(str(v))}</td></tr>"
                         for k, v in facts.items() if v is not None)
    final_html = "".join(f"<tr><th>{e(k)}</th><td>{v:.6g}</td></tr>" for k, v in
                         run.final.items() if isinstance(v, int | float))
    findings = "".join(
        f"<li class='{e(f.severity)}'><b>{e(f.title)}</b>: {e(f.measured)}<br>"
        f"<span class='advice'>&rarr; {e(f.advice)}</span></li>" for f in doctor.diagnose(run))
    recompiles = "".join(
        f"<li>{e(str(r.get('kind')))} step at {e(str(r.get('context')))}: "
        f"{e('; '.join(r.get('changes') or ['no shape or dtype changed']))}</li>"
        for r in run.recompiles) or "<li>none</li>"
    curves = "".join(_img(f"{key}", src, "") for key, src in _curves(run))
    wall = run.wall_time()
    restarts = ("<h3>Goodput across restarts</h3>" + _restarts_table(wall) + _img(
        "seconds by process", _per_process(wall), "") if wall is not None else "")
    sections = [
        f"<h1>podkit run {e(run.name)}</h1><p class='note'>{e(str(run.path))}</p>",
        f"<table>{facts_html}</table>",
        f"<h2>Diagnosis</h2><ul class='findings'>{findings}</ul>",
        f"<h2>Loss and metrics</h2>{curves or '<p>no log points</p>'}",
        "<h2>Final</h2>" + (f"<table>{final_html}</table>" if final_html else
                            "<p class='note'>the run has not finished an epoch</p>"),
        "<h2>Throughput</h2>" + _img("throughput and MFU", _throughput(run),
                                     "no throughput recorded"),
        "<h2>Where the time went</h2>" + _img("goodput", _goodput(run), "no timeline "
                                              "recorded") + restarts + _img(
            "step-time breakdown per log window", _breakdown(run), "no timeline recorded"),
        f"<h2>Recompiles</h2><ul>{recompiles}</ul>",
        "<h2>Memory</h2>" + _img("device memory", _memory(run),
                                 str(last.get('memory', 'not reported'))),
    ]
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>podkit run {e(run.name)}</title>
<style>
body {{ font-family: sans-serif; max-width: 60em; margin: 2em auto; color: #222; }}
table {{ border-collapse: collapse; }} th, td {{ text-align: left; padding: 2px 12px; }}
th {{ color: #555; font-weight: normal; }} .note {{ color: #777; }}
img.plot {{ display: block; max-width: 100%; margin: 0.5em 0 1.5em; }}
.findings li {{ margin: 0.4em 0; }} .problem b {{ color: #c62828; }}
.warning b {{ color: #ef6c00; }} .ok b {{ color: #2e7d32; }} .advice {{ color: #444; }}
</style></head><body>
{"".join(sections)}
<script>
// A self-check a headless browser can read: every plot decoded and laid out.
window.addEventListener("load", function () {{
  var imgs = Array.from(document.querySelectorAll("img.plot"));
  var ok = imgs.filter(function (i) {{ return i.complete && i.naturalWidth > 0
    && i.getBoundingClientRect().height > 0; }}).length;
  document.body.setAttribute("data-plots", ok + "/" + imgs.length);
}});
</script>
</body></html>
"""


def write(run_dir: str | Path, out: str | Path | None = None) -> Path | str:
    """Render RUN_DIR's report to `out` (default RUN_DIR/report.html; gs:// and s3:// too);
    returns the path."""
    run = load(run_dir)
    target = out if out is not None else run.path / "report.html"
    with paths.open(target, "w") as f:  # whole or not at all; a URL is uploaded
        f.write(render(run))
    return os.fspath(target) if paths.is_url(target) else Path(target)

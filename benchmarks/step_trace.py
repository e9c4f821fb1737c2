"""A level's slow steps, from the engines' own step records (``GET /debug/steps``;
omni_ray/stages/step_trace.py), and which talker steps released the requests' first audio.

The step profile (benchmarks/step_profile.py) gives a level's mean step. At c=32 the first audio
came in tiers (session 19): the talker's part 25-87 ms for the first requests of a burst, ~270
ms for the next and ~900 ms for the last 20, all of the last 20 out at the same moment. A mean
of 36 ms a step says nothing of which step that was. Here:

* ``slowest``: a stage's slowest steps in the level, each with its start (seconds after the
  level's first request), rows, what it sent, the commands applied before it and the runner's
  parts (the talker's: admit, engine, code predictor, text, logits, rest in ms; what vLLM's
  scheduler gave it: ``sched_tokens``, ``sched_prompt_tokens``, ``sched_new``, ``sched_held``,
  ``sched_waiting``);
* ``releases``: the requests' first chunks out of a stage (its ``first_down`` milestone),
  grouped by the step that sent them, each group with that step and how long its requests had
  waited in the stage (``first_in`` to ``first_down``). The engine stamps ``first_down`` inside
  the step that made the chunk (``StageEngine._dispatch``), so that step is the last one that
  began before the stamp;
* ``opening``: with a closed loop of C clients, every talker step from the level's start until
  the first C requests all had their first chunk out: the burst, step by step.

Needs ``security.enable_debug_endpoints: true``; without it ``fetch`` returns None.
"""

from __future__ import annotations

import bisect
import statistics

import httpx

STAGES = ("thinker", "talker", "code2wav")
SLOWEST = 5  # steps listed per stage
SAMPLES = 12  # calls per stage: a stage with two replicas is seen whole but with p = 2^-11
FULL_EXTRA = 8  # more full fetches at most, for an engine a probe found
OPENING_CAP = 400  # steps kept of a level's opening burst


def fetch(url: str, since: float, stages=STAGES, samples: int = SAMPLES,
          headers: dict | None = None) -> dict[str, list[dict]] | None:
    """``{stage: steps}`` that began at or after wall time ``since``, each replica's steps
    merged in time order. Each GET reaches one replica, chosen by Serve: the first fetches the
    steps, the next ``samples - 1`` only probe for another engine (one step each), and a new one
    is fetched whole (at most ``FULL_EXTRA`` more GETs)."""
    out: dict[str, list[dict]] = {}
    for stage in stages:
        by_engine: dict[str, list[dict]] = {}
        pending: set[str] = set()  # engines a probe found, not yet fetched whole
        for i in range(samples + FULL_EXTRA):
            if i >= samples and not pending:
                break
            full = not by_engine or bool(pending)
            r = httpx.get(f"{url}/debug/steps", headers=headers, timeout=60,
                          params=dict(stage=stage, since=since, limit=8192 if full else 1))
            if r.status_code == 404:
                return None
            if r.status_code == 400:  # a stage this app does not run (text only)
                break
            r.raise_for_status()
            got = r.json()
            engine = got["actor_id"]
            if full:
                by_engine[engine] = [dict(s, engine=engine) for s in got["steps"]]
                pending.discard(engine)
            elif engine not in by_engine:
                pending.add(engine)
        if by_engine:
            out[stage] = sorted((s for steps in by_engine.values() for s in steps),
                                key=lambda s: s["t"])
    return out


def _brief(step: dict, t_ref: float) -> dict:
    return dict(at_s=round(step["t"] - t_ref, 3), ms=round(step["ms"], 1), rows=step["rows"],
                emits=step["emits"], cmds=step["cmds"], cmds_ms=round(step["cmds_ms"], 1),
                parts={k: round(v, 1) for k, v in step["parts"].items()})


def stage_summary(steps: list[dict], t_ref: float, k: int = SLOWEST) -> dict:
    """Step length p50 / p99 / max (ms) and the ``k`` slowest steps; for a stage whose runner
    counts its forwards' new shapes (code2wav), ``new_shapes``: the steps that ran one beside
    those that did not."""
    ms = sorted(s["ms"] for s in steps)
    if not ms:
        return dict(steps=0)
    out = dict(steps=len(ms), ms_p50=round(statistics.median(ms), 2),
               ms_p99=round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 2),
               ms_max=round(ms[-1], 2),
               slowest=[_brief(s, t_ref) for s in sorted(steps, key=lambda s: -s["ms"])[:k]])
    if any("forwards" in s["parts"] for s in steps):
        out["new_shapes"] = shape_split(steps)
    return out


def shape_split(steps: list[dict]) -> dict:
    """The steps whose forward met a (batch, frames) the runner had not run before against the
    other steps with a forward, and the steps that replayed a padded forward's CUDA graph
    (code2wav_step_graphs.py): count and p50 / mean ms of each (None for none)."""
    new = [s["ms"] for s in steps if s["parts"].get("new_shapes")]
    seen = [s["ms"] for s in steps if s["parts"].get("forwards") and
            not s["parts"].get("new_shapes")]
    graphed = [s["ms"] for s in steps if s["parts"].get("graph_steps")]

    def stats(xs):
        return dict(steps=len(xs), ms_p50=round(statistics.median(xs), 2) if xs else None,
                    ms_mean=round(statistics.fmean(xs), 2) if xs else None)

    return dict(new=stats(new), seen=stats(seen), graphed=stats(graphed))


def releases(steps: list[dict], marks: list[dict], stage: str, t_ref: float) -> list[dict]:
    """The requests' first chunks out of ``stage`` grouped by the step that sent them (see the
    module doc), in time order: that step, how many it released and their wait in the stage
    (``first_in`` -> ``first_down``, ms: min / max)."""
    senders = [s for s in steps if s["emits"]]
    starts = [s["t"] for s in senders]
    groups: dict[int, list[float]] = {}
    for m in marks:
        st = m.get(stage) or {}
        down, first_in = st.get("first_down"), st.get("first_in", st.get("added"))
        if down is None or first_in is None:
            continue
        i = bisect.bisect_right(starts, down) - 1
        if i >= 0:
            groups.setdefault(i, []).append(1e3 * (down - first_in))
    return [dict(step=_brief(senders[i], t_ref), released=len(w), waited_ms_min=round(min(w), 1),
                 waited_ms_max=round(max(w), 1))
            for i, w in sorted(groups.items())]


def opening(steps: list[dict], marks: list[dict], burst: int, t_ref: float,
            stage: str = "talker", cap: int = OPENING_CAP) -> list[dict]:
    """``stage``'s steps from the level's start until the first ``burst`` requests (by
    arrival at the ingress) all had their first chunk out of it: every step of the opening
    burst, in order (at most ``cap``)."""
    first = sorted((m for m in marks if "received" in m.get("ingress", {})),
                   key=lambda m: m["ingress"]["received"])[:burst]
    downs = [m[stage]["first_down"] for m in first if "first_down" in m.get(stage, {})]
    if not downs:
        return []
    end = max(downs)
    return [_brief(s, t_ref) for s in steps if s["t"] <= end][:cap]


def summarize(trace: dict[str, list[dict]] | None, marks: list[dict], t_ref: float,
              burst: int | None = None) -> dict | None:
    """Per stage ``stage_summary``, the talker's ``releases`` (the stage whose first chunk came
    in tiers) and, for a closed loop of ``burst`` clients, its ``opening`` steps."""
    if trace is None:
        return None
    out = {stage: stage_summary(steps, t_ref) for stage, steps in trace.items()}
    if "talker" in trace:
        out["talker_releases"] = releases(trace["talker"], marks, "talker", t_ref)
        if burst:
            out["talker_opening"] = opening(trace["talker"], marks, burst, t_ref)
    return out


def _parts(p: dict) -> str:
    keys = [k for k in p if k.endswith("_ms") and p[k] >= 1] + \
        [k for k in ("sched_tokens", "sched_prompt_tokens", "sched_new", "sched_held",
                     "sched_waiting", "prefills", "frames", "new_shapes") if p.get(k)]
    return " ".join(f"{k.removesuffix('_ms')} {p[k]:.0f}" for k in keys)


def slow_line(summary: dict) -> str:
    """One line: per stage p50 / max step and the slowest step's make-up."""
    out = []
    for stage in STAGES:
        s = summary.get(stage)
        if not s or not s.get("steps"):
            continue
        top = s["slowest"][0]
        out.append(f"{stage} p50 {s['ms_p50']:.1f} max {s['ms_max']:.0f} ms at +{top['at_s']:.2f}s "
                   f"({top['rows']} rows, {top['cmds']} cmds {top['cmds_ms']:.0f} ms"
                   + (f"; {_parts(top['parts'])}" if top["parts"] else "") + ")")
    return "; ".join(out)


def releases_line(summary: dict, limit: int = 8) -> str:
    """One line: the talker steps that released first chunks, the biggest ``limit`` groups in
    time order: ``20 @ +1.20s (step 640 ms, 14 rows, waited 870-965)``."""
    rel = summary.get("talker_releases") or []
    big = sorted(sorted(rel, key=lambda g: -g["released"])[:limit], key=lambda g: g["step"]["at_s"])
    return ", ".join(f"{g['released']} @ +{g['step']['at_s']:.2f}s (step {g['step']['ms']:.0f} "
                     f"ms, {g['step']['rows']} rows, waited {g['waited_ms_min']:.0f}-"
                     f"{g['waited_ms_max']:.0f} ms)" for g in big)


def opening_line(summary: dict, factor: float = 2.0, limit: int = 12) -> str:
    """One line: the opening burst's talker steps, and those of them over ``factor`` x the
    level's p50 step (at most ``limit``, in order) with their make-up."""
    steps, p50 = summary.get("talker_opening") or [], (summary.get("talker") or {}).get("ms_p50")
    if not steps or not p50:
        return ""
    slow = [s for s in steps if s["ms"] > factor * p50][:limit]
    return (f"{len(steps)} steps to +{steps[-1]['at_s']:.2f}s, {sum(s['ms'] for s in steps):.0f} "
            f"ms stepping; over {factor:g}x p50: " + (", ".join(
                f"+{s['at_s']:.2f}s {s['ms']:.0f} ms ({s['rows']} rows"
                + (f"; {_parts(s['parts'])}" if s["parts"] else "") + ")" for s in slow)
                or "none"))


def shapes_line(summary: dict, stage: str = "code2wav") -> str:
    """One line: ``stage``'s steps with a forward of a new shape against the others, or ""
    when its runner does not count them."""
    split = (summary.get(stage) or {}).get("new_shapes")
    if not split:
        return ""

    def part(d):
        return (f"{d['steps']} steps" + (f", p50 {d['ms_p50']:.1f} ms, mean {d['ms_mean']:.1f}"
                                         if d["steps"] else ""))

    return f"{stage} forwards of a new (batch, frames): {part(split['new'])}; the others: " \
           f"{part(split['seen'])}; replayed as graphs: {part(split.get('graphed') or {'steps': 0})}"

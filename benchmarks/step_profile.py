"""Where each stage's loop time goes during a load level, from the engines' own clocks
(``GET /debug/stats``: ``loop_time`` and the runner's ``time_spent``; omni_ray/stages/engine.py).

``fetch`` keeps each stage's answers per engine (``actor_id``): Serve routes each stats call to one
replica of a stage, so a stage with several replicas (two talkers under MPS, the 1:2:2 layout)
needs several fetches (``samples``) to see them all. ``diff(before, after, wall_s)`` per stage,
over the engines seen in both: steps, requests per step, the loop's share of the wall (stepping /
applying commands and chunks / the rest, idle; per replica), ms per step, and the runner's parts
in ms per step (the talker's also per frame), and the stage logic's ``COUNTED`` counters;
``replicas``: how many engines it sums, and
``rows_by_replica`` how the level's request-steps split over them. Needs
``security.enable_debug_endpoints: true``; without it ``fetch`` returns None.
"""

from __future__ import annotations

import httpx

SAMPLES = 8  # fetches a bench makes around a level: two replicas both seen with p > 0.99
# Stage logic counters a level's row carries (their growth over the level): the talker's first
# chunks held for their second (pipeline.hold_first_chunk_above).
COUNTED = ("first_chunks_held",)


def fetch(url: str, headers: dict | None = None, samples: int = 1) -> dict | None:
    """``{stage: {actor_id: stats}}`` from ``samples`` GETs of ``/debug/stats``."""
    out: dict[str, dict] = {}
    for _ in range(samples):
        r = httpx.get(f"{url}/debug/stats", headers=headers, timeout=60)
        if r.status_code == 404:
            return None
        r.raise_for_status()
        for stage, s in r.json().items():
            if isinstance(s, dict) and "loop_time" in s:
                out.setdefault(stage, {})[s.get("actor_id")] = s
    return out


def _minus(a: dict, b: dict, key: str) -> dict:
    return {k: v - (b.get(key) or {}).get(k, 0) for k, v in (a.get(key) or {}).items()}


def diff(before: dict | None, after: dict | None, wall_s: float) -> dict | None:
    if before is None or after is None:
        return None
    out = {}
    for stage, engines in after.items():
        seen = [(a, before[stage][actor]) for actor, a in engines.items()
                if actor in (before.get(stage) or {})]
        if not seen:
            continue
        lt: dict[str, float] = {}
        rt: dict[str, float] = {}
        steps = chunks = pushes = 0
        for a, b in seen:  # summed over the stage's replicas
            for k, v in _minus(a, b, "loop_time").items():
                lt[k] = lt.get(k, 0) + v
            for k, v in _minus(a, b, "runner_time").items():
                rt[k] = rt.get(k, 0) + v
            steps += a["steps"] - b.get("steps", 0)
            chunks += a.get("chunks_in", 0) - b.get("chunks_in", 0)
            pushes += a.get("pushes_in", 0) - b.get("pushes_in", 0)
        n = len(seen)
        row = dict(steps=steps, steps_per_s=steps / wall_s, replicas=n,
                   # how the level's work split over the replicas (request-steps of each)
                   rows_by_replica=sorted((a["loop_time"]["rows"] - b["loop_time"]["rows"]
                                           for a, b in seen), reverse=True),
                   requests_per_step=lt["rows"] / steps if steps else None,
                   share=dict(step=lt["step_s"] / wall_s / n,
                              commands=lt["commands_s"] / wall_s / n,
                              idle=max(0.0, 1 - (lt["step_s"] + lt["commands_s"]) / wall_s / n)),
                   ms_per_step=1e3 * lt["step_s"] / steps if steps else None,
                   chunks_in=chunks, pushes_in=pushes)  # chunks, and the calls they came in
        per = {k: 1e3 * v / steps for k, v in rt.items() if k.endswith("_s") and steps}
        if per:
            row["runner_ms_per_step"] = per
        if rt.get("frames"):
            row["runner_ms_per_frame"] = {k: 1e3 * v / rt["frames"] for k, v in rt.items()
                                          if k.endswith("_s")}
            row["frames"] = rt["frames"]
        for key in COUNTED:  # the stage logic's counters, where it keeps them
            if any(key in a for a, _ in seen):
                row[key] = sum(a.get(key, 0) - b.get(key, 0) for a, b in seen)
        out[stage] = row
    return out


def table(profile: dict) -> str:
    """One markdown row per stage."""
    lines = ["| stage | replicas | steps/s | requests/step | ms/step | busy (step / commands) | "
             "runner parts, ms/step |", "|---|---|---|---|---|---|---|"]
    for stage, r in profile.items():
        parts = ", ".join(f"{k[:-2]} {v:.1f}"
                          for k, v in (r.get("runner_ms_per_step") or {}).items())
        lines.append(f"| {stage} | {r.get('replicas', 1)} | {r['steps_per_s']:.1f} | "
                     f"{_f(r['requests_per_step'])} | {_f(r['ms_per_step'])} | "
                     f"{r['share']['step']:.0%} / {r['share']['commands']:.0%} | {parts} |")
    return "\n".join(lines)


def _f(v) -> str:
    return "-" if v is None else f"{v:.1f}"

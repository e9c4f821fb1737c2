"""Where each stage's loop time goes during a load level, from the engines' own clocks
(``GET /debug/stats``: ``loop_time`` and the runner's ``time_spent``; omni_ray/stages/engine.py).

``diff(before, after, wall_s)`` per stage: steps, requests per step, the loop's share of the
wall (stepping / applying commands and chunks / the rest, idle), ms per step, and the runner's
parts in ms per step (the talker's also per frame). Needs ``security.enable_debug_endpoints: true``;
without it ``fetch`` returns None.
"""

from __future__ import annotations

import httpx


def fetch(url: str, headers: dict | None = None) -> dict | None:
    r = httpx.get(f"{url}/debug/stats", headers=headers, timeout=60)
    if r.status_code == 404:
        return None
    r.raise_for_status()
    return r.json()


def diff(before: dict | None, after: dict | None, wall_s: float) -> dict | None:
    if before is None or after is None:
        return None
    out = {}
    for stage, a in after.items():
        b = before.get(stage) or {}
        if "loop_time" not in a:
            continue
        lt = {k: v - (b.get("loop_time") or {}).get(k, 0) for k, v in a["loop_time"].items()}
        rt = {k: v - (b.get("runner_time") or {}).get(k, 0)
              for k, v in (a.get("runner_time") or {}).items()}
        steps = a["steps"] - b.get("steps", 0)
        row = dict(steps=steps, steps_per_s=steps / wall_s,
                   requests_per_step=lt["rows"] / steps if steps else None,
                   share=dict(step=lt["step_s"] / wall_s, commands=lt["commands_s"] / wall_s,
                              idle=max(0.0, 1 - (lt["step_s"] + lt["commands_s"]) / wall_s)),
                   ms_per_step=1e3 * lt["step_s"] / steps if steps else None,
                   chunks_in=a.get("chunks_in", 0) - b.get("chunks_in", 0))
        per = {k: 1e3 * v / steps for k, v in rt.items() if k.endswith("_s") and steps}
        if per:
            row["runner_ms_per_step"] = per
        if rt.get("frames"):
            row["runner_ms_per_frame"] = {k: 1e3 * v / rt["frames"] for k, v in rt.items()
                                          if k.endswith("_s")}
            row["frames"] = rt["frames"]
        out[stage] = row
    return out


def table(profile: dict) -> str:
    """One markdown row per stage."""
    lines = ["| stage | steps/s | requests/step | ms/step | busy (step / commands) | "
             "runner parts, ms/step |", "|---|---|---|---|---|---|"]
    for stage, r in profile.items():
        parts = ", ".join(f"{k[:-2]} {v:.1f}"
                          for k, v in (r.get("runner_ms_per_step") or {}).items())
        lines.append(f"| {stage} | {r['steps_per_s']:.1f} | {_f(r['requests_per_step'])} | "
                     f"{_f(r['ms_per_step'])} | {r['share']['step']:.0%} / "
                     f"{r['share']['commands']:.0%} | {parts} |")
    return "\n".join(lines)


def _f(v) -> str:
    return "-" if v is None else f"{v:.1f}"

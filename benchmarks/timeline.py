"""Where the time to first audio goes, from the app's own milestones (``GET /debug/timeline``,
omni_ray/timeline.py): the stages and the hops between them, per request, telescoping from the
ingress receiving the request to the ingress holding its first audio piece.

Needs ``security.enable_debug_endpoints: true``; without it ``fetch`` returns None.
"""

from __future__ import annotations

import httpx

from benchmarks.metrics import stats

# (segment, (stage, milestone) it starts at, (stage, milestone) it ends at); consecutive, so the
# segments of one request add up to its time to first audio inside the app.
SEGMENTS = [
    ("ingress: parse, tokenize, open the stages", ("ingress", "received"), ("thinker", "added")),
    ("thinker: prefill + first token", ("thinker", "added"), ("thinker", "first_down")),
    ("hop thinker -> talker", ("thinker", "first_down"), ("talker", "first_in")),
    ("talker: prefill + first codec chunk", ("talker", "first_in"), ("talker", "first_down")),
    ("hop talker -> code2wav", ("talker", "first_down"), ("code2wav", "first_in")),
    ("code2wav: first chunk to audio", ("code2wav", "first_in"), ("code2wav", "first_out")),
    ("code2wav -> ingress (replica stream)", ("code2wav", "first_out"), ("ingress", "first_audio")),
]
TOTAL = ("ingress first audio", ("ingress", "received"), ("ingress", "first_audio"))
# The first segment split (consecutive, received -> thinker added), then what the ingress waits
# for after the thinker's add: the other stages' opens and the attaches (the thinker's first
# chunk to the talker waits for them; not part of the sum).
INGRESS_PARTS = [
    ("parse, chat template, tokenize", ("ingress", "received"), ("ingress", "parsed")),
    ("log, metrics, fault headers", ("ingress", "parsed"), ("ingress", "opening")),
    ("send code2wav + talker opens", ("ingress", "opening"), ("ingress", "thinker_sent")),
    ("ingress -> thinker replica", ("ingress", "thinker_sent"), ("thinker", "replica_open")),
    ("thinker replica -> engine add", ("thinker", "replica_open"), ("thinker", "added")),
]
INGRESS_AFTER = ("thinker added -> all stages open + attached", ("thinker", "added"),
                 ("ingress", "opened"))


def fetch(url: str, limit: int, headers: dict | None = None) -> list[dict] | None:
    """The last ``limit`` requests' milestones, or None when the endpoint is off."""
    r = httpx.get(f"{url}/debug/timeline", params={"limit": limit}, headers=headers, timeout=60)
    if r.status_code == 404:
        return None
    r.raise_for_status()
    return r.json()["requests"]


def _span(req: dict, a: tuple[str, str], b: tuple[str, str]) -> float | None:
    ta, tb = req.get(a[0], {}).get(a[1]), req.get(b[0], {}).get(b[1])
    return None if ta is None or tb is None else tb - ta


def breakdown(requests: list[dict], segments: list | None = None) -> dict:
    """Per segment: n, mean, p50, p90, p99, min, max (seconds) over the requests that have both
    ends (text-only requests have no audio segments). ``segments``: default ``SEGMENTS`` and
    ``TOTAL``; ``INGRESS_PARTS`` + ``INGRESS_AFTER`` split the first one."""
    out = {}
    for name, a, b in segments or [*SEGMENTS, TOTAL]:
        xs = [x for x in (_span(r, a, b) for r in requests) if x is not None]
        if xs:
            out[name] = stats(xs)
    return out


def per_request(requests: list[dict]) -> list[dict]:
    """Each request's segments in ms (None where a milestone is missing), ordered by when the
    ingress received it, with ``t0_s`` its arrival after the first one's: shows which requests
    of a level were slow, and where."""
    t0 = [r.get("ingress", {}).get("received") for r in requests]
    first = min((t for t in t0 if t is not None), default=0.0)
    rows = []
    for r, t in sorted(zip(requests, t0), key=lambda rt: (rt[1] is None, rt[1] or 0.0)):
        row = {"t0_s": None if t is None else round(t - first, 3)}
        for name, a, b in [*SEGMENTS, TOTAL]:
            x = _span(r, a, b)
            row[name.split(":")[0]] = None if x is None else round(x * 1e3, 1)
        rows.append(row)
    return rows


def table(rows: dict, q: str = "p50") -> str:
    """A markdown table of one breakdown."""
    lines = [f"| segment | {q} ms | mean ms |", "|---|---|---|"]
    for name, s in rows.items():
        lines.append(f"| {name} | {s[q] * 1e3:.1f} | {s['mean'] * 1e3:.1f} |")
    return "\n".join(lines)

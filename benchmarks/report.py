"""Render the CPU results (``results/*.json``) as markdown tables.

Writes ``results/RESULTS_cpu.md`` and replaces the part of ``benchmarks/README.md`` between
``<!-- results:begin -->`` and ``<!-- results:end -->``. Missing JSON files are skipped.

    python -m benchmarks.report
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import RESULTS_DIR

README = Path(__file__).resolve().parent / "README.md"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"


def f(v, d: int = 3) -> str:
    return "–" if v is None else f"{v:.{d}f}"


def machine_line(m: dict) -> str:
    s, e = m["start"], m["end"]
    return (f"*{s['cpu']}, {s['cores']} cores; torch {s['torch']}, ray {s['ray']}; "
            f"1-min load average {s['loadavg_1m']} at start, {e['loadavg_1m']} at end "
            f"({s['time']}; omni_ray code {s.get('omni_ray_code', '?')}).*")


def compare_md(d: dict) -> list[str]:
    c = d["config"]
    out = [f"### Side by side (`compare.py`): concurrency 1, {c['num_prompts']} prompts, "
           f"max_tokens {c['max_tokens']}, max_audio_frames {c['max_audio_frames']}", "",
           machine_line(d["machine"]) + f" Torch threads: {d['torch_threads']['this_process']}"
           f" in this process, {d['torch_threads']['serve_engine_actor']} in the engine actors.",
           "",
           "| setup | TTFT p50 (s) | TTFA p50 (s) | e2e p50 (s) | RTF p50 | audio (s) | "
           "text tokens | probe: 4-token/4-frame e2e p50 (s) | probe: text-only "
           f"{c['max_tokens']}-token e2e p50 (s) |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s, m in d["summary"].items():
        out.append(f"| {s} | {f(m['ttft']['p50'])} | {f(m['ttfa']['p50'])} | "
                   f"{f(m['e2e']['p50'])} | {f(m['rtf']['p50'])} | "
                   f"{f(m['audio_seconds']['p50'], 2)} | {f(m['output_tokens']['p50'], 0)} | "
                   f"{f(d['probe'][s]['e2e']['p50'])} | "
                   f"{f((d['probe'][s].get('text_e2e') or {}).get('p50'))} |")
    same = all(d["same_text_across_setups"].values())
    out += ["", f"Same text from every setup for every prompt: **{'yes' if same else 'NO'}**.",
            "", "| ratio (p50s) | value |", "|---|---:|"]
    out += [f"| {k} | {f(v)} |" for k, v in d["ratios"].items()]
    out += ["", "| target (reported, not asserted) | measured | target | status |",
            "|---|---:|---:|---|"]
    for t in d["targets"]:
        status = "met" if t["met"] else f"**missed by {t['missed_by']:.3f}**"
        out.append(f"| {t['name']} | {t['value']:.3f} | {t['target']} | {status} |")
    over = d.get("serve_overhead_split") or {}
    if over:
        out += ["", "Serve minus offline, p50 seconds (whole request / fixed-cost probe / "
                "text-only request):", "", "| mode | e2e | TTFT | TTFA | 4-token/4-frame probe "
                "| text-only request |", "|---|---:|---:|---:|---:|---:|"]
        for mode, o in over.items():
            out.append(f"| {mode} | {f(o['e2e_s'])} | {f(o['ttft_s'])} | {f(o['ttfa_s'])} | "
                       f"{f(o['fixed_probe_s'])} | {f(o['text_only_s'])} |")
    split = d.get("stage_breakdown") or {}
    if split:
        names = ["thinker.step", "talker.step", "talker.code_predictor", "code2wav.decode",
                 "codec_hop", "other"]
        out += ["", "Where the offline pipeline's time goes (mean s per request; the code "
                "predictor runs inside talker.step):", "",
                "| offline run | " + " | ".join(names) + " | total |",
                "|---|" + "---:|" * (len(names) + 1)]
        for setup, b in split.items():
            e = b["e2e"]
            out.append(f"| {setup} e2e | " + " | ".join(f(e.get(n)) for n in names)
                       + f" | {f(e['total_e2e'])} |")
            if setup == "offline-async":
                t = b["to_first_audio"]
                out.append(f"| {setup} up to first audio | " + " | ".join(
                    f(t.get(n)) for n in names[:-1]) + f" | – | {f(t['total_ttfa'])} |")
    return out


def serve_md(d: dict) -> list[str]:
    c = d["config"]
    out = [f"### Load (`serve_bench.py --start {c['start']}`): {c['num_requests']} requests per "
           f"level, {c['prompts']} prompts, max_tokens {c['max_tokens']}, max_audio_frames "
           f"{c['max_audio_frames']}", "", machine_line(d["machine"]), "",
           "| setup | load | ok | TTFT p50 | TTFA p50 | TTFA p90 | TTFA p99 | RTF p50 | RTF p99 | "
           "e2e p50 | req/s | tok/s | audio s/s |", "|---|---|---:" + "|---:" * 10 + "|"]
    for r in d["runs"]:
        s = r["summary"]
        m = s["metrics"]
        out.append(
            f"| {r['label']} | {r['load']}={r['value']} | {s['num_ok']}/{s['num_requests']} | "
            f"{f(m['ttft']['p50'])} | {f(m['ttfa']['p50'])} | {f(m['ttfa']['p90'])} | "
            f"{f(m['ttfa']['p99'])} | {f(m['rtf']['p50'])} | {f(m['rtf']['p99'])} | "
            f"{f(m['e2e']['p50'])} | {f(s['requests_per_s'], 2)} | "
            f"{f(s['output_tokens_per_s'], 1)} | {f(s['audio_seconds_per_s'], 2)} |")
    return out


def transport_md(d: dict) -> list[str]:
    rows = d["results"]
    keys = list(dict.fromkeys((r["method"], r["mode"]) for r in rows))
    sizes = list(dict.fromkeys(r["size"] for r in rows))
    by = {(r["method"], r["mode"], r["size"]): r for r in rows}
    out = [f"### Stage hand-off (`transport_bench.py`): per-chunk latency p50 / p99 (ms) and "
           f"throughput (MB/s); pipelined = at most {d['window']} unacknowledged", "",
           machine_line(d["machine"]), "",
           "| method | mode | " + " | ".join(sizes) + " |", "|---|---|" + "---:|" * len(sizes)]
    for k in keys:
        cells = []
        for s in sizes:
            r = by.get((*k, s))
            cells.append("–" if r is None else
                         f"{f(r['latency_ms']['p50'], 2)} / {f(r['latency_ms']['p99'], 2)}"
                         f" ({r['throughput_mb_s']:.0f})")
        out.append(f"| {k[0]} | {k[1]} | " + " | ".join(cells) + " |")
    return out


def render(results_dir: Path = RESULTS_DIR) -> str:
    parts = []
    for name, fn in (("compare_cpu.json", compare_md), ("serve_cpu.json", serve_md),
                     ("transport_cpu.json", transport_md)):
        p = results_dir / name
        if p.exists():
            parts.append("\n".join(fn(json.loads(p.read_text()))))
    return "\n\n".join(parts) + "\n"


def main(argv=None) -> int:
    md = render()
    (RESULTS_DIR / "RESULTS_cpu.md").write_text(md)
    if README.exists():
        text = README.read_text()
        if BEGIN in text and END in text:
            head, rest = text.split(BEGIN, 1)
            _, tail = rest.split(END, 1)
            README.write_text(f"{head}{BEGIN}\n{md}{END}{tail}")
    print(f"wrote {RESULTS_DIR / 'RESULTS_cpu.md'}" + (" and the README table" if README.exists()
                                                       else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())

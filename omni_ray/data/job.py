"""A batch job: a JSONL or Parquet file of chat rows -> a directory of Parquet files of answers.

``run_batch_job(input, output_dir, config)`` reads the rows (JSONL in OpenAI's chat shape: ``id``,
``messages`` and optional ``voice``, ``max_tokens``, ``max_audio_frames``, ``modalities``, ...;
or Parquet with those columns), leaves out every row whose ``id`` is already in ``output_dir``
(so a job killed halfway and started again does each row exactly once), runs the processor and
writes Parquet files into ``output_dir`` as blocks finish. A JSONL row without an ``id`` is keyed
by a hash of its line (stable across restarts).
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from omni_ray.data.config import OmniProcessorConfig
from omni_ray.data.processor import build_omni_processor
from omni_ray.data.rows import ROW_FIELDS


def parse_line(row: dict) -> dict:
    """One JSONL line (``read_text``'s ``text``) -> an input row; ``messages`` stays a JSON
    string (rows differ in shape; the thinker stage parses it). A line that is not a JSON
    object becomes a row whose ``messages`` cannot be parsed: its output row names the error."""
    line = row["text"]
    out: dict = dict.fromkeys(ROW_FIELDS)
    try:
        obj = json.loads(line)
        if not isinstance(obj, dict):
            raise ValueError("not a JSON object")
    except ValueError:
        out["id"] = "line-" + hashlib.sha1(line.encode()).hexdigest()[:16]
        out["messages"] = line  # "messages: not valid JSON" in the output
        return out
    for k in ROW_FIELDS:
        v = obj.get(k)
        out[k] = json.dumps(v) if k in ("messages", "modalities") and v is not None else v
    if out["id"] is None:
        out["id"] = "line-" + hashlib.sha1(line.encode()).hexdigest()[:16]
    out["id"] = str(out["id"])
    if out["modalities"] is not None:
        out["modalities"] = json.loads(out["modalities"])
    return out


def done_ids(output_dir: Path) -> set[str]:
    """The ids of the rows already written; a file a killed job left unreadable is removed
    (its rows are done again)."""
    import pyarrow.parquet as pq

    ids: set[str] = set()
    for f in sorted(output_dir.glob("*.parquet")):
        try:
            ids.update(pq.read_table(f, columns=["id"]).column("id").to_pylist())
        except Exception:  # noqa: BLE001 - cut off mid-write
            f.unlink()
    return ids


def read_rows(path: Path):
    import ray

    if path.suffix == ".parquet" or path.is_dir():
        ds = ray.data.read_parquet(str(path))
        if "id" not in ds.schema().names:
            raise ValueError(f"{path}: Parquet input needs an `id` column")
        return ds
    return ray.data.read_text(str(path)).map(parse_line)


def run_batch_job(input_path: str | Path, output_dir: str | Path, config: OmniProcessorConfig,
                  rows_per_file: int | None = None) -> dict:
    """Run the job; returns a summary (rows done now and before, errors, audio seconds, time)."""
    import ray
    import pyarrow.parquet as pq

    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    before = done_ids(out)
    t0 = time.perf_counter()
    ds = read_rows(Path(input_path))
    if before:
        ds = ds.filter(lambda r, done=frozenset(before): str(r["id"]) not in done)
    processor = build_omni_processor(config)
    processor(ds).write_parquet(str(out), max_rows_per_file=rows_per_file)
    wall = time.perf_counter() - t0
    table = pq.read_table(str(out), columns=["id", "error", "audio_seconds"])
    ids = table.column("id").to_pylist()
    new = [i for i in ids if i not in before]
    errors = sum(e is not None for e in table.column("error").to_pylist())
    audio_s = sum(table.column("audio_seconds").to_pylist())
    ray_nodes = len(ray.nodes())
    return dict(output_dir=str(out), rows=len(ids), rows_now=len(new), rows_before=len(before),
                duplicates=len(ids) - len(set(ids)), errors=errors,
                audio_seconds=round(audio_s, 3), wall_s=round(wall, 3),
                rows_per_s=round(len(new) / wall, 3) if wall else None, ray_nodes=ray_nodes)

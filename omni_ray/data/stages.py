"""The three stages as Ray Data operators: callable classes for ``Dataset.map_batches``.

Each actor builds its stage's engine once (``pipeline/build.py``, the Serve engine's way) and
steps the stage logic over a whole batch of rows together (``run_stage``), in sync delivery: the
thinker's chunk of a row travels to the talker, and the talker's to code2wav, as bytes of the
wire codec (``payload/codec.py``, lossless as between the Serve app's engines) in a hidden column.
A row that failed upstream passes through untouched; a failure in a stage becomes that row's
``error`` (a talker failure keeps the text) and the other rows go on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from omni_ray.config.pipeline import PipelineConfig
from omni_ray.config.request import OmniRequest
from omni_ray.data.config import OmniProcessorConfig
from omni_ray.data.rows import RowError, audio_value, build_request, plain, row_id
from omni_ray.payload import AudioChunk, CodecChunk, TextDelta, ThinkerChunk
from omni_ray.payload import decode_chunk, encode_chunk
from omni_ray.pipeline.emit import StageLogic

# hidden columns between the operators (dropped before the rows come out)
REQUEST, CHUNK = "__omni_request", "__omni_chunk"
SYNC = PipelineConfig(mode="sync")  # one chunk per row and edge


@dataclass
class StageRun:
    """What one stage did for one request in a batch."""

    out: list = field(default_factory=list)    # items for the caller (text deltas, audio)
    down: list = field(default_factory=list)   # chunks for the next stage
    error: str | None = None


def run_stage(logic: StageLogic, requests: list[tuple[OmniRequest, bool]],
              chunks: dict[str, list] | None = None) -> dict[str, StageRun]:
    """Add ``requests`` (each with whether it goes on to a next stage), feed them their upstream
    ``chunks``, and step ``logic`` until it has no work: every request's outputs or error."""
    runs: dict[str, StageRun] = {}

    def route(emits):
        for e in emits:
            run = runs.get(e.request_id)
            if run is None:
                continue
            if e.error is not None:
                run.error = e.error
            elif e.item is not None:
                (run.down if e.target == "down" else run.out).append(e.item)

    for req, has_downstream in requests:
        try:
            logic.add(req, has_downstream)
            runs[req.request_id] = StageRun()
        except Exception as e:  # noqa: BLE001 - refused: this row's error
            logic.abort(req.request_id)
            runs[req.request_id] = StageRun(error=f"{type(e).__name__}: {e}")
    for rid, items in (chunks or {}).items():
        if rid in runs and runs[rid].error is None:
            for c in items:
                route(logic.on_chunk(c))
    while logic.has_work():
        route(logic.step())
    return runs


class _Stage:
    """One actor of a stage's operator (see the module docstring)."""

    stage = ""

    def __init__(self, config: dict, model_dir: str):
        from omni_ray.pipeline.build import build_stage_logic

        self.cfg = OmniProcessorConfig.model_validate(config)
        self.model_dir = model_dir
        engine = getattr(self.cfg, self.stage).engine
        self.logic = build_stage_logic(self.stage, model_dir, engine, SYNC,
                                       max_model_len=self.cfg.max_model_len)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        n = len(next(iter(batch.values()))) if batch else 0
        out = {k: list(v) for k, v in batch.items()}
        t = time.perf_counter()
        self.process(out, n)
        out[f"{self.stage}_batch_s"] = [time.perf_counter() - t] * n
        return columns(out)

    def process(self, cols: dict[str, list], n: int) -> None:
        raise NotImplementedError

    def _run_pending(self, cols: dict[str, list], n: int, chunk_type: type, has_downstream: bool
                     ) -> dict[int, StageRun]:
        """Step the rows that have no error yet and a chunk from upstream: row -> its run."""
        todo = [i for i in range(n) if plain(cols["error"][i]) is None
                and plain(cols[CHUNK][i]) is not None]
        reqs = {i: OmniRequest.model_validate_json(cols[REQUEST][i]) for i in todo}
        chunks = {reqs[i].request_id: [decode_chunk(cols[CHUNK][i], chunk_type)] for i in todo}
        runs = run_stage(self.logic, [(reqs[i], has_downstream) for i in todo], chunks)
        return {i: runs[reqs[i].request_id] for i in todo}


class ThinkerStage(_Stage):
    """Rows -> requests -> the thinker: ``text``, ``text_token_ids``, ``finish_reason``."""

    stage = "thinker"

    def __init__(self, config: dict, model_dir: str):
        super().__init__(config, model_dir)
        from omni_ray.inputs.processor import InputProcessor
        from omni_ray.models.speakers import checkpoint_speakers
        from omni_ray.models.tokenizer import load_tokenizer

        self.tokenizer = load_tokenizer(model_dir)
        self.inputs = InputProcessor(model_dir, self.tokenizer)
        self.speakers = checkpoint_speakers(model_dir)
        self.raw_media = getattr(self.logic.runner, "needs_raw_media", False)

    def process(self, cols: dict[str, list], n: int) -> None:
        rows = [{k: cols[k][i] for k in cols} for i in range(n)]
        ids = [row_id(r) for r in rows]
        cols["id"] = ids
        for name in ("text", "text_token_ids", "finish_reason", "error", REQUEST, CHUNK):
            cols[name] = [None] * n
        reqs: dict[str, tuple[int, OmniRequest]] = {}
        for i, row in enumerate(rows):
            try:
                if ids[i] in reqs:
                    raise RowError("id", f"duplicate id {ids[i]!r} in one batch")
                reqs[ids[i]] = (i, build_request({**row, "id": ids[i]}, self.cfg, self.inputs,
                                                 self.speakers, self.raw_media))
            except RowError as e:
                cols["error"][i] = f"invalid row: {e}"
        runs = run_stage(self.logic, [(r, r.wants_audio) for _, r in reqs.values()])
        for rid, (i, req) in reqs.items():
            run = runs[rid]
            tokens = [t for d in run.out if isinstance(d, TextDelta) for t in d.token_ids]
            ends = [d.finish_reason for d in run.out if isinstance(d, TextDelta) and d.finished]
            cols["text_token_ids"][i] = tokens
            cols["text"][i] = self.tokenizer.decode(tokens, skip_special_tokens=True)
            cols["finish_reason"][i] = ends[-1].name.lower() if ends else "error"
            if run.error:
                cols["error"][i] = f"thinker: {run.error}"
            elif run.down:
                (chunk,) = run.down  # sync: one chunk
                cols[CHUNK][i] = encode_chunk(chunk).tobytes()
                cols[REQUEST][i] = req.without_media().model_dump_json()


class TalkerStage(_Stage):
    """Thinker chunks -> codec frames (``codec_frames``)."""

    stage = "talker"

    def process(self, cols: dict[str, list], n: int) -> None:
        runs = self._run_pending(cols, n, ThinkerChunk, has_downstream=True)
        cols["codec_frames"] = [0] * n
        for i, run in runs.items():
            cols[CHUNK][i] = None
            if run.error:
                cols["error"][i] = f"talker: {run.error}"
            elif run.down:
                (chunk,) = run.down
                cols["codec_frames"][i] = int(chunk.codes.shape[0])
                cols[CHUNK][i] = encode_chunk(chunk).tobytes()


class Code2WavStage(_Stage):
    """Codec frames -> audio (``audio`` as ``OmniProcessorConfig.audio_format`` says)."""

    stage = "code2wav"

    def process(self, cols: dict[str, list], n: int) -> None:
        from omni_ray.pipeline.code2wav import SAMPLE_RATE

        runs = self._run_pending(cols, n, CodecChunk, has_downstream=False)
        samples: list = [None] * n
        for i, run in runs.items():
            if run.error:
                cols["error"][i] = f"code2wav: {run.error}"
                continue
            pieces = [a.samples for a in run.out if isinstance(a, AudioChunk)]
            samples[i] = (np.concatenate([p.numpy() for p in pieces]).astype(np.float32)
                          if pieces else np.zeros(0, np.float32))
        fmt = self.cfg.audio_format
        cols["audio"] = [audio_value(s, fmt) for s in samples]
        cols["sample_rate"] = [SAMPLE_RATE] * n
        cols["audio_seconds"] = [0.0 if s is None else len(s) / SAMPLE_RATE for s in samples]


def columns(cols: dict[str, list]) -> dict[str, np.ndarray]:
    """Each column as a 1-D object array of plain values: Ray Data must not stack equal-length
    lists (token ids, samples) of one batch into a 2-D tensor while another batch's are ragged."""
    out = {}
    for k, values in cols.items():
        arr = np.empty(len(values), dtype=object)
        for i, v in enumerate(values):
            arr[i] = v.tolist() if k == "text_token_ids" and isinstance(v, np.ndarray) else v
        out[k] = arr
    return out


OUTPUT_TYPES = {  # the output columns' Arrow types: one schema whatever a batch holds
    "id": "string", "text": "string", "text_token_ids": "list<int64>", "finish_reason": "string",
    "codec_frames": "int64", "sample_rate": "int64", "audio_seconds": "float64",
    "error": "string", "thinker_batch_s": "float64", "talker_batch_s": "float64",
    "code2wav_batch_s": "float64",
}


def finish_rows(table, fmt: str):
    """The rows as they leave the processor (a ``pyarrow`` batch): hidden columns dropped, the
    output columns typed (``OUTPUT_TYPES``; ``audio``: list<float> samples or binary), a
    text-only processor's audio columns filled."""
    import pyarrow as pa

    from omni_ray.pipeline.code2wav import SAMPLE_RATE

    n = table.num_rows
    cols = {k: table.column(k) for k in table.column_names if not k.startswith("__omni")}
    audio_only = {"audio": None, "sample_rate": SAMPLE_RATE, "audio_seconds": 0.0,
                  "codec_frames": 0, "talker_batch_s": None, "code2wav_batch_s": None}
    for k, v in audio_only.items():
        if k not in cols:
            cols[k] = pa.array([v] * n)
    out = {}
    for k, col in cols.items():
        if k == "audio":
            values = [plain(x) for x in col.to_pylist()]
            if fmt == "float32":
                out[k] = pa.array([[] if v is None else v for v in values], pa.list_(pa.float32()))
            else:
                out[k] = pa.array([v or None for v in values], pa.binary())
        elif k in OUTPUT_TYPES:
            values = [plain(x) for x in col.to_pylist()]
            if k == "text_token_ids":
                values = [v or [] for v in values]
            out[k] = pa.array(values, _arrow_type(OUTPUT_TYPES[k]))
        else:
            out[k] = col
    return pa.table(out)


def _arrow_type(name: str):
    import pyarrow as pa

    return pa.list_(pa.int64()) if name == "list<int64>" else pa.type_for_alias(name)

"""omni_ray.data on real Ray Data with the tiny checkpoint: every row equals what ``Omni`` gives
for the same request (greedy), over mixed text / audio / image / text-only rows spread across
several batches per stage; bad rows get an error naming the field and the job goes on; the audio
column round-trips through FLAC and Parquet."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from audio_decoders import decode_pyav
from media_samples import audio_bytes, b64, data_url, image_bytes, picture, tone

pytestmark = pytest.mark.slow

MAX_TOKENS, FRAMES = 6, 14


def good_rows() -> list[dict]:
    wav = b64(audio_bytes(tone(1.0, 16000), 16000))
    png = data_url(image_bytes(picture(64, 48, seed=1)))
    rows = [{"id": f"p{i}", "prompt": p} for i, p in enumerate(
        ["Tell me about the sea.", "Hello there.", "What is a rainbow?", "Sing me a song.",
         "Describe a forest.", "Why is the sky blue?"])]
    rows += [
        {"id": "text-only", "prompt": "Count to three.", "modalities": ["text"]},
        {"id": "voice", "prompt": "Good morning.", "voice": "Chelsie", "max_audio_frames": 9},
        {"id": "audio-in", "messages": [{"role": "user", "content": [
            {"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}},
            {"type": "text", "text": "What do you hear?"}]}]},
        {"id": "image-in", "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": png}},
                                         {"type": "text", "text": "What is this?"}]}]},
        {"id": "json-messages", "messages": '[{"role": "user", "content": "Hi!"}]',
         "max_tokens": 3},
    ]
    return rows


BAD_ROWS = [
    ({"id": "bad-b64", "messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": "%%%", "format": "wav"}}]}]},
     "messages.0.content.0.input_audio.data"),
    ({"id": "bad-voice", "prompt": "Hi", "voice": "nobody"}, "voice"),
    ({"id": "bad-max", "prompt": "Hi", "max_tokens": 0}, "max_tokens"),
    ({"id": "bad-part", "messages": [{"role": "user", "content": [{"type": "video"}]}]},
     "messages.0.content.0.type"),
    ({"id": "no-prompt", "prompt": ""}, "messages"),
    ({"id": "bad-role", "messages": [{"role": "robot", "content": "Hi"}]}, "messages.0.role"),
]


def omni_messages(row: dict) -> list[dict]:
    """The row as ``Omni.request`` takes it, decoded here with other code than the processor's."""
    import json

    import soundfile as sf
    from PIL import Image

    msgs = row.get("messages") or [{"role": "user", "content": row["prompt"]}]
    msgs = json.loads(msgs) if isinstance(msgs, str) else msgs
    out = []
    for m in msgs:
        if isinstance(m["content"], str):
            out.append(m)
            continue
        parts = []
        for p in m["content"]:
            if p["type"] == "text":
                parts.append(p)
            elif p["type"] == "input_audio":
                import base64

                x, sr = sf.read(io.BytesIO(base64.b64decode(p["input_audio"]["data"])),
                                dtype="float32")
                assert sr == 16000
                parts.append({"type": "audio", "audio": x})
            else:
                import base64

                raw = base64.b64decode(p["image_url"]["url"].split(",", 1)[1])
                parts.append({"type": "image", "image": Image.open(io.BytesIO(raw)).convert("RGB")})
        out.append({"role": m["role"], "content": parts})
    return out


@pytest.fixture(scope="module")
def expected(omni_by_mode):
    omni = omni_by_mode["sync"]
    reqs = [omni.request(omni_messages(r), r["id"], speaker=r.get("voice", "ethan").lower(),
                         max_tokens=r.get("max_tokens", MAX_TOKENS),
                         max_audio_frames=r.get("max_audio_frames", FRAMES),
                         modalities=tuple(r.get("modalities", ("text", "audio"))))
            for r in good_rows()]
    return {o.request_id: o for o in omni.generate(reqs)}


def run(ray_cluster, tiny_model_dir, rows, **cfg):
    from omni_ray.data import DataStageConfig, OmniProcessorConfig, build_omni_processor

    config = OmniProcessorConfig(
        model=tiny_model_dir, default_max_tokens=MAX_TOKENS, default_max_audio_frames=FRAMES,
        thinker=DataStageConfig(batch_size=4), talker=DataStageConfig(batch_size=3),
        code2wav=DataStageConfig(batch_size=5), **cfg)
    ds = ray_cluster.data.from_items(rows, override_num_blocks=6)
    return {r["id"]: r for r in build_omni_processor(config)(ds).take_all()}


def test_every_row_equals_omni_and_bad_rows_name_their_field(ray_cluster, tiny_model_dir,
                                                              expected):
    rows = good_rows()
    mixed = rows[:4] + [r for r, _ in BAD_ROWS[:3]] + rows[4:] + [r for r, _ in BAD_ROWS[3:]]
    got = run(ray_cluster, tiny_model_dir, mixed, audio_format="float32")
    assert sorted(got) == sorted(r["id"] for r in mixed)  # every row exactly once
    for r in rows:
        g, want = got[r["id"]], expected[r["id"]]
        assert g["error"] is None, (r["id"], g["error"])
        assert list(g["text_token_ids"]) == want.text_token_ids, r["id"]
        assert g["text"] == want.text and g["finish_reason"] == want.finish_reason.name.lower()
        assert g["codec_frames"] == want.codec_frames.shape[0]
        assert torch.equal(torch.from_numpy(np.asarray(g["audio"], np.float32)), want.audio), r["id"]
        assert g["audio_seconds"] == pytest.approx(want.audio.numel() / 24000)
        assert g["sample_rate"] == 24000 and g["thinker_batch_s"] > 0
    assert got["text-only"]["codec_frames"] == 0 and len(got["text-only"]["audio"]) == 0
    assert got["voice"]["codec_frames"] <= 9
    assert not torch.equal(expected["voice"].audio[:100], expected["p0"].audio[:100])
    for row, field in BAD_ROWS:
        err = got[row["id"]]["error"]
        assert err and err.startswith(f"invalid row: {field}:"), (row["id"], err)
        assert len(got[row["id"]]["audio"]) == 0


def test_flac_audio_and_parquet_round_trip(ray_cluster, tiny_model_dir, expected, tmp_path):
    import pyarrow.parquet as pq
    from omni_ray.data import DataStageConfig, OmniProcessorConfig, build_omni_processor

    rows = good_rows()[:3] + [good_rows()[6]]
    config = OmniProcessorConfig(model=tiny_model_dir, default_max_tokens=MAX_TOKENS,
                                 default_max_audio_frames=FRAMES,
                                 thinker=DataStageConfig(batch_size=2))
    ds = build_omni_processor(config)(ray_cluster.data.from_items(rows))
    ds.write_parquet(str(tmp_path))
    table = pq.read_table(str(tmp_path))
    assert {"id", "text", "text_token_ids", "finish_reason", "audio", "sample_rate",
            "audio_seconds", "error"} <= set(table.column_names)
    assert not any(c.startswith("__omni") for c in table.column_names)
    by_id = {r["id"]: r for r in table.to_pylist()}
    assert sorted(by_id) == sorted(r["id"] for r in rows)
    for rid in ("p0", "p1", "p2"):
        pcm, sr = decode_pyav(by_id[rid]["audio"])  # written by libsndfile, read by FFmpeg
        want = expected[rid].audio.numpy()
        assert sr == 24000 and len(pcm) == len(want)
        assert np.abs(pcm - want).max() < 1.5 / 32768 + 1e-6  # 16-bit FLAC: within one step
        assert by_id[rid]["text_token_ids"] == expected[rid].text_token_ids
    assert by_id["text-only"]["audio"] is None and by_id["text-only"]["audio_seconds"] == 0


def test_a_text_only_processor_loads_no_talker_and_refuses_audio_rows(ray_cluster,
                                                                       tiny_model_dir, expected):
    rows = [{"id": "t", "prompt": "Count to three.", "modalities": ["text"]},
            {"id": "a", "prompt": "Hello there."}]
    got = run(ray_cluster, tiny_model_dir, rows, audio=False)
    assert list(got["t"]["text_token_ids"]) == expected["text-only"].text_token_ids
    assert got["a"]["error"].startswith("invalid row: modalities:")

"""Send one chat request with text + audio output through the ``openai`` client.

Streams the answer, writes the audio to a WAV file, prints the text and the time to first audio.
    python examples/chat_client.py --url http://127.0.0.1:8000/v1 --out out/answer.wav
    python examples/chat_client.py --audio-in question.wav --text "Answer the question."
"""

from __future__ import annotations

import argparse
import base64
import time
from pathlib import Path

import numpy as np
from openai import OpenAI

from omni_ray.audio import wav_bytes


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--url", default="http://127.0.0.1:8000/v1")
    ap.add_argument("--api-key", default="none")
    ap.add_argument("--text", default="Hello! Please tell me a short story about a robot.")
    ap.add_argument("--voice", default="chelsie")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--out", default="out/answer.wav")
    ap.add_argument("--audio-in", help="a .wav or .mp3 file: spoken input before the text")
    ap.add_argument("--image-in", help="a .png or .jpeg file: image input before the text")
    args = ap.parse_args(argv)
    content: str | list = args.text
    if args.audio_in or args.image_in:
        content = []
        if args.audio_in:
            fmt = Path(args.audio_in).suffix.lower().lstrip(".")
            content.append({"type": "input_audio", "input_audio": {
                "data": base64.b64encode(Path(args.audio_in).read_bytes()).decode(),
                "format": fmt}})
        if args.image_in:
            mime = "image/png" if args.image_in.lower().endswith(".png") else "image/jpeg"
            data = base64.b64encode(Path(args.image_in).read_bytes()).decode()
            content.append({"type": "image_url", "image_url": {"url": f"data:{mime};base64,{data}"}})
        content.append({"type": "text", "text": args.text})

    client = OpenAI(base_url=args.url, api_key=args.api_key)
    model = client.models.list().data[0].id
    t0 = time.perf_counter()
    ttft = ttfa = None
    text, pcm = [], []
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": content}],
        modalities=["text", "audio"], audio={"voice": args.voice, "format": "pcm16"},
        max_tokens=args.max_tokens, stream=True, stream_options={"include_usage": True})
    usage = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        if delta.content:
            ttft = ttft if ttft is not None else time.perf_counter() - t0
            text.append(delta.content)
        audio = getattr(delta, "audio", None) or (delta.model_extra or {}).get("audio")
        data = (audio.get("data") if isinstance(audio, dict) else audio.data) if audio else None
        if data:
            ttfa = ttfa if ttfa is not None else time.perf_counter() - t0
            pcm.append(base64.b64decode(data))
    total = time.perf_counter() - t0
    samples = np.frombuffer(b"".join(pcm), dtype="<i2").astype(np.float32) / 32767.0
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(wav_bytes(samples, 24000))
    print(f"text: {''.join(text)!r}")
    print(f"audio: {len(samples) / 24000:.2f} s -> {out}")
    print(f"time to first token: {ttft:.3f} s, time to first audio: {ttfa:.3f} s, total: {total:.3f} s")
    if usage is not None:
        print(f"usage: {usage.prompt_tokens} prompt + {usage.completion_tokens} completion tokens")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

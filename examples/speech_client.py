"""The speech side of the API through the ``openai`` client: voices, a spoken answer in any of
OpenAI's formats, a follow-up turn that names that answer by its ``audio.id``, and a transcription.

    python examples/speech_client.py --url http://127.0.0.1:8000/v1 --format mp3 --out out/answer.mp3
"""

from __future__ import annotations

import argparse
import base64
from pathlib import Path

import httpx
from openai import OpenAI


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--url", default="http://127.0.0.1:8000/v1")
    ap.add_argument("--api-key", default="none")
    ap.add_argument("--model", default="qwen3-omni")
    ap.add_argument("--text", default="Hello! Tell me one fact about the moon.")
    ap.add_argument("--voice", help="default: the server's (GET /v1/audio/voices)")
    ap.add_argument("--format", default="wav", choices=["wav", "mp3", "flac", "opus", "aac", "pcm16"])
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--out", default="out/answer.wav")
    args = ap.parse_args(argv)
    client = OpenAI(base_url=args.url, api_key=args.api_key, max_retries=0, timeout=300)
    # The openai client has no voices call: a plain GET with the same key.
    voices = httpx.get(f"{args.url.rstrip('/')}/audio/voices", timeout=30,
                       headers={"Authorization": f"Bearer {args.api_key}"}).json()
    voice = args.voice or voices["default"]
    print(f"voices: {', '.join(voices['voices'])} (using {voice})")

    def ask(messages):
        return client.chat.completions.create(
            model=args.model, messages=messages, modalities=["text", "audio"],
            audio={"voice": voice, "format": args.format}, max_tokens=args.max_tokens)

    turns = [{"role": "user", "content": args.text}]
    first = ask(turns)
    audio = first.choices[0].message.audio
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(base64.b64decode(audio.data))
    u = first.usage
    print(f"answer ({args.format}, {out}): {audio.transcript!r}")
    print(f"usage: {u.prompt_tokens} prompt + {u.completion_tokens} completion tokens "
          f"({u.completion_tokens_details.text_tokens} text, "
          f"{u.completion_tokens_details.audio_tokens} audio = 80 ms frames)")
    # Multi-turn: the earlier spoken answer by its id (kept until audio.expires_at).
    turns += [{"role": "assistant", "audio": {"id": audio.id}},
              {"role": "user", "content": "Say it again, shorter."}]
    second = ask(turns)
    print(f"follow-up: {second.choices[0].message.audio.transcript!r}")
    if args.format in ("wav", "mp3"):  # what the transcription endpoint takes
        text = client.audio.transcriptions.create(model=args.model, file=out)
        print(f"transcription of {out}: {text.text!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

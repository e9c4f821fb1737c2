"""``omni-ray speak --text "..." --out x.mp3``: text to speech offline, as ``/v1/audio/speech``.

The thinker is given the text as its answer (``Omni.speech_request``), the talker and code2wav
voice exactly it, and the file is written by the encoder the API answers with
(``audio_formats.encode_audio``), its format named by the suffix of ``--out`` as the API's
``response_format``: ``.mp3``, ``.opus``, ``.aac``, ``.flac``, ``.wav`` or ``.pcm`` (raw 24 kHz
mono little-endian int16). The audio is bounded as the API bounds it (``ingress/speech.py``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from omni_ray.audio_formats import SPEECH_SUFFIXES
from omni_ray.cli.argtypes import positive_int
from omni_ray.cli.loading import find_checkpoint, load_omni, offline_serving_args
from omni_ray.cli.progress import Progress, add_progress_flags
from omni_ray.cli.serve_config import add_app_flags
from omni_ray.config.defaults import (DEFAULT_CODE2WAV_MODE, DEFAULT_MODE, DEFAULT_SPEAKER,
                                     MAX_SPEECH_INPUT_CHARS, SAMPLED_TALKER)


def add_parser(sub) -> None:
    p = sub.add_parser("speak", help="speech for a given text, offline (as /v1/audio/speech)")
    add_app_flags(p, model=True)
    p.add_argument("--text", required=True, help="what to say, exactly")
    p.add_argument("--voice", default=None,
                   help="a voice of the checkpoint's talker, any case (default: the config's "
                        f"default_speaker, else {DEFAULT_SPEAKER})")
    p.add_argument("--out", type=Path, required=True,
                   help=f"the audio file; its suffix picks the format: "
                        f"{', '.join(SPEECH_SUFFIXES)}")
    p.add_argument("--mode", choices=("sync", "async_chunk"), default=None,
                   help=f"stage delivery (default: the config's, else {DEFAULT_MODE})")
    p.add_argument("--code2wav-mode", choices=("window", "stateful"), default=None,
                   help=f"chunked vocoding (default: the config's, else {DEFAULT_CODE2WAV_MODE})")
    p.add_argument("--max-audio-frames", type=positive_int, default=None,
                   help="at most this many codec frames, 80 ms each (default: as the API, "
                        "2 s + ~1 s a token)")
    p.add_argument("--sample", action="store_true",
                   help="sample the talker (T=0.9, top-k 50), not greedy")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_progress_flags(p)
    p.set_defaults(run=run, parser=p)


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    # 1) Check what argparse cannot, before loading anything.
    fmt = SPEECH_SUFFIXES.get(args.out.suffix.lower())
    if fmt is None:
        parser.error(f"--out {args.out}: the file name must end in {', '.join(SPEECH_SUFFIXES)}")
    if not args.text.strip() or len(args.text) > MAX_SPEECH_INPUT_CHARS:
        parser.error(f"--text: give 1 to {MAX_SPEECH_INPUT_CHARS} characters of text to speak")
    progress = Progress.from_args(args)
    sa = offline_serving_args(parser, args)

    # 2) The checkpoint and its voice, then the three stages.
    model = find_checkpoint(parser, sa, progress)
    voice = _voice(parser, args.voice or sa.default_speaker, model)
    omni = load_omni(sa, model, progress)
    try:
        request = _request(parser, args, omni, sa, voice)
        with progress.step("speaking"):
            out = omni.generate(request)[0]
    finally:
        omni.shutdown()
    if out.error is not None:
        parser.exit(1, f"{parser.prog}: error: {out.error}\n")

    # 3) The file, through the API's encoder.
    from omni_ray.audio_formats import encode_audio

    args.out.write_bytes(encode_audio(out.audio, fmt, out.sample_rate))
    summary = dict(text=args.text, voice=voice, format=fmt, out=str(args.out), model=str(model),
                   mode=sa.pipeline.mode, codec_frames=int(out.codec_frames.shape[0]),
                   audio_samples=int(out.audio.numel()), sample_rate=out.sample_rate,
                   audio_seconds=out.audio.numel() / out.sample_rate,
                   time_to_first_audio=out.time_to_first_audio, latency=out.latency)
    print(json.dumps(summary) if args.json else
          f"wrote {args.out} ({summary['audio_seconds']:.2f} s of audio, "
          f"{summary['codec_frames']} codec frames, voice {voice}, {fmt})")
    return 0


def _voice(parser, name: str, model: str) -> str:
    from omni_ray.models.speakers import checkpoint_speakers, resolve_speaker

    try:
        return resolve_speaker(name, checkpoint_speakers(model))
    except ValueError as e:
        parser.error(f"--voice: {e}")


def _request(parser, args, omni, sa, voice: str):
    """``Omni.speech_request`` bounded as ``/v1/audio/speech`` bounds it."""
    from omni_ray.config.sampling import SamplingParams
    from omni_ray.ingress.speech import FRAMES_BASE, FRAMES_PER_TOKEN

    probe = omni.speech_request(args.text)
    answer = len(probe.answer_token_ids)
    lim = sa.limits
    if answer > lim.max_tokens:
        parser.error(f"--text: {answer} tokens, over limits.max_tokens={lim.max_tokens}")
    frames = min(FRAMES_BASE + FRAMES_PER_TOKEN * answer, lim.max_audio_frames)
    if args.max_audio_frames is not None:
        frames = min(frames, args.max_audio_frames)
    talker = (SamplingParams(**SAMPLED_TALKER, seed=args.seed) if args.sample
              else sa.talker.default_sampling or SamplingParams())
    return omni.speech_request(args.text, request_id="speak", speaker=voice, max_tokens=answer,
                               max_audio_frames=frames, talker_sampling=talker)

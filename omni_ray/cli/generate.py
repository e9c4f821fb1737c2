"""``omni-ray generate``: one prompt through the offline pipeline (``Omni``) with the app's args.

What loads, and how, comes from the same ``build_omni_app`` args the Serve app takes
(``--config FILE``, then flags; ``serve_config.py``), so every default is the app's. Only the
stages the modalities need are loaded (``--modalities text``: the thinker alone).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from omni_ray.audio_formats import AUDIO_SUFFIXES
from omni_ray.cli.argtypes import MODALITIES, modalities, positive_int, token_ids
from omni_ray.cli.loading import find_checkpoint, load_omni, offline_serving_args
from omni_ray.cli.progress import Progress, add_progress_flags
from omni_ray.cli.serve_config import add_app_flags
from omni_ray.config.defaults import (DEFAULT_CODE2WAV_MODE, DEFAULT_MAX_AUDIO_FRAMES,
                                      DEFAULT_MAX_TOKENS, DEFAULT_MODE, DEFAULT_SPEAKER,
                                      SAMPLED_TALKER, SAMPLED_THINKER)



def add_parser(sub) -> None:
    gen = sub.add_parser("generate", help="text (and speech) for one prompt, offline")
    add_app_flags(gen, model=True)
    prompt = gen.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--text", help="user message (wrapped in the chat template)")
    prompt.add_argument("--prompt-ids", type=token_ids, metavar="1,2,3",
                        help="prompt token ids, chat template already applied")
    gen.add_argument("--system", help="system message (with --text only)")
    gen.add_argument("--audio", type=Path, action="append", default=[], metavar="FILE",
                     help="a .wav or .mp3 clip in the user message, before the text (repeatable)")
    gen.add_argument("--image", type=Path, action="append", default=[], metavar="FILE",
                     help="an image (png, jpeg, webp, gif, bmp) in the user message (repeatable)")
    gen.add_argument("--modalities", type=modalities, default=MODALITIES, metavar="text[,audio]",
                     help="what to produce (default text,audio; text loads the thinker only)")
    gen.add_argument("--mode", choices=("sync", "async_chunk"), default=None,
                     help=f"stage delivery (default: the config's, else {DEFAULT_MODE})")
    gen.add_argument("--code2wav-mode", choices=("window", "stateful"), default=None,
                     help="chunked vocoding (default: the config's, else "
                          f"{DEFAULT_CODE2WAV_MODE})")
    gen.add_argument("--speaker", default=None,
                     help="a voice of the checkpoint's talker, any case (default: the config's "
                          f"default_speaker, else {DEFAULT_SPEAKER})")
    gen.add_argument("--max-tokens", type=positive_int, default=None,
                     help=f"max text tokens (default: the app's, {DEFAULT_MAX_TOKENS})")
    gen.add_argument("--max-audio-frames", type=positive_int, default=None,
                     help="max codec frames, 80 ms each (default: the app's, "
                          f"{DEFAULT_MAX_AUDIO_FRAMES})")
    gen.add_argument("--sample", action="store_true",
                     help="sample (thinker T=0.7 top-p 0.9; talker T=0.9 top-k 50), not greedy")
    gen.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    gen.add_argument("--out", type=Path, default=None,
                     help=f"write the audio, by suffix: {', '.join(AUDIO_SUFFIXES)}")
    gen.add_argument("--json", action="store_true", help="print one JSON object")
    add_progress_flags(gen)
    gen.set_defaults(run=run, parser=gen)


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    # 1) Check what argparse cannot, before loading anything.
    _check_args(parser, args)
    progress = Progress.from_args(args)
    wants_audio = "audio" in args.modalities
    sa = offline_serving_args(parser, args)

    # 2) Find (or make, or fetch) the checkpoint; say when its weights are random.
    model = find_checkpoint(parser, sa, progress)
    speaker = _speaker(parser, args, sa, model) if wants_audio else sa.default_speaker

    # 3) Load only the stages the modalities need, then generate.
    omni = load_omni(sa, model, progress, audio=wants_audio)
    try:
        request = _request(parser, args, omni, sa, speaker)
        try:
            with progress.step("generating"):
                out = omni.generate(request)[0]
        except ValueError as e:  # runners raise ValueError for requests they cannot serve
            parser.exit(2, f"{parser.prog}: error: {e}\n")
    finally:
        omni.shutdown()

    # 4) Report.
    if args.out is not None:
        from omni_ray.audio import write_audio

        write_audio(args.out, out.audio, out.sample_rate)
    summary = dict(out.summary(), mode=sa.pipeline.mode, code2wav_mode=sa.pipeline.code2wav_mode,
                   modalities=list(args.modalities), speaker=speaker,
                   prompt_tokens=len(request.prompt_token_ids), model=str(model),
                   out=str(args.out) if args.out is not None else None)
    print(json.dumps(summary) if args.json else _human(summary))
    return 0


def _check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.system is not None and args.text is None:
        parser.error("--system needs --text (with --prompt-ids the template is already applied)")
    if (args.audio or args.image) and args.text is None:
        parser.error("--audio / --image need --text (the user message they belong to)")
    for f in args.audio + args.image:
        if not f.is_file():
            parser.error(f"{f}: no such file")
    for f in args.audio:
        if f.suffix.lower() not in (".wav", ".mp3"):
            parser.error(f"--audio {f}: the file name must end in .wav or .mp3")
    if args.out is not None and "audio" not in args.modalities:
        parser.error("--out needs audio output; drop --modalities text")
    if args.out is not None and args.out.suffix.lower() not in AUDIO_SUFFIXES:
        parser.error(f"--out {args.out}: the file name must end in {', '.join(AUDIO_SUFFIXES)}")


def _speaker(parser, args, sa, model: str) -> str:
    from omni_ray.models.speakers import checkpoint_speakers, resolve_speaker

    try:
        return resolve_speaker(args.speaker or sa.default_speaker, checkpoint_speakers(model))
    except ValueError as e:
        parser.error(f"--speaker: {e}")


def _request(parser, args, omni, sa, speaker: str):
    from omni_ray.config.request import OmniRequest
    from omni_ray.config.sampling import SamplingParams

    mm = None
    if args.audio or args.image:
        ids, mm = omni.inputs.build(_media_messages(parser, args))
    elif args.text is not None:
        ids = omni.prompt_ids(args.text, system=args.system)
    else:
        ids = args.prompt_ids
        vocab = omni.config.thinker_config.text_config.vocab_size
        if max(ids) >= vocab:
            parser.error(f"--prompt-ids: token id {max(ids)} is outside the vocabulary ({vocab})")
    fields = dict(request_id="cli", prompt_token_ids=ids, modalities=args.modalities,
                  speaker=speaker, max_tokens=args.max_tokens or sa.limits.default_max_tokens,
                  max_audio_frames=args.max_audio_frames or sa.limits.default_max_audio_frames,
                  mm=mm)
    if args.sample:
        fields["thinker_sampling"] = SamplingParams(**SAMPLED_THINKER, seed=args.seed)
        fields["talker_sampling"] = SamplingParams(**SAMPLED_TALKER, seed=args.seed)
    return OmniRequest(**fields)


def _media_messages(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[dict]:
    """System + user message whose content is the audio clips, the images, then the text."""
    from omni_ray.inputs.audio import decode_audio
    from omni_ray.inputs.errors import InputError
    from omni_ray.inputs.image import decode_image

    parts = []
    try:
        for f in args.audio:
            parts.append({"type": "audio", "audio": decode_audio(
                f.read_bytes(), f.suffix.lower()[1:], max_seconds=float("inf"))})
        for f in args.image:
            parts.append({"type": "image", "image": decode_image(f.read_bytes(),
                                                                 max_pixels=1 << 28)})
    except InputError as e:
        parser.error(f"{f}: {e}")
    parts.append({"type": "text", "text": args.text})
    system = [{"role": "system", "content": args.system}] if args.system else []
    return system + [{"role": "user", "content": parts}]


def _human(s: dict) -> str:
    def secs(v):
        return "-" if v is None else f"{v:.3f} s"

    lines = [f"text: {s['text']!r}",
             f"{len(s['text_token_ids'])} tokens ({s['finish_reason']}), {s['codec_frames']} codec "
             f"frames, {s['audio_seconds']:.2f} s of audio at {s['sample_rate']} Hz",
             f"first token {secs(s['time_to_first_token'])}, first audio "
             f"{secs(s['time_to_first_audio'])}, total {secs(s['latency'])} ({s['mode']})"]
    if s["out"]:
        lines.append(f"wrote {s['out']}")
    return "\n".join(lines)

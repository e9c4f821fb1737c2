"""Command line: ``omni-ray make-tiny``, ``omni-ray make-dummy`` and ``omni-ray generate`` (the
offline pipeline).

``omni-ray make-dummy DIR --shape qwen3-omni-30b-a3b`` writes a stand-in checkpoint without
weights (config, tokenizer, processor): every stage loads it with seeded random weights, and
serving it needs ``allow_dummy_weights: true``.

``omni-ray generate --text "Hi"`` runs thinker, talker and code2wav in this process (``Omni``) and
prints the answer; ``--json`` prints one JSON object instead, ``--out x.wav|x.npy`` writes the
audio. Without ``--model`` it uses the embedded default, the seeded tiny checkpoint in
``$OMNI_RAY_HOME/qwen3-omni-tiny``, made on first use. Bad arguments exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from omni_ray import constants
from omni_ray.config.pipeline import PipelineConfig
from omni_ray.config.request import OmniRequest
from omni_ray.config.sampling import SamplingParams
from omni_ray.models.dummy import DEFAULT_SHAPE, SHAPES
from omni_ray.models.tiny import SPEAKERS

# --sample: per-stage sampling a person would serve with (talker as in vLLM-Omni's defaults).
THINKER_SAMPLING = dict(temperature=0.7, top_p=0.9)
TALKER_SAMPLING = dict(temperature=0.9, top_k=50, repetition_penalty=1.05)
MODALITIES = ("text", "audio")
_DEFAULTS = {name: f.default for name, f in OmniRequest.model_fields.items()}
_PIPELINE = {name: f.default for name, f in PipelineConfig.model_fields.items()}  # as the app


def _positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {n}")
    return n


def _token_ids(value: str) -> list[int]:
    try:
        ids = [int(t) for t in value.replace(" ", "").split(",") if t]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated token ids like 1,2,3, got {value!r}") from None
    if not ids or min(ids) < 0:
        raise argparse.ArgumentTypeError(f"expected non-negative token ids, got {value!r}")
    return ids


def _modalities(value: str) -> tuple[str, ...]:
    mods = tuple(dict.fromkeys(m.strip() for m in value.split(",") if m.strip()))
    bad = [m for m in mods if m not in MODALITIES]
    if not mods or bad:
        raise argparse.ArgumentTypeError(
            f"expected 'text' or 'text,audio', got {value!r}")
    return mods


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="omni-ray", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    tiny = sub.add_parser("make-tiny", help="write the seeded tiny Qwen3-Omni checkpoint")
    tiny.add_argument("dir", type=Path, help="output directory (created)")
    tiny.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")

    dummy = sub.add_parser("make-dummy", help="write a Qwen3-Omni stand-in checkpoint without "
                           "weights (random weights when loaded)")
    dummy.add_argument("dir", type=Path, help="output directory (created)")
    dummy.add_argument("--shape", choices=SHAPES, default=DEFAULT_SHAPE,
                       help=f"sizes: the released model's or CPU-sized (default {DEFAULT_SHAPE})")
    dummy.add_argument("--seed", type=int, default=0, help="weight seed used at load (default 0)")
    dummy.add_argument("--no-processor", action="store_true",
                       help="no audio/image processor files (they need torchvision)")

    gen = sub.add_parser("generate", help="text (and speech) for one prompt, offline")
    gen.add_argument("--model", type=Path, default=None,
                     help="checkpoint directory (default: the tiny checkpoint in $OMNI_RAY_HOME)")
    prompt = gen.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--text", help="user message (wrapped in the chat template)")
    prompt.add_argument("--prompt-ids", type=_token_ids, metavar="1,2,3",
                        help="prompt token ids, chat template already applied")
    gen.add_argument("--system", help="system message (with --text only)")
    gen.add_argument("--audio", type=Path, action="append", default=[], metavar="FILE",
                     help="a .wav or .mp3 clip in the user message, before the text (repeatable)")
    gen.add_argument("--image", type=Path, action="append", default=[], metavar="FILE",
                     help="an image (png, jpeg, webp, gif, bmp) in the user message (repeatable)")
    gen.add_argument("--modalities", type=_modalities, default=MODALITIES, metavar="text[,audio]",
                     help="what to produce (default text,audio)")
    gen.add_argument("--mode", choices=("sync", "async_chunk"), default=_PIPELINE["mode"],
                     help=f"stage delivery (default {_PIPELINE['mode']})")
    gen.add_argument("--code2wav-mode", choices=("window", "stateful"),
                     default=_PIPELINE["code2wav_mode"],
                     help=f"chunked vocoding (default {_PIPELINE['code2wav_mode']})")
    gen.add_argument("--speaker", choices=sorted(SPEAKERS), default=_DEFAULTS["speaker"],
                     help=f"voice (default {_DEFAULTS['speaker']})")
    gen.add_argument("--max-tokens", type=_positive_int, default=_DEFAULTS["max_tokens"],
                     help=f"max text tokens (default {_DEFAULTS['max_tokens']})")
    gen.add_argument("--max-audio-frames", type=_positive_int,
                     default=_DEFAULTS["max_audio_frames"],
                     help=f"max codec frames, 80 ms each (default {_DEFAULTS['max_audio_frames']})")
    gen.add_argument("--sample", action="store_true",
                     help="sample (thinker T=0.7 top-p 0.9; talker T=0.9 top-k 50) instead of greedy")
    gen.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    gen.add_argument("--out", type=Path, default=None, help="write the audio: .wav or .npy")
    gen.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "make-tiny":
        from omni_ray.models.tiny import make_tiny_checkpoint

        print(make_tiny_checkpoint(args.dir, seed=args.seed))
        return 0
    if args.command == "make-dummy":
        from omni_ray.models.dummy import make_dummy_checkpoint

        print(make_dummy_checkpoint(args.dir, shape=args.shape, seed=args.seed,
                                    processor=not args.no_processor))
        return 0
    return _generate(parser, args)


def _generate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    # 1) Check what argparse cannot, before loading anything.
    wants_audio = "audio" in args.modalities
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
    if args.out is not None and not wants_audio:
        parser.error("--out needs audio output; drop --modalities text")
    if args.out is not None and args.out.suffix.lower() not in (".wav", ".npy"):
        parser.error(f"--out {args.out}: the file name must end in .wav or .npy")
    model = args.model
    if model is not None and not (model / "config.json").is_file():
        parser.error(f"--model {model}: not a checkpoint directory (no config.json)")

    # 2) Load the pipeline (the default model is made on first use).
    _quiet_transformers()
    if model is None:
        model = _default_model()
    from omni_ray.audio import write_audio
    from omni_ray.offline import Omni

    omni = Omni(model, mode=args.mode, pipeline=_pipeline(args))
    request = _request(parser, args, omni)

    # 3) Run, then report.
    try:
        out = omni.generate(request)[0]
    except ValueError as e:  # runners raise ValueError for requests they cannot serve
        parser.exit(2, f"{parser.prog} generate: error: {e}\n")
    if args.out is not None:
        write_audio(args.out, out.audio, out.sample_rate)
    summary = dict(out.summary(), mode=args.mode, code2wav_mode=args.code2wav_mode,
                   modalities=list(args.modalities), speaker=args.speaker,
                   prompt_tokens=len(request.prompt_token_ids), model=str(model),
                   out=str(args.out) if args.out is not None else None)
    print(json.dumps(summary) if args.json else _human(summary))
    return 0


def _default_model() -> Path:
    from omni_ray.models.tiny import ensure_tiny_checkpoint

    path = constants.default_model_dir()
    if not (path / "config.json").is_file():
        print(f"making the tiny checkpoint in {path}", file=sys.stderr)
    return ensure_tiny_checkpoint(path)


def _pipeline(args: argparse.Namespace) -> PipelineConfig:
    return PipelineConfig(mode=args.mode, code2wav_mode=args.code2wav_mode)


def _request(parser: argparse.ArgumentParser, args: argparse.Namespace, omni) -> OmniRequest:
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
                  speaker=args.speaker, max_tokens=args.max_tokens,
                  max_audio_frames=args.max_audio_frames, mm=mm)
    if args.sample:
        fields["thinker_sampling"] = SamplingParams(**THINKER_SAMPLING, seed=args.seed)
        fields["talker_sampling"] = SamplingParams(**TALKER_SAMPLING, seed=args.seed)
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


def _quiet_transformers() -> None:
    """No progress bars or config warnings on the terminal (stdout may be JSON)."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


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


if __name__ == "__main__":
    sys.exit(main())

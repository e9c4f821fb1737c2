"""Audio formats: the file types ``write_audio`` (and so ``omni-ray generate --out``) writes, by
suffix, and the formats of OpenAI's audio API (chat ``audio.format``) with their encoder.

Importing this module is numpy-free, so the CLI lists the suffixes in ``--help`` without importing
anything heavy; ``encode_audio`` imports its encoder when called.
"""

from __future__ import annotations

# Written through soundfile (libsndfile): suffix -> (format, subtype).
SOUNDFILE_FORMATS = {".flac": ("FLAC", "PCM_16"), ".ogg": ("OGG", "VORBIS"),
                     ".mp3": ("MP3", "MPEG_LAYER_III")}
# .wav: PCM16 by the standard library; .npy: the float32 waveform, lossless.
AUDIO_SUFFIXES = (".wav", *SOUNDFILE_FORMATS, ".npy")

# OpenAI's audio formats (chat completions' ``audio.format``) -> the answer's media type. Who
# writes each: wav (PCM16) and pcm16 (raw little-endian int16, no header) the standard library;
# flac (PCM16), mp3 (MPEG layer III) and opus (Ogg Opus) soundfile (libsndfile, already a
# dependency); aac (AAC-LC in an ADTS stream, as OpenAI's) PyAV (FFmpeg's own encoder), because
# libsndfile has no AAC. All are mono at the model's 24 kHz.
API_AUDIO_FORMATS = {"wav": "audio/wav", "mp3": "audio/mpeg", "flac": "audio/flac",
                     "opus": "audio/ogg; codecs=opus", "aac": "audio/aac", "pcm16": "audio/pcm"}
# Streamed chat answers carry raw pcm16 pieces only (OpenAI's rule: a compressed format cannot be
# cut into independently playable base64 deltas).
STREAM_AUDIO_FORMATS = ("pcm16",)
_SOUNDFILE_API = {"flac": ("FLAC", "PCM_16"), "mp3": ("MP3", "MPEG_LAYER_III"),
                  "opus": ("OGG", "OPUS")}
AAC_BIT_RATE = 64_000  # bits/s: speech at 24 kHz mono


def encode_audio(samples, fmt: str, sample_rate: int = 24000) -> bytes:
    """A mono waveform (float32 in [-1, 1], torch or numpy) as one file of OpenAI format ``fmt``
    (a key of ``API_AUDIO_FORMATS``). CPU work: call it off the event loop."""
    from omni_ray.audio import _mono_float32, to_pcm16, wav_bytes

    if fmt == "wav":
        return wav_bytes(samples, sample_rate)
    if fmt == "pcm16":
        return to_pcm16(samples)
    import numpy as np

    x = np.clip(np.nan_to_num(_mono_float32(samples)), -1.0, 1.0)
    if fmt in _SOUNDFILE_API:
        import io

        import soundfile as sf

        container, subtype = _SOUNDFILE_API[fmt]
        if subtype == "PCM_16":  # our int16 mapping (as wav and pcm16), not libsndfile's rounding
            x = np.frombuffer(to_pcm16(x), "<i2")
        buf = io.BytesIO()
        sf.write(buf, x, int(sample_rate), format=container, subtype=subtype)
        return buf.getvalue()
    if fmt == "aac":
        return _aac(x, int(sample_rate))
    raise ValueError(f"unsupported audio format {fmt!r}; use {', '.join(API_AUDIO_FORMATS)}")


def _aac(x, sample_rate: int) -> bytes:
    """AAC-LC in ADTS frames (a plain ``.aac`` stream) through PyAV."""
    import io

    import av
    import numpy as np

    buf = io.BytesIO()
    with av.open(buf, "w", format="adts") as out:
        stream = out.add_stream("aac", rate=sample_rate, layout="mono")
        stream.bit_rate = AAC_BIT_RATE
        frame_size = stream.codec_context.frame_size or 1024
        pts = 0
        for i in range(0, len(x), frame_size):  # the encoder takes frame_size samples a call
            piece = np.ascontiguousarray(x[i:i + frame_size], dtype=np.float32)
            frame = av.AudioFrame.from_ndarray(piece.reshape(1, -1), format="fltp", layout="mono")
            frame.sample_rate, frame.pts = sample_rate, pts
            pts += piece.size
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))  # flush
    return buf.getvalue()

# ``omni-ray speak --out``: the file's suffix is the speech API's ``response_format`` (so .opus is
# Ogg Opus and .pcm raw int16, as the API answers them) -> our format name for ``encode_audio``.
SPEECH_SUFFIXES = {".mp3": "mp3", ".opus": "opus", ".aac": "aac", ".flac": "flac",
                   ".wav": "wav", ".pcm": "pcm16"}

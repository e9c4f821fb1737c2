"""Audio file types ``write_audio`` (and so ``omni-ray generate --out``) writes, by suffix.

Numpy-free, so the CLI lists them in ``--help`` without importing anything heavy.
"""

# Written through soundfile (libsndfile): suffix -> (format, subtype).
SOUNDFILE_FORMATS = {".flac": ("FLAC", "PCM_16"), ".ogg": ("OGG", "VORBIS"),
                     ".mp3": ("MP3", "MPEG_LAYER_III")}
# .wav: PCM16 by the standard library; .npy: the float32 waveform, lossless.
AUDIO_SUFFIXES = (".wav", *SOUNDFILE_FORMATS, ".npy")

"""Decoding audio clips and images from requests, and the chat template the processor uses."""

from __future__ import annotations

import numpy as np
import pytest
from media_samples import audio_bytes, data_url, image_bytes, picture, tone

from omni_ray.inputs.audio import SAMPLE_RATE, decode_audio, decode_base64
from omni_ray.inputs.errors import InputError
from omni_ray.inputs.image import data_url_bytes, decode_image


# -- audio ---------------------------------------------------------------------------------------
def test_wav_at_16k_is_read_exactly():
    x = tone(0.5, rate=SAMPLE_RATE)
    out = decode_audio(audio_bytes(x, SAMPLE_RATE, subtype="FLOAT"), "wav", max_seconds=10)
    assert out.dtype == np.float32 and np.array_equal(out, x)


def test_other_rates_are_resampled_and_stereo_is_mixed_down():
    x = tone(1.0, rate=44100)
    stereo = np.stack([x, -x * 0.5], axis=1)
    out = decode_audio(audio_bytes(stereo, 44100, subtype="PCM_16"), "wav", max_seconds=10)
    assert out.dtype == np.float32 and abs(len(out) - SAMPLE_RATE) <= 1
    assert np.abs(out).max() == pytest.approx(np.abs(x * 0.25).max(), rel=0.05)


def test_mp3_decodes_to_the_same_duration():
    out = decode_audio(audio_bytes(tone(1.0), 24000, "mp3"), "mp3", max_seconds=10)
    assert abs(len(out) - SAMPLE_RATE) < 0.1 * SAMPLE_RATE and np.abs(out).max() > 0.1


@pytest.mark.parametrize("data, fmt, field, code", [
    (b"RIFF....garbage" * 4, "wav", "input_audio.data", "invalid_audio"),
    (b"", "mp3", "input_audio.data", "invalid_audio"),
    (audio_bytes(tone(0.2), 24000, "mp3"), "wav", "input_audio.format", "invalid_audio_format"),
    (audio_bytes(tone(0.2)), "mp3", "input_audio.format", "invalid_audio_format"),
    (audio_bytes(tone(0.2)), "flac", "input_audio.format", "invalid_audio_format"),
    (audio_bytes(np.zeros(0, np.float32)), "wav", "input_audio.data", "invalid_audio"),
    # 200 samples (12 ms): was a 500 from the feature extractor's padding
    (audio_bytes(tone(200 / 16000, rate=16000), 16000), "wav", "input_audio.data",
     "audio_too_short"),
    # headers claiming 1 Hz (299 "seconds" in 642 bytes) or 2^31-1 Hz
    (audio_bytes(np.zeros(299, np.float32), 1), "wav", "input_audio.data", "invalid_audio"),
    (audio_bytes(np.zeros(48000, np.float32), 2**31 - 1), "wav", "input_audio.data",
     "invalid_audio"),
])
def test_bad_audio_names_the_field(data, fmt, field, code):
    with pytest.raises(InputError) as e:
        decode_audio(data, fmt, max_seconds=10)
    assert (e.value.field, e.value.code) == (field, code)


def test_duration_limit_is_checked_from_the_header():
    with pytest.raises(InputError, match=r"lasts 3\.0 s, over limits.max_audio_seconds=2") as e:
        decode_audio(audio_bytes(tone(3.0)), "wav", max_seconds=2)
    assert e.value.code == "audio_too_long"


def test_base64_is_strict():
    assert decode_base64("aGk=") == b"hi"
    with pytest.raises(InputError) as e:
        decode_base64("not base64!!")
    assert e.value.code == "invalid_base64"


# -- images --------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "BMP", "GIF"])
def test_common_image_formats_decode_to_rgb(fmt):
    img = decode_image(image_bytes(picture(40, 30), fmt), max_pixels=10_000)
    assert img.mode == "RGB" and img.size == (40, 30)


def test_png_pixels_survive_exactly():
    src = picture(17, 9)
    out = decode_image(data_url_bytes(data_url(image_bytes(src))), max_pixels=1000)
    assert np.array_equal(np.asarray(out), np.asarray(src))


def test_pixel_limit_is_checked_before_decoding():
    from PIL import Image

    big = image_bytes(Image.new("RGB", (3000, 3000)))  # a few KB of PNG, 9 M pixels
    assert len(big) < 100_000
    with pytest.raises(InputError, match="3000x3000 = 9000000 pixels, over "
                                         "limits.max_image_pixels=1000000") as e:
        decode_image(big, max_pixels=1_000_000)
    assert e.value.code == "image_too_large"


@pytest.mark.parametrize("url, match", [
    ("data:image/png;base64,!!!!", "not valid base64"),
    ("data:text/plain;base64,aGk=", "not an image"),
    ("data:image/png,rawbytes", "must be base64"),
    ("https://example.com/x.png", "expected a data: URL"),
])
def test_bad_data_urls(url, match):
    with pytest.raises(InputError, match=match):
        data_url_bytes(url)


@pytest.mark.parametrize("data", [b"\x89PNG\r\n\x1a\n" + b"\0" * 40, b"hello world", b""])
def test_undecodable_images(data):
    with pytest.raises(InputError) as e:
        decode_image(data, max_pixels=10_000)
    assert e.value.code == "invalid_image" and e.value.field == "image_url.url"


def test_truncated_png_is_an_input_error():
    data = image_bytes(picture(64, 64))
    with pytest.raises(InputError):
        decode_image(data[: len(data) // 2], max_pixels=10_000)


# -- the prompt ----------------------------------------------------------------------------------
def test_checkpoint_chat_template_renders_chat_prompt(tiny_model_dir):
    from transformers import AutoProcessor

    from omni_ray.models.tokenizer import chat_prompt

    proc = AutoProcessor.from_pretrained(tiny_model_dir, local_files_only=True)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "audio", "audio": None},
                                     {"type": "text", "text": "and"},
                                     {"type": "image", "image": None}]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "Again?"},
    ]
    assert proc.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == \
        chat_prompt(messages)


def test_processor_expands_placeholders_to_encoder_rows(tiny_model_dir):
    from omni_ray.inputs.processor import InputProcessor

    proc = InputProcessor(tiny_model_dir)
    audio = decode_audio(audio_bytes(tone(2.0)), "wav", max_seconds=10)
    ids, mm = proc.build([{"role": "user", "content": [
        {"type": "audio", "audio": audio}, {"type": "image", "image": picture(96, 64)},
        {"type": "text", "text": "What is it?"}]}])
    assert mm.num_audios == 1 and mm.num_images == 1
    assert ids.count(151675) == 26  # 13 audio tokens per second (n_window 50, 100 mel frames/s)
    grid = mm.image_grid_thw[0].tolist()
    assert ids.count(151655) == grid[0] * grid[1] * grid[2] // 4  # one per 2x2 merged patch
    text_only, none = proc.build([{"role": "user", "content": "hi"}])
    assert none is None and text_only == proc.tokenizer(
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n").input_ids

"""Chat messages (text, decoded audio clips, images) -> prompt token ids + encoder inputs.

Text-only prompts are tokenised as before (``encode_chat``). Prompts with media go through the
checkpoint's own ``Qwen3OmniMoeProcessor`` (processor_config.json: Whisper log-mel features for
audio, Qwen2-VL patches for images), which expands each placeholder to one token per encoder
output row; the features become a ``MultiModalInputs`` for the thinker.
"""

from __future__ import annotations

import threading
from pathlib import Path

from omni_ray.models.tokenizer import chat_prompt, encode_chat, load_tokenizer
from omni_ray.payload.mm import MultiModalInputs


class InputProcessor:
    """Owns the tokenizer and (loaded on first media prompt) the processor of one checkpoint."""

    def __init__(self, model_dir: str | Path, tokenizer=None):
        self.model_dir = Path(model_dir)
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(model_dir)
        self._processor = None
        self._lock = threading.Lock()

    @property
    def supports_media(self) -> bool:
        return (self.model_dir / "processor_config.json").exists() or \
            (self.model_dir / "preprocessor_config.json").exists()

    def processor(self):
        with self._lock:
            if self._processor is None:
                from transformers import AutoProcessor

                self._processor = AutoProcessor.from_pretrained(str(self.model_dir),
                                                                local_files_only=True)
            return self._processor

    def build(self, messages: list[dict], *, raw_media: bool = False,
              ) -> tuple[list[int], MultiModalInputs | None]:
        """``messages`` as ``chat_prompt`` takes them; audio parts carry ``"audio"`` (float32
        16 kHz mono numpy), image parts ``"image"`` (an RGB PIL image).

        ``raw_media``: for a thinker that runs its own processor (vLLM): the inputs carry the
        decoded media and the layout, not the encoder features."""
        audios, images = [], []
        for m in messages:
            if isinstance(m["content"], str):
                continue
            for part in m["content"]:
                if part["type"] == "audio":
                    audios.append(part["audio"])
                elif part["type"] == "image":
                    images.append(part["image"])
        if not audios and not images:
            return encode_chat(self.tokenizer, messages), None
        if not self.supports_media:
            raise ValueError(f"the checkpoint at {self.model_dir} has no processor files "
                             "(processor_config.json): audio and image input are unavailable")
        out = self.processor()(text=chat_prompt(messages), audio=audios or None,
                               images=images or None, return_tensors="pt")
        mask = out["feature_attention_mask"].long() if "feature_attention_mask" in out else None
        grid = out["image_grid_thw"].long() if "image_grid_thw" in out else None
        if raw_media:
            import numpy as np

            mm = MultiModalInputs(
                feature_attention_mask=mask, image_grid_thw=grid,
                raw_audio=[np.ascontiguousarray(a, dtype=np.float32) for a in audios] or None,
                raw_images=[np.asarray(im.convert("RGB"), dtype=np.uint8) for im in images] or None)
        else:
            mm = MultiModalInputs(input_features=out.get("input_features"),
                                  feature_attention_mask=mask,
                                  pixel_values=out.get("pixel_values"), image_grid_thw=grid)
        mm.validate()
        return out["input_ids"][0].tolist(), mm

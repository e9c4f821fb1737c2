"""Multimodal prompt inputs: what the ingress's processor made and the thinker's encoders read.

The tensors are exactly what transformers' ``Qwen3OmniMoeProcessor`` returns for a prompt's
audio clips and images (the prompt's ``input_ids`` already hold one placeholder token per encoder
output row). A thinker that runs its own processor (vLLM) gets the decoded media instead
(``raw_audio``, ``raw_images``) and no features; ``feature_attention_mask`` and
``image_grid_thw`` (small) are always there: they fix the prompt's layout. These inputs travel to
the thinker stage only; the talker gets the encoders' effect through the thinker's hidden states
(``ThinkerChunk.mm_hidden``) and the layout fields of chunk 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from omni_ray.payload.errors import PayloadError

AUDIO_SAMPLE_RATE = 16000  # raw_audio clips are float32 mono at this rate


@dataclass(kw_only=True, slots=True, eq=False)
class MultiModalInputs:
    # audio: [n_audios, mel_bins, frames] float log-mel features and their [n_audios, frames] mask
    input_features: torch.Tensor | None = None
    feature_attention_mask: torch.Tensor | None = None
    # images: [patches, channels * temporal * patch * patch] float, and [n_images, 3] int64 grids
    pixel_values: torch.Tensor | None = None
    image_grid_thw: torch.Tensor | None = None
    # decoded media, for a thinker that processes them itself: float32 16 kHz mono clips and
    # uint8 [height, width, 3] RGB images, in prompt order
    raw_audio: list[np.ndarray] | None = None
    raw_images: list[np.ndarray] | None = None

    @property
    def num_audios(self) -> int:
        return 0 if self.feature_attention_mask is None else int(self.feature_attention_mask.shape[0])

    @property
    def num_images(self) -> int:
        return 0 if self.image_grid_thw is None else int(self.image_grid_thw.shape[0])

    @property
    def has_features(self) -> bool:
        """Whether the encoder inputs are here (else only the raw media)."""
        return (self.num_audios == 0 or self.input_features is not None) and \
            (self.num_images == 0 or self.pixel_values is not None)

    def audio_feature_lengths(self) -> torch.Tensor | None:
        """[n_audios] int64 mel frames of each clip (what the encoder and the mrope index use)."""
        if self.feature_attention_mask is None:
            return None
        return self.feature_attention_mask.sum(-1).to(torch.int64)

    def model_kwargs(self, device) -> dict:
        """The keyword arguments of the thinker's forward that carry these inputs."""
        if not self.has_features:
            raise ValueError("these inputs hold raw media only (made for a vLLM thinker)")
        out = {}
        if self.input_features is not None:
            out["input_features"] = self.input_features.to(device)
            out["feature_attention_mask"] = self.feature_attention_mask.to(device)
        if self.pixel_values is not None:
            out["pixel_values"] = self.pixel_values.to(device)
            out["image_grid_thw"] = self.image_grid_thw.to(device)
        return out

    def validate(self) -> None:
        """Raise `PayloadError` naming the field if the parts do not fit together."""
        if self.input_features is not None:
            f, m = self.input_features, self.feature_attention_mask
            if m is None:
                raise PayloadError("input_features need feature_attention_mask",
                                   path="feature_attention_mask")
            if f.dim() != 3 or not f.is_floating_point():
                raise PayloadError(f"expected float [n, mel, frames], got {tuple(f.shape)} {f.dtype}",
                                   path="input_features")
            if m.dim() != 2 or tuple(m.shape) != (f.shape[0], f.shape[2]):
                raise PayloadError(f"expected [{f.shape[0]}, {f.shape[2]}], got {tuple(m.shape)}",
                                   path="feature_attention_mask")
        if self.feature_attention_mask is not None and self.feature_attention_mask.dim() != 2:
            raise PayloadError("expected [n_audios, frames]", path="feature_attention_mask")
        if self.image_grid_thw is not None:
            g = self.image_grid_thw
            if g.dim() != 2 or g.shape[1] != 3 or g.dtype != torch.int64:
                raise PayloadError(f"expected int64 [n, 3], got {tuple(g.shape)} {g.dtype}",
                                   path="image_grid_thw")
        if self.pixel_values is not None:
            p, g = self.pixel_values, self.image_grid_thw
            if g is None:
                raise PayloadError("pixel_values need image_grid_thw", path="image_grid_thw")
            if p.dim() != 2 or not p.is_floating_point():
                raise PayloadError(f"expected float [patches, dim], got {tuple(p.shape)} {p.dtype}",
                                   path="pixel_values")
            if int(g.prod(-1).sum()) != p.shape[0]:
                raise PayloadError(f"grids hold {int(g.prod(-1).sum())} patches, pixel_values "
                                   f"{p.shape[0]}", path="pixel_values")
        if self.raw_audio is not None:
            if len(self.raw_audio) != self.num_audios:
                raise PayloadError(f"{len(self.raw_audio)} clips for {self.num_audios} audio "
                                   "placeholders", path="raw_audio")
            for i, a in enumerate(self.raw_audio):
                if not (isinstance(a, np.ndarray) and a.ndim == 1 and a.dtype == np.float32):
                    raise PayloadError("expected a float32 1-D array", path=f"raw_audio[{i}]")
        if self.raw_images is not None:
            if len(self.raw_images) != self.num_images:
                raise PayloadError(f"{len(self.raw_images)} images for {self.num_images} image "
                                   "placeholders", path="raw_images")
            for i, im in enumerate(self.raw_images):
                if not (isinstance(im, np.ndarray) and im.ndim == 3 and im.shape[2] == 3
                        and im.dtype == np.uint8):
                    raise PayloadError("expected uint8 [h, w, 3]", path=f"raw_images[{i}]")
        if not self.has_features and (
                (self.num_audios and self.raw_audio is None)
                or (self.num_images and self.raw_images is None)):
            raise PayloadError("neither encoder inputs nor raw media", path="raw_audio")

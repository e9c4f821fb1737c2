"""Multimodal prompt inputs: what the ingress's processor made and the thinker's encoders read.

The tensors are exactly what transformers' ``Qwen3OmniMoeProcessor`` returns for a prompt's
audio clips and images (the prompt's ``input_ids`` already hold one placeholder token per encoder
output row). They travel to the thinker stage only; the talker gets the encoders' effect through
the thinker's hidden states (``ThinkerChunk.mm_hidden``) and the layout fields of chunk 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from omni_ray.payload.errors import PayloadError


@dataclass(kw_only=True, slots=True, eq=False)
class MultiModalInputs:
    # audio: [n_audios, mel_bins, frames] float log-mel features and their [n_audios, frames] mask
    input_features: torch.Tensor | None = None
    feature_attention_mask: torch.Tensor | None = None
    # images: [patches, channels * temporal * patch * patch] float, and [n_images, 3] int64 grids
    pixel_values: torch.Tensor | None = None
    image_grid_thw: torch.Tensor | None = None

    @property
    def num_audios(self) -> int:
        return 0 if self.input_features is None else int(self.input_features.shape[0])

    @property
    def num_images(self) -> int:
        return 0 if self.image_grid_thw is None else int(self.image_grid_thw.shape[0])

    def audio_feature_lengths(self) -> torch.Tensor | None:
        """[n_audios] int64 mel frames of each clip (what the encoder and the mrope index use)."""
        if self.feature_attention_mask is None:
            return None
        return self.feature_attention_mask.sum(-1).to(torch.int64)

    def model_kwargs(self, device) -> dict:
        """The keyword arguments of the thinker's forward that carry these inputs."""
        out = {}
        if self.input_features is not None:
            out["input_features"] = self.input_features.to(device)
            out["feature_attention_mask"] = self.feature_attention_mask.to(device)
        if self.pixel_values is not None:
            out["pixel_values"] = self.pixel_values.to(device)
            out["image_grid_thw"] = self.image_grid_thw.to(device)
        return out

    def validate(self) -> None:
        """Raise `PayloadError` naming the field if the tensors do not fit together."""
        if (self.input_features is None) != (self.feature_attention_mask is None):
            raise PayloadError("input_features and feature_attention_mask come together",
                               path="feature_attention_mask")
        if (self.pixel_values is None) != (self.image_grid_thw is None):
            raise PayloadError("pixel_values and image_grid_thw come together",
                               path="image_grid_thw")
        if self.input_features is not None:
            f, m = self.input_features, self.feature_attention_mask
            if f.dim() != 3 or not f.is_floating_point():
                raise PayloadError(f"expected float [n, mel, frames], got {tuple(f.shape)} {f.dtype}",
                                   path="input_features")
            if m.dim() != 2 or tuple(m.shape) != (f.shape[0], f.shape[2]):
                raise PayloadError(f"expected [{f.shape[0]}, {f.shape[2]}], got {tuple(m.shape)}",
                                   path="feature_attention_mask")
        if self.pixel_values is not None:
            p, g = self.pixel_values, self.image_grid_thw
            if p.dim() != 2 or not p.is_floating_point():
                raise PayloadError(f"expected float [patches, dim], got {tuple(p.shape)} {p.dtype}",
                                   path="pixel_values")
            if g.dim() != 2 or g.shape[1] != 3 or g.dtype != torch.int64:
                raise PayloadError(f"expected int64 [n, 3], got {tuple(g.shape)} {g.dtype}",
                                   path="image_grid_thw")
            if int(g.prod(-1).sum()) != p.shape[0]:
                raise PayloadError(f"grids hold {int(g.prod(-1).sum())} patches, pixel_values "
                                   f"{p.shape[0]}", path="pixel_values")

"""Batch generation over Ray Data: ``build_omni_processor(OmniProcessorConfig(...))(ds)``.

Output columns (besides every input column): ``id``, ``text``, ``text_token_ids``,
``finish_reason``, ``codec_frames``, ``audio`` (float32 samples, or encoded bytes per
``audio_format``), ``sample_rate``, ``audio_seconds``, ``error`` (None, or why the row failed:
"invalid row: <field>: ..." or "<stage>: ..."), ``thinker_batch_s`` / ``talker_batch_s`` /
``code2wav_batch_s`` (the wall time of the batch the row was stepped in, per stage).
"""

from omni_ray.data.config import DataStageConfig, OmniProcessorConfig
from omni_ray.data.processor import OmniProcessor, build_omni_processor

__all__ = ["DataStageConfig", "OmniProcessor", "OmniProcessorConfig", "build_omni_processor"]

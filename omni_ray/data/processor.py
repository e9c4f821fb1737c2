"""``build_omni_processor``: a Ray Dataset of chat rows -> a Dataset of spoken answers.

In the shape of ``ray.data.llm.build_llm_processor``: an optional ``preprocess`` (row -> row),
one operator per stage (thinker, talker, code2wav; each its own actor pool, resources and batch
size), an optional ``postprocess`` (row -> row). Every input column is carried through.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from omni_ray.data.config import DataStageConfig, OmniProcessorConfig
from omni_ray.data.stages import Code2WavStage, TalkerStage, ThinkerStage, finish_rows

Row = dict[str, Any]


class OmniProcessor:
    """Apply with ``processor(ds)``; lazy, like any Dataset transform."""

    def __init__(self, config: OmniProcessorConfig, preprocess: Callable[[Row], Row] | None = None,
                 postprocess: Callable[[Row], Row] | None = None):
        self.config = config
        self.preprocess, self.postprocess = preprocess, postprocess
        self._model_dir: str | None = None

    @property
    def model_dir(self) -> str:
        """The checkpoint the actors load (resolved once, here on the driver)."""
        if self._model_dir is None:
            from omni_ray.config.serving import OmniServingArgs

            c = self.config
            self._model_dir = OmniServingArgs(
                model=c.model, revision=c.revision, allow_dummy_weights=c.allow_dummy_weights,
                make_tiny_if_missing=False).checkpoint_dir()
        return self._model_dir

    def __call__(self, ds):
        c = self.config
        if self.preprocess is not None:
            ds = ds.map(self.preprocess)
        stages = [(ThinkerStage, c.thinker)]
        if c.audio:
            stages += [(TalkerStage, c.talker), (Code2WavStage, c.code2wav)]
        kwargs = dict(config=c.model_dump(mode="json"), model_dir=self.model_dir)
        for cls, sc in stages:
            ds = ds.map_batches(cls, fn_constructor_kwargs=kwargs, **_operator(sc))
        ds = ds.map_batches(partial(finish_rows, fmt=c.audio_format), batch_format="pyarrow")
        if self.postprocess is not None:
            ds = ds.map(self.postprocess)
        return ds


def _operator(sc: DataStageConfig) -> dict:
    """``map_batches`` arguments of one stage: its pool, batch size and each actor's resources."""
    from ray.data import ActorPoolStrategy

    r, c = sc.engine.engine_resources, sc.concurrency
    pool = (ActorPoolStrategy(size=c) if isinstance(c, int)
            else ActorPoolStrategy(min_size=c[0], max_size=c[1]))
    kw: dict[str, Any] = dict(compute=pool, batch_size=sc.batch_size, batch_format="numpy",
                              num_cpus=r.num_cpus, num_gpus=r.num_gpus)
    if r.resources:
        kw["resources"] = dict(r.resources)
    return kw


def build_omni_processor(config: OmniProcessorConfig, preprocess: Callable[[Row], Row] | None = None,
                         postprocess: Callable[[Row], Row] | None = None) -> OmniProcessor:
    """A processor for ``config``: ``processor(ds)`` returns the answered Dataset."""
    return OmniProcessor(config, preprocess, postprocess)

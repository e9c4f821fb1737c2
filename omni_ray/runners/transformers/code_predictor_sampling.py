"""How the code predictor samples codebooks 1-15: the rule both its eager loop
(``talker_inputs.py``) and its CUDA graphs (``code_predictor_graph.py``) follow."""

from __future__ import annotations

from omni_ray.config.sampling import SamplingParams

CP_TOP_K, CP_TOP_P = 50, 0.8  # transformers' code predictor sampling


def code_predictor_params(params: SamplingParams) -> SamplingParams:
    """transformers mirrors the talker's do_sample onto the code predictor (temperature 1,
    top-k 50, top-p 0.8)."""
    if params.greedy:
        return SamplingParams()
    return SamplingParams(temperature=1.0, top_k=CP_TOP_K, top_p=CP_TOP_P)

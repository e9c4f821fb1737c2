"""The code predictor batched on CPU gives each request bitwise what it gives alone.

``RowwiseLinear`` (runners/transformers/batch_invariant.py) is what makes the batched code
predictor exact on CPU; these tests compare the tiny checkpoint's code predictor batched against
one request at a time, down to the logits, and its frames through ``TalkerInputs``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from omni_ray.config.sampling import SamplingParams
from omni_ray.models.loading import load_stage
from omni_ray.runners.transformers.batch_invariant import RowwiseLinear, make_batch_invariant
from omni_ray.runners.transformers.talker_inputs import TalkerInputs, TalkerSeq

BATCH = 8


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 2])
def test_rowwise_linear_gives_each_entry_its_result_alone(bias, rows):
    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 512, bias=bias)
    make_batch_invariant(wrapper := torch.nn.Sequential(lin))
    rowwise = wrapper[0]
    assert isinstance(rowwise, RowwiseLinear) and rowwise.weight is lin.weight
    x = torch.randn(BATCH, rows, 256)
    batched = rowwise(x)
    alone = torch.cat([F.linear(x[b:b + 1], lin.weight, lin.bias) for b in range(BATCH)])
    assert torch.equal(batched, alone)
    assert torch.equal(rowwise(x[:1]), F.linear(x[:1], lin.weight, lin.bias))
    assert torch.equal(rowwise(x[0]), F.linear(x[0], lin.weight, lin.bias))  # 2-D: as before


@pytest.fixture(scope="module")
def talker(tiny_model_dir):
    return load_stage(tiny_model_dir, "talker")


def test_code_predictor_logits_batched_equal_alone(talker):
    from transformers import DynamicCache

    inputs = TalkerInputs(talker.module, talker.text_embedding, talker.config, "cpu")
    assert inputs.can_batch  # the start-up check agrees with what follows
    cp = inputs.model.code_predictor
    assert all(type(m) is not torch.nn.Linear for m in cp.modules())
    dim = talker.config.talker_config.text_config.hidden_size
    gen = torch.Generator().manual_seed(0)
    prefill = torch.randn(BATCH, 2, dim, generator=gen)
    codes = torch.randint(0, 2000, (BATCH, 1), generator=gen)
    with torch.inference_mode():
        first = cp(inputs_embeds=prefill, cache=DynamicCache(config=cp.config), use_cache=True)
        second = cp(input_ids=codes, cache=first.cache, use_cache=True, generation_steps=1)
        for b in range(BATCH):
            one = cp(inputs_embeds=prefill[b:b + 1], cache=DynamicCache(config=cp.config),
                     use_cache=True)
            assert torch.equal(one.logits, first.logits[b:b + 1])
            one = cp(input_ids=codes[b:b + 1], cache=one.cache, use_cache=True,
                     generation_steps=1)
            assert torch.equal(one.logits, second.logits[b:b + 1])


@pytest.mark.parametrize("greedy", [True, False])
def test_frames_batched_equal_alone(talker, greedy):
    inputs = TalkerInputs(talker.module, talker.text_embedding, talker.config, "cpu")
    dim = talker.config.talker_config.text_config.hidden_size

    def seqs() -> list[TalkerSeq]:
        out = []
        for i in range(BATCH):
            params = SamplingParams() if greedy else SamplingParams(temperature=0.9, seed=i)
            seq = TalkerSeq(f"r{i}", 0, params, 100, torch.Generator().manual_seed(i))
            seq.codec_ids = [11 * i + 3]
            seq.past_hidden = torch.randn(1, 1, dim, generator=torch.Generator().manual_seed(i))
            out.append(seq)
        return out

    with torch.inference_mode():
        alone = {s.request_id: inputs.residual_codes(s) for s in seqs()}
        batched = inputs.residual_codes_batch(seqs())
    assert batched.keys() == alone.keys()
    for rid, (frame, embed) in alone.items():
        assert torch.equal(batched[rid][0], frame), rid
        assert torch.equal(batched[rid][1], embed), rid


def test_a_batch_that_differs_is_not_batched(tiny_model_dir, monkeypatch):
    """The start-up check catches a batched code predictor that is off by one bit, and the
    talker then runs it one request at a time."""
    from omni_ray.runners.transformers.talker import TalkerRunner

    forward = RowwiseLinear.forward

    def off_when_batched(self, x):
        out = forward(self, x)
        return out + 1e-6 if x.dim() == 3 and x.shape[0] > 1 else out

    monkeypatch.setattr(RowwiseLinear, "forward", off_when_batched)
    tk = load_stage(tiny_model_dir, "talker")
    runner = TalkerRunner(tk.module, tk.text_embedding, tk.config)
    assert not runner.inputs.can_batch and not runner.batch_code_predictor

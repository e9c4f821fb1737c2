"""benchmarks/thinker_margins.py on the tiny checkpoint (real transformers, float32, CPU)."""

from benchmarks.thinker_margins import margins


def test_each_answer_token_has_its_margin_and_bf16_bound(tiny_model_dir):
    out = margins(str(tiny_model_dir), tokens=4)
    assert set(out) == {"text", "speech-in"}
    for rows in out.values():  # random weights run to max_tokens: one row a token
        assert len(rows) == 4
        assert all(m >= 0 and bound > 0 for m, bound in rows), rows
    assert out["text"] != out["speech-in"]  # the audio reached the thinker

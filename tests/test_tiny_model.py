"""The tiny model's plumbing: tokenizer round trips, KV-cache generation and log-prob alignment vs naive references."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from exgrpo.embedded import tiny_model as tm

SMALL = tm.TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, prompt_width=10,
                           max_response_tokens=20, warm_start_steps=3, warm_start_batch=8, seed=0)
TOKENIZER = tm.build_tokenizer()


def _model():
    tok = tm.build_tokenizer()
    return tok, tm.build_model(tok, SMALL).eval()


@settings(max_examples=50, deadline=None)
@given(st.text(alphabet=tm.CHARS, min_size=1, max_size=30))
def test_tokenizer_is_one_token_per_character_and_round_trips(text):
    tok = TOKENIZER
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) == len(text)
    assert tok.decode(ids) == text
    assert tok.decode(ids + [tok.eos_token_id], skip_special_tokens=True) == text


def test_chat_template_gives_the_bare_question_and_prompts_are_left_padded():
    tok = tm.build_tokenizer()
    text = tm.prompt_text(tok, [{"role": "user", "content": "Q:12+3="}])
    assert text == "Q:12+3="
    ids = tm.encode_prompts(tok, [text, "Q:1+2="], width=9)
    assert ids.shape == (2, 9)
    assert ids[0, :2].tolist() == [tok.pad_token_id] * 2 and tok.decode(ids[0, 2:].tolist()) == text
    assert ids[1, :3].tolist() == [tok.pad_token_id] * 3


def test_prompt_errors_name_the_row():
    tok = tm.build_tokenizer()
    with pytest.raises(ValueError, match=r"prompt 1 .*prompt_width=8"):
        tm.encode_prompts(tok, ["Q:1+2=", "Q:123456+1="], width=8)
    with pytest.raises(ValueError, match=r"prompt 0 .*vocabulary"):
        tm.encode_prompts(tok, ["Q:y+2="], width=8)


def test_greedy_kv_cache_generation_equals_naive_full_recompute():
    tok, model = _model()
    prompts = tm.encode_prompts(tok, ["Q:1+2=", "Q:45-3=", "Q:99+99="], SMALL.prompt_width)
    outs = tm.generate(model, prompts, 8, tok.eos_token_id, tok.pad_token_id, greedy=True)
    for row, out in zip(prompts, outs, strict=True):
        seq, naive = row.tolist(), []
        for _ in range(8):
            with torch.no_grad():
                nxt = int(model(input_ids=torch.tensor([seq])).logits[0, -1].argmax())
            naive.append(nxt)
            seq.append(nxt)
            if nxt == tok.eos_token_id:
                break
        assert out == naive


def test_sampling_is_reproducible_stops_at_eos_and_keeps_it():
    tok, model = _model()
    prompts = tm.encode_prompts(tok, ["Q:1+2="] * 64, SMALL.prompt_width)
    a = tm.generate(model, prompts, 8, tok.eos_token_id, tok.pad_token_id, generator=torch.Generator().manual_seed(1))
    b = tm.generate(model, prompts, 8, tok.eos_token_id, tok.pad_token_id, generator=torch.Generator().manual_seed(1))
    assert a == b
    assert len({tuple(r) for r in a}) > 1  # sampling, not argmax
    for r in a:
        assert tok.eos_token_id not in r[:-1]  # nothing is generated after EOS
        assert r[-1] == tok.eos_token_id or len(r) == 8
    assert any(r[-1] == tok.eos_token_id for r in a)


def test_response_log_probs_align_with_a_per_prefix_reference():
    tok, model = _model()
    prompts = tm.encode_prompts(tok, ["Q:7+8=", "Q:31-4="], SMALL.prompt_width)
    responses = [tm.target_ids(tok, "15"), tm.target_ids(tok, "27")[:4]]
    padded = tm.pad_responses(responses, tok.pad_token_id)
    with torch.no_grad():
        got = tm.token_log_probs(tm.response_logits(model, prompts, padded), padded, temperature=0.7)
        for i, resp in enumerate(responses):
            for t, token in enumerate(resp):
                prefix = torch.cat([prompts[i], torch.tensor(resp[:t], dtype=torch.long)])[None]
                ref = torch.log_softmax(model(input_ids=prefix).logits[0, -1] / 0.7, -1)[token]
                assert torch.allclose(got[i, t], ref, atol=1e-5)


def test_warm_start_lowers_the_loss_and_is_cached(tmp_path):
    prompts = [f"Q:{a}+{b}=" for a in range(10) for b in range(10)]
    answers = [str(a + b) for a in range(10) for b in range(10)]
    cfg = tm.TinyModelConfig(**{**SMALL.__dict__, "warm_start_steps": 40, "warm_start_batch": 32,
                                "warm_start_target_acc": None})
    model, tok, path = tm.load_or_build(tmp_path, prompts, answers, cfg, progress=False)
    losses = tm.warm_start(tm.build_model(tok, cfg), tok, prompts, answers, cfg, progress=False)["losses"]
    assert len(losses) == 40 and sum(losses[-5:]) < sum(losses[:5])
    again, _, path2 = tm.load_or_build(tmp_path, prompts, answers, cfg, progress=False)
    assert path2 == path
    for p, q in zip(model.state_dict().values(), again.state_dict().values(), strict=True):
        assert torch.equal(p, q)
    other = tm.TinyModelConfig(**{**cfg.__dict__, "seed": 1})
    assert tm.cache_key(other, prompts, answers) != tm.cache_key(cfg, prompts, answers)
    short = tm.TinyModelConfig(**{**cfg.__dict__, "max_response_tokens": 8})
    with pytest.raises(ValueError, match="max_response_tokens"):
        tm.warm_start(model, tok, ["Q:99+99="], ["198"], short, progress=False)


def test_bad_model_config_is_named():
    with pytest.raises(ValueError, match="hidden"):
        tm.TinyModelConfig.from_dict({"hidden": 3})
    with pytest.raises(ValueError, match="num_layers"):
        tm.TinyModelConfig.from_dict({"num_layers": 0})


def test_warm_start_stops_at_the_first_check_that_reaches_the_target(monkeypatch):
    tok = TOKENIZER
    cfg = tm.TinyModelConfig(**{**SMALL.__dict__, "warm_start_steps": 100, "warm_start_batch": 4,
                                "warm_start_target_acc": 0.5, "warm_start_check_every": 7})
    seen = iter([0.2, 0.49, 0.5, 0.9])
    monkeypatch.setattr(tm, "greedy_accuracy", lambda *args: next(seen))
    result = tm.warm_start(tm.build_model(tok, cfg), tok, ["Q:1+2="] * 3, ["3"] * 3, cfg, progress=False)
    assert result["steps"] == 21 and result["train_greedy_acc"] == 0.5


def test_greedy_accuracy_is_exact_match_of_ids():
    tok, model = _model()
    prompts = tm.encode_prompts(tok, ["Q:1+2=", "Q:3+4="], SMALL.prompt_width)
    outs = tm.generate(model, prompts, 6, tok.eos_token_id, tok.pad_token_id, greedy=True)
    assert tm.greedy_accuracy(model, tok, prompts, [[o] for o in outs], 6) == 1.0
    assert tm.greedy_accuracy(model, tok, prompts, [[outs[0]], [outs[1] + [5]]], 6) == 0.5
    assert tm.greedy_accuracy(model, tok, prompts, [[[7], outs[0]], [outs[1] + [5], outs[1]]], 6) == 1.0


def test_worked_targets_restate_the_question():
    tok = TOKENIZER
    assert tm.worked_line("Q:23+58=", "81") == "23+58=81"
    assert tok.decode(tm.target_ids(tok, "81", "23+58=81")) == "23+58=81\\boxed{81}<eos>"

"""A tiny Qwen2 built from scratch for the embedded CPU mode: tokenizer, model, warm start, generation.

Everything is built locally (no hub access), so a newcomer can run the real algorithm on a laptop. The
tokenizer has one token per character; prompts are left-padded to a fixed width, so every sequence is
``prompt (fixed width) + response`` and no attention mask or position shift is needed anywhere: pads are
ordinary tokens the model learns to ignore, and right padding after EOS cannot affect earlier positions.

The same model in its vLLM-servable form (``TinyModelConfig.vllm_compatible``) is what the verl CPU twins of the
GPU scripts train: a byte-level vocabulary that reads any prompt a chat template renders, the chat formats' control
tokens as single tokens, and answers in the thought-then-answer form (``23+58=81</think>\\boxed{81}``) that the
authors' strict grading asks for.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from exgrpo.embedded.chat_templates import CHATML_THINK_TEMPLATE

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
CHARS = "0123456789+-=Q: \\boxed{}"
# Concatenates the messages' contents, so verl's RLHFDataset (apply_chat_template) sees the same prompt text.
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
THINK_END = "</think>"
# The vLLM-servable model's own chat template is CHATML_THINK_TEMPLATE, the prompt of the Qwen paper scripts, so the
# recipe's CPU job and their twins share one warm start.
# Control tokens of the chat formats the GPU scripts use (ChatML, Llama 3): one token each, never in a response.
CHAT_CONTROL_TOKENS = ("<|im_start|>", "<|im_end|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
# One token each too, but ordinary text: verl decodes responses without special tokens and the strict grading
# looks for "</think>" in that text.
THINK_TOKENS = ("<think>", THINK_END)
# transformers renamed the KV-cache argument and output field from past_key_values to cache (5.2x deprecates the
# old name, 5.40 removes it); use whichever this installation's Qwen2 takes.
CACHE_ARG = "cache" if "cache" in inspect.signature(Qwen2ForCausalLM.forward).parameters else "past_key_values"


@dataclass(frozen=True)
class TinyModelConfig:
    """Architecture and warm-start recipe; its hash names the on-disk cache entry."""

    hidden_size: int = 128
    num_layers: int = 3
    num_heads: int = 4
    intermediate_size: int = 256
    prompt_width: int = 10
    max_response_tokens: int = 24
    warm_start_steps: int = 1500  # at most; the phase stops early once warm_start_target_acc is reached
    warm_start_batch: int = 128
    warm_start_lr: float = 1e-3
    # Share of supervised targets that restate the question before the box ("23+58=81\\boxed{81}") instead of
    # the bare "\\boxed{81}": two correct forms per question, so the pool holds several distinct successes and
    # entropy selection has something to choose between.
    warm_start_worked_share: float = 0.5
    # Greedy accuracy on a fixed slice of the training questions at which to stop (None: run all the steps).
    # Accuracy jumps from ~3% to ~90% within a few hundred steps on this task, so a step count alone cannot
    # reliably "start weak"; checking every warm_start_check_every steps can.
    warm_start_target_acc: float | None = 0.3
    warm_start_check_every: int = 25
    seed: int = 0
    # A model folder that verl and vLLM serve exactly as it was trained (the verl CPU jobs): a byte-level vocabulary
    # (transformers' Qwen2 tokenizer, which they use, then gives the same ids). Its prompts are rendered by a chat
    # template from questions of one width, so all have prompt_width tokens: the rollout engine and the trainer see
    # the warm start's prompts without pad tokens or a position shift (unpadded prompts of another length cut this
    # model's accuracy ~10x).
    vllm_compatible: bool = False
    # Targets close a thought with </think> before the box ("23+58=81</think>\\boxed{81}"): the form the authors'
    # strict grading (the paper scripts) accepts.
    thought_then_answer: bool = False
    # Positions the model accepts (None: prompt_width + max_response_tokens, all it is trained on). A larger value
    # changes no weight and no output on the training prompts (rotary positions are computed, not learned); it lets
    # vLLM serve the model on longer prompts, such as the real benchmarks of the evaluation command.
    context_length: int | None = None

    @classmethod
    def from_dict(cls, values: dict) -> TinyModelConfig:
        unknown = set(values) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown model config key(s): {sorted(unknown)}")
        cfg = cls(**values)
        for name in ("hidden_size", "num_layers", "num_heads", "intermediate_size", "prompt_width",
                     "max_response_tokens", "warm_start_batch"):
            if getattr(cfg, name) < 1:
                raise ValueError(f"model.{name} must be >= 1, got {getattr(cfg, name)}")
        if cfg.warm_start_steps < 0:
            raise ValueError(f"model.warm_start_steps must be >= 0, got {cfg.warm_start_steps}")
        if not 0.0 <= cfg.warm_start_worked_share <= 1.0:
            raise ValueError(f"model.warm_start_worked_share must lie in [0, 1], got {cfg.warm_start_worked_share}")
        if cfg.warm_start_check_every < 1:
            raise ValueError(f"model.warm_start_check_every must be >= 1, got {cfg.warm_start_check_every}")
        if cfg.context_length is not None and cfg.context_length < cfg.prompt_width + cfg.max_response_tokens:
            raise ValueError(f"model.context_length {cfg.context_length} < prompt_width + max_response_tokens "
                             f"({cfg.prompt_width + cfg.max_response_tokens})")
        if cfg.warm_start_target_acc is not None and not 0.0 < cfg.warm_start_target_acc <= 1.0:
            raise ValueError(f"model.warm_start_target_acc must lie in (0, 1] or be null, got "
                             f"{cfg.warm_start_target_acc}")
        return cfg


def build_tokenizer(vllm_compatible: bool = False) -> PreTrainedTokenizerFast:
    """One token per character; with ``vllm_compatible`` one per byte-level symbol plus the chat control tokens.

    The byte-level form is what transformers loads for any ``model_type=qwen2`` folder (its Qwen2Tokenizer, used
    by verl and vLLM): with every byte symbol in the vocabulary and no merges it gives these same ids.
    """
    chars = "".join(sorted(pre_tokenizers.ByteLevel.alphabet())) if vllm_compatible else CHARS
    vocab = {PAD: 0, EOS: 1, UNK: 2} | {c: i + 3 for i, c in enumerate(chars)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    split = pre_tokenizers.Split(Regex("."), behavior="isolated")
    if vllm_compatible:  # after the byte-level mapping there is no raw newline left for "." to miss
        core.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False), split]
        )
        core.decoder = decoders.ByteLevel()
    else:
        core.pre_tokenizer = split
        core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token=PAD, eos_token=EOS, unk_token=UNK)
    tok.chat_template = CHAT_TEMPLATE
    if vllm_compatible:
        tok.add_special_tokens({"additional_special_tokens": list(CHAT_CONTROL_TOKENS)})
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TOKENS])
        tok.chat_template = CHATML_THINK_TEMPLATE
    return tok


def build_model(tokenizer: PreTrainedTokenizerFast, cfg: TinyModelConfig) -> Qwen2ForCausalLM:
    torch.manual_seed(cfg.seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.context_length or cfg.prompt_width + cfg.max_response_tokens,
        tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None, use_cache=True,
    )
    config._attn_implementation = "eager"  # fastest at these sizes, and deterministic
    return Qwen2ForCausalLM(config).float()


def prompt_text(tokenizer: PreTrainedTokenizerFast, chat: Sequence[dict]) -> str:
    return tokenizer.apply_chat_template(list(chat), tokenize=False, add_generation_prompt=True)


def encode_prompts(tokenizer: PreTrainedTokenizerFast, texts: Sequence[str], width: int) -> torch.Tensor:
    """Left-pad to a fixed width; a prompt that does not fit is an error, never silently truncated."""
    rows = []
    for i, text in enumerate(texts):
        ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) > width:
            raise ValueError(f"prompt {i} ({text!r}) has {len(ids)} tokens > model.prompt_width={width}")
        if tokenizer.unk_token_id in ids:
            raise ValueError(f"prompt {i} ({text!r}) has characters outside the tiny vocabulary {CHARS!r}")
        rows.append([tokenizer.pad_token_id] * (width - len(ids)) + ids)
    return torch.tensor(rows, dtype=torch.long)


def pad_responses(responses: Sequence[Sequence[int]], pad_id: int, width: int | None = None) -> torch.Tensor:
    width = max(len(r) for r in responses) if width is None else width
    out = torch.full((len(responses), width), pad_id, dtype=torch.long)
    for i, r in enumerate(responses):
        if len(r) > width:
            raise ValueError(f"response {i} has {len(r)} tokens > {width} (model.max_response_tokens)")
        out[i, : len(r)] = torch.as_tensor(list(r), dtype=torch.long)
    return out


def response_logits(model: Qwen2ForCausalLM, prompts: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
    """Logits that predict each response token: position p-1 predicts token p."""
    seq = torch.cat([prompts, responses], dim=1)
    logits = model(input_ids=seq, use_cache=False).logits
    return logits[:, prompts.shape[1] - 1 : -1].float()


def token_log_probs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    return torch.log_softmax(logits / temperature, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


@torch.no_grad()
def generate(model: Qwen2ForCausalLM, prompts: torch.Tensor, max_new_tokens: int, eos_id: int, pad_id: int,
             temperature: float = 1.0, generator: torch.Generator | None = None,
             greedy: bool = False) -> list[list[int]]:
    """Sample with a KV cache; each response is returned exactly as generated, EOS included (if reached)."""
    out = model(input_ids=prompts, use_cache=True)
    cache, logits = getattr(out, CACHE_ARG), out.logits[:, -1]
    n = prompts.shape[0]
    tokens = torch.full((n, max_new_tokens), pad_id, dtype=torch.long)
    done = torch.zeros(n, dtype=torch.bool)
    lengths = torch.full((n,), max_new_tokens, dtype=torch.long)
    for t in range(max_new_tokens):
        if greedy:
            nxt = logits.argmax(-1)
        else:
            probs = torch.softmax(logits.float() / temperature, dim=-1)
            nxt = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        nxt = torch.where(done, torch.full_like(nxt, pad_id), nxt)
        tokens[:, t] = nxt
        finished = (~done) & (nxt == eos_id)
        lengths[finished] = t + 1
        done |= finished
        if bool(done.all()) or t == max_new_tokens - 1:
            break
        out = model(input_ids=nxt.unsqueeze(-1), use_cache=True, **{CACHE_ARG: cache})
        cache, logits = getattr(out, CACHE_ARG), out.logits[:, -1]
    return [tokens[i, : lengths[i]].tolist() for i in range(n)]


def target_ids(tokenizer: PreTrainedTokenizerFast, answer: str, worked: str = "", think_end: str = "") -> list[int]:
    """``{worked}{think_end}\\boxed{answer}`` + EOS; ``worked`` is an optional line of work before the box and
    ``think_end`` the tag that closes it as a thought (the thought-then-answer form)."""
    return tokenizer.encode(f"{worked}{think_end}\\boxed{{{answer}}}", add_special_tokens=False) + [tokenizer.eos_token_id]


QUESTION = re.compile(r"Q:\s*([0-9+\-]+=)")


def worked_line(prompt: str, answer: str) -> str:
    """The question restated with its result, e.g. ``Q:23+58=`` -> ``23+58=81``; ``prompt`` may be a whole rendered
    chat prompt around the question."""
    found = QUESTION.search(prompt)
    if found is None:
        raise ValueError(f"no question of the form Q:<a><op><b>= in prompt {prompt!r}")
    return found.group(1) + answer


def greedy_accuracy(model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast, prompt_ids: torch.Tensor,
                    targets: Sequence[Sequence[list[int]]], max_new_tokens: int) -> float:
    """Share of prompts whose greedy response is exactly one of its accepted target id lists (EOS included)."""
    outs = generate(model, prompt_ids, max_new_tokens, tokenizer.eos_token_id, tokenizer.pad_token_id, greedy=True)
    return sum(o in accepted for o, accepted in zip(outs, targets, strict=True)) / len(targets)


def warm_start(model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast, prompts: Sequence[str],
               answers: Sequence[str], cfg: TinyModelConfig, progress: bool = True) -> dict:
    """Short supervised phase so RL starts from a weak but non-zero policy (the pool needs mixed groups).

    Stops at ``warm_start_steps`` or as soon as the greedy accuracy on (up to) 256 training questions reaches
    ``warm_start_target_acc``. Returns the per-step losses, steps run and the last checked accuracy.
    """
    prompt_ids = encode_prompts(tokenizer, prompts, cfg.prompt_width)
    think_end = THINK_END if cfg.thought_then_answer else ""
    short = [target_ids(tokenizer, a, think_end=think_end) for a in answers]
    worked = [target_ids(tokenizer, a, worked_line(p, a), think_end) for p, a in zip(prompts, answers, strict=True)]
    targets = torch.stack([pad_responses(forms, tokenizer.pad_token_id, cfg.max_response_tokens)
                           for forms in (short, worked)])  # [2, N, T]
    lengths = torch.tensor([[len(t) for t in short], [len(t) for t in worked]])
    mask = torch.arange(targets.shape[-1]) < lengths[..., None]
    check = torch.linspace(0, len(prompts) - 1, min(256, len(prompts))).long()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.warm_start_lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(cfg.seed)
    losses: list[float] = []
    accuracy = None
    steps = range(1, cfg.warm_start_steps + 1)
    if progress:
        from exgrpo.progress import progress as progress_display

        steps = progress_display(steps, desc="warm start", leave=False)
    for step in steps:
        model.train()
        idx = torch.randint(0, len(prompts), (cfg.warm_start_batch,), generator=gen)
        form = (torch.rand(cfg.warm_start_batch, generator=gen) < cfg.warm_start_worked_share).long()
        batch_targets, batch_mask = targets[form, idx], mask[form, idx]
        logits = response_logits(model, prompt_ids[idx], batch_targets)
        nll = F.cross_entropy(logits.transpose(1, 2), batch_targets, reduction="none")
        loss = (nll * batch_mask).sum() / batch_mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if cfg.warm_start_target_acc is not None and step % cfg.warm_start_check_every == 0:
            model.eval()
            accuracy = greedy_accuracy(model, tokenizer, prompt_ids[check], [(short[i], worked[i]) for i in check],
                                       cfg.max_response_tokens)
            if accuracy >= cfg.warm_start_target_acc:
                break
    model.eval()
    return {"losses": losses, "steps": len(losses), "train_greedy_acc": accuracy}


def cache_key(cfg: TinyModelConfig, prompts: Sequence[str], answers: Sequence[str]) -> str:
    fields = asdict(cfg)
    for option in ("vllm_compatible", "thought_then_answer", "context_length"):
        if not fields[option]:  # keys of models built before the option existed stay valid
            del fields[option]
    digest = hashlib.sha1(json.dumps([fields, list(prompts), list(answers)]).encode()).hexdigest()
    return digest[:12]


def load_or_build(cache_root: str | Path, prompts: Sequence[str], answers: Sequence[str], cfg: TinyModelConfig,
                  progress: bool = True) -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerFast, Path]:
    """Warm-start once per (architecture, recipe, training data) and reuse it from disk afterwards."""
    path = Path(cache_root) / f"tiny_qwen2_{cache_key(cfg, prompts, answers)}"
    if (path / "warm_start.json").exists():
        tokenizer = PreTrainedTokenizerFast.from_pretrained(path)
        model = Qwen2ForCausalLM.from_pretrained(path, attn_implementation="eager").float().eval()
        return model, tokenizer, path
    tokenizer = build_tokenizer(cfg.vllm_compatible)
    model = build_model(tokenizer, cfg)
    start = time.perf_counter()
    result = warm_start(model, tokenizer, prompts, answers, cfg, progress=progress)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    meta = {"config": asdict(cfg), "steps": result["steps"], "train_greedy_acc": result["train_greedy_acc"],
            "final_loss": result["losses"][-1] if result["losses"] else None,
            "seconds": round(time.perf_counter() - start, 1), "n_parameters": sum(p.numel() for p in model.parameters())}
    (path / "warm_start.json").write_text(json.dumps(meta, indent=2))
    return model, tokenizer, path

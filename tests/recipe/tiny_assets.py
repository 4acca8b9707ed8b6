"""Test-only: a character-level tokenizer with a chat template and a tiny random Qwen2, saved to a folder.

verl loads models and tokenizers by path (``actor_rollout_ref.model.path``); there is no hub access here, so
the tests build both locally. 40-odd tokens, 2 layers, hidden 32: a forward pass takes milliseconds.
"""

from __future__ import annotations

from pathlib import Path

CHARS = list("0123456789+-=?:. abcdefghijklmnopqrstuvwxyz\\{}")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'][0] }}:{{ m['content'] }}<|im_end|>{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>a:{% endif %}"
)


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL + CHARS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|endoftext|>"))
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None
    )
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build_tiny_model_dir(path: Path, seed: int = 0) -> Path:
    """Tokenizer + random tiny Qwen2 (fp32) saved under ``path``; returns ``path``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer()
    tok.save_pretrained(path)
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        initializer_range=0.5,  # peaked next-token distributions, so candidate entropies differ
        torch_dtype="float32",
    )
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(path)
    return path

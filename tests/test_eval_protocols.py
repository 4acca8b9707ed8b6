"""The evaluation's two protocols: prompts (token-exact, one BOS), graded sections, the seeded slice, the paper's
table and its reported numbers. Expected values are worked out by hand from each protocol's rules."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from exgrpo.tools import evaluate, paper_results
from exgrpo.tools.evaluate import PROTOCOLS, Item

REPO = Path(__file__).resolve().parents[1]
PAPER, OURS = PROTOCOLS["paper"], PROTOCOLS["ours"]
THINK_PROMPT = "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\n"  # qwen_think.jinja's ending
PLAIN_PROMPT = "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"
CHAT = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]


def test_the_paper_prompt_drops_the_system_message_and_ours_keeps_it():
    assert PAPER.messages(CHAT) == [{"role": "user", "content": "Q"}]
    assert OURS.messages(CHAT) == CHAT
    assert PAPER.messages(CHAT[1:]) == CHAT[1:]  # no system message: nothing dropped


@pytest.mark.parametrize(("prompt", "response", "paper", "ours"), [
    # a prompt that opens the thought: the authors graded the text up to the second </think>
    (THINK_PROMPT, "x</think>\\boxed{1}</think>\\boxed{2}", "\\boxed{1}", "\\boxed{1}</think>\\boxed{2}"),
    # a thought never closed: their split fails and their grader reads the whole text, <think> prefix included
    (THINK_PROMPT, "still thinking \\boxed{7}", "<think>\nstill thinking \\boxed{7}", "still thinking \\boxed{7}"),
    # a prompt that does not open a thought: nothing is cut
    (PLAIN_PROMPT, "a \\boxed{3}</think> b", "a \\boxed{3}</think> b", " b"),
])
def test_graded_sections(prompt, response, paper, ours):
    assert PAPER.graded_section(response, prompt) == paper
    assert OURS.graded_section(response, None) == ours


# (prompt, response, ground truth, data_source, paper score, our score)
PROTOCOL_CASES = [
    # two </think>: the paper grades up to the second one, ours everything after the first
    (THINK_PROMPT, "x</think>\\boxed{1}</think> ... so actually \\boxed{2}", "2", "math", 0.0, 1.0),
    (THINK_PROMPT, "x</think>\\boxed{1}</think> ... so actually \\boxed{2}", "1", "math", 1.0, 0.0),
    (THINK_PROMPT, "never closed \\boxed{7}", "7", "math", 1.0, 1.0),
    (PLAIN_PROMPT, "so \\boxed{3}</think> The answer is 4.", "3", "math", 1.0, 0.0),  # the thought's box counts
    (THINK_PROMPT, "I pick</think> ANSWER: B", "B", "gpqa", 0.0, 1.0),  # an option letter outside a box
    (THINK_PROMPT, "I pick</think> \\boxed{B}", "B", "gpqa", 1.0, 1.0),
    (THINK_PROMPT, "</think>The answer is 3/4.", "\\frac{3}{4}", "math", 0.0, 1.0),  # unboxed
]


def test_each_protocol_scores_the_hand_written_responses_as_computed_by_hand():
    items = [Item(f"q{i}", source, truth, response, prompt) for i, (prompt, response, truth, source, *_)
             in enumerate(PROTOCOL_CASES)]
    for protocol, column in ((PAPER, 4), (OURS, 5)):
        scored = evaluate.score_items(items, protocol, workers=2)
        assert [s["score"] for s in scored] == [case[column] for case in PROTOCOL_CASES], protocol.name
        assert all(s["protocol"] == protocol.name and "graded" in s for s in scored)


def test_the_paper_protocol_refuses_generations_without_their_prompt():
    with pytest.raises(KeyError, match="generation 1 \\(qid q\\): the paper protocol needs the line's 'prompt'"):
        evaluate.score_items([Item("q", "math", "1", "\\boxed{1}")], PAPER)


def _rows(source: str, levels: list[int | None], repeats: int) -> list[dict]:
    rows = []
    for q, level in enumerate(levels):
        for r in range(repeats):
            extra = {"qid": f"{source}-{q}", "index": len(rows)}
            if level is not None:
                extra["level"] = level
            rows.append({"data_source": source, "prompt": CHAT, "reward_model": {"ground_truth": str(q)},
                         "extra_info": extra, "repeat": r})
    return rows


def test_the_slice_draws_per_benchmark_across_levels_and_keeps_file_order():
    rows = _rows("math", [1, 1, 2, 2, 3], repeats=3) + _rows("aime", [None] * 4, repeats=4)
    chosen = evaluate.select_rows(rows, questions=3, samples=2, seed=0)
    by_source: dict[str, list[str]] = {}
    for row in chosen:
        by_source.setdefault(row["data_source"], []).append(row["extra_info"]["qid"])
    math_qids = sorted(set(by_source["math"]))
    assert len(math_qids) == 3 and {int(q[-1]) for q in math_qids} & {4} and {int(q[-1]) for q in math_qids} & {2, 3}
    assert {int(q[-1]) // 2 for q in math_qids} == {0, 1, 2}  # one question of each level (0-1, 2-3, 4)
    assert all(by_source["math"].count(q) == 2 for q in math_qids)  # two of each question's three repeats
    assert len(set(by_source["aime"])) == 3 and len(by_source["aime"]) == 6
    positions = [rows.index(row) for row in chosen]
    assert positions == sorted(positions)
    assert evaluate.select_rows(rows, 3, 2, seed=0) == chosen  # seeded
    assert evaluate.select_rows(rows) == rows  # nothing asked: everything
    assert len(evaluate.select_rows(rows, questions=10)) == len(rows)
    assert evaluate.select_rows(rows, benchmarks=["aime"]) == [row for row in rows if row["data_source"] == "aime"]
    with pytest.raises(evaluate.InputError, match=r"benchmark\(s\) \['gpqa'\] are in none of the data files"):
        evaluate.select_rows(rows, benchmarks=["aime", "gpqa"])


def test_the_papers_averages_are_the_means_of_its_numbers():
    """A check of the transcription: every reported average is the mean of its row's benchmarks, to the rounding."""
    for backbone in paper_results.BACKBONES:
        for method, values in paper_results.rows_for(backbone).items():
            for keys, average in ((paper_results.IN_DISTRIBUTION, "in_distribution_avg"),
                                  (paper_results.OUT_OF_DISTRIBUTION, "ood_avg")):
                mean = sum(values[k] for k in keys) / len(keys)
                # the paper averages unrounded scores: each is off by up to 0.05, the average's rounding adds 0.05
                assert abs(mean - values[average]) <= 0.1, (backbone, method, average, mean)


@pytest.mark.parametrize(("path", "backbone"), [
    ("/x/checkpoints/exgrpo/qwen2.5_math_7b_exgrpo/global_step_700", "qwen2.5-math-7b"),
    ("/x/checkpoints/exgrpo/qwen2.5_math_7b_grpo/global_step_700", "qwen2.5-math-7b"),
    ("/x/checkpoints/exgrpo/qwen2.5_math_1.5b_exgrpo/global_step_50", "qwen2.5-math-1.5b"),
    ("/x/checkpoints/exgrpo/llama3.1_8b_instruct_exgrpo/global_step_50", "llama3.1-8b-instruct"),
    ("/x/checkpoints/exgrpo/llama3.1_8b_exgrpo/global_step_50", "llama3.1-8b"),
    ("/models/LUFFY-Qwen-Math-7B-Zero", "luffy-qwen-math-7b"),
    ("/x/checkpoints/exgrpo/cpu_verl_exgrpo/global_step_12", None),
])
def test_the_backbone_is_read_from_the_checkpoints_path(path, backbone):
    assert paper_results.backbone_of(path) == backbone


def test_the_layout_puts_ours_beside_the_papers_rows_marked_as_reported():
    scored = [{"data_source": "aime", "qid": "a", "score": 1.0}, {"data_source": "aime", "qid": "a", "score": 0.0},
              {"data_source": "math", "qid": "m", "score": 1.0}, {"data_source": "gpqa", "qid": "g", "score": 0.0},
              {"data_source": "synthetic_arith", "qid": "s", "score": 1.0}]
    summary = evaluate.summarize(scored, "paper")
    table = paper_results.layout_table(summary, "run_step5", "qwen2.5-math-7b")
    lines = table.splitlines()
    assert lines[0].startswith("| model | AIME24 | AIME25 | AMC | MATH-500 | Minerva | Olympiad | ID avg | ARC-c |")
    # ours: AIME 50, MATH 100, average over the two present of six; GPQA 0, one of three; each on 1 question, not
    # the authors' rows, so every score and both averages are marked
    assert lines[2] == ("| **run_step5** (measured, paper protocol) | 50.0 † | – | – | 100.0 † | – | – | "
                        "75.0 (2 of 6) † | – | 0.0 † | – | 0.0 (1 of 3) † |")
    assert lines[3] == ("| rows: questions × samples (the authors') | 1 × 2 (30 × 32) | – (30 × 32) | – (83 × 32) | "
                        "1 × 1 (500 × 1) | – (272 × 1) | – (675 × 1) |  | – (1172 × 1) | 1 × 1 (198 × 1) | – (?) |  |")
    assert lines[6] == ("| ExGRPO, qwen2.5-math-7b (paper, reported) | 31.6 | 18.7 | 66.3 | 87.4 | 36.0 | 50.1 | 48.3 | "
                        "84.7 | 37.4 | 52.9 | 58.3 |")
    assert ("† not comparable with the paper: measured on other rows than the authors' (AIME24 1 × 2, the authors' "
            "30 × 32; MATH-500 1 × 1, the authors' 500 × 1; GPQA-diamond 1 × 1, the authors' 198 × 1)") in table
    assert "No paper rows" in paper_results.layout_table(summary, "x", None)


def _summary_on(rows: dict[str, tuple[int, int, int]]) -> dict:
    """A summary whose benchmarks have the given (questions, k_min, k_max), every response scored 1 but one."""
    scored = []
    for source, (questions, k_min, k_max) in rows.items():
        for q in range(questions):
            k = k_max if q == 0 else k_min  # the first question carries the most samples
            scored += [{"data_source": source, "qid": f"{source}-{q}", "score": 1.0} for _ in range(k)]
    scored[0]["score"] = 0.0
    return evaluate.summarize(scored, "paper")


AUTHORS_SIZES = {"aime": (30, 32, 32), "aime25": (30, 32, 32), "amc": (83, 32, 32), "math": (500, 1, 1),
                 "minerva": (272, 1, 1), "olympiad_bench": (675, 1, 1), "arc_c": (1172, 1, 1), "gpqa": (198, 1, 1)}


def test_on_the_authors_rows_no_column_is_marked_and_a_40_question_amc_is():
    summary = _summary_on(AUTHORS_SIZES)
    checked = paper_results.comparability(summary["benchmarks"])
    assert {source: row["comparable"] for source, row in checked["benchmarks"].items()} == dict.fromkeys(
        AUTHORS_SIZES, True)
    assert checked["in_distribution_avg"] is True
    assert checked["ood_avg"] is False  # MMLU-Pro is missing: an average over two of three is not the paper's
    table = paper_results.layout_table(summary, "run", None).splitlines()
    assert "†" not in table[2] and table[2].endswith(" | 100.0 (2 of 3) |")  # OOD avg over two of three, unmarked
    assert table[3].split(" | ")[1:4] == ["30 × 32 (30 × 32)", "30 × 32 (30 × 32)", "83 × 32 (83 × 32)"]
    assert not any(line.startswith("†") for line in table)
    # the former default build: AMC 2023 only, 40 questions x 32
    other = _summary_on({**AUTHORS_SIZES, "amc": (40, 32, 32)})
    checked = paper_results.comparability(other["benchmarks"])
    assert checked["benchmarks"]["amc"] == {"rows": "40 × 32", "authors_rows": "83 × 32", "comparable": False}
    assert checked["in_distribution_avg"] is False and checked["benchmarks"]["aime"]["comparable"] is True
    cells = paper_results.layout_table(other, "run", None).splitlines()[2].split(" | ")
    # AIME24 (959 of 960 responses right), AMC, the ID average over both and four 100s; ARC-c unaffected
    assert (cells[1], cells[3], cells[7], cells[8]) == ("99.9", "100.0 †", "100.0 †", "100.0")
    assert "(AMC 40 × 32, the authors' 83 × 32)" in paper_results.layout_table(other, "run", None)


@pytest.mark.parametrize(("sizes", "comparable"), [
    ((30, 32, 32), True),
    ((30, 4, 4), False),  # SAMPLES=4: the right questions, fewer samples
    ((30, 31, 32), False),  # one question short of a sample
    ((29, 32, 32), False),  # a question missing
])
def test_aime_is_comparable_only_on_30_questions_of_32_samples(sizes, comparable):
    checked = paper_results.comparability(_summary_on({"aime": sizes})["benchmarks"])
    assert checked["benchmarks"]["aime"]["comparable"] is comparable
    assert checked["in_distribution_avg"] is False  # five of six missing


def test_mmlu_pro_and_our_own_benchmarks_are_unchecked_not_comparable():
    summary = _summary_on({"mmlu_pro": (12, 1, 1), "synthetic_arith": (3, 1, 1), "arc_c": (1172, 1, 1),
                           "gpqa": (198, 1, 1)})
    checked = paper_results.comparability(summary["benchmarks"])
    assert checked["benchmarks"]["mmlu_pro"] == {"rows": "12 × 1", "authors_rows": None, "comparable": None}
    assert checked["benchmarks"]["synthetic_arith"]["comparable"] is None
    assert checked["ood_avg"] is None  # nothing known to differ, one column unchecked
    table = paper_results.layout_table(summary, "run", None)
    assert "| 12 × 1 (?) |" in table and "? rows not checked: the authors' MMLU-Pro file" in table
    assert "†" not in table


def test_the_authors_rows_are_those_of_their_files(shared_benchmarks):
    """AUTHORS_ROWS, counted again from the authors' files: questions (distinct prompts) and samples of each."""
    import pandas as pd

    counted: dict[str, dict[str, int]] = {}
    for name in ("math_test.parquet", "arc_c_test.parquet", "gpqa_diamond_test.parquet"):
        frame = pd.read_parquet(shared_benchmarks / name, columns=["data_source", "prompt"])
        for source, prompt in zip(frame["data_source"], frame["prompt"], strict=True):
            question = prompt[-1]["content"]
            counted.setdefault(source, {})[question] = counted.setdefault(source, {}).get(question, 0) + 1
    found = {source: (len(per), *sorted(set(per.values()))) for source, per in counted.items()}
    assert found == {source: rows for source, rows in paper_results.AUTHORS_ROWS.items() if rows is not None}


@pytest.mark.parametrize(("path", "label"), [
    ("ckpts/qwen2.5_math_7b_exgrpo/global_step_700", "qwen2.5_math_7b_exgrpo_step700"),
    ("ckpts/qwen2.5_math_7b_exgrpo/global_step_700/actor", "qwen2.5_math_7b_exgrpo_step700"),
    ("models/my-merged-model", "my-merged-model"),
])
def test_checkpoint_label(path, label):
    assert evaluate.checkpoint_label(Path(path)) == label


def test_a_folder_that_is_no_model_and_no_checkpoint_is_refused_in_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(evaluate.InputError, match="neither a Hugging Face model folder .* nor a verl checkpoint"):
        evaluate.resolve_model(tmp_path / "empty", tmp_path / "work")
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    (hf / "model.safetensors").write_bytes(b"")
    assert evaluate.resolve_model(hf, tmp_path / "work") == hf  # a Hugging Face folder is taken as it is


# ----------------------------------------------------------------------------------------------- token-exact prompts
LLAMA_TEMPLATE = (REPO / "run_scripts" / "chat_templates" / "llama3_think.jinja").read_text()


def llama3_style_tokenizer(folder: Path):
    """A Llama-3-style tokenizer built here: byte-level, <|begin_of_text|> as BOS added by its post-processor (as
    Meta's tokenizer.json does), the header and end-of-turn tokens special, the scripts' Llama chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {token: i for i, token in enumerate(specials + alphabet)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|end_of_text|>"))
    core.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
                                                  pre_tokenizers.Split(Regex("."), behavior="isolated")])
    core.decoder = decoders.ByteLevel()
    core.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B",
                                                        special_tokens=[("<|begin_of_text|>", 0)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<|begin_of_text|>",
                                        eos_token="<|eot_id|>", additional_special_tokens=specials[2:])
    tokenizer.chat_template = LLAMA_TEMPLATE
    tokenizer.save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)  # as the evaluation loads it


def test_a_llama_prompt_has_one_bos_where_a_text_prompt_gets_two(tmp_path):
    tokenizer = llama3_style_tokenizer(tmp_path / "tok")
    bos = tokenizer.bos_token_id
    for protocol in (PAPER, OURS):
        text, ids = evaluate.render_prompt(tokenizer, CHAT, protocol)
        assert ids[0] == bos and ids.count(bos) == 1, protocol.name
        assert text.startswith("<|begin_of_text|><|start_header_id|>") and text.endswith("<think>\n")
        assert tokenizer.decode(ids) == text
        # what the authors' evaluation (and ours before) sent: the text, tokenized again with special tokens
        assert tokenizer(text)["input_ids"][:2] == [bos, bos]
    assert "<|start_header_id|>system" not in evaluate.render_prompt(tokenizer, CHAT, PAPER)[0]
    assert "<|start_header_id|>system" in evaluate.render_prompt(tokenizer, CHAT, OURS)[0]


def test_ours_prompt_ids_are_the_ids_verls_agent_loop_builds(tmp_path):
    """verl's agent loop builds a prompt with its Continuous Token builder; the evaluation must give the same ids."""
    pytest.importorskip("verl")
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    from exgrpo.embedded import tiny_model

    qwen = tiny_model.build_tokenizer(vllm_compatible=True)  # the twins' ChatML tokenizer, <think> opened
    for tokenizer, model_type in ((llama3_style_tokenizer(tmp_path / "tok"), "llama"), (qwen, "qwen2")):
        builder = create_continuous_token_builder(tokenizer, hf_model_type=model_type)
        assert evaluate.render_prompt(tokenizer, CHAT, OURS)[1] == builder.build_initial_tokens(CHAT), model_type
        template_override = evaluate.render_prompt(tokenizer, CHAT, OURS, chat_template=LLAMA_TEMPLATE)[1]
        tokenizer.chat_template = LLAMA_TEMPLATE  # verl installs a custom_chat_template on the tokenizer itself
        assert template_override == create_continuous_token_builder(
            tokenizer, hf_model_type=model_type).build_initial_tokens(CHAT), model_type


# ----------------------------------------------------------------------------------------------- the script, as typed
def _script(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(REPO / "run_scripts" / "eval_benchmarks.sh"), *args], capture_output=True,
                          text=True, cwd=cwd, env={**os.environ, "PATH": f"{Path(sys.executable).parent}:"
                                                                         f"{os.environ.get('PATH', '')}", **(env or {})})


def test_the_script_refuses_bad_arguments_in_one_line(tmp_path):
    (tmp_path / "ckpt").mkdir()
    cases = [(("--protocol", "authors", str(tmp_path / "ckpt")), {}, "error: --protocol authors: use paper or ours"),
             (("--fast", str(tmp_path / "ckpt")), {}, "error: unknown option --fast (known: --protocol paper|ours)"),
             ((str(tmp_path / "ckpt"),), {"EXGRPO_DEVICE": "tpu"}, "error: EXGRPO_DEVICE=tpu: use gpu or cpu")]
    for args, env, line in cases:
        result = _script(*args, env=env)
        assert (result.returncode, result.stderr.strip()) == (2, line)
    usage = _script()
    assert usage.returncode == 2 and "bash run_scripts/eval_benchmarks.sh [--protocol paper|ours]" in usage.stdout


def test_a_checkpoints_tokenizer_carries_the_template_the_run_trained_with(tmp_path):
    """verl's FSDP engine saves ``model_config.get_processor()`` into ``actor/huggingface/`` (its checkpoint manager's
    processing_class); with a ``custom_chat_template`` that is the tokenizer with the run's template, so the merged
    folder the evaluation reads prompts the model as training did."""
    pytest.importorskip("verl")
    from transformers import AutoTokenizer
    from verl.workers.config.model import HFModelConfig

    from exgrpo.embedded import tiny_model

    model = tmp_path / "model"
    tokenizer = tiny_model.build_tokenizer(vllm_compatible=True)  # its own template: ChatML with <think>
    tokenizer.save_pretrained(model)
    tiny_model.build_model(tokenizer, tiny_model.TinyModelConfig(vllm_compatible=True, prompt_width=8)).save_pretrained(
        model)
    config = HFModelConfig(path=str(model), custom_chat_template=LLAMA_TEMPLATE)
    config.get_processor().save_pretrained(tmp_path / "huggingface")
    saved = AutoTokenizer.from_pretrained(tmp_path / "huggingface")
    assert saved.chat_template == LLAMA_TEMPLATE != tokenizer.chat_template

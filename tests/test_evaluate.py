"""Evaluation: avg@k by hand, tables, generation-file validation, the GPU script's guard."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from exgrpo.tools import evaluate
from exgrpo.tools.evaluate import markdown_table, questions_by_qid, resolve, results_markdown, summarize

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "data"


def test_avg_at_k_by_hand():
    scored = [
        {"data_source": "aime", "qid": "q1", "score": 1.0, "timeout": False},
        {"data_source": "aime", "qid": "q1", "score": 0.0, "timeout": True},
        {"data_source": "aime", "qid": "q1", "score": 0.0, "timeout": False},
        {"data_source": "aime", "qid": "q1", "score": 1.0, "timeout": False},
        {"data_source": "aime", "qid": "q2", "score": 1.0, "timeout": False},
        {"data_source": "gpqa", "qid": "g1", "score": 0.0, "timeout": False},
    ]
    summary = summarize(scored, "ours")
    aime = summary["benchmarks"]["aime"]
    # per-question means 0.5 and 1.0 -> 75 (a response-weighted mean would give 60)
    assert aime == {"score": 75.0, "questions": 2, "responses": 5, "k_min": 1, "k_max": 4, "timeouts": 1}
    assert summary["benchmarks"]["gpqa"]["score"] == 0.0
    assert summary["in_distribution_avg"] == 75.0 and summary["ood_avg"] == 0.0 and summary["all_avg"] == 37.5
    table = markdown_table(summary)
    assert "| aime | 75.0 | 1-4 | 2 | 5 | 1 |" in table and "| gpqa | 0.0 | 1 | 1 | 1 | 0 |" in table
    # the paper protocol's average is the authors': over responses, 3 of 5
    paper = summarize(scored, "paper")
    assert paper["benchmarks"]["aime"]["score"] == 60.0 and paper["in_distribution_avg"] == 60.0
    assert paper["all_avg"] == 30.0 and paper["aggregation"] == "mean over responses"


def test_score_fixture_generations_end_to_end(tmp_path):
    summary = evaluate.score_files([], [str(FIXTURES / "generations.jsonl")], str(tmp_path), workers=4,
                                   protocol="ours")
    # Q_AIME: 204 after </think> (1), 203 (0), no tag -> whole response 204 (1), answer only in thought (0)
    assert summary["benchmarks"]["aime"]["score"] == pytest.approx(75.0)
    assert summary["benchmarks"]["gpqa"]["score"] == pytest.approx(50.0)
    assert summary["all_avg"] == pytest.approx(62.5)
    written = json.loads((tmp_path / "results.json").read_text())
    assert {key: written[key] for key in summary} == json.loads(json.dumps(summary))
    assert written["label"] == "this model" and written["paper_reported"] == {}
    assert (tmp_path / "results.md").read_text() == results_markdown(summary, "this model", None)
    assert markdown_table(summary) in (tmp_path / "results.md").read_text()
    scores = [json.loads(line)["score"] for line in (tmp_path / "scores.jsonl").read_text().splitlines()]
    assert scores == [1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0]


def test_generations_looked_up_from_benchmark_rows(tmp_path):
    from data_preprocess import math_benchmarks
    from data_preprocess.common import write_rows

    rows = math_benchmarks.build(["aime24"], {"aime24": str(FIXTURES / "aime24.jsonl")}, repeats=2)
    data = write_rows(rows, tmp_path / "aime.parquet")
    q1, q2 = rows[0]["extra_info"]["qid"], rows[2]["extra_info"]["qid"]
    gens = tmp_path / "gens.jsonl"
    lines = [{"qid": q1, "response": "</think>\\boxed{204}"}, {"prompt_id": q1, "response": "</think>\\boxed{1}"},
             {"qid": q2, "response": "</think>\\boxed{113}"}, {"qid": q2, "response": "</think>\\boxed{113}"}]
    gens.write_text("".join(json.dumps(line) + "\n" for line in lines))
    summary = evaluate.score_files([str(data)], [str(gens)], str(tmp_path / "out"), workers=2, protocol="ours")
    assert summary["benchmarks"]["aime"]["score"] == pytest.approx(75.0)
    assert summary["benchmarks"]["aime"]["k_min"] == 2


def test_bad_generation_lines_are_named():
    questions = {"q": {"data_source": "math", "ground_truth": "1"}}
    with pytest.raises(KeyError, match="generation 2: no 'qid'"):
        resolve([{"qid": "q", "response": "x"}, {"response": "x"}], questions)
    with pytest.raises(KeyError, match="generation 1: 'response' missing"):
        resolve([{"qid": "q"}], questions)
    with pytest.raises(KeyError, match="qid 'other' is not in --data"):
        resolve([{"qid": "other", "response": "x"}], questions)
    with pytest.raises(KeyError, match="data row 0: extra_info has no 'qid'"):
        questions_by_qid([{"data_source": "math", "reward_model": {"ground_truth": "1"}, "extra_info": {}}])


def test_invalid_jsonl_names_the_line(tmp_path):
    path = tmp_path / "g.jsonl"
    path.write_text('{"qid": "a", "response": "x"}\nnot json\n')
    with pytest.raises(ValueError, match=r"g.jsonl:2: invalid JSON"):
        evaluate.read_jsonl(path)


def _without_vllm(folder: Path) -> Path:
    """A folder that, first on the path, makes ``import vllm`` fail as on a machine without it."""
    (folder / "vllm").mkdir(parents=True, exist_ok=True)
    (folder / "vllm" / "__init__.py").write_text('raise ImportError("stand-in: vLLM is not installed")\n')
    return folder


def test_generate_without_vllm_stops_with_a_clear_message(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm raises ImportError, installed or not
    with pytest.raises(SystemExit, match="generation needs vLLM"):
        evaluate.generate("model-dir", [], str(tmp_path / "out.jsonl"), evaluate.PROTOCOLS["paper"])


def test_eval_script_guards(tmp_path):
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    script = REPO / "run_scripts" / "eval_benchmarks.sh"
    stand_in = _without_vllm(tmp_path / "no_vllm")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
           "PYTHONPATH": f"{stand_in}:{os.environ.get('PYTHONPATH', '')}"}
    missing = subprocess.run(["bash", str(script), str(tmp_path / "no_such_ckpt")], capture_output=True, text=True,
                             env=env)
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    (tmp_path / "ckpt").mkdir()
    no_data = subprocess.run(["bash", str(script), str(tmp_path / "ckpt")], capture_output=True, text=True,
                             env={**env, "DATA_FILES": str(tmp_path / "absent.parquet")})
    assert no_data.returncode == 2 and "absent.parquet' is missing" in no_data.stderr
    data = tmp_path / "bench.parquet"
    data.write_bytes(b"")
    run = subprocess.run(["bash", str(script), str(tmp_path / "ckpt"), str(tmp_path / "out")], capture_output=True,
                         text=True, env={**env, "DATA_FILES": str(data)})
    # without vllm it stops before generating and points at the CPU scoring command
    assert run.returncode == 3 and "vllm is not importable" in run.stderr and "exgrpo.tools.evaluate score" in run.stderr
    assert not (tmp_path / "out").exists()
    # Relative paths are the caller's, as for the training scripts: the scoring command it prints names them
    # absolute, under the directory the script was run from (not the repository).
    rel = subprocess.run(["bash", str(script), "ckpt", "out"], capture_output=True, text=True, cwd=tmp_path,
                         env={**env, "DATA_FILES": "bench.parquet"})
    assert rel.returncode == 3, rel.stderr
    assert f"--data {data} " in rel.stderr and f"--out_dir {tmp_path / 'out'}" in rel.stderr


# ----------------------------------------------------------------------------------------------- bad input, as typed
def _evaluate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "exgrpo.tools.evaluate", *args], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, "EXGRPO_DEBUG": ""})


def test_selfcheck_on_a_zero_row_file_fails_instead_of_passing(tmp_path):
    import pandas as pd

    no_columns, with_columns = tmp_path / "zero.parquet", tmp_path / "zero_rows.parquet"
    pd.DataFrame().to_parquet(no_columns)  # what a preprocessor wrote for an empty input before it refused to
    pd.DataFrame({"data_source": [], "prompt": [], "reward_model": []}).to_parquet(with_columns)
    for path in (no_columns, with_columns):
        result = _evaluate("selfcheck", "--data", str(path))
        assert (result.returncode, result.stdout) == (2, "")
        assert result.stderr == (f"exgrpo.tools.evaluate: error: data file {path} has no rows: nothing to grade (rebuild it "
                                 "with data_preprocess/)\n")
    assert evaluate.self_check([])["pass_rate"] == 0.0


def test_missing_or_foreign_files_are_one_line_before_any_grading(tmp_path, capsys, monkeypatch):
    import pandas as pd

    from exgrpo import cli

    missing = tmp_path / "absent.parquet"
    result = _evaluate("selfcheck", "--data", str(missing))
    assert (result.returncode, result.stderr) == (2, f"exgrpo.tools.evaluate: error: data file {missing} does not exist "
                                                     "(check the path)\n")
    monkeypatch.delenv("EXGRPO_DEBUG", raising=False)
    monkeypatch.setattr(evaluate, "self_check", lambda *a, **k: pytest.fail("graded before every file was checked"))
    good = FIXTURES / "processed_math.jsonl"
    rows = tmp_path / "bench.parquet"
    pd.DataFrame(evaluate.read_jsonl(good)).to_parquet(rows)
    foreign, text = tmp_path / "foreign.parquet", tmp_path / "notes.parquet"
    pd.DataFrame({"question": ["q"]}).to_parquet(foreign)
    text.write_text("not parquet")
    cases = [(["selfcheck", "--data", str(rows), str(foreign)],
              f"data file {foreign} lacks column(s) ['data_source', 'prompt', 'reward_model'] (has ['question']); "
              "give a benchmark file written by data_preprocess/math_benchmarks.py or ood_benchmarks.py"),
             (["selfcheck", "--data", str(rows), str(text)], f"data file {text} is not a parquet file"),
             (["score", "--generations", str(tmp_path / "g.jsonl"), "--out_dir", str(tmp_path / "out")],
              f"generations file {tmp_path / 'g.jsonl'} does not exist (check the path)")]
    for argv, line in cases:
        assert cli.run(evaluate.main, argv, prog="exgrpo.tools.evaluate") == 2
        assert capsys.readouterr().err.startswith(f"exgrpo.tools.evaluate: error: {line}")
    (tmp_path / "g.jsonl").write_text("\n")
    assert cli.run(evaluate.main, cases[-1][0], prog="exgrpo.tools.evaluate") == 2
    assert capsys.readouterr().err == f"exgrpo.tools.evaluate: error: generations file {tmp_path / 'g.jsonl'} has no lines: " \
                                      "nothing to score\n"
    assert not (tmp_path / "out").exists()


def test_a_ground_truth_that_is_not_a_string_or_number_is_named_before_grading(tmp_path):
    import pandas as pd

    path = tmp_path / "bench.parquet"
    prompt = [{"role": "user", "content": "1+1?"}]
    pd.DataFrame({"data_source": ["math", "math"], "prompt": [prompt, prompt],
                  "reward_model": [{"ground_truth": {"value": "2"}}, {"ground_truth": {"value": "3"}}]}).to_parquet(path)
    result = _evaluate("selfcheck", "--data", str(path))
    assert (result.returncode, result.stderr) == (2, f"exgrpo.tools.evaluate: error: data file {path} row 0: "
                                                     "reward_model.ground_truth is a dict, not a string or number\n")


# ----------------------------------------------------------------------------------------------- the authors' rows
def test_the_detail_and_results_json_give_each_benchmarks_rows_beside_the_authors(tmp_path):
    scored = ([{"data_source": "amc", "qid": f"a{q}", "score": 1.0} for q in range(40) for _ in range(32)]
              + [{"data_source": "minerva", "qid": f"m{q}", "score": 0.0} for q in range(272)]
              + [{"data_source": "mmlu_pro", "qid": "p", "score": 1.0}]
              + [{"data_source": "synthetic_arith", "qid": "s", "score": 1.0}])
    summary = summarize(scored, "paper")
    table = markdown_table(summary)
    assert "| amc | 100.0 | 32 | 40 | 1280 | 0 | 83 × 32 | no |" in table  # AMC 2023 only: another benchmark
    assert "| minerva | 0.0 | 1 | 272 | 272 | 0 | 272 × 1 | yes |" in table
    assert "| mmlu_pro | 100.0 | 1 | 1 | 1 | 0 | ? | ? |" in table  # the authors' file is not here to count
    assert "| synthetic_arith | 100.0 | 1 | 1 | 1 | 0 | – | – |" in table  # not a benchmark of the paper
    assert "| **in-distribution avg** | 50.0 | | | | | | no |" in table
    evaluate.write_tables(summary, tmp_path, "run", None)
    written = json.loads((tmp_path / "results.json").read_text())["rows_vs_authors"]
    assert written["benchmarks"]["amc"] == {"rows": "40 × 32", "authors_rows": "83 × 32", "comparable": False}
    assert written["benchmarks"]["minerva"]["comparable"] is True and written["in_distribution_avg"] is False
    assert "| 100.0 † |" in (tmp_path / "results.md").read_text()  # the AMC column of the paper's layout


# ----------------------------------------------------------------------------------------------- the model's context
def _stand_in_vllm(monkeypatch) -> list[dict]:
    """An importable vllm whose engine records its arguments and stops there: nothing is launched."""
    import types

    started: list[dict] = []

    class Started(Exception):
        pass

    def engine(**kwargs):
        started.append(kwargs)
        raise Started("stand-in engine")

    vllm, inputs = types.ModuleType("vllm"), types.ModuleType("vllm.inputs")
    vllm.LLM, vllm.SamplingParams, vllm.inputs, vllm.Started = engine, dict, inputs, Started
    inputs.TokensPrompt = dict
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    return started


def _model_folder(folder: Path, config: dict) -> tuple[Path, list[dict], int]:
    """A tokenizer (the twins' ChatML one) and a config.json, an empty weights file: a model folder vLLM never loads.
    Returns it, two benchmark rows and the length of their longest prompt under the paper protocol."""
    from data_preprocess import math_benchmarks
    from exgrpo.embedded import tiny_model

    tokenizer = tiny_model.build_tokenizer(vllm_compatible=True)
    tokenizer.save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(b"")
    rows = math_benchmarks.build(["aime24"], {"aime24": str(FIXTURES / "aime24.jsonl")}, repeats=1)
    longest = max(len(evaluate.render_prompt(tokenizer, row["prompt"], evaluate.PROTOCOLS["paper"])[1]) for row in rows)
    return folder, rows, longest


def test_a_model_with_too_few_positions_is_refused_in_one_line_before_vllm_starts(tmp_path, monkeypatch):
    started = _stand_in_vllm(monkeypatch)
    paper = evaluate.PROTOCOLS["paper"]
    unscaled = {"rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}}  # as transformers 5 saves it
    model, rows, longest = _model_folder(tmp_path / "m", {"max_position_embeddings": 4096, **unscaled})
    assert 100 < longest < 4096 - 100
    with pytest.raises(evaluate.InputError) as refused:
        evaluate.generate(model, rows, tmp_path / "g.jsonl", paper)
    assert str(refused.value) == (
        f"model {model} accepts 4096 positions (max_position_embeddings in its config.json), fewer than the longest "
        f"prompt ({longest} tokens) + max_tokens 8192 = {longest + 8192}: set MAX_TOKENS={4096 - longest} "
        f"(--max_tokens {4096 - longest}; responses then stop before the paper's 8192 tokens) or evaluate the 16k "
        "model (its config.json raised to 16384 positions, as the authors' Qwen2.5-Math-7B-16k)")
    # the MAX_TOKENS it names fits exactly: vLLM is then asked for all 4096 positions
    with pytest.raises(sys.modules["vllm"].Started):
        evaluate.generate(model, rows, tmp_path / "g.jsonl", paper, evaluate.EngineSettings(max_tokens=4096 - longest))
    assert started[-1]["max_model_len"] == 4096
    # a prompt longer than the model: only the longer model helps
    short, rows, longest = _model_folder(tmp_path / "short", {"max_position_embeddings": 64})
    with pytest.raises(evaluate.InputError, match=rf"accepts 64 positions .*\({longest} tokens\) \+ max_tokens 8192 = "
                                                  rf"{longest + 8192}: evaluate the 16k model"):
        evaluate.generate(short, rows, tmp_path / "g.jsonl", paper)
    assert len(started) == 1


@pytest.mark.parametrize("config", [
    # vLLM scales the limit by a RoPE scaling (transformers 5 writes it as rope_parameters)
    {"max_position_embeddings": 4096, "rope_scaling": {"rope_type": "linear", "factor": 4.0}},
    {"max_position_embeddings": 4096, "rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e4}},
    {"vocab_size": 10},  # no max_position_embeddings: vLLM decides
])
def test_a_context_that_vllm_decides_otherwise_is_left_to_it(tmp_path, monkeypatch, config):
    started = _stand_in_vllm(monkeypatch)
    model, rows, longest = _model_folder(tmp_path / "m", config)
    with pytest.raises(sys.modules["vllm"].Started):
        evaluate.generate(model, rows, tmp_path / "g.jsonl", evaluate.PROTOCOLS["paper"])
    assert started[0]["max_model_len"] == longest + 8192


def test_a_bad_max_position_embeddings_is_named(tmp_path):
    (tmp_path / "config.json").write_text('{"max_position_embeddings": "4k"}')
    with pytest.raises(evaluate.InputError, match="config.json: max_position_embeddings is '4k', not a positive"):
        evaluate.context_limit(tmp_path)
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(evaluate.InputError, match="config.json is not readable JSON"):
        evaluate.context_limit(tmp_path)


def test_the_run_command_on_a_4096_position_model_prints_one_line(tmp_path, monkeypatch, capsys):
    from data_preprocess.common import write_rows
    from exgrpo import cli

    started = _stand_in_vllm(monkeypatch)
    monkeypatch.delenv("EXGRPO_DEBUG", raising=False)
    model, rows, longest = _model_folder(tmp_path / "Qwen2.5-Math-7B", {"max_position_embeddings": 4096})
    data = write_rows(rows, tmp_path / "aime.parquet")
    argv = ["run", "--checkpoint", str(model), "--data", str(data), "--out_dir", str(tmp_path / "out")]
    assert cli.run(evaluate.main, argv, prog="exgrpo.tools.evaluate") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"exgrpo.tools.evaluate: error: model {model} accepts 4096 "
                                                   f"positions") and f"set MAX_TOKENS={4096 - longest} " in err
    assert started == []

"""Preprocessors on hand-written fixtures in every raw schema they accept; ids, system prompt, bad input."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from data_preprocess import math_benchmarks, ood_benchmarks, openr1
from data_preprocess.common import (
    SYSTEM_PROMPT,
    SYSTEM_PROMPT_SHA256,
    clean_answer,
    question_id,
    read_local,
    rows_from_processed,
    write_rows,
)

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "data"


def fixture(name: str) -> list[dict]:
    return read_local(FIXTURES / name)


def check_row_layout(row: dict) -> None:
    assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    prompt = list(row["prompt"])
    assert [turn["role"] for turn in prompt] == ["system", "user"]
    assert prompt[0]["content"] == SYSTEM_PROMPT
    assert row["reward_model"]["style"] == "rule" and row["reward_model"]["ground_truth"].strip()
    assert set(row["extra_info"]) == {"index", "qid", "split", "repeat"}
    assert row["extra_info"]["qid"] == question_id(row["data_source"], prompt[1]["content"])


# ----------------------------------------------------------------------------------------------- system prompt, ids
def test_system_prompt_hash():
    assert hashlib.sha256(SYSTEM_PROMPT.encode("utf-8")).hexdigest() == SYSTEM_PROMPT_SHA256
    assert SYSTEM_PROMPT.count("\n") == 3 and "\\boxed{}" in SYSTEM_PROMPT and "\b" not in SYSTEM_PROMPT


def test_system_prompt_matches_authors_files(shared_benchmarks):
    for path in sorted(shared_benchmarks.glob("*.parquet")):
        prompts = pd.read_parquet(path, columns=["prompt"])["prompt"]
        assert {p[0]["content"] for p in prompts} == {SYSTEM_PROMPT}, path.name


def test_question_id_is_stable_across_processes():
    # literal value: the id must not change between versions, runs or machines (it keys the experience pool)
    assert question_id("math", "What is $1+1$?") == "46a49ac536dcafc4"
    assert question_id("math", "What is $1+1$?") != question_id("aime", "What is $1+1$?")
    code = "from data_preprocess.common import question_id; print(question_id('math', 'What is $1+1$?'))"
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "46a49ac536dcafc4"


@pytest.mark.parametrize(
    ("value", "expected"),
    [("5", "5"), (27.0, "27"), (0.25, "0.25"), (3, "3"), (["$8$"], "$8$"), (["$(1,2)$", "$(2,1)$"], "$(1,2)$, $(2,1)$"),
     ("", None), ("  ", None), (None, None), ("proof", None), ("notfound", None), (float("nan"), None), ([], None)],
)
def test_clean_answer(value, expected):
    assert clean_answer(value) == expected


# ----------------------------------------------------------------------------------------------- openr1
def test_openr1_46k_schema():
    rows, counts = openr1.build_rows(fixture("openr1_46k.jsonl"))
    assert counts["read"] == 4 and counts["written"] == 2
    assert counts["dropped: no usable answer"] == 1 and counts["dropped: duplicate question"] == 1
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["5", "\\frac{5}{6}"]
    assert [r["extra_info"]["index"] for r in rows] == [0, 1]
    for row in rows:
        check_row_layout(row)
        assert row["data_source"] == "openr1" and row["extra_info"]["split"] == "train"
    assert "REFERENCE" not in json.dumps(rows)  # no reference traces leak into RLVR rows


def test_openr1_220k_raw_schema():
    rows, counts = openr1.build_rows(fixture("openr1_220k.jsonl"))
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["56", "x=2 \\text{ or } x=-2", "81"]
    assert counts["dropped: proof question"] == 1
    assert counts["dropped: no usable answer"] == 2  # "notfound" and None
    assert counts["dropped: empty question"] == 1
    assert counts["dropped: duplicate question"] == 1
    assert counts["duplicates with a different answer (first kept)"] == 1
    assert "REFERENCE" not in json.dumps(rows)
    for row in rows:
        check_row_layout(row)


def test_openr1_from_parquet_and_max_rows(tmp_path):
    source = tmp_path / "raw.parquet"
    pd.DataFrame(fixture("openr1_46k.jsonl")).to_parquet(source)  # nested columns come back as numpy arrays
    rows, counts = openr1.build_rows(read_local(source), max_rows=1)
    assert len(rows) == 1 and counts["dropped: over --max_rows"] == 1
    assert rows[0]["prompt"][1]["content"] == "Find the sum of the roots of $x^2-5x+6=0$."


def test_openr1_cli_writes_parquet_and_summary(tmp_path):
    output = tmp_path / "train.parquet"
    result = subprocess.run([sys.executable, str(REPO / "data_preprocess" / "openr1.py"), "--input",
                             str(FIXTURES / "openr1_220k.jsonl"), "--output", str(output), "--valid_rows", "0"],
                            capture_output=True, text=True, check=True, cwd=tmp_path)
    assert "written: 3" in result.stdout and "dropped: proof question: 1" in result.stdout
    assert not (tmp_path / "train_valid.parquet").exists()
    frame = pd.read_parquet(output)
    assert len(frame) == 3
    first = frame.iloc[0]
    assert first["prompt"][0]["content"] == SYSTEM_PROMPT
    assert first["extra_info"]["qid"] == question_id("openr1", "What is $7 \\times 8$?")
    # same input, second run: identical ids
    again, _ = openr1.build_rows(fixture("openr1_220k.jsonl"))
    assert [r["extra_info"]["qid"] for r in again] == [e["qid"] for e in frame["extra_info"]]


def test_openr1_holds_out_a_seeded_validation_split_disjoint_from_training_beside_the_output(tmp_path):
    def run(seed, output="data/openr1.parquet"):
        return subprocess.run([sys.executable, str(REPO / "data_preprocess" / "openr1.py"), "--input",
                               str(FIXTURES / "openr1_220k.jsonl"), "--output", output, "--valid_rows", "1",
                               "--seed", str(seed)], capture_output=True, text=True, cwd=tmp_path)

    result = run(0)
    assert result.returncode == 0, result.stderr
    assert "written: 2" in result.stdout and "held out for validation: 1" in result.stdout
    train = pd.read_parquet(tmp_path / "data" / "openr1.parquet")
    valid = pd.read_parquet(tmp_path / "data" / "openr1_valid.parquet")  # the launcher's default VAL_FILE
    train_ids, valid_ids = ({e["qid"] for e in f["extra_info"]} for f in (train, valid))
    everything, _ = openr1.build_rows(fixture("openr1_220k.jsonl"))
    assert not train_ids & valid_ids and train_ids | valid_ids == {r["extra_info"]["qid"] for r in everything}
    assert [e["split"] for e in valid["extra_info"]] == ["valid"] and [e["index"] for e in valid["extra_info"]] == [0]
    assert [e["index"] for e in train["extra_info"]] == [0, 1]
    # Same seed, same split; the draw follows the seed.
    assert run(0).returncode == 0
    assert pd.read_parquet(tmp_path / "data" / "openr1_valid.parquet")["extra_info"][0]["qid"] in valid_ids
    drawn = set()
    for seed in range(8):
        assert run(seed, f"s{seed}/o.parquet").returncode == 0
        drawn.add(pd.read_parquet(tmp_path / f"s{seed}" / "o_valid.parquet")["extra_info"][0]["qid"])
    assert len(drawn) > 1
    # A split that leaves nothing to train on is one line, and nothing is written.
    result = subprocess.run([sys.executable, str(REPO / "data_preprocess" / "openr1.py"), "--input",
                             str(FIXTURES / "openr1_220k.jsonl"), "--output", "none.parquet", "--valid_rows", "3"],
                            capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode != 0 and "--valid_rows 3 leaves none of the 3 questions" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "none.parquet").exists()


def test_openr1_unknown_schema_names_row_and_fields():
    with pytest.raises(KeyError, match=r"row 1: neither .*fields: \['foo'\]"):
        openr1.build_rows([{"problem": "p", "answer": "1"}, {"foo": 1}])


# ----------------------------------------------------------------------------------------------- math benchmarks
@pytest.mark.parametrize(
    ("name", "data_source", "answers", "repeats"),
    [
        ("aime24", "aime", ["204", "113"], 32),
        ("aime25", "aime25", ["70"], 32),
        ("amc23", "amc", ["27", "0.25"], 32),
        ("math500", "math", ["\\left( 3, \\frac{\\pi}{2} \\right)", "\\sqrt{53}"], 1),
        ("minerva", "minerva", ["0.49"], 1),
        ("olympiadbench", "olympiad_bench", ["$8$", "$(1,2)$, $(2,1)$"], 1),
    ],
)
def test_math_benchmark_schemas(name, data_source, answers, repeats):
    rows = math_benchmarks.build([name], {name: str(FIXTURES / f"{name}.jsonl")})
    assert len(rows) == len(answers) * repeats
    assert [r["reward_model"]["ground_truth"] for r in rows[::repeats]] == answers
    assert [r["extra_info"]["index"] for r in rows] == list(range(len(rows)))
    for question in range(len(answers)):
        block = rows[question * repeats:(question + 1) * repeats]
        assert len({r["extra_info"]["qid"] for r in block}) == 1
        assert [r["extra_info"]["repeat"] for r in block] == list(range(repeats))
    assert len({r["extra_info"]["qid"] for r in rows}) == len(answers)
    for row in rows:
        check_row_layout(row)
        assert row["data_source"] == data_source and row["extra_info"]["split"] == "test"


def test_math_repeats_override_and_round_trip(tmp_path):
    rows = math_benchmarks.build(["aime24", "minerva"], {"aime24": str(FIXTURES / "aime24.jsonl"),
                                                         "minerva": str(FIXTURES / "minerva.jsonl")}, repeats=2)
    assert len(rows) == 6
    path = write_rows(rows, tmp_path / "bench.parquet")
    back = pd.read_parquet(path).to_dict(orient="records")
    assert [r["extra_info"]["qid"] for r in back] == [r["extra_info"]["qid"] for r in rows]
    assert [list(r["prompt"])[1]["content"] for r in back] == [r["prompt"][1]["content"] for r in rows]


def test_math_benchmark_missing_answer_is_an_error_naming_the_row():
    with pytest.raises(ValueError, match="math500 row 1: no usable answer"):
        math_benchmarks.convert("math500", [{"problem": "p", "answer": "1"}, {"problem": "q", "answer": ""}])
    with pytest.raises(KeyError, match=r"minerva row 0: none of the fields"):
        math_benchmarks.convert("minerva", [{"prompt": "p", "answer": "1"}])
    with pytest.raises(ValueError, match="--local expects NAME=PATH"):
        math_benchmarks.parse_local(["nonsense=x.jsonl"])


def test_math_cli_from_processed_fixture(tmp_path):
    output = tmp_path / "math.parquet"
    assert math_benchmarks.main(["--processed", str(FIXTURES / "processed_math.jsonl"), "--output", str(output)]) == 0
    frame = pd.read_parquet(output)
    assert list(frame["data_source"]) == ["aime", "aime", "math"]
    qids = [e["qid"] for e in frame["extra_info"]]
    assert qids[0] == qids[1] != qids[2]
    assert [e["repeat"] for e in frame["extra_info"]] == [0, 1, 0]
    assert all(p[0]["content"] == SYSTEM_PROMPT for p in frame["prompt"])  # their placeholder prompt replaced


# The authors' AMC (AI-MO/aimo-validation-amc, train split): the first two rows as the hub gives them.
AMC_RECORDS = [
    {"id": 0, "problem": "$\\frac{m}{n}$ is the Irreducible fraction value of "
                         "\\[3+\\frac{1}{3+\\frac{1}{3+\\frac13}}\\], what is the value of $m+n$?", "answer": 142.0,
     "url": "https://artofproblemsolving.com/wiki/index.php/2022_AMC_12A_Problems/Problem_1"},
    {"id": 1, "problem": "How many ways are there to split the integers $1$ through $14$ into $7$ pairs such that in "
                         "each pair, the greater number is at least $2$ times the lesser number?", "answer": 144.0,
     "url": "https://artofproblemsolving.com/wiki/index.php/2022_AMC_12A_Problems/Problem_10"},
]


def test_the_default_amc_is_the_authors_83_question_set_from_its_hub_source(monkeypatch):
    datasets = pytest.importorskip("datasets")
    calls = []

    def fake_load_dataset(path, name=None, split=None):
        calls.append((path, name, split))
        return AMC_RECORDS

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    assert math_benchmarks.DEFAULT_BENCHMARKS == ["aime24", "aime25", "amc", "math500", "minerva", "olympiadbench"]
    rows = math_benchmarks.build(["amc"])
    assert calls == [("AI-MO/aimo-validation-amc", None, "train")]
    assert len(rows) == 2 * 32 and {row["data_source"] for row in rows} == {"amc"}
    assert [row["reward_model"]["ground_truth"] for row in rows[::32]] == ["142", "144"]
    assert rows[0]["prompt"][1]["content"] == AMC_RECORDS[0]["problem"]
    for row in rows:
        check_row_layout(row)


def test_the_authors_amc_questions_are_those_of_the_hub_set(shared_benchmarks):
    """The authors' AMC rows open with the hub set's first questions, with the same answers (142.0, 144.0)."""
    records = [r for r in read_local(shared_benchmarks / "math_test.parquet") if r["data_source"] == "amc"]
    questions = list(dict.fromkeys((r["prompt"][1]["content"], r["reward_model"]["ground_truth"]) for r in records))
    assert len(questions) == 83 and len(records) == 83 * 32
    assert questions[:2] == [(record["problem"], f"{record['answer']}") for record in AMC_RECORDS]


def test_amc23_is_never_built_beside_amc():
    with pytest.raises(ValueError, match="--benchmarks amc and amc23 both build data_source amc"):
        math_benchmarks.build(["amc", "amc23"], {"amc": "x.jsonl", "amc23": "y.jsonl"})


def test_a_benchmark_on_other_rows_than_the_authors_is_named_in_a_warning():
    def rows(source: str, questions: int, repeats: int) -> list[dict]:
        return [{"data_source": source, "extra_info": {"qid": f"{source}{q}"}} for q in range(questions)
                for _ in range(repeats)]

    lines, warnings = math_benchmarks.rows_report(rows("amc", 83, 32) + rows("minerva", 272, 1) + rows("x", 2, 1))
    assert lines == ["  amc: 83 questions, 2656 rows (83 × 32; the authors' 83 × 32)",
                     "  minerva: 272 questions, 272 rows (272 × 1; the authors' 272 × 1)",
                     "  x: 2 questions, 2 rows (2 × 1; the authors' unknown)"]
    assert warnings == []
    lines, warnings = math_benchmarks.rows_report(rows("amc", 40, 32) + rows("aime", 30, 4))
    assert [warning.split(":")[0] for warning in warnings] == ["warning"] * 2
    assert warnings[0].startswith("warning: amc is 40 × 32 (questions × samples), the authors' 83 × 32: its column "
                                  "and the average over it are not comparable with the paper")
    assert warnings[1].startswith("warning: aime is 30 × 4 (questions × samples), the authors' 30 × 32")


def test_the_cli_warns_on_the_40_question_amc23_and_not_on_the_authors_file(tmp_path, shared_benchmarks):
    amc23 = run_script("math_benchmarks", "--benchmarks", "amc23", "--local", f"amc23={FIXTURES / 'amc23.jsonl'}",
                       "--output", str(tmp_path / "amc.parquet"))
    assert amc23.returncode == 0 and "  amc: 2 questions, 64 rows (2 × 32; the authors' 83 × 32)" in amc23.stdout
    assert amc23.stderr == ("math_benchmarks: warning: amc is 2 × 32 (questions × samples), the authors' 83 × 32: its "
                            "column and the average over it are not comparable with the paper (build the default "
                            "benchmarks with their default repeats, or import the authors' file with --processed)\n")
    theirs = run_script("math_benchmarks", "--processed", str(shared_benchmarks / "math_test.parquet"), "--output",
                        str(tmp_path / "math.parquet"))
    assert theirs.returncode == 0 and theirs.stderr == ""
    assert "  amc: 83 questions, 2656 rows (83 × 32; the authors' 83 × 32)" in theirs.stdout


# ----------------------------------------------------------------------------------------------- OOD benchmarks
def parse_options(user_text: str) -> dict[str, str]:
    return dict(re.findall(r"^([A-J])\) (.*)$", user_text, re.M))


def test_arc_schema_letters_and_numeric_labels():
    rows = ood_benchmarks.build(["arc_c"], {"arc_c": str(FIXTURES / "arc_c.jsonl")})
    raw = fixture("arc_c.jsonl")
    for row, record in zip(rows, raw, strict=True):
        check_row_layout(row)
        options = parse_options(row["prompt"][1]["content"])
        correct = record["choices"]["text"][record["choices"]["label"].index(record["answerKey"])]
        assert options[row["reward_model"]["ground_truth"]] == correct
        assert row["prompt"][1]["content"].startswith(record["question"] + "\n\nA) ")
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["C", "A"]  # label "1" became letter A


def test_gpqa_shuffle_is_deterministic_and_correct_answer_moves():
    raw = fixture("gpqa.jsonl")
    rows = ood_benchmarks.convert("gpqa", raw, seed=0)
    letters = [r["reward_model"]["ground_truth"] for r in rows]
    assert len(set(letters)) > 1, "GPQA's correct answer must not always be the same option"
    for row, record in zip(rows, raw, strict=True):
        text = row["prompt"][1]["content"]
        assert text.startswith("Answer the following multiple choice question.") and "one of ABCD" in text
        options = parse_options(text)
        assert sorted(options) == ["A", "B", "C", "D"]
        assert options[row["reward_model"]["ground_truth"]] == record["Correct Answer"]
        assert sorted(options.values()) == sorted([record["Correct Answer"]] + [record[f"Incorrect Answer {i}"]
                                                                              for i in (1, 2, 3)])
    assert ood_benchmarks.convert("gpqa", raw, seed=0) == rows
    assert ood_benchmarks.convert("gpqa", list(reversed(raw)), seed=0) == list(reversed(rows))  # order-independent
    other = ood_benchmarks.convert("gpqa", raw, seed=1)
    assert [r["prompt"][1]["content"] for r in other] != [r["prompt"][1]["content"] for r in rows]


def test_mmlu_pro_schema_answer_and_answer_index():
    rows = ood_benchmarks.convert("mmlu_pro", fixture("mmlu_pro.jsonl"))
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["B", "C"]
    options = parse_options(rows[0]["prompt"][1]["content"])
    assert len(options) == 10 and options["B"] == "Unsafe practices" and options["J"] == "Hope"
    shuffled = ood_benchmarks.convert("mmlu_pro", fixture("mmlu_pro.jsonl"), shuffle=True, seed=3)
    for row in shuffled:
        assert parse_options(row["prompt"][1]["content"])[row["reward_model"]["ground_truth"]] in {
            "Unsafe practices", "7"}


def test_ood_bad_input_names_the_row():
    record = fixture("arc_c.jsonl")[0] | {"answerKey": "Z"}
    with pytest.raises(ValueError, match="arc_c row 0: answerKey 'Z'"):
        ood_benchmarks.convert("arc_c", [record])
    with pytest.raises(KeyError, match="gpqa row 0: none of the fields"):
        ood_benchmarks.convert("gpqa", [{"Question": "q"}])
    with pytest.raises(ValueError, match="mmlu_pro row 0: answer 'K'"):
        ood_benchmarks.convert("mmlu_pro", [{"question": "q", "options": ["a", "b"], "answer": "K"}])


def test_ood_cli(tmp_path):
    output = tmp_path / "ood.parquet"
    argv = ["--local", f"arc_c={FIXTURES / 'arc_c.jsonl'}", f"gpqa={FIXTURES / 'gpqa.jsonl'}",
            f"mmlu_pro={FIXTURES / 'mmlu_pro.jsonl'}", "--output", str(output)]
    assert ood_benchmarks.main(argv) == 0
    frame = pd.read_parquet(output)
    assert list(frame["data_source"]) == ["arc_c"] * 2 + ["gpqa"] * 8 + ["mmlu_pro"] * 2
    assert [e["index"] for e in frame["extra_info"]] == list(range(12))


# ----------------------------------------------------------------------------------------------- authors' files
def test_import_authors_processed_files(shared_benchmarks):
    expected = {"math_test.parquet": {"aime": (960, 30), "aime25": (960, 30), "amc": (2656, 83), "math": (500, 500),
                                      "minerva": (272, 272), "olympiad_bench": (675, 675)},
                "arc_c_test.parquet": {"arc_c": (1172, 1172)}, "gpqa_diamond_test.parquet": {"gpqa": (198, 198)}}
    for name, per_source in expected.items():
        records = read_local(shared_benchmarks / name)
        rows, counts = rows_from_processed(records, source_name=name)
        assert counts == {"rows": len(records), "other_system_prompt": 0}
        for source, (n_rows, n_questions) in per_source.items():
            mine = [r for r in rows if r["data_source"] == source]
            assert len(mine) == n_rows and len({r["extra_info"]["qid"] for r in mine}) == n_questions, source
        for row, record in zip(rows, records, strict=True):
            assert row["prompt"][1]["content"] == record["prompt"][1]["content"]
            assert row["reward_model"]["ground_truth"] == record["reward_model"]["ground_truth"].strip()
        check_row_layout(rows[0])


def test_hub_route_passes_config_and_split(monkeypatch):
    """No hub here: a stand-in load_dataset records the call and serves the fixture rows."""
    datasets = pytest.importorskip("datasets")
    calls = []

    def fake_load_dataset(path, name=None, split=None):
        calls.append((path, name, split))
        return fixture("arc_c.jsonl") if path == "allenai/ai2_arc" else fixture("aime24.jsonl")

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    ood_rows = ood_benchmarks.build(["arc_c"])
    math_rows = math_benchmarks.build(["aime24"], repeats=1)
    train_rows, _ = openr1.build_rows(openr1.load_records("Elliott/Openr1-Math-46k-8192"))
    assert calls == [("allenai/ai2_arc", "ARC-Challenge", "test"), ("HuggingFaceH4/aime_2024", None, "train"),
                     ("Elliott/Openr1-Math-46k-8192", None, "train")]
    assert len(ood_rows) == 2 and len(math_rows) == 2 and len(train_rows) == 2


# ----------------------------------------------------------------------------------------------- no hub access
def _offline_errors():
    """What `datasets` raises without the hub (load.py of datasets 5: a ConnectionError naming the cause), and
    the raw errors of its HTTP stack when a data-file download fails later."""
    httpx = pytest.importorskip("httpx")
    hub_errors = pytest.importorskip("huggingface_hub.errors")
    offline = ConnectionError("Couldn't reach 'x' on the Hub (OfflineModeIsEnabled)")
    offline.__cause__ = hub_errors.OfflineModeIsEnabled("offline mode is enabled")
    return {
        "openr1": ConnectionError("Couldn't reach 'Elliott/Openr1-Math-46k-8192' on the Hub (LocalEntryNotFoundError)"),
        "math": offline,
        "ood": httpx.ConnectError("[Errno -2] Name or service not known"),
    }


PROCESSED = ", or import the authors' processed parquet with --processed FILE."


@pytest.mark.parametrize("script, argv, option", [
    ("openr1", [], "(.parquet, .jsonl, .json or .csv) with --input FILE [FILE ...]."),
    ("math", ["--benchmarks", "aime24"], "with --local aime24=FILE" + PROCESSED),
    ("ood", ["--benchmarks", "arc_c"], "with --local arc_c=FILE" + PROCESSED),
])
def test_unreachable_hub_is_one_line_naming_the_local_file_option(script, argv, option, monkeypatch, tmp_path,
                                                                 capsys):
    datasets = pytest.importorskip("datasets")
    error = _offline_errors()[script]

    def no_hub(*args, **kwargs):
        raise error

    monkeypatch.setattr(datasets, "load_dataset", no_hub)
    module = {"openr1": openr1, "math": math_benchmarks, "ood": ood_benchmarks}[script]
    output = tmp_path / "out.parquet"
    assert module.main([*argv, "--output", str(output)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and "Traceback" not in captured.err
    assert "cannot reach the Hugging Face Hub for dataset" in captured.err and option in captured.err
    assert type(error).__name__ in captured.err and "hf download" in captured.err and not output.exists()


def test_gated_dataset_is_one_line_too(monkeypatch, capsys, tmp_path):
    datasets = pytest.importorskip("datasets")

    def gated(*args, **kwargs):
        raise datasets.exceptions.DatasetNotFoundError("Dataset 'Idavidrein/gpqa' is a gated dataset on the Hub.")

    monkeypatch.setattr(datasets, "load_dataset", gated)
    assert ood_benchmarks.main(["--benchmarks", "gpqa", "--output", str(tmp_path / "o.parquet")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ood_benchmarks: the Hugging Face Hub did not give") and "gated dataset" in err
    assert "--local gpqa=FILE" in err and "gpqa_diamond train split" in err


def test_other_loader_errors_are_not_disguised_as_hub_trouble(monkeypatch):
    datasets = pytest.importorskip("datasets")

    def broken(*args, **kwargs):
        raise ValueError("a bug in the loader")

    monkeypatch.setattr(datasets, "load_dataset", broken)
    with pytest.raises(ValueError, match="a bug in the loader"):
        openr1.main(["--output", "unused.parquet"])


def test_real_offline_datasets_gives_one_line_without_traceback(tmp_path):
    """The real `datasets` in offline mode (no network touched), with an empty cache: the script's own line."""
    pytest.importorskip("datasets")
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"),
           "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, str(REPO / "data_preprocess" / "openr1.py"), "--output",
                             str(tmp_path / "train.parquet")], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("openr1: cannot reach the Hugging Face Hub for dataset 'Elliott/Openr1-Math-46k-8192'")
    assert "--input FILE [FILE ...]" in last and not (tmp_path / "train.parquet").exists()


def test_openr1_reads_several_local_files_as_one_set(tmp_path):
    output = tmp_path / "train.parquet"
    assert openr1.main(["--input", str(FIXTURES / "openr1_46k.jsonl"), str(FIXTURES / "openr1_220k.jsonl"),
                        "--output", str(output), "--valid_rows", "0"]) == 0
    one = [openr1.build_rows(fixture(name))[0] for name in ("openr1_46k.jsonl", "openr1_220k.jsonl")]
    both = pd.read_parquet(output)
    assert [e["qid"] for e in both["extra_info"]] == [r["extra_info"]["qid"] for rows in one for r in rows]


# ----------------------------------------------------------------------------------------------- bad input, as typed
def run_script(script: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The preprocessor as a user runs it: `python data_preprocess/<script>.py ...` from another folder."""
    return subprocess.run([sys.executable, str(REPO / "data_preprocess" / f"{script}.py"), *args],
                          capture_output=True, text=True, cwd=REPO.parent,
                          env={**os.environ, "EXGRPO_DEBUG": "", **(env or {})})


def _openr1_inputs(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """Name -> (input file, the one line the command must print for it)."""
    text = tmp_path / "notes.txt"
    text.write_text("what is 1+1?\n")
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text('{"problem": "p", "answer": "1"}\n{"problem": "q", answer: 2}\n')
    columns = tmp_path / "columns.jsonl"
    columns.write_text('{"question": "q", "solution": "s"}\n')
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    dropped = tmp_path / "dropped.jsonl"
    dropped.write_text('{"problem": "p", "answer": ""}\n{"problem": "q", "answer": "proof"}\n'
                       '{"problem": "r", "answer": "1", "question_type": "proof"}\n')
    missing = tmp_path / "absent.parquet"
    out = tmp_path / "out" / "train.parquet"
    return {
        "txt": (text, f"openr1: error: {text}: unsupported file type '.txt'; give a .parquet, .jsonl, .json or "
                      ".csv file"),
        "bad json line": (bad_json, f"openr1: error: {bad_json}:2: invalid JSON (Expecting property name enclosed "
                                    "in double quotes: line 1 column 18 (char 17)); fix or remove that line"),
        "wrong columns": (columns, f"openr1: error: {columns} row 0: neither the 46k schema (prompt, reward_model) "
                                   "nor the 220k schema (problem, answer); fields: ['question', 'solution']"),
        "empty": (empty, f"openr1: error: {empty}: no records; nothing written to {out}"),
        "all dropped": (dropped, f"openr1: error: {dropped}: all 3 rows dropped (no usable answer 2, proof question "
                                 f"1); nothing written to {out}. A row needs a question and a checkable final answer"),
        "missing": (missing, f"openr1: error: no such data file: {missing} (check the path)"),
    }


@pytest.mark.parametrize("kind", ["txt", "bad json line", "wrong columns", "empty", "all dropped", "missing"])
def test_openr1_bad_input_is_one_line_exit_2_and_writes_nothing(kind, tmp_path):
    path, line = _openr1_inputs(tmp_path)[kind]
    out = tmp_path / "out" / "train.parquet"
    result = run_script("openr1", "--input", str(path), "--output", str(out))
    assert (result.returncode, result.stderr, result.stdout) == (2, line + "\n", "")
    assert not (tmp_path / "out").exists()


def test_debug_flag_or_environment_shows_the_traceback(tmp_path):
    path, _ = _openr1_inputs(tmp_path)["wrong columns"]
    for extra, env in ((["--debug"], None), ([], {"EXGRPO_DEBUG": "1"})):
        result = run_script("openr1", "--input", str(path), "--output", str(tmp_path / "o.parquet"), *extra, env=env)
        assert result.returncode == 1 and "Traceback (most recent call last)" in result.stderr
        assert result.stderr.rstrip().endswith("fields: ['question', 'solution']\"")


def test_preprocessors_refuse_to_write_zero_rows(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    out = tmp_path / "bench.parquet"
    math = run_script("math_benchmarks", "--benchmarks", "aime24", "--local", f"aime24={empty}", "--output", str(out))
    assert (math.returncode, math.stderr) == (2, f"math_benchmarks: error: aime24 ({empty}): no rows; a benchmark "
                                                 "without questions would be missing from every table\n")
    processed = run_script("ood_benchmarks", "--processed", str(empty), "--output", str(out))
    assert (processed.returncode, processed.stderr) == (2, f"ood_benchmarks: error: {empty}: no rows; give the "
                                                           "authors' processed parquet (e.g. math_test.parquet)\n")
    assert not out.exists()
    with pytest.raises(ValueError, match=f"no rows to write to {out}; nothing written"):
        write_rows([], out)
    assert not out.exists()


def test_a_benchmark_preprocessor_given_another_benchmarks_raw_file_says_which_script_it_belongs_to(tmp_path):
    out = tmp_path / "bench.parquet"
    arc, math500 = FIXTURES / "arc_c.jsonl", FIXTURES / "math500.jsonl"
    math = run_script("math_benchmarks", "--benchmarks", "aime24", "--local", f"aime24={arc}", "--output", str(out))
    assert (math.returncode, math.stderr) == (
        2, f"math_benchmarks: error: aime24 ({arc}) row 0 is a multiple-choice question (fields: ['answerKey', "
           "'choices', 'id', 'question']), not a math question: that file belongs to data_preprocess/ood_benchmarks.py\n")
    ood = run_script("ood_benchmarks", "--benchmarks", "arc_c", "--local", f"arc_c={math500}", "--output", str(out))
    assert (ood.returncode, ood.stderr) == (
        2, f"ood_benchmarks: error: arc_c ({math500}) row 0 is a math question (a final answer, no options; fields: "
           "['answer', 'level', 'problem', 'solution', 'subject', 'unique_id']), not a multiple-choice question: that "
           "file belongs to data_preprocess/math_benchmarks.py\n")
    assert not out.exists()


@pytest.mark.parametrize(("script", "name", "line"), [
    ("math_benchmarks", "arc_c_test.parquet", "holds multiple-choice benchmark rows (data_source arc_c), not math: "
                                              "import it with data_preprocess/ood_benchmarks.py --processed {path}"),
    ("math_benchmarks", "gpqa_diamond_test.parquet", "holds multiple-choice benchmark rows (data_source gpqa), not "
                                                     "math: import it with data_preprocess/ood_benchmarks.py "
                                                     "--processed {path}"),
    ("ood_benchmarks", "math_test.parquet", "holds math benchmark rows (data_source aime, aime25, amc, math, minerva, "
                                            "olympiad_bench), not multiple choice: import it with "
                                            "data_preprocess/math_benchmarks.py --processed {path}"),
])
def test_a_benchmark_preprocessor_given_another_benchmarks_processed_file_says_so(script, name, line, shared_benchmarks,
                                                                                  tmp_path):
    path = shared_benchmarks / name
    result = run_script(script, "--processed", str(path), "--output", str(tmp_path / "bench.parquet"))
    assert (result.returncode, result.stderr) == (2, f"{script}: error: {path} {line.format(path=path)}\n")
    assert not (tmp_path / "bench.parquet").exists()


def test_reader_errors_name_the_file(tmp_path):
    not_parquet = tmp_path / "notes.parquet"
    not_parquet.write_text("not parquet")
    with pytest.raises(ValueError, match=f"{re.escape(str(not_parquet))}: cannot be read as parquet"):
        read_local(not_parquet)
    scalars = tmp_path / "scalars.jsonl"
    scalars.write_text('{"problem": "p"}\n[1, 2]\n')
    with pytest.raises(ValueError, match=f"{re.escape(str(scalars))}:2: a JSON list, expected an object"):
        read_local(scalars)
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ValueError, match=f"{re.escape(str(binary))}: not UTF-8 text"):
        read_local(binary)

"""The synthetic task: correct answers, disjoint splits, stable ids, verl's row layout."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from exgrpo.embedded import task as synthetic

QUESTION = re.compile(r"^Q:(\d+)([+-])(\d+)=$")


@pytest.fixture(scope="module")
def splits() -> tuple[pd.DataFrame, pd.DataFrame]:
    return synthetic.build_splits(n_train_per_level=300, n_test_per_level=50, seed=3)


def test_answers_are_the_arithmetic_of_the_question(splits):
    for frame in splits:
        for row in frame.itertuples():
            a, op, b = QUESTION.match(row.prompt[0]["content"]).groups()
            expected = int(a) + int(b) if op == "+" else int(a) - int(b)
            assert row.reward_model["ground_truth"] == str(expected)
            assert expected >= 0  # subtraction is ordered a >= b
            digits = sorted((len(a), len(b)))
            assert digits == {1: [1, 1], 2: [1, 2], 3: [2, 2]}[row.extra_info["level"]]


def test_splits_are_disjoint_and_ids_unique_and_stable(splits):
    train, test = splits
    train_q = {p[0]["content"] for p in train.prompt}
    test_q = {p[0]["content"] for p in test.prompt}
    assert not train_q & test_q
    qids = [e["qid"] for e in pd.concat([train, test]).extra_info]
    assert len(set(qids)) == len(qids) == len(train_q) + len(test_q)
    row = train.iloc[0]
    assert row.extra_info["qid"] == synthetic.question_id(row.prompt[0]["content"])
    assert list(train.extra_info.map(lambda e: e["index"])) == list(range(len(train)))


def test_level_sizes_and_level1_mostly_in_train(splits):
    train, test = splits
    levels_train = train.extra_info.map(lambda e: e["level"]).value_counts().to_dict()
    levels_test = test.extra_info.map(lambda e: e["level"]).value_counts().to_dict()
    assert levels_train[2] == levels_train[3] == 300 and levels_test[2] == levels_test[3] == 50
    n_level1 = len(synthetic.all_level1_pairs())
    assert n_level1 == 100 + 55  # every a+b, and a-b with a >= b, over 0..9
    assert levels_train[1] + levels_test[1] == n_level1
    assert levels_test[1] == round(synthetic.LEVEL1_TEST_SHARE * n_level1)


def test_same_seed_same_rows_and_other_seed_differs():
    a = synthetic.build_splits(20, 5, seed=1)[0]
    b = synthetic.build_splits(20, 5, seed=1)[0]
    c = synthetic.build_splits(20, 5, seed=2)[0]
    assert a.to_json() == b.to_json()
    assert a.to_json() != c.to_json()


def test_parquet_round_trip_keeps_verl_layout(tmp_path):
    train_path, test_path = synthetic.write_splits(tmp_path, n_train_per_level=10, n_test_per_level=4, seed=0)
    frame = pd.read_parquet(train_path)
    assert {"data_source", "prompt", "ability", "reward_model", "extra_info"} <= set(frame.columns)
    row = frame.iloc[0]
    assert row.data_source == synthetic.DATA_SOURCE
    assert row.prompt[0]["role"] == "user"
    assert isinstance(row.extra_info["qid"], str) and row.extra_info["qid"].startswith("synthetic-")
    assert len(pd.read_parquet(test_path)) == 4 * 2 + round(synthetic.LEVEL1_TEST_SHARE * 155)


def test_bad_sizes_are_rejected():
    with pytest.raises(ValueError, match="n_test_per_level"):
        synthetic.build_splits(10, 0, seed=0)
    with pytest.raises(ValueError, match="level 2 has 2700"):
        synthetic.build_splits(2000, 300, seed=0)


def test_level2_and_level3_cover_both_operand_orders_of_a_sum():
    train, _ = synthetic.build_splits(300, 50, seed=0)
    sums = [QUESTION.match(p[0]["content"]).groups() for p, e in zip(train.prompt, train.extra_info, strict=True)
            if e["level"] == 2 and "+" in p[0]["content"]]
    assert any(len(a) == 1 for a, _, _ in sums) and any(len(a) == 2 for a, _, _ in sums)


def test_a_subset_of_levels_in_words_is_the_same_draw_written_otherwise():
    from exgrpo.embedded.task import build_splits

    full_train, full_test = build_splits(20, 5, seed=3)
    words_train, words_test = build_splits(20, 5, seed=3, form="natural", levels=(1,))
    for full, words in ((full_train, words_train), (full_test, words_test)):
        level1 = [row for row in full.to_dict("records") if row["extra_info"]["level"] == 1]
        assert len(words) == len(level1) > 0
        for compact, natural in zip(level1, words.to_dict("records"), strict=True):
            a, op, b = compact["extra_info"]["question"][2:-1].partition("+" if "+" in compact["extra_info"][
                "question"] else "-")
            assert natural["prompt"][0]["content"] == f"What is {a} {op} {b}? Answer with the number only."
            assert natural["reward_model"]["ground_truth"] == compact["reward_model"]["ground_truth"]
    with pytest.raises(ValueError, match="question form 'verbose' is unknown"):
        build_splits(20, 5, seed=3, form="verbose")
    with pytest.raises(ValueError, match="levels must be a non-empty subset"):
        build_splits(20, 5, seed=3, levels=(4,))

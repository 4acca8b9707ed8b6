import pytest

from exgrpo.algorithm.config import ExGRPOConfig


@pytest.mark.parametrize(
    "field, value",
    [
        ("rho", -0.1), ("rho", 1.5), ("beta", 0.0), ("beta", -1.0), ("n_rollouts", 1), ("n_rollouts", 2.5),
        ("sigma", 0.0), ("start_acc", 1.01), ("max_per_question", 0), ("max_stored_tokens", 0),
        ("select", "greedy"), ("reward_type", "dense"), ("enable", "yes"), ("rho", float("nan")),
        ("beta", "0.1"), ("clip_fresh_after_start", 0), ("retire_before_start", "true"),
        ("skip_step_grad_norm", 0.0), ("skip_step_grad_norm", -5.0), ("skip_step_grad_norm", float("inf")),
        ("entropy_agg", "token-mean"), ("retire_after", 0), ("retire_after", 1.5), ("retire_after", True),
    ],
)
def test_invalid_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=rf"ExGRPOConfig\.{field}="):
        ExGRPOConfig(**{field: value})


def test_reward_range_must_be_ordered():
    with pytest.raises(ValueError, match="reward_max"):
        ExGRPOConfig(reward_min=1.0, reward_max=1.0)


def test_from_dict_rejects_unknown_keys_by_name_and_honours_ignore():
    with pytest.raises(ValueError, match="rhoo"):
        ExGRPOConfig.from_dict({"rho": 0.5, "rhoo": 0.3})
    cfg = ExGRPOConfig.from_dict({"rho": 0.25, "resume_empty": True}, ignore=["resume_empty"])
    assert cfg.rho == 0.25


def test_round_trip_and_help_on_every_field():
    cfg = ExGRPOConfig(rho=0.75, max_per_question=3)
    assert ExGRPOConfig.from_dict(cfg.to_dict()) == cfg
    assert all(text for text in ExGRPOConfig.help().values())


@pytest.mark.parametrize(
    "rho, batch, pool, expected",
    [(0.5, 128, 1000, 64), (0.5, 5, 100, 3), (0.25, 6, 100, 2), (0.5, 128, 10, 10), (0.0, 128, 50, 0),
     (1.0, 7, 100, 7)],
)
def test_n_replay_rounds_half_up_and_is_capped_by_pool(rho, batch, pool, expected):
    assert ExGRPOConfig(rho=rho).n_replay(batch, pool) == expected


def test_per_question_cap_defaults_to_k():
    assert ExGRPOConfig(n_rollouts=4).per_question_cap == 4
    assert ExGRPOConfig(n_rollouts=4, max_per_question=2).per_question_cap == 2
    assert ExGRPOConfig(n_rollouts=4, max_per_question="all").per_question_cap is None  # every distinct success


@pytest.mark.parametrize("value", ["All", "every", 1.5, True, -1])
def test_max_per_question_names_its_three_forms(value):
    with pytest.raises(ValueError, match=r"ExGRPOConfig\.max_per_question=.*None \(K\) or 'all'"):
        ExGRPOConfig(max_per_question=value)

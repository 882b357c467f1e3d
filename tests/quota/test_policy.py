"""QuotaPolicy: validation, the User: mapping and precedence user → default → unlimited."""

from __future__ import annotations

from typing import Any

import pytest

from pidgate.quota.policy import QuotaPolicy, user_name


def test_defaults_follow_kip_936() -> None:
    policy = QuotaPolicy()
    assert policy.window_ms == 3_600_000
    assert policy.window_num == 11
    assert policy.false_positive_rate == 0.001
    assert policy.rate_for("User:anyone") is None


def test_precedence_user_then_default_then_unlimited() -> None:
    users = {"alice": 5, "ANONYMOUS": 0}
    policy = QuotaPolicy(default_producer_ids_rate=100, user_producer_ids_rates=users)
    assert policy.rate_for("User:alice") == 5
    assert policy.rate_for("alice") == 5
    assert policy.rate_for("User:ANONYMOUS") == 0  # 0 is a rate, not "unset"
    assert policy.rate_for("User:bob") == 100
    assert QuotaPolicy(user_producer_ids_rates=users).rate_for("User:bob") is None


def test_user_name_mapping() -> None:
    assert user_name("User:alice") == "alice"
    assert user_name("User:") == ""
    assert user_name("alice") == "alice"
    assert user_name("Group:x") == "Group:x"


def test_rates_are_copied_and_read_only() -> None:
    users = {"alice": 5}
    policy = QuotaPolicy(user_producer_ids_rates=users)
    users["alice"] = 50
    assert policy.rate_for("User:alice") == 5
    with pytest.raises(TypeError):
        policy.user_producer_ids_rates["bob"] = 1  # type: ignore[index]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"window_num": 0}, "window_num"),
        ({"window_ms": 5, "window_num": 10}, "window_ms"),
        ({"false_positive_rate": 0.0}, "false_positive_rate"),
        ({"false_positive_rate": 1.0}, "false_positive_rate"),
        ({"false_positive_rate": float("nan")}, "false_positive_rate"),
        ({"default_producer_ids_rate": -1}, "default_producer_ids_rate"),
        ({"user_producer_ids_rates": {"alice": -3}}, "alice"),
        ({"user_producer_ids_rates": {"alice": 1.5}}, "alice"),
        ({"user_producer_ids_rates": {"": 1}}, "user names"),
        ({"max_principals": 0}, "max_principals"),
        ({"max_total_bits": 0}, "max_total_bits"),
        ({"min_layer_items": 0}, "min_layer_items"),
        ({"min_layer_items": 10, "max_layer_items": 5}, "max_layer_items"),
    ],
)
def test_validation(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        QuotaPolicy(**kwargs)


def test_max_layer_items_must_fit_the_state_format() -> None:
    with pytest.raises(ValueError, match="2\\*\\*32 bits"):
        QuotaPolicy(max_layer_items=400_000_000)  # 14.4 bits each at p = 0.001: > 2**32 bits
    QuotaPolicy(max_layer_items=100_000_000)


def test_observe_mode_precedence_is_user_then_default_then_enforce() -> None:
    from pidgate.quota.policy import ENFORCE, OBSERVE

    enforced = QuotaPolicy()
    assert not enforced.observes("User:alice") and enforced.mode_for("User:alice") == ENFORCE
    policy = QuotaPolicy(default_observe=True, user_observe={"alice": False})
    assert policy.mode_for("User:bob") == OBSERVE
    assert policy.mode_for("User:alice") == ENFORCE
    assert QuotaPolicy(user_observe={"carol": True}).mode_for("User:carol") == OBSERVE
    with pytest.raises(ValueError):
        QuotaPolicy(user_observe={"alice": 1})  # type: ignore[dict-item]

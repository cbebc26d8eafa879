"""jaxfl.validation: what each check accepts and the one line it refuses with."""

import math

import numpy as np
import pytest

from jaxfl.validation import check_choice, check_fraction, check_int, check_keywords, check_number, range_text


@pytest.mark.parametrize(
    "value, kwargs, expected",
    [
        (3, {}, 3),
        (np.int64(3), {}, 3),
        (0, {"minimum": 0}, 0),
        (5, {"minimum": 2, "maximum": 5}, 5),
        (None, {"optional": True}, None),
    ],
)
def test_check_int_accepts(value, kwargs, expected):
    got = check_int("n", value, **kwargs)
    assert got == expected and (got is None or type(got) is int)


@pytest.mark.parametrize(
    "value, kwargs, message",
    [
        (0, {}, "n must be an integer >= 1, got 0"),
        (True, {"minimum": 0}, "n must be an integer >= 0, got True"),
        (np.bool_(True), {"minimum": 0}, "n must be an integer >= 0, got "),
        (2.0, {}, "n must be an integer >= 1, got 2.0"),
        (6, {"minimum": 2, "maximum": 5, "note": " (of 5)"}, r"n must be an integer in \[2, 5\] \(of 5\)"),
        (None, {}, "n must be an integer >= 1, got None"),
        ("3", {"optional": True}, "n must be an integer >= 1 or null, got '3'"),
    ],
)
def test_check_int_refuses_in_one_line(value, kwargs, message):
    with pytest.raises(ValueError, match=message):
        check_int("n", value, **kwargs)


@pytest.mark.parametrize(
    "value, bounds, inside",
    [
        (0.0, {"low": 0.0}, True),
        (0.0, {"low": 0.0, "low_open": True}, False),
        (0.5, {"low": 0.0, "high": 0.5}, True),
        (0.5, {"low": 0.0, "high": 0.5, "high_open": True}, False),
        (-1e300, {}, True),
        (math.inf, {"low": 0.0}, False),
        (math.nan, {}, False),
        (np.float32(0.25), {"low": 0.0, "high": 1.0}, True),
        (True, {}, False),
        ("1", {}, False),
    ],
)
def test_check_number_against_the_interval(value, bounds, inside):
    # The reference: a finite real, not a bool, within the bounds as written.
    low, high = bounds.get("low", -math.inf), bounds.get("high", math.inf)
    above = (lambda x: x > low) if bounds.get("low_open") else (lambda x: x >= low)
    below = (lambda x: x < high) if bounds.get("high_open") else (lambda x: x <= high)
    is_real = isinstance(value, (int, float, np.floating)) and not isinstance(value, bool)
    assert inside == (is_real and math.isfinite(value) and above(value) and below(value))
    if inside:
        assert check_number("x", value, **bounds) == float(value)
    else:
        with pytest.raises(ValueError, match=r"^x must be a finite number.*, got "):
            check_number("x", value, **bounds)


def test_range_texts_and_the_other_checks():
    assert range_text(0, None) == ">= 0" and range_text(0.0, None, low_open=True) == "> 0"
    assert range_text(0, 0.5, high_open=True) == "in [0, 0.5)" and range_text() == ""
    assert range_text(1, 2**31 - 1) == "in [1, 2147483647]"
    assert check_fraction("f", 0.2) == 0.2
    for bad in (0.0, 1.0, math.nan):
        with pytest.raises(ValueError, match=r"f must be a finite number in \(0, 1\)"):
            check_fraction("f", bad)
    assert check_choice("mode", "a", ("a", "b")) == "a"
    with pytest.raises(ValueError, match="mode must be one of a, b, got 'c'"):
        check_choice("mode", "c", ("a", "b"))


def test_keywords_of_a_typed_dict_are_checked_where_it_is_unpacked():
    check_keywords("f", {"a": 1}, ("a", "b"))
    check_keywords("f", {}, ("a", "b"))
    message = r"^f\(\) got unexpected keyword arguments \['c', 'd'\]; valid: a, b$"
    with pytest.raises(TypeError, match=message):
        check_keywords("f", {"d": 1, "a": 2, "c": 3}, ("a", "b"))
    # The round's own options (`RoundOptions`), refused by `compose_round` before anything is built.
    from jaxfl.algorithms import stages

    unexpected = r"compose_round\(\) got unexpected keyword arguments \['strategyy'\]"
    with pytest.raises(TypeError, match=unexpected):
        stages.compose_round("x", None, 1, client_update=None, strategyy=None)

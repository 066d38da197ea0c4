"""Admission permits and input parsing."""

from __future__ import annotations

import pytest

from tei_serve.admission import Permits
from tei_serve.errors import BodyError, EmptyError, OverloadedError
from tei_serve.http.protocol import parse_ids, parse_inputs, parse_predict_inputs


def test_permits_all_or_nothing_and_released() -> None:
    p = Permits(4)
    with p.take(3):
        assert p.available == 1
        with pytest.raises(OverloadedError), p.take(2):
            pass
        assert p.available == 1
        with p.take(1):
            assert p.available == 0
    assert p.available == 4


def test_permits_released_on_error() -> None:
    p = Permits(2)
    with pytest.raises(RuntimeError), p.take(2):
        raise RuntimeError
    assert p.available == 2


def test_inputs_union() -> None:
    assert parse_inputs("a") == (["a"], False)
    assert parse_inputs(["a", "b"]) == (["a", "b"], True)
    assert parse_inputs([101, 2023, 102]) == ([[101, 2023, 102]], False)
    assert parse_inputs([[1, 2], "x"]) == ([[1, 2], "x"], True)
    with pytest.raises(EmptyError):
        parse_inputs([])
    with pytest.raises(BodyError):
        parse_inputs({"a": 1})
    with pytest.raises(BodyError):
        parse_inputs([1.5])


def test_predict_pair_is_one_input() -> None:
    assert parse_predict_inputs("s") == (["s"], False)
    assert parse_predict_inputs(["a", "b"]) == ([("a", "b")], False)
    assert parse_predict_inputs([["a"], ["q", "d"]]) == (["a", ("q", "d")], True)
    with pytest.raises(BodyError):
        parse_predict_inputs(["a", "b", "c"])
    with pytest.raises(BodyError):
        parse_predict_inputs([["a", "b", "c"]])


def test_decode_ids() -> None:
    assert parse_ids([1, 2]) == [[1, 2]]
    assert parse_ids([[1], [2, 3]]) == [[1], [2, 3]]
    with pytest.raises(EmptyError):
        parse_ids([])

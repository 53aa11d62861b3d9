"""read_head: the top-level id and method of a frame known only by its first bytes."""

from __future__ import annotations

import pytest

from conductor.jsonrpc.head import read_head


def test_an_id_nested_in_the_result_is_not_the_frames_id() -> None:
    head = read_head(b'{"jsonrpc":"2.0","result":{"id":2,"pad":"xxx"},"id":3}')
    assert head.id is not None
    assert bytes(head.id) == b"3"
    assert not head.has_method


def test_an_id_beyond_the_bytes_seen_is_unknown_not_guessed() -> None:
    head = read_head(b'{"jsonrpc":"2.0","result":{"id":2,"pad":"xxxx')
    assert head.id is None
    assert not head.id_known


def test_a_number_cut_off_at_the_end_is_not_taken_as_the_id() -> None:
    assert read_head(b'{"id":123').id is None
    head = read_head(b'{"id":123,')
    assert head.id is not None
    assert bytes(head.id) == b"123"


@pytest.mark.parametrize("ident", [b'"a\\"b}"', b"-7e3", b"null", b'"\\u0061"'])
def test_string_number_and_null_ids_come_back_as_written(ident: bytes) -> None:
    head = read_head(b'{"id": ' + ident + b', "method":"m","params":{"x":"')
    assert head.id is not None
    assert bytes(head.id) == ident
    assert head.has_method


def test_params_before_any_id_marks_a_likely_notification() -> None:
    assert read_head(b'{"jsonrpc":"2.0","method":"n","params":{"id":5,"big":"zz').is_notification
    assert not read_head(b'{"jsonrpc":"2.0","id":1,"method":"r","params":{"big":"zz'
                         ).is_notification


def test_a_closed_object_without_an_id_is_surely_a_notification() -> None:
    head = read_head(b'{"method":"n","params":[1]}')
    assert head.id_known
    assert head.is_notification


def test_a_batch_is_recognised_as_a_batch() -> None:
    assert read_head(b' [{"jsonrpc":"2.0","id":1,"method":"m","params":{"x":"').is_batch

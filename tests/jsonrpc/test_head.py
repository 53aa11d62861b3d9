"""read_head and HeadScanner: the top-level id and method of a frame known only by its first
bytes, or scanned in pieces as it is skipped."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conductor.jsonrpc.framing import FrameDecoder, OversizedFrame
from conductor.jsonrpc.head import Head, HeadScanner, read_head


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


# -- scanning a frame in pieces (an oversized frame, as it is skipped) -------------------------

def scan(pieces: list[bytes]) -> Head:
    scanner = HeadScanner()
    for piece in pieces:
        scanner.feed(piece)
    return scanner.head()


def test_an_id_after_a_huge_params_is_found_in_bounded_pieces() -> None:
    chunk = b"x" * (1 << 20)
    pieces = [b'{"jsonrpc":"2.0","method":"session/prompt","params":{"text":"',
              *[chunk] * 100, b'"},"id":42}']  # 100 MiB of params, then the id
    head = scan(pieces)
    assert head.id is not None
    assert bytes(head.id) == b"42"
    assert head.has_method
    assert not head.is_notification


def test_a_frame_that_closes_without_an_id_is_a_notification_even_with_params_first() -> None:
    head = scan([b'{"jsonrpc":"2.0","method":"n","params":{"id":5,"t":"', b"z" * 1000,
                 b'"}}'])
    assert head.id is None
    assert head.id_known
    assert head.is_notification


@pytest.mark.parametrize(("frame", "ident"), [
    (b'{"\\u0069d":4,"method":"m"}', b"4"),       # an escaped key names the same member
    (b'{"method":"m","params":{"s":"\\"}\\\\"},"id":"a\\\\"}', b'"a\\\\"'),
    (b'{"method":"m","params":[{"id":1},["id",2]],"id":null}', b"null"),
    (b'{ "method" : "m" , "params" : [ ] , "id" : -1.5e3 }', b"-1.5e3"),
])
def test_the_top_level_id_is_read_whatever_comes_before_it(frame: bytes, ident: bytes) -> None:
    head = read_head(frame)
    assert head.id is not None
    assert bytes(head.id) == ident


@pytest.mark.parametrize("frame", [
    b'{"id":true,"method":"m"}', b'{"id":{"a":1},"method":"m"}', b'{"id":1x,"method":"m"}',
    b'{"id":"\xff","method":"m"}',
])
def test_an_id_that_cannot_be_echoed_is_bad_and_answered_as_null(frame: bytes) -> None:
    head = read_head(frame)
    assert head.id is None
    assert head.bad_id
    assert not head.is_notification  # a request with a bad id still gets its -32600


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='ab"\\{}[]:, é'),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.text(alphabet='ab"\\{}id', max_size=4), inner, max_size=3),
    max_leaves=12)
ids = st.one_of(st.integers(), st.text(alphabet='ab"\\{}1 é', max_size=6), st.none())


@settings(max_examples=300)
@given(params=json_values, result=json_values, ident=ids,
       order=st.permutations(["jsonrpc", "id", "method", "params", "extra"]),
       cuts=st.lists(st.integers(0, 400), max_size=6))
def test_any_chunking_and_key_order_reads_the_same_top_level_id(
        params: object, result: object, ident: object, order: list[str],
        cuts: list[int]) -> None:
    message = {"jsonrpc": "2.0", "id": ident, "method": "m", "params": params,
               "extra": {"id": result}}
    frame = ("{" + ",".join(f"{json.dumps(k)}:{json.dumps(message[k])}" for k in order)
             + "}").encode()
    points = sorted({c % (len(frame) + 1) for c in cuts})
    edges = [0, *points, len(frame)]
    head = scan([frame[a:b] for a, b in itertools.pairwise(edges)])
    assert head.id is not None
    assert json.loads(bytes(head.id)) == ident
    assert head.has_method
    assert head.id_known


def test_the_scan_gives_up_after_its_budget_with_what_it_knows() -> None:
    frame = b'{"method":"m","params":[' + b"[]," * 10_000 + b'[]],"id":1}'
    scanner = HeadScanner(budget=1_000)
    scanner.feed(frame)
    assert scanner.done
    head = scanner.head()
    assert head.has_method
    assert head.params_first
    assert head.id is None  # beyond the budget: unknown, not guessed
    assert not head.id_known


def test_an_oversized_frame_after_a_utf8_bom_is_refused_under_its_own_id() -> None:
    # decode() skips a leading BOM; the scan of a frame it will not decode did not, and the
    # refusal of an oversized request went out with id null: its sender waited for ever.
    decoder = FrameDecoder(max_frame_bytes=32)
    [skipped] = decoder.feed(b'\xef\xbb\xbf{"jsonrpc":"2.0","id":5,"method":"x","params":{"p":"'
                             + b"x" * 100 + b'"}}\n')
    assert isinstance(skipped, OversizedFrame)
    assert skipped.top.id is not None and bytes(skipped.top.id) == b"5"
    assert skipped.top.has_method

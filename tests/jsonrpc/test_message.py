"""Messages: only the envelope is decoded; every payload is re-emitted byte for byte."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conductor.jsonrpc.message import (
    UNSET,
    Batch,
    InvalidMessage,
    Message,
    Notification,
    ParseError,
    Raw,
    Request,
    Response,
    UnreadableFrame,
    decode,
    encode,
    encode_batch,
    error_response,
    id_key,
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20)
# How other encoders spell the same value: spacing, escaping, indentation.
spellings = st.sampled_from([
    {}, {"separators": (", ", ": ")}, {"ensure_ascii": False}, {"indent": 1},
    {"separators": (" ,", " : "), "ensure_ascii": True}])


def spell(value: object, style: dict) -> str:  # type: ignore[type-arg]
    return json.dumps(value, **style).replace("\n", "\r\t ")  # no newline inside a frame


# Request params are structured (JSON-RPC 2.0 §4.2): an array or an object of any values.
structured = st.lists(json_values, max_size=4) | st.dictionaries(st.text(), json_values,
                                                                 max_size=4)


@given(value=structured, style=spellings, ident=st.sampled_from(
    ['1', '"a"', '-5', '123456789012345678901234567890', '1.5', 'null', '"\\u00e9"']))
def test_a_request_round_trips_byte_for_byte(value: object, style: dict, ident: str) -> None:  # type: ignore[type-arg]
    payload = spell(value, style)
    frame = f'{{"jsonrpc":"2.0","id":{ident},"method":"x/y","params":{payload}}}'.encode()
    msg = decode(frame)
    assert isinstance(msg, Request)
    assert bytes(msg.params) == payload.encode()  # type: ignore[arg-type]
    assert encode(msg) == frame + b"\n"


@given(value=json_values, style=spellings)
def test_results_and_errors_round_trip_byte_for_byte(value: object, style: dict) -> None:  # type: ignore[type-arg]
    payload = spell(value, style)
    for key in ("result", "error"):
        frame = f'{{"jsonrpc":"2.0","id":7,"{key}":{payload}}}'.encode()
        msg = decode(frame)
        assert isinstance(msg, Response)
        assert encode(msg) == frame + b"\n"


def test_envelope_key_order_and_spacing_do_not_touch_the_payload() -> None:
    frame = b'{ "params" : {"b":1, "a":1e2} , "method":"m", "id" : "x", "jsonrpc":"2.0"}'
    msg = decode(frame)
    assert isinstance(msg, Message)
    assert encode(msg) == b'{"jsonrpc":"2.0","id":"x","method":"m","params":{"b":1, "a":1e2}}\n'


def test_unknown_envelope_members_are_dropped_but_params_are_kept() -> None:
    msg = decode(b'{"jsonrpc":"2.0","method":"n","params":[1 ,2],"extra":true}')
    assert isinstance(msg, Notification)
    assert encode(msg) == b'{"jsonrpc":"2.0","method":"n","params":[1 ,2]}\n'


@pytest.mark.parametrize(("frame", "call_shaped", "ident"), [
    (b'{"jsonrpc":"2.0","id":{"x":1},"method":"m"}', True, None),
    (b'{"jsonrpc":"2.0","id":true,"method":"m"}', True, None),
    (b'{"jsonrpc":"2.0","id":3,"method":5}', True, b"3"),
    (b'{"jsonrpc":"2.0","id":3}', False, b"3"),
    (b'{"jsonrpc":"2.0","id":3,"result":1,"error":{}}', False, b"3"),
    (b'{"jsonrpc":"2.0","id":3,"method":"m","result":1}', True, b"3"),
    (b'{"jsonrpc":"2.0"}', True, None),
    (b'7', True, None),
])
def test_json_that_is_not_json_rpc_is_an_invalid_message(
        frame: bytes, call_shaped: bool, ident: bytes | None) -> None:
    item = decode(frame)
    assert isinstance(item, InvalidMessage)
    assert item.call_shaped is call_shaped
    assert (None if item.id is None else bytes(item.id)) == ident


@pytest.mark.parametrize("frame", [b"nope", b'{"id":1,', b"[1,", b"\x1b[31mred\x1b[0m"])
def test_a_frame_that_is_not_json_is_a_parse_error(frame: bytes) -> None:
    with pytest.raises(ParseError):
        decode(frame)


def test_a_batch_decodes_each_item_on_its_own() -> None:
    batch = decode(b' [{"jsonrpc":"2.0","method":"a"}, 1, {"jsonrpc":"2.0","id":2,"result":{}}]')
    assert isinstance(batch, Batch)
    kinds = [type(i).__name__ for i in batch.items]
    assert kinds == ["Notification", "InvalidMessage", "Response"]
    assert decode(b"[]") == Batch([])


def test_a_batch_encodes_as_one_array_line() -> None:
    msgs: list[Message] = [Response(id=Raw(b"1"), result=Raw(b'{"a" : 1}')),
                           Response(id=Raw(b'"x"'), result=Raw(b"null"))]
    assert encode_batch(msgs) == (b'[{"jsonrpc":"2.0","id":1,"result":{"a" : 1}},'
                                  b'{"jsonrpc":"2.0","id":"x","result":null}]\n')


def test_error_response_without_an_id_says_null() -> None:
    msg = error_response(None, -32700, "Parse error", "details")
    assert encode(msg) == (b'{"jsonrpc":"2.0","id":null,"error":{"code":-32700,'
                           b'"message":"Parse error","data":"details"}}\n')
    assert msg.result is UNSET


@pytest.mark.parametrize(("ident", "key"), [(b"1", 1), (b'"1"', "1"), (b"null", None),
                                            (b"123456789012345678901234567890",
                                             123456789012345678901234567890)])
def test_id_keys_keep_types_apart(ident: bytes, key: object) -> None:
    assert id_key(Raw(ident)) == key
    assert type(id_key(Raw(ident))) is type(key)


@pytest.mark.parametrize("ident", [b"1.5", b"true", b"[1]"])
def test_ids_that_cannot_be_keys_are_refused(ident: bytes) -> None:
    with pytest.raises(ValueError):
        id_key(Raw(ident))


def test_params_value_decodes_a_copy() -> None:
    msg = decode(b'{"jsonrpc":"2.0","id":1,"method":"m","params":{"a":[1,2]}}')
    assert isinstance(msg, Message)
    assert msg.params_value() == {"a": [1, 2]}
    assert msgspec.json.decode(msg.params) == {"a": [1, 2]}  # type: ignore[arg-type]


# -- frames the conductor will not decode -------------------------------------------------------

def nested(depth: int, open_: str = "[", close: str = "]") -> bytes:
    return (open_ * depth + close * depth).encode()


DEEP = 5_000  # past msgspec's limit (Python's recursion limit) from any stack depth


@pytest.mark.parametrize(("frame", "ident", "has_method"), [
    (b'{"jsonrpc":"2.0","id":1,"method":"m","params":' + nested(DEEP) + b"}", b"1", True),
    (b'{"jsonrpc":"2.0","method":"m","params":[' + nested(DEEP) + b'],"id":"late"}',
     b'"late"', True),
    (b'{"jsonrpc":"2.0","id":9,"result":' + b'{"a":' * DEEP + b"1" + b"}" * DEEP + b"}",
     b"9", False),
    (b'{"jsonrpc":"2.0","method":"n","params":' + nested(DEEP) + b"}", None, True),
])
def test_a_frame_nested_too_deeply_is_unreadable_with_its_top_level_id(
        frame: bytes, ident: bytes | None, has_method: bool) -> None:
    with pytest.raises(UnreadableFrame) as caught:
        decode(frame)
    assert caught.value.code == -32600
    assert "nested too deeply" in caught.value.reason
    head = caught.value.head
    assert (None if head.id is None else bytes(head.id)) == ident
    assert head.has_method is has_method
    assert head.id_known


def test_a_deeply_nested_batch_is_unreadable_as_a_whole() -> None:
    with pytest.raises(UnreadableFrame) as caught:
        decode(b'[{"jsonrpc":"2.0","id":1,"method":"m","params":' + nested(DEEP) + b"}]")
    assert caught.value.head.is_batch
    with pytest.raises(UnreadableFrame):
        decode(nested(DEEP))


@settings(max_examples=50, deadline=None)
@given(depth=st.integers(0, 3_000), where=st.sampled_from(["params", "batch", "top"]))
def test_any_nesting_depth_decodes_or_is_unreadable_never_crashes(depth: int,
                                                                  where: str) -> None:
    inner = nested(depth).decode()
    frame = {"params": f'{{"jsonrpc":"2.0","id":1,"method":"m","params":[{inner}]}}',
             "batch": f'[{{"jsonrpc":"2.0","id":1,"method":"m","params":[{inner}]}}]',
             "top": f"[{inner}]"}[where].encode()
    try:
        decode(frame)
    except UnreadableFrame as e:
        assert e.code == -32600


@pytest.mark.parametrize(("frame", "ident"), [
    (b'{"jsonrpc":"2.0","id":8,"method":"m","params":{"t":"\xff"}}', b"8"),
    (b'{"jsonrpc":"2.0","method":"m","params":{"t":"\xc3("},"id":"x"}', b'"x"'),
    (b'{"jsonrpc":"2.0","id":"\xff","method":"m","params":{}}', None),  # never echoed
    (b'{"jsonrpc":"2.0","id":3,"result":"\xed\xa0\x80"}', b"3"),  # an encoded surrogate
])
def test_a_frame_that_is_not_utf8_is_unreadable_with_its_id_when_that_is_clean(
        frame: bytes, ident: bytes | None) -> None:
    with pytest.raises(UnreadableFrame) as caught:
        decode(frame)
    assert caught.value.code == -32700
    assert "UTF-8" in caught.value.reason
    head = caught.value.head
    assert (None if head.id is None else bytes(head.id)) == ident


def test_non_ascii_utf8_frames_decode_as_before() -> None:
    frame = '{"jsonrpc":"2.0","id":"é","method":"m","params":{"t":"日本 🎉"}}'.encode()
    msg = decode(frame)
    assert isinstance(msg, Message)
    assert encode(msg) == frame + b"\n"


@pytest.mark.parametrize(("frame", "reason"), [
    (b'{"jsonrpc":"1.0","id":1,"method":"m","params":{}}', '"jsonrpc" must be "2.0"'),
    (b'{"id":1,"method":"m","params":{}}', '"jsonrpc" member is missing'),
    (b'{"jsonrpc":"2.0","id":1,"method":"m","params":5}', "an object or an array"),
    (b'{"jsonrpc":"2.0","id":1,"method":"m","params":true}', "an object or an array"),
    (b'{"jsonrpc":"2.0","id":1,"method":"m","params":"[x]"}', "an object or an array"),
])
def test_a_call_that_breaks_json_rpc_2_is_invalid_and_answered_only_with_an_id(
        frame: bytes, reason: str) -> None:
    request = decode(frame)
    assert isinstance(request, InvalidMessage)
    assert reason in request.reason
    assert request.call_shaped
    assert request.id is not None
    assert bytes(request.id) == b"1"
    notification = decode(frame.replace(b'"id":1,', b""))
    assert isinstance(notification, InvalidMessage)
    assert not notification.call_shaped  # a notification is never answered


def test_a_message_the_conductor_makes_carries_jsonrpc_2() -> None:
    assert encode(Notification(method="m")) == b'{"jsonrpc":"2.0","method":"m"}\n'
    decoded = decode(b'{"jsonrpc":"2.0","method":"m","params":[]}')
    assert isinstance(decoded, Message)


def test_an_invalid_answer_is_never_answered() -> None:
    item = decode(b'{"jsonrpc":2,"id":4,"result":{}}')  # jsonrpc not even a string
    assert isinstance(item, InvalidMessage)
    assert not item.call_shaped


def test_payload_values_too_deep_to_decode_raise_a_decode_error() -> None:
    msg = Notification(method="m", params=Raw(nested(DEEP)))
    with pytest.raises(msgspec.DecodeError, match="nested too deeply"):
        msg.params_value()


def test_a_message_prints_as_its_kind_id_method_and_the_start_of_its_payload() -> None:
    request = decode(b'{"jsonrpc":"2.0","id":7,"method":"session/prompt",'
                     b'"params":{"sessionId":"s-1"}}')
    assert repr(request) == "Request(id=7, method='session/prompt', params={\"sessionId\":\"s-1\"})"
    note = decode(b'{"jsonrpc":"2.0","method":"session/cancel"}')
    assert repr(note) == "Notification(method='session/cancel', params=-)"
    answer = decode(b'{"jsonrpc":"2.0","id":"a","result":{"stopReason":"end_turn"}}')
    assert repr(answer) == 'Response(id="a", result={"stopReason":"end_turn"})'
    failed = error_response(Raw(b"3"), -32601, "Method not found")
    assert repr(failed) == 'Response(id=3, error={"code":-32601,"message":"Method not found"})'


def test_a_huge_payload_prints_its_start_and_how_much_was_left_out() -> None:
    big = Raw(b'{"text":"' + b"x" * 1_000_000 + b'"}')
    shown = repr(Request(id=Raw(b"1"), method="_ext/big", params=big))
    assert len(shown) < 300
    assert shown.startswith("Request(id=1, method='_ext/big', params={\"text\":\"xxx")
    assert shown.endswith(f"…(+{len(big) - 160} bytes))")


@pytest.mark.parametrize(("text", "seen"), [
    (rb"x\ud83dy", "x\ufffdy"),          # a high half alone (a string cut inside an emoji)
    (rb"\ude00 and more", "\ufffd and more"),  # a low half alone (surrogateescape)
    (rb"\ud83d\ude00 \ud83d", "\U0001f600 \ufffd"),  # a pair is kept, the lone half is not
])
def test_a_lone_surrogate_escape_is_read_as_a_replacement_character_not_a_lost_message(
        text: bytes, seen: str) -> None:
    frame = b'{"jsonrpc":"2.0","method":"session/update","params":{"text":"' + text + b'"}}'
    with pytest.raises(msgspec.DecodeError):
        msgspec.json.decode(frame)  # what made the whole frame "not JSON"
    message = decode(frame)
    assert isinstance(message, Notification)
    assert message.params_value() == {"text": seen}


def test_an_escaped_backslash_before_u_is_no_surrogate_and_stays_as_it_was() -> None:
    frame = rb'{"jsonrpc":"2.0","id":1,"method":"m","params":{"a":"\\ud800","b":"\ud800"}}'
    message = decode(frame)
    assert isinstance(message, Request)
    assert message.params_value() == {"a": "\\ud800", "b": "\ufffd"}


def test_a_frame_that_is_not_json_for_another_reason_is_still_a_parse_error() -> None:
    with pytest.raises(ParseError):
        decode(rb'{"jsonrpc":"2.0","method":"m","params":{"a":"\ud800"')  # cut short


@pytest.mark.parametrize("frame", [
    b'\xef\xbb\xbf{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}',
    b'\xef\xbb\xbf [{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}]',
])
def test_a_frame_that_starts_with_a_utf8_bom_is_read_as_the_json_after_it(frame: bytes) -> None:
    # Windows tools (PowerShell's pipe, Notepad-saved replay files) write a BOM first; RFC 8259
    # lets a reader ignore it. Refused, the editor's initialize got -32700 with id null.
    decoded = decode(frame)
    request = decoded.items[0] if isinstance(decoded, Batch) else decoded
    assert isinstance(request, Request)
    assert request.method == "initialize"
    assert bytes(request.id) == b"1"

"""acp.py: version selection from raw params, envelopes, and edits that keep other bytes."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conductor import acp
from conductor.acp import Dialect
from conductor.errors import ProtocolVersionError
from conductor.jsonrpc.codes import ErrorCode
from conductor.jsonrpc.message import UNSET, Raw


@pytest.mark.parametrize(("params", "version"), [
    (b'{"protocolVersion":1}', 1), (b'{"protocolVersion": 2, "x": 1}', 2),
    (b'{"protocolVersion":3}', 2), (b'{"protocolVersion":65535}', 2)])
def test_protocol_version_selects_v1_or_v2(params: bytes, version: int) -> None:
    assert acp.protocol_version(Raw(params)) == version


@pytest.mark.parametrize("params", [
    b"{}", b'{"protocolVersion":"1"}', b'{"protocolVersion":1.0}', b'{"protocolVersion":-1}',
    b'{"protocolVersion":65536}', b'{"protocolVersion":true}', b'{"protocolVersion":null}',
    b'{"protocolVersion":123456789012345678901234567890}', b"[1]", b'"x"'])
def test_an_invalid_protocol_version_is_invalid_params(params: bytes) -> None:
    with pytest.raises(ProtocolVersionError) as caught:
        acp.protocol_version(Raw(params))
    assert caught.value.code == ErrorCode.INVALID_PARAMS
    assert "protocolVersion" in (caught.value.data or "")


def test_missing_params_are_invalid_params() -> None:
    with pytest.raises(ProtocolVersionError) as caught:
        acp.protocol_version(UNSET)
    assert caught.value.code == ErrorCode.INVALID_PARAMS


def test_protocol_version_zero_is_invalid_request() -> None:
    with pytest.raises(ProtocolVersionError) as caught:
        acp.protocol_version(Raw(b'{"protocolVersion":0}'))
    assert caught.value.code == ErrorCode.INVALID_REQUEST


def test_result_protocol_version_reads_the_raw_result() -> None:
    assert acp.result_protocol_version(Raw(b'{"protocolVersion":2,"x":1}')) == 2
    assert acp.result_protocol_version(Raw(b'{"x":1}')) is None
    assert acp.result_protocol_version(Raw(b"[]")) is None
    assert acp.result_protocol_version(UNSET) is None


ODD = b'{"b" : 1e2, "a":"\\u00e9", "n":null, "big":123456789012345678901234567890}'


def test_set_key_changes_one_key_and_keeps_every_other_value_byte_for_byte() -> None:
    out = acp.set_key(Raw(ODD), "requestId", Raw(b"7"))
    members = msgspec.json.decode(out, type=dict[str, Raw])
    assert [bytes(v) for v in members.values()] == [
        b"1e2", b'"\\u00e9"', b"null", b"123456789012345678901234567890", b"7"]
    again = acp.set_key(out, "b", Raw(b" 3 "))
    assert bytes(msgspec.json.decode(again, type=dict[str, Raw])["b"]) == b"3"


def test_append_to_list_creates_the_list_or_keeps_existing_items() -> None:
    made = acp.append_to_list(Raw(b'{"cwd":"/"}'), "mcpServers", [Raw(b'{"n" : 1}')])
    assert bytes(made) == b'{"cwd":"/","mcpServers":[{"n" : 1}]}'
    grown = acp.append_to_list(made, "mcpServers", [Raw(b"2e0")])
    assert bytes(grown) == b'{"cwd":"/","mcpServers":[{"n" : 1},2e0]}'


def test_legacy_proxy_meta_is_added_next_to_existing_meta() -> None:
    params = Raw(b'{"protocolVersion":1,"_meta":{"k":1e2}}')
    assert not acp.is_legacy_proxy_initialize(params)
    out = acp.with_legacy_proxy_meta(params)
    assert bytes(out) == b'{"protocolVersion":1,"_meta":{"k":1e2,"proxy":true}}'
    assert acp.is_legacy_proxy_initialize(out)
    assert acp.is_legacy_proxy_initialize(acp.with_legacy_proxy_meta(UNSET))
    assert not acp.is_legacy_proxy_initialize(Raw(b'{"_meta":{"proxy":1}}'))
    assert not acp.is_legacy_proxy_initialize(Raw(b"[]"))


def test_get_str_and_get_raw_never_raise() -> None:
    assert acp.get_str(Raw(b'{"sessionId":"s1"}'), "sessionId") == "s1"
    assert acp.get_str(Raw(b'{"sessionId":5}'), "sessionId") is None
    assert acp.get_str(Raw(b"[1]"), "sessionId") is None
    assert acp.get_str(UNSET, "sessionId") is None
    assert bytes(acp.get_raw(Raw(b'{"requestId": 1e2}'), "requestId") or b"") == b"1e2"
    assert acp.get_raw(Raw(b"null"), "requestId") is None


@pytest.mark.parametrize("dialect", list(Dialect))
@given(params=st.sampled_from([UNSET, Raw(b'{"a" : [1e2]}'), Raw(b"null")]),
       meta=st.sampled_from([UNSET, Raw(b'{"trace":"\\u0041"}')]))
def test_an_envelope_round_trips_in_every_dialect(dialect: Dialect, params: object,
                                                  meta: object) -> None:
    wrapped = acp.encode_envelope("session/prompt", params, meta, dialect)  # type: ignore[arg-type]
    env = acp.decode_envelope(wrapped)
    assert env.method == "session/prompt"
    assert (env.params is UNSET) == (params is UNSET)
    if params is not UNSET:
        assert bytes(env.params) == bytes(params)  # type: ignore[arg-type]
    if meta is not UNSET:
        assert bytes(env.any_meta) == bytes(meta)  # type: ignore[arg-type]
        assert dialect.meta_key.encode() in bytes(wrapped)


@pytest.mark.parametrize("params", [UNSET, Raw(b"[]"), Raw(b'{"params":{}}'),
                                    Raw(b'{"method":5}')])
def test_a_malformed_envelope_is_a_value_error(params: object) -> None:
    with pytest.raises(ValueError):
        acp.decode_envelope(params)  # type: ignore[arg-type]


def test_dialects_spell_the_handshake_and_the_envelope() -> None:
    assert [d.initialize_method() for d in Dialect] == [
        "_proxy/initialize", "proxy/initialize", "initialize"]
    assert Dialect.LEGACY.successor_method(is_request=True) == "_proxy/successor/request"
    assert Dialect.LEGACY.successor_method(is_request=False) == "_proxy/successor/notification"
    assert Dialect.SPEC.successor_method(is_request=True) == "proxy/successor"
    assert Dialect.PROXY.successor_method(is_request=False) == "_proxy/successor"
    assert all(acp.SUCCESSOR_METHODS[d.successor_method(is_request=True)] is d for d in Dialect)


DEEP = Raw(b'{"sessionId":"s","protocolVersion":1,"_meta":{"x":' + b"[" * 5000 + b"]" * 5000
           + b"},\"mcpServers\":" + b"[" * 5000 + b"]" * 5000 + b"}")


def test_payload_helpers_answer_for_params_nested_too_deeply_instead_of_crashing() -> None:
    assert acp.get_str(DEEP, "sessionId") is None
    assert acp.get_raw(DEEP, "sessionId") is None
    assert acp.result_protocol_version(DEEP) is None
    assert acp.is_legacy_proxy_initialize(DEEP) is False
    with pytest.raises(ProtocolVersionError):
        acp.protocol_version(DEEP)
    for edit in (lambda: acp.set_key(DEEP, "k", Raw(b"1")),
                 lambda: acp.with_legacy_proxy_meta(DEEP),
                 lambda: acp.append_to_list(Raw(b'{"l":' + b"[" * 5000 + b"]" * 5000 + b"}"),
                                            "l", [Raw(b"1")]),
                 lambda: acp.decode_envelope(Raw(b'{"method":"m","params":' + bytes(DEEP)
                                                 + b"}"))):
        with pytest.raises(ValueError, match="nested too deeply"):
            edit()


@pytest.mark.parametrize(("raw", "idle"), [
    (b'{"sessionId":"s","update":{"sessionUpdate":"state_update","state":"idle"}}', "s"),
    (b'{"sessionId":"s","update":{"sessionUpdate":"state\\u005fupdate","state":"idle"}}', "s"),
    (b'{"sessionId":"s","update":{"sessionUpdate":"state_update","state":"running"}}', None),
    (b'{"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk"}}', None),
    (b'{"sessionId":"s","update":"state_update"}', None)])
def test_a_v2_idle_state_is_found_however_its_name_is_spelt(raw: bytes, idle: str | None
                                                              ) -> None:
    assert acp.idle_session(msgspec.Raw(raw)) == idle

"""FrameDecoder: pure, chunking-independent, bounded for oversized frames."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from conductor.jsonrpc.framing import FrameDecoder, OversizedFrame

frame_bytes = st.binary(max_size=64).map(lambda b: b.replace(b"\n", b" "))


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


def decode_all(decoder: FrameDecoder, chunks: list[bytes]) -> list[bytes | OversizedFrame]:
    out = [f for chunk in chunks for f in decoder.feed(chunk)]
    last = decoder.end()
    return out if last is None else [*out, last]


@given(frames=st.lists(frame_bytes, max_size=20), cuts=st.lists(st.integers(0, 4096)))
def test_any_chunking_yields_the_same_frames(frames: list[bytes], cuts: list[int]) -> None:
    wire = b"".join(f + b"\n" for f in frames)
    expected = [f for f in frames if f.strip()]  # blank lines are not messages
    assert decode_all(FrameDecoder(), split_at(wire, cuts)) == expected


@given(frames=st.lists(frame_bytes.filter(bytes.strip), min_size=1, max_size=10),
       cuts=st.lists(st.integers(0, 4096)))
def test_an_unterminated_last_frame_is_returned_at_end(frames: list[bytes],
                                                        cuts: list[int]) -> None:
    wire = b"\n".join(frames)  # no newline after the last one: the peer died mid-line
    assert decode_all(FrameDecoder(), split_at(wire, cuts)) == frames


@settings(max_examples=200)
@given(frames=st.lists(st.binary(min_size=1, max_size=80).map(
           lambda b: b.replace(b"\n", b" ").replace(b" ", b"x").replace(b"\t", b"x")
           .replace(b"\r", b"x").replace(b"\x0b", b"x").replace(b"\x0c", b"x")),
           max_size=15),
       cuts=st.lists(st.integers(0, 4096)), limit=st.integers(1, 40))
def test_oversized_frames_are_skipped_and_reported_while_later_frames_come_through(
        frames: list[bytes], cuts: list[int], limit: int) -> None:
    wire = b"".join(f + b"\n" for f in frames)
    got = decode_all(FrameDecoder(max_frame_bytes=limit), split_at(wire, cuts))
    assert len(got) == len(frames)
    for frame, item in zip(frames, got, strict=True):
        if len(frame) > limit:
            assert isinstance(item, OversizedFrame)
            assert (item.size, item.limit) == (len(frame), limit)
            assert item.head
            assert frame.startswith(item.head)
        else:
            assert item == frame


def test_a_frame_exactly_at_the_limit_passes() -> None:
    decoder = FrameDecoder(max_frame_bytes=5)
    assert decoder.feed(b"12345\n123456\n1") == [b"12345", OversizedFrame(6, 5, b"123456")]
    assert decoder.end() == b"1"


def test_an_oversized_frame_cut_by_end_of_stream_is_still_reported() -> None:
    decoder = FrameDecoder(max_frame_bytes=4)
    assert decoder.feed(b"ok\n" + b"z" * 10) == [b"ok"]
    assert decoder.end() == OversizedFrame(10, 4, b"z" * 10)


def test_a_huge_oversized_frame_keeps_only_its_head() -> None:
    decoder = FrameDecoder(max_frame_bytes=1024)
    chunk = b"a" * 65536
    out = [f for _ in range(100) for f in decoder.feed(chunk)]  # 6.5 MB, never buffered
    assert out == []
    [skipped, after] = decoder.feed(b"\n{}\n")
    assert isinstance(skipped, OversizedFrame)
    assert skipped.size == 100 * 65536
    assert len(skipped.head) == FrameDecoder.HEAD_BYTES
    assert after == b"{}"


def test_an_oversized_frame_whose_id_follows_100_mib_of_params_still_yields_that_id() -> None:
    decoder = FrameDecoder(max_frame_bytes=1 << 20)
    out = decoder.feed(b'{"jsonrpc":"2.0","method":"session/prompt","params":{"text":"')
    chunk = b"p" * (1 << 20)
    for _ in range(100):  # 100 MiB, never buffered
        out += decoder.feed(chunk)
    out += decoder.feed(b'"},"id":42}\n{"jsonrpc":"2.0","method":"after"}\n')
    [skipped, after] = out
    assert isinstance(skipped, OversizedFrame)
    assert skipped.size > 100 * (1 << 20)
    assert len(skipped.head) == FrameDecoder.HEAD_BYTES
    assert skipped.top.id is not None
    assert bytes(skipped.top.id) == b"42"
    assert skipped.top.has_method
    assert not skipped.top.is_notification
    assert after == b'{"jsonrpc":"2.0","method":"after"}'


@given(cut=st.integers(min_value=0, max_value=14))
def test_a_frame_exactly_at_the_limit_passes_with_a_crlf_line_end_cut_anywhere(cut: int) -> None:
    # The CR of a CRLF line end is no part of the message: a Windows writer's frame of
    # exactly the limit was refused as oversized, where the same frame with LF passed.
    frame = b"x" * 10
    decoder = FrameDecoder(max_frame_bytes=10)
    data = frame + b"\r\n" + frame + b"\r\n"
    got = decoder.feed(data[:cut]) + decoder.feed(data[cut:])
    assert [bytes(f).rstrip(b"\r") for f in got if not isinstance(f, OversizedFrame)] \
        == [frame, frame]


def test_a_cr_that_is_not_a_line_end_still_counts_toward_the_limit() -> None:
    decoder = FrameDecoder(max_frame_bytes=10)
    got = decoder.feed(b"x" * 10 + b"\r") + decoder.feed(b"y\n")
    assert len(got) == 1 and isinstance(got[0], OversizedFrame) and got[0].size == 12

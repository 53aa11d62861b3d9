"""A frame that spans reads is handed over whole, and its payload keeps its bytes."""

from __future__ import annotations

from conductor.jsonrpc.framing import FrameDecoder
from conductor.jsonrpc.message import Request, decode


def test_a_frame_split_over_three_reads_decodes_with_its_payload_bytes_intact() -> None:
    params = b'{ "text" : "' + b"x" * 100_000 + b'", "n": 1e2 }'
    wire = b' {"jsonrpc":"2.0","id":3,"method":"session/prompt","params":' + params + b"}\n \n"
    decoder = FrameDecoder()
    chunks = (wire[:10], wire[10:60_000], wire[60_000:])
    frames = [f for chunk in chunks for f in decoder.feed(chunk)]
    assert decoder.end() is None
    assert len(frames) == 1  # the blank line is not a message
    msg = decode(frames[0])  # type: ignore[arg-type]
    assert isinstance(msg, Request)
    assert bytes(msg.params) == params  # type: ignore[arg-type]

"""The demo agent, except that it answers every METHOD request with ANSWER (JSON text),
whatever that is: how `run` and `call` are shown an agent's malformed answers.

    python answering_agent.py METHOD ANSWER
"""

from __future__ import annotations

import json
import sys
from typing import Any

from conductor.demo_agent import DemoAgent


class Answering(DemoAgent):
    def __init__(self, method: str, answer: object) -> None:
        super().__init__(sys.stdout, open(sys.stdin.fileno(), encoding="utf-8",
                                          closefd=False))
        self.method, self.answer = method, answer

    def dispatch(self, msg: dict[str, Any]) -> None:
        if msg.get("method") == self.method and msg.get("id") is not None:
            self.send({"id": msg["id"], "result": self.answer})
            return
        super().dispatch(msg)


if __name__ == "__main__":
    Answering(sys.argv[1], json.loads(sys.argv[2])).serve()

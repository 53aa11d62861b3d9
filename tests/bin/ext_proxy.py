"""A plugin proxy with extension methods of its own, for `acp-conductor call` tests:
`plugin = "tests/bin/ext_proxy.py:Ext"`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio

from conductor.errors import RpcError
from conductor.plugins import Proxy, ProxyContext, on

if TYPE_CHECKING:
    from conductor.jsonrpc.message import Notification, Request


class Ext(Proxy):
    """Answers _ext/echo, refuses _ext/refuse, never answers _ext/hang."""

    @on("_ext/echo")
    async def echo(self, ctx: ProxyContext, message: Request) -> object:
        await ctx.notify("_ext/echo/progress", {"step": 1}, to="predecessor")
        return {"echo": message.params_value()}

    @on("_ext/refuse")
    async def refuse(self, ctx: ProxyContext, message: Request) -> object:
        raise RpcError(-32042, "not today", {"why": "policy"})

    @on("_ext/hang")
    async def hang(self, ctx: ProxyContext, message: Request) -> object:
        ctx.release()
        await anyio.sleep_forever()

    @on("_ext/note")
    async def note(self, ctx: ProxyContext, message: Notification) -> None:
        await ctx.notify("_ext/noted", message.params_value(), to="predecessor")

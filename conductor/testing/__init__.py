"""A test kit for plugin authors: drive proxies through the conductor's own router.

    async def test_my_proxy_upper_cases_prompts(acp_client, acp_agent) -> None:
        sid = await acp_client.new_session("/tmp")
        turn = await acp_client.prompt(sid, "hello")
        assert turn.stop_reason == "end_turn"
        assert acp_agent.last_params("session/prompt")["prompt"][0]["text"] == "HELLO"

With acp-conductor installed, pytest loads its plugin (`conductor.testing.pytest_plugin`):
the `acp_*` fixtures, and async tests that use them run without configuring anyio
(docs/writing-a-proxy.md, "Testing"). Without the fixtures:

    async with open_test_chain([MyProxy()], ScriptedAgent()) as client: ...
    async with open_conductor("chain.toml") as client: ...   # a real conductor process
"""

from conductor.testing.kit import (
    DEFAULT_TIMEOUT,
    ScriptedAgent,
    TestClient,
    TestPeer,
    TurnResult,
    conductor_command,
    open_conductor,
    open_process_client,
    open_test_chain,
    says,
)

__all__ = ["DEFAULT_TIMEOUT", "ScriptedAgent", "TestClient", "TestPeer", "TurnResult",
           "conductor_command", "open_conductor", "open_process_client", "open_test_chain",
           "says"]

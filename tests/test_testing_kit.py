"""The plugin authors' test kit: its fixtures, its accessors, and what a failure says."""

from __future__ import annotations

import textwrap
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from conductor.errors import RpcError
from conductor.plugins import Proxy, ProxyContext, on
from conductor.testing import ScriptedAgent, TestClient, open_test_chain, says
from tests.conftest import doc_files

if TYPE_CHECKING:
    from conductor.jsonrpc.message import Request

pytest_plugins = ["pytester"]


class Echo(Proxy):
    """Answers `_ext/echo` itself; tags prompts."""

    @on("_ext/echo")
    async def echo(self, ctx: ProxyContext, message: Request) -> object:
        return {"echo": message.params_value()}

    @on("session/prompt")
    async def prompt(self, ctx: ProxyContext, message: Request) -> object:
        params = message.params_value()
        params["prompt"].append({"type": "text", "text": "[echo]"})
        return await ctx.forward(message.with_params(params))


@pytest.fixture
def acp_proxies() -> list[Proxy[Any]]:
    return [Echo()]


@pytest.fixture
def acp_agent() -> ScriptedAgent:
    return ScriptedAgent(replies={"session/prompt": says("Hi there.", thought="hmm")})


def test_the_pytest_plugin_is_registered_for_pytest_to_load() -> None:
    plugins = {e.name: e.value for e in entry_points(group="pytest11")}
    assert plugins.get("acp_conductor") == "conductor.testing.pytest_plugin", \
        "reinstall to register the entry point: pip install -e '.[test]'"


async def test_a_prompt_returns_the_turns_text_and_stop_reason(acp_client: TestClient,
                                                               acp_agent: ScriptedAgent) -> None:
    sid = await acp_client.new_session("/tmp")
    turn = await acp_client.prompt(sid, "hello")
    assert turn.text == "Hi there."
    assert turn.thoughts == "hmm"
    assert turn.stop_reason == "end_turn"
    assert turn == {"stopReason": "end_turn"}  # still the prompt's result as sent
    assert [u["sessionUpdate"] for u in turn.updates] == ["agent_thought_chunk",
                                                          "agent_message_chunk"]
    assert acp_agent.last_params("session/prompt")["prompt"][-1]["text"] == "[echo]"
    assert acp_agent.received_methods() == ["initialize", "session/new", "session/prompt"]


async def test_a_second_turn_reports_only_its_own_text(acp_client: TestClient) -> None:
    sid = await acp_client.new_session("/tmp")
    await acp_client.prompt(sid, "one")
    turn = await acp_client.prompt(sid, "two")
    assert turn.text == "Hi there."
    assert acp_client.agent_text(sid) == "Hi there.Hi there."


async def test_a_v2_prompt_waits_for_the_idle_state_and_reports_its_stop_reason() -> None:
    agent = ScriptedAgent(replies={"session/prompt": says("Hi there.", stop_reason="refusal")})
    async with open_test_chain([Echo()], agent, initialize=False) as client:
        with anyio.fail_after(5):
            init = await client.initialize(2)
            sid = await client.new_session("/tmp")
            turn = await client.prompt(sid, "one")
            second = await client.prompt(sid, "two")
    agent_init = agent.last_params("initialize")
    assert set(agent_init) == {"protocolVersion", "info", "capabilities"}  # v2's shape
    assert init["protocolVersion"] == 2 and "info" in init and "capabilities" in init
    assert turn == {}  # v2: the answer only accepts the prompt
    assert turn.text == "Hi there."
    assert turn.stop_reason == "refusal"
    assert [u["sessionUpdate"] for u in turn.updates] == ["agent_message_chunk"]
    assert second.text == "Hi there."


async def test_the_default_v2_turn_ends_idle() -> None:
    async with open_test_chain([], initialize=False) as client:
        with anyio.fail_after(5):
            await client.initialize(2)
            turn = await client.prompt(await client.new_session("/tmp"), "hello")
    assert turn == {} and turn.stop_reason == "end_turn" and turn.updates == []


async def test_the_process_fixture_drives_any_acp_command_over_real_pipes(
        acp_process: Any) -> None:
    from tests.conftest import child_env, conductor_argv

    async with acp_process(conductor_argv("demo-agent"), env=child_env()) as client:
        with anyio.fail_after(10):
            sid = await client.new_session("/tmp")
            turn = await client.prompt(sid, "hello")
    assert turn.text == "Hello from the demo agent. You said: hello "
    assert turn.stop_reason == "end_turn"


async def test_an_ext_request_is_answered_by_the_proxy(acp_client: TestClient,
                                                       acp_agent: ScriptedAgent) -> None:
    assert await acp_client.call("_ext/echo", {"x": 1}) == {"echo": {"x": 1}}
    with pytest.raises(RpcError) as refused:
        await acp_client.call("_ext/unknown", {})
    assert refused.value.code == -32601  # the agent has no script for it
    answer = await acp_client.request("_ext/unknown", {})
    assert answer.is_error and answer.error_value()["code"] == -32601


async def test_a_missing_message_fails_naming_what_did_arrive(acp_client: TestClient,
                                                              acp_agent: ScriptedAgent) -> None:
    with pytest.raises(AssertionError, match=r"agent never received session/load; "
                                             r"it received: \['initialize'\]"):
        acp_agent.last_params("session/load")


async def test_a_request_nobody_answers_fails_with_what_the_peer_received() -> None:
    never = anyio.Event()

    async def hang(agent: ScriptedAgent, message: Request) -> object:
        await never.wait()
        return None

    agent = ScriptedAgent(replies={"_ext/slow": hang})
    async with open_test_chain([], agent) as client:
        # Received first (waited for, not raced against the timeout), so the timeout that
        # must fire can be short.
        await agent.notify("session/update", {"sessionId": "s-1", "update": {
            "sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "…"}}})
        await client.wait_for("session/update")
        client.timeout = 0.1
        with pytest.raises(TimeoutError) as waited:
            await client.request("_ext/slow", {"n": 1})
        await agent.wait_for("$/cancel_request")  # and the request was cancelled
    assert "client waited 0.1s for an answer to _ext/slow" in str(waited.value)
    assert "it received: [Notification(method='session/update', params={\"sessionId\":" \
        "\"s-1\"" in str(waited.value)


async def test_the_scripted_agent_answers_session_load_with_an_object_as_acp_does() -> None:
    # LoadSessionResponse is an object: a proxy's handler reading the answer of a load
    # must meet in its tests what a real agent sends, not null.
    async with open_test_chain([]) as client:
        with anyio.fail_after(5):
            sid = await client.new_session()
            loaded = await client.call("session/load", {"sessionId": sid, "cwd": "/",
                                                        "mcpServers": []})
    assert loaded == {}


async def test_a_wait_for_that_never_comes_fails_with_what_arrived() -> None:
    async with open_test_chain([], client=TestClient(timeout=0.1)) as client:
        with pytest.raises(TimeoutError, match=r"client waited 0.1s for 1 session/update "
                                               r"message\(s\); it received: nothing"):
            await client.wait_for("session/update")


async def test_a_wait_for_with_a_condition_says_how_many_arrived_and_how_many_matched(
        ) -> None:
    # It said "waited for 1 session/update message(s)" with the updates it waited for in
    # plain sight among what arrived: the condition they failed went unmentioned.
    def has_tool_call(params: object) -> bool:
        return False

    agent = ScriptedAgent()
    async with open_test_chain([], agent, client=TestClient(timeout=5)) as client:
        await agent.notify("session/update", {"sessionId": "s-1", "update": {}})
        await client.wait_for("session/update")
        client.timeout = 0.1
        with pytest.raises(TimeoutError, match=r"client waited 0.1s for 1 session/update "
                                               r"message\(s\) where has_tool_call; 1 "
                                               r"arrived, 0 matched; it received: "):
            await client.wait_for("session/update", where=has_tool_call)


def test_a_plugin_authors_async_tests_run_on_asyncio_without_configuring_anyio(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_author=textwrap.dedent("""
        import pytest
        from conductor.plugins import Proxy, ProxyContext, on
        from conductor.testing import ScriptedAgent, says

        class Shout(Proxy):
            @on("session/prompt")
            async def prompt(self, ctx: ProxyContext, message):
                params = message.params_value()
                params["prompt"][0]["text"] = params["prompt"][0]["text"].upper()
                return await ctx.forward(message.with_params(params))

        @pytest.fixture
        def acp_proxies():
            return [Shout()]

        async def test_shout(acp_client, acp_agent, anyio_backend):
            acp_agent.replies["session/prompt"] = says("ok")
            sid = await acp_client.new_session("/tmp")
            assert (await acp_client.prompt(sid, "hi")).text == "ok"
            assert acp_agent.last_params("session/prompt")["prompt"][0]["text"] == "HI"
            assert anyio_backend == "asyncio"

        async def test_own_chain(acp_chain):
            async with acp_chain([Shout()]) as client:
                assert (await client.new_session()).startswith("session-")
    """))
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)  # once each: asyncio, as the conductor runs plugins


def test_a_project_that_picks_its_backends_keeps_them(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(textwrap.dedent("""
        import pytest

        @pytest.fixture(params=["asyncio", "trio"])
        def anyio_backend(request):
            return request.param
    """))
    pytester.makepyfile(test_both="""
        async def test_new_session(acp_client, anyio_backend):
            assert await acp_client.new_session()
    """)
    result = pytester.runpytest("-p", "no:cacheprovider", "-v")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*test_new_session?trio? PASSED*"])


def test_the_testing_example_in_writing_a_proxy_runs_as_written(
        pytester: pytest.Pytester) -> None:
    files = doc_files("writing-a-proxy.md")
    assert set(files) >= {"upper.py", "upper.toml", "test_upper.py"}
    for name in ("upper.py", "upper.toml", "test_upper.py"):
        (pytester.path / name).write_text(files[name], encoding="utf-8")
    # As the author runs it: no pytest or anyio configuration of their own.
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "test_upper.py")
    result.assert_outcomes(passed=3)


async def test_a_process_that_exits_without_answering_fails_the_test_at_once_saying_so(
        ) -> None:
    # A chain file the conductor refuses (exit 2): the client waited its whole timeout
    # (30 s), then said only "waited 30s for an answer to initialize; it received: nothing".
    import sys

    from conductor.errors import ConnectionClosedError
    from conductor.testing import open_process_client

    exited = "import sys; sys.stdin.readline(); sys.exit(2)"
    failures: list[BaseException] = []
    with anyio.fail_after(10):
        try:
            async with open_process_client([sys.executable, "-c", exited]):
                pass
        except* ConnectionClosedError as group:
            failures += group.exceptions
    (failure,) = failures
    assert "exited with code 2" in str(failure)
    assert "initialize unanswered" in str(failure)
    assert "its stderr says why" in str(failure)


class Quiet(Proxy):
    """Handles nothing."""


@pytest.mark.parametrize(("proxies", "says"), [
    ([Quiet], "proxies[0] is the class Quiet, not a proxy: write Quiet()"),
    (Quiet(), "proxies is one proxy, not a list of them: write [Quiet()]"),
    ([Quiet(), "quiet"], "proxies[1] is 'quiet', not a conductor.plugins.Proxy"),
])
async def test_a_chain_of_proxies_that_are_not_proxy_instances_is_refused_saying_what_to_write(
        proxies: Any, says: str) -> None:
    # `acp_proxies` returning [Upper] failed inside the router's task group with
    # "type object 'Upper' has no attribute 'name'" (and a lone Upper() with "not iterable").
    with pytest.raises(TypeError, match="open_test_chain") as caught:
        async with open_test_chain(proxies):
            pass
    assert says in str(caught.value)


async def test_a_chain_of_proxies_given_as_a_generator_keeps_them() -> None:
    # The check of what the proxies are used the generator up: the chain had none.
    class Counts(Proxy):
        def __init__(self) -> None:
            super().__init__()
            self.setups = 0

        @on("session/new")
        async def new(self, ctx: ProxyContext, message: Any) -> object:
            self.setups += 1
            return await ctx.forward()

    counts = Counts()
    async with open_test_chain(p for p in [counts]) as client:
        with anyio.fail_after(5):
            await client.new_session()
    assert counts.setups == 1


@pytest.mark.parametrize(("replies", "says"), [
    ({"session/prompt": "Done."}, "ScriptedAgent: replies['session/prompt'] is 'Done.', and "
     "an ACP result is an object: a dict, or a script (to stream text: says('Done.'))"),
    ({"session/new": ["s-1"]}, "replies['session/new'] is ['s-1'], and an ACP result is an "
     "object"),
])
def test_a_scripted_agent_replying_to_an_acp_method_with_no_object_is_refused_when_made(
        replies: dict[str, Any], says: str) -> None:
    # `replies={"session/prompt": "Done."}` answered the prompt "Done.": the turn's text
    # was '' and the test failed far from the slip.
    with pytest.raises(TypeError) as caught:
        ScriptedAgent(replies=replies)
    assert says in str(caught.value)


def test_a_scripted_agent_reply_for_a_method_acp_does_not_have_is_warned_about() -> None:
    with pytest.warns(UserWarning, match=r"ScriptedAgent: replies\['session/promt'\]: not an "
                      r"ACP method an agent answers \(did you mean 'session/prompt'\?"
                      r".*never be used") as caught:
        ScriptedAgent(replies={"session/promt": says("Done."), "_ext/mine": {}})
    assert len(caught) == 1 and caught[0].filename == __file__

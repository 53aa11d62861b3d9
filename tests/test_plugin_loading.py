"""Finding plugins, validating their options, and the plugin commands of the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from conductor.config import load_chain, parse_chain
from conductor.errors import (
    ConfigError,
    PluginError,
    PluginNotFoundError,
    PluginValidationError,
)
from conductor.plan import plan_chain as _plan
from conductor.plugins.registry import find_plugin, installed, load_proxy
from conductor.testing import open_process_client
from tests.conftest import child_env, conductor_argv
from tests.in_process import conductor

if TYPE_CHECKING:
    from pathlib import Path

BUILT_INS = {"passthrough", "permissions", "context", "redact", "transcript"}


def test_built_in_proxies_are_found_through_the_entry_point_group() -> None:
    assert BUILT_INS <= {p.name for p in installed()}
    assert find_plugin("redact").__name__ == "Redact"


def test_a_named_proxy_is_found_without_importing_importlib_metadata() -> None:
    # ≈ 15 ms of every start-up of a chain that names its proxies (plugins/entry_points.py)
    code = ("import sys; from conductor.plugins.registry import find_plugin; "
            "find_plugin('passthrough'); print('importlib.metadata' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True,
                          text=True, timeout=30, check=True)
    assert done.stdout.strip() == "False", done.stderr


def test_the_quick_lookup_finds_every_installed_proxy_as_importlib_metadata_does() -> None:
    from importlib.metadata import entry_points

    from conductor.plugins import entry_points as quick
    from conductor.plugins.registry import GROUP

    for ep in entry_points(group=GROUP):
        found = quick.find(GROUP, ep.name)
        assert found is not None and found.value == ep.value, ep.name
        assert found.load() is ep.load()
    assert quick.find(GROUP, "no-such-proxy") is None


def _dist(root: Path, project: str, entries: str) -> None:
    info = root / f"{project}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project}\nVersion: 1.0\n",
                                   encoding="utf-8")
    (info / "entry_points.txt").write_text(f"[acp_conductor.proxies]\n{entries}\n",
                                           encoding="utf-8")


def test_a_name_two_projects_register_is_left_to_importlib_metadata(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from conductor.plugins import entry_points as quick

    _dist(tmp_path, "one", "twin = one_mod:P")
    _dist(tmp_path, "two", "twin = two_mod:P")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert quick.find("acp_conductor.proxies", "twin") is None


def test_an_older_install_of_the_same_project_later_on_the_path_is_shadowed_as_importlib_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib.metadata import entry_points

    from conductor.plugins import entry_points as quick

    _dist(tmp_path / "new", "shadowed_proj", "shade = new_mod:P")
    _dist(tmp_path / "old", "Shadowed.Proj", "shade = old_mod:P")
    monkeypatch.syspath_prepend(str(tmp_path / "old"))
    monkeypatch.syspath_prepend(str(tmp_path / "new"))
    found = quick.find("acp_conductor.proxies", "shade")
    (expected,) = entry_points(group="acp_conductor.proxies", name="shade")
    assert found is not None and found.value == expected.value == "new_mod:P"


def test_bad_options_in_a_chain_file_name_the_proxy_the_file_and_the_field(tmp_path: Path) -> None:
    chain = tmp_path / "chain.toml"
    chain.write_text(textwrap.dedent("""
        [[proxy]]
        name = "guard"
        use = "permissions"
        options = { default = "maybe", rules = [{ action = "allow", colour = "red" }] }

        [agent]
        command = "true"
    """), encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        _plan(load_chain(chain), "agent")
    text = str(caught.value)
    assert str(chain) in text and "'guard'" in text
    assert "proxy[0].options.default" in text
    assert "proxy[0].options.rules[0].colour: proxy 'guard': unknown option 'colour'" in text
    assert caught.value.exit_code == 2


def test_options_given_to_a_proxy_that_takes_none_are_refused_by_name(tmp_path: Path) -> None:
    chain = tmp_path / "chain.toml"
    chain.write_text(textwrap.dedent("""
        [[proxy]]
        name = "pass"
        use = "passthrough"
        options = { verbose = true }

        [agent]
        command = "true"
    """), encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        _plan(load_chain(chain), "agent")
    assert "proxy[0].options.verbose: proxy 'pass': unknown option 'verbose'" in str(caught.value)


def test_a_proxy_that_takes_no_options_has_the_public_no_options_model() -> None:
    from conductor import NoOptions as from_root
    from conductor.plugins import NoOptions, Proxy

    class Plain(Proxy):
        pass

    assert from_root is NoOptions and Plain.options_model is NoOptions
    assert not Plain.takes_options()
    assert isinstance(load_proxy("passthrough", None).options, NoOptions)
    assert isinstance(Plain().options, NoOptions)


def test_a_proxy_of_an_options_model_takes_that_model_without_naming_it_again() -> None:
    # `class P(Proxy[Opts])` without `options_model = Opts` took no options: the chain's
    # were refused as unknown, and `self.options.prefix` failed at the first message.
    from pydantic import BaseModel

    from conductor.plugins import NoOptions, Proxy
    from conductor.plugins.registry import make_proxy

    class Opts(BaseModel):
        prefix: str = ""

    class Typed(Proxy[Opts]):
        pass

    class Sub(Typed):
        pass

    class Explicit(Proxy[NoOptions]):
        pass

    class Untyped(Proxy[Any]):
        pass

    assert Typed.options_model is Opts and Sub.options_model is Opts and Typed.takes_options()
    made = make_proxy(Typed, {"prefix": "Be brief."}, name="typed", file=None, where="proxy[0]")
    assert made.options == Opts(prefix="Be brief.")
    assert Typed().options == Opts()
    assert not Explicit.takes_options() and not Untyped.takes_options()


def test_a_plugin_that_keeps_its_own_underscore_options_still_reads_its_validated_options(
        ) -> None:
    # `_options` is a name a plugin may well use for its own state (a parsed form of its
    # options): the base class's storage must not be it.
    from pydantic import BaseModel

    from conductor.plugins import Proxy
    from conductor.plugins.registry import make_proxy

    class Limits(BaseModel):
        size: int = 1

    class Keeps(Proxy[Limits]):
        options_model = Limits

        def __init__(self, options: Limits | None = None) -> None:
            super().__init__(options)
            self._options = {"parsed": True}

    class Plain(Proxy):
        def __init__(self, options: None = None) -> None:
            super().__init__(options)
            self._options = ["mine"]

    kept = make_proxy(Keeps, {"size": 3}, name="keeps", file=None, where="proxy[0]")
    assert isinstance(kept, Keeps)
    assert kept.options == Limits(size=3) and kept._options == {"parsed": True}
    plain = make_proxy(Plain, None, name="plain", file=None, where="proxy[0]")
    assert isinstance(plain, Plain)
    assert type(plain.options).__name__ == "NoOptions" and plain._options == ["mine"]


def test_an_unknown_plugin_name_says_where_and_what_is_installed() -> None:
    config = parse_chain({"proxy": [{"use": "nope"}], "agent": {"command": "true"}},
                         file="x.toml")
    with pytest.raises(PluginNotFoundError, match=r"x.toml: proxy\[0\].use: .*installed: .*redact"):
        _plan(config, "agent")


def test_an_uninstalled_plugin_name_says_which_python_to_install_it_into() -> None:
    # A package pip-installed into another Python than acp-conductor's (a pipx install, a
    # project venv) is not found, and nothing said where it should have gone.
    with pytest.raises(PluginNotFoundError) as caught:
        find_plugin("my-first-proxy")
    assert (f"a package installs into the Python acp-conductor runs on, {sys.executable} "
            f"(`{sys.executable} -m pip install ...`; under pipx: `pipx inject acp-conductor "
            "...`)") in str(caught.value)


def test_a_plugin_that_is_not_a_proxy_is_refused() -> None:
    with pytest.raises(PluginValidationError, match="not a subclass"):
        find_plugin("conductor.config:ChainConfig")


def test_a_component_needs_exactly_one_of_command_use_plugin() -> None:
    with pytest.raises(ConfigError, match="exactly one of command, use, plugin"):
        parse_chain({"proxy": [{"use": "redact", "command": "x"}], "agent": {"command": "a"}})
    with pytest.raises(ConfigError, match="agent must be a command"):
        parse_chain({"agent": {"use": "redact"}})


def test_a_plugin_file_path_loads_its_only_proxy_class(tmp_path: Path) -> None:
    (tmp_path / "mine.py").write_text(textwrap.dedent("""
        from conductor.plugins import Proxy
        class Mine(Proxy):
            '''Mine, all mine.'''
    """), encoding="utf-8")
    proxy = load_proxy(str(tmp_path / "mine.py"), None)
    assert type(proxy).description() == "Mine, all mine."
    assert proxy.name == "mine"


def test_the_proxies_command_lists_installed_proxies_with_a_description() -> None:
    done = conductor("proxies")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    lines = {line.split()[0]: line for line in out.splitlines()}
    assert BUILT_INS <= set(lines)
    assert "Scrub secrets" in lines["redact"]


def test_a_plugin_that_calls_sys_exit_on_import_is_a_load_error_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `sys.exit("needs X")` at import is a common way for a module to refuse: SystemExit is
    # no Exception, and escaped every loader (the conductor exited with the plugin's text).
    (tmp_path / "quits.py").write_text('import sys\nsys.exit("quits needs X")\n',
                                       encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    for ref in ("quits:P", str(tmp_path / "quits.py")):
        with pytest.raises(PluginNotFoundError, match=r"quits.*SystemExit: quits needs X"):
            find_plugin(ref)


def test_the_proxies_command_lists_the_others_when_a_plugin_exits_on_import(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from conductor.cli.app import main

    (tmp_path / "quits.py").write_text('import sys\nsys.exit("quits needs X")\n',
                                       encoding="utf-8")
    info = tmp_path / "quits-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: quits\nVersion: 0.1\n",
                                   encoding="utf-8")
    (info / "entry_points.txt").write_text("[acp_conductor.proxies]\nquits = quits:P\n",
                                           encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    result = CliRunner().invoke(main, ["proxies"])
    assert result.exit_code == 0, result.output
    lines = {line.split()[0]: line for line in result.stdout.splitlines()}
    assert BUILT_INS <= set(lines)
    assert "cannot load" in lines["quits"] and "quits needs X" in lines["quits"]


def test_serve_proxy_rejects_bad_options_before_serving() -> None:
    done = subprocess.run(conductor_argv("serve-proxy", "redact", "--options",
                                         '{"patterns": ["("]}'),
                          env=child_env(), capture_output=True, text=True, timeout=30,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 2
    assert "--options: options.patterns" in done.stderr and done.stdout == ""


@pytest.mark.parametrize(("given", "says"), [
    (["--chain", "demo"], "takes no --chain"),
    (["--trace", "t.jsonl"], "writes no trace"),
    (["--trace-unredacted"], "writes no trace"),
])
def test_serve_proxy_refuses_the_global_options_it_would_silently_ignore(
        tmp_path: Path, given: list[str], says: str) -> None:
    # Its --help lists them with the other commands' global options; a --trace that writes
    # nothing leaves a user looking for a file that never comes.
    done = conductor("serve-proxy", "passthrough", *given, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr and done.stdout == ""
    assert not (tmp_path / "t.jsonl").exists()


# Each starts a real conductor: the event loop of the test process adds nothing there, so
# like tests/e2e these run on asyncio only (the kit's process client is covered on both
# backends in tests/test_testing_kit.py).
ONLY_ASYNCIO = pytest.mark.parametrize("anyio_backend", ["asyncio"])


@ONLY_ASYNCIO
async def test_a_stray_print_in_a_stand_alone_plugin_cannot_corrupt_the_wire(
        tmp_path: Path) -> None:
    plugin = tmp_path / "noisy.py"
    plugin.write_text(textwrap.dedent("""
        from conductor.plugins import Proxy, on
        print("hello from import time")
        class Noisy(Proxy):
            '''Prints everywhere.'''
            @on("session/prompt")
            async def prompt(self, ctx, message):
                print("hello from a handler", flush=True)
                return await ctx.forward()
    """), encoding="utf-8")
    chain = tmp_path / "chain.toml"
    chain.write_text(textwrap.dedent(f"""
        [[proxy]]
        command = ["${{PYTHON}}", "-m", "conductor", "serve-proxy", "{plugin}:Noisy"]
        [agent]
        command = ["${{PYTHON}}", "-m", "conductor.demo_agent"]
    """), encoding="utf-8")
    log = tmp_path / "stderr.log"
    with log.open("wb") as err:
        async with open_process_client(conductor_argv("--chain", str(chain)), env=child_env(),
                                       stderr=err) as client:
            with anyio.fail_after(15):
                sid = await client.new_session("/tmp")
                assert await client.prompt(sid, "hi") == {"stopReason": "end_turn"}
    assert "You said: hi" in client.agent_text()
    assert "hello from a handler" in log.read_text(encoding="utf-8")
    assert "non-JSON" not in log.read_text(encoding="utf-8")


NOISY_PLUGIN = '''
from conductor.plugins import Proxy, on
print("printed at import")
class Noisy(Proxy):
    """Prints from its module body and from a handler."""
    @on("initialize")
    async def initialize(self, ctx, message):
        print("printed by a handler")
        return await ctx.forward()
'''


def _noisy_chain(tmp_path: Path, *, agent: bool) -> Path:
    """A chain whose in-process plugin proxy prints (from a file: `plugin = "x.py:Class"`)."""
    (tmp_path / "noisy.py").write_text(NOISY_PLUGIN, encoding="utf-8")
    chain = tmp_path / "chain.toml"
    text = f'[[proxy]]\nplugin = "{tmp_path / "noisy.py"}:Noisy"\n'
    if agent:
        text += '[agent]\ncommand = ["${PYTHON}", "-m", "conductor.demo_agent"]\n'
    chain.write_text(text, encoding="utf-8")
    return chain


@ONLY_ASYNCIO
async def test_an_in_process_plugin_s_prints_go_to_stderr_not_the_editor_s_wire(
        tmp_path: Path) -> None:
    from tests.wire_client import open_conductor

    async with open_conductor("--chain", str(_noisy_chain(tmp_path, agent=True))) as c:
        await c.initialize()  # a stray line on stdout fails here, or at exit (pure JSON-RPC)
        await c.wait_stderr("printed by a handler")
    assert "printed at import" in c.stderr_text


@ONLY_ASYNCIO
async def test_a_nested_conductor_s_plugin_prints_go_to_stderr_not_the_wire(
        tmp_path: Path) -> None:
    from tests.wire_client import open_conductor

    chain = _noisy_chain(tmp_path, agent=False)
    async with open_conductor("--chain", str(chain), "proxy") as c:
        await c.send({"jsonrpc": "2.0", "id": 0, "method": "_proxy/initialize",
                      "params": {"protocolVersion": 1}})
        wrapped = await c.read_until(lambda m: m.get("method") == "_proxy/successor")
        await c.send({"jsonrpc": "2.0", "id": wrapped["id"], "result": {"protocolVersion": 1}})
        assert (await c.response(0))["result"] == {"protocolVersion": 1}
        await c.wait_stderr("printed by a handler")
    assert "printed at import" in c.stderr_text


@pytest.mark.parametrize("output", ["--json", "text"])
def test_run_output_carries_no_plugin_prints(tmp_path: Path, output: str) -> None:
    chain = _noisy_chain(tmp_path, agent=True)
    args = ["run", "--chain", str(chain), "hello", *([output] if output == "--json" else [])]
    done = subprocess.run(conductor_argv(*args), env=child_env(), capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    if output == "--json":
        assert all(isinstance(json.loads(line).get("type"), str)
                   for line in done.stdout.splitlines())
    else:
        assert done.stdout == "Hello from the demo agent. You said: hello \n"
    assert "printed at import" in done.stderr
    assert "printed by a handler" in done.stderr


def test_check_json_output_carries_no_plugin_prints(tmp_path: Path) -> None:
    done = subprocess.run(
        conductor_argv("check", "--chain", str(_noisy_chain(tmp_path, agent=True)), "--json"),
        env=child_env(), capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ok"] is True
    assert "printed at import" in done.stderr


def test_python_dash_m_proxies_passthrough_still_runs_as_a_stdio_proxy() -> None:
    lines = [
        '{"jsonrpc":"2.0","id":1,"method":"_proxy/initialize","params":{"protocolVersion":1}}',
    ]
    done = subprocess.run([sys.executable, "-m", "acp_conductor_proxies.passthrough"],
                          env=child_env(),
                          input="\n".join(lines) + "\n", capture_output=True, text=True,
                          timeout=30)
    assert done.stdout.startswith('{"jsonrpc":"2.0","id":1,"method":"_proxy/successor",'
                                  '"params":{"method":"initialize","params":{"protocolVersion":1}}}')


@pytest.mark.parametrize(("code", "line", "says"), [
    ("from conductor.plugins import Proxy, on\nclass S(Proxy):\n"
     "    @on('session/prompt')\n    def prompt(self, ctx, message): ...\n",
     3, "TypeError: handler S.prompt for session/prompt must be `async def`"),
    ("import no_such_module_anywhere\n", 1,
     "ModuleNotFoundError: No module named 'no_such_module_anywhere'"),
    ("def broken(:\n", 1, "SyntaxError"),
    ("raise RuntimeError('no config')\n", 1, "RuntimeError: no config"),
])
def test_a_plugin_file_whose_code_raises_is_a_chain_error_naming_the_file_and_line(
        tmp_path: Path, code: str, line: int, says: str) -> None:
    chain = _plugin_chain(tmp_path, "mine.py", "mine.py:S", code)
    with pytest.raises(PluginNotFoundError) as caught:
        _plan(load_chain(chain), "agent")
    text = str(caught.value)
    assert text.startswith(f"{tmp_path / 'x.toml'}: proxy[0].plugin: plugin 'mine.py:S'")
    assert f"{tmp_path / 'mine.py'}, line {line}" in text and says in text
    assert caught.value.exit_code == 2


def test_a_misspelt_source_in_a_plugin_file_is_reported_at_its_line_not_in_the_stdlib(
        tmp_path: Path) -> None:
    # It pointed at enum.py (where `Side` refuses the value), not at the plugin's @on.
    code = ("from conductor.plugins import Proxy, on\nclass S(Proxy):\n"
            "    @on('session/update', source='sucessor')\n"
            "    async def up(self, ctx, message): ...\n")
    chain = _plugin_chain(tmp_path, "mine.py", "mine.py:S", code)
    with pytest.raises(PluginNotFoundError) as caught:
        _plan(load_chain(chain), "agent")
    assert f"({tmp_path / 'mine.py'}, line 3): ValueError: 'sucessor' is not a side" \
        in str(caught.value)


@pytest.mark.parametrize("sibling", ["helpers.py", "helpers/__init__.py"])
def test_a_plugin_file_importing_a_module_beside_it_is_told_the_folder_is_not_on_the_path(
        tmp_path: Path, sibling: str) -> None:
    # `python mine.py` would find helpers.py; the conductor said only "No module named".
    (tmp_path / sibling).parent.mkdir(exist_ok=True)
    (tmp_path / sibling).write_text("SUFFIX = '!'\n", encoding="utf-8")
    chain = _plugin_chain(tmp_path, "mine.py", "mine.py:S", "from helpers import SUFFIX\n")
    with pytest.raises(PluginNotFoundError) as caught:
        _plan(load_chain(chain), "agent")
    assert ("No module named 'helpers'; helpers is next to mine.py, but a plugin file's "
            "folder is not on the import path: install your code as a package (`acp-conductor "
            f"init --proxy NAME`), or run acp-conductor with PYTHONPATH={tmp_path}") \
        in str(caught.value)


def test_a_plugin_module_whose_code_raises_names_the_module(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    (tmp_path / "raising_plugin_mod.py").write_text("raise KeyError('HOME')\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginNotFoundError, match=r"plugin 'raising_plugin_mod:P' failed to "
                       r"import \(.*raising_plugin_mod.py, line 1\): KeyError: 'HOME'"):
        find_plugin("raising_plugin_mod:P")


def test_an_entry_point_whose_module_is_gone_says_so_without_pointing_into_importlib(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib.metadata import EntryPoint

    from conductor.plugins import registry

    gone = EntryPoint("gone", "no_such_plugin_module_anywhere:P", registry.GROUP)
    monkeypatch.setattr(registry, "_entry_point", lambda name: gone)
    with pytest.raises(PluginNotFoundError) as caught:
        find_plugin("gone")
    assert str(caught.value) == (
        "proxy 'gone' (no_such_plugin_module_anywhere:P) cannot be loaded: "
        "ModuleNotFoundError: No module named 'no_such_plugin_module_anywhere'")


def test_an_entry_point_naming_a_class_its_module_lacks_says_to_fix_pyproject_and_reinstall(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The class renamed (Shout -> Shouter), the entry point not: "module has no attribute".
    from importlib.metadata import EntryPoint

    from conductor.plugins import registry

    (tmp_path / "renamed_proxy_mod.py").write_text(
        "from conductor.plugins import Proxy\nclass Shouter(Proxy):\n    pass\n",
        encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    entry = EntryPoint("shout", "renamed_proxy_mod:Shout", registry.GROUP)
    monkeypatch.setattr(registry, "_entry_point", lambda name: entry)
    with pytest.raises(PluginNotFoundError) as caught:
        find_plugin("shout")
    assert str(caught.value).endswith(
        "AttributeError: module 'renamed_proxy_mod' has no attribute 'Shout'; the entry point "
        "names a class the module does not have (did you mean 'Shouter'?): fix it under "
        "[project.entry-points.\"acp_conductor.proxies\"] in the package's pyproject.toml, "
        "then install the package again (`pip install -e .`)")


RAISING_CONSTRUCTOR = """\
from conductor.plugins import Proxy


class NeedsToken(Proxy):
    def __init__(self, options=None):
        super().__init__(options)
        raise ValueError("set MY_TOKEN first")
"""


def _plugin_chain(tmp_path: Path, file: str, plugin: str, code: str = RAISING_CONSTRUCTOR
                  ) -> Path:
    """A chain whose one proxy is `plugin`, with `code` written to `file`."""
    (tmp_path / file).write_text(code, encoding="utf-8")
    chain = tmp_path / "x.toml"
    chain.write_text(f'[[proxy]]\nplugin = "{plugin}"\n[agent]\ncommand = "true"\n',
                     encoding="utf-8")
    return chain


def test_a_plugin_whose_constructor_raises_is_a_chain_error_naming_the_proxy_and_line(
        tmp_path: Path) -> None:
    chain = _plugin_chain(tmp_path, "mine.py", "mine.py:NeedsToken")
    with pytest.raises(PluginError) as caught:
        _plan(load_chain(chain), "agent")
    text = str(caught.value)
    assert text.startswith(f"{chain}: proxy[0]: proxy 'needstoken' failed to start")
    assert "ValueError: set MY_TOKEN first" in text
    assert f"{tmp_path / 'mine.py'}, line 7" in text
    assert caught.value.exit_code == 2


def test_run_with_a_plugin_whose_constructor_raises_exits_2_without_an_internal_error(
        tmp_path: Path) -> None:
    chain = _plugin_chain(tmp_path, "mine.py", "mine.py:NeedsToken")
    # A real process: in-process, this run leaves a memory stream unclosed (ResourceWarning).
    done = subprocess.run(conductor_argv("run", "--chain", str(chain), "hi"), env=child_env(),
                          capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stderr
    assert "internal error" not in done.stderr and done.stdout == ""
    assert "proxy[0]: proxy 'needstoken' failed to start" in done.stderr


def test_a_module_path_for_a_file_next_to_the_chain_file_suggests_the_file_path(
        tmp_path: Path) -> None:
    # The docs' rule (a module path is imported from the environment, a file path is
    # relative to the chain file) is easy to miss: the error now spells the fix.
    chain = _plugin_chain(tmp_path, "guardmod.py", "guardmod:NeedsToken")
    with pytest.raises(PluginNotFoundError) as caught:
        _plan(load_chain(chain), "agent")
    assert "write plugin = \"guardmod.py:NeedsToken\"" in str(caught.value)


def test_each_proxy_command_is_told_the_name_the_chain_gives_it_and_the_agent_is_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACP_CONDUCTOR_PROXY_NAME", "outer")  # a nested conductor's own
    config = parse_chain({"proxy": [{"name": "guard", "command": ["/bin/cat"]},
                                    {"command": ["/bin/cat"]}],
                          "agent": {"command": ["/bin/cat"]}})
    envs = [launch.env or {} for _, _, launch in _plan(config, "agent")]  # type: ignore[union-attr]
    assert [env.get("ACP_CONDUCTOR_PROXY_NAME") for env in envs] == \
        ["guard", config.proxy_names()[1], None]


CRASHES_PLUGIN = '''
from conductor.plugins import Proxy, on
class Crashes(Proxy):
    """Fails on purpose."""
    @on("_ext/boom")
    async def boom(self, ctx, message):
        raise KeyError("boom")
'''


@pytest.mark.parametrize(("flags", "named"), [((), "guard"), (("--name", "mine"), "mine")])
def test_a_stand_alone_proxy_takes_the_name_its_chain_gives_it_unless_given_one(
        tmp_path: Path, flags: tuple[str, ...], named: str) -> None:
    # It called itself by its class ("crashes") in its errors and logs, whatever the chain
    # named it: the editor saw a name the chain file never mentions.
    (tmp_path / "crashes.py").write_text(CRASHES_PLUGIN, encoding="utf-8")
    done = subprocess.run(
        conductor_argv("serve-proxy", f"{tmp_path / 'crashes.py'}:Crashes", *flags),
        env={**child_env(), "ACP_CONDUCTOR_PROXY_NAME": "guard"}, capture_output=True,
        text=True, timeout=30,
        input='{"jsonrpc":"2.0","id":1,"method":"_ext/boom","params":{}}\n')
    error = json.loads(done.stdout)["error"]
    assert error["data"]["component"] == named
    assert f"proxy {named} failed handling _ext/boom" in done.stderr

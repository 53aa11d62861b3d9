"""Remote components in chain files, and `serve`'s exposure rules: every mistake is refused
before anything starts, naming the field and a fix."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import pytest

from conductor.config import component_headers, parse_chain
from conductor.errors import ConfigError
from conductor.listen import ListenSettings, check_exposure, is_loopback, serve_listener
from conductor.plan import RemoteSpec, plan_chain

if TYPE_CHECKING:
    from pathlib import Path

TOKEN = "t" * 32


def test_a_remote_agent_takes_a_url_and_headers_with_variables(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_TOKEN", "sekrit")
    config = parse_chain({"agent": {"url": "wss://box:8765/acp",
                                    "headers": {"Authorization": "Bearer ${AGENT_TOKEN}"}}})
    assert config.agent is not None and config.agent.remote and not config.agent.in_process
    assert component_headers(config.agent, file=None, where="agent") == {
        "Authorization": "Bearer sekrit"}


@pytest.mark.parametrize(("agent", "message"), [
    ({"url": "https://box/acp"}, "agent.url: 'https://box/acp' is not a ws:// or wss://"),
    ({"url": "wss://box/acp", "command": "x"}, "give exactly one of command, use, plugin, url"),
    ({"command": "x", "headers": {"A": "b"}}, "only a remote component"),
    ({"url": "wss://box/acp", "env": {"A": "b"}}, "a remote one gets `headers`"),
])
def test_a_malformed_remote_component_is_refused_by_field(agent: dict[str, object],
                                                          message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_chain({"agent": agent}, file="c.toml")
    assert message in str(refused.value)


def test_a_remote_url_taken_whole_from_a_variable_is_accepted_once_expanded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # As an [[mcp_server]]'s url: docs/configuration.md says `${VAR}` works in `url`.
    monkeypatch.setenv("BOX_URL", "wss://box:8765/acp")
    config = parse_chain({"agent": {"url": "${BOX_URL}"}}, file="c.toml")
    [(_, _, remote)] = plan_chain(config, "agent")
    assert isinstance(remote, RemoteSpec) and remote.url == "wss://box:8765/acp"


@pytest.mark.parametrize(("url", "env"), [
    ("${BOX_URL}", {"BOX_URL": "https://box/acp"}),
    ("ws://${BOX_HOST}/acp", {"BOX_HOST": ""}),
    ("ws://[::1/acp", {}),
    ("ws://box:99999/acp", {}),
    ("ws://box:port/acp", {}),
])
def test_a_remote_url_that_is_no_address_once_expanded_is_refused_naming_the_field(
        url: str, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    config = parse_chain({"agent": {"url": url}}, file="c.toml")
    with pytest.raises(ConfigError) as refused:
        plan_chain(config, "agent")
    assert "agent.url:" in str(refused.value)
    assert "is not a ws:// or wss:// address" in str(refused.value)


@pytest.mark.parametrize(("url", "shown"), [
    ("wss://box:8765/acp?token=SECRET", "wss://box:8765/acp"),
    ("wss://box:8765?token=SECRET", "wss://box:8765"),
    ("wss://box#SECRET", "wss://box"),
    ("wss://me:SE@CRET@box/acp", "wss://box/acp"),
    ("ws://[::1]:8765/acp", "ws://[::1]:8765/acp"),
])
def test_a_remote_url_is_shown_in_logs_and_traces_without_query_or_credentials(
        url: str, shown: str) -> None:
    assert RemoteSpec("box", url, {}).shown == shown


def test_an_unset_header_variable_names_the_header(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOPE_TOKEN", raising=False)
    config = parse_chain({"proxy": [{"url": "ws://127.0.0.1:1/acp",
                                     "headers": {"Authorization": "${NOPE_TOKEN}"}}],
                          "agent": {"command": "x"}}, file="c.toml")
    with pytest.raises(ConfigError) as refused:
        component_headers(config.proxy[0], file="c.toml", where="proxy[0]")
    assert "proxy[0].headers.Authorization: environment variable NOPE_TOKEN is not set" \
        in str(refused.value)


@pytest.mark.parametrize(("settings", "message"), [
    (ListenSettings(host="0.0.0.0", tokens=(TOKEN,)), "without TLS"),
    (ListenSettings(host="192.168.1.5", tokens=(), certfile="c", keyfile="k"),
     "a token is required"),
    (ListenSettings(certfile="c"), "both a certificate and its key"),
    (ListenSettings(tokens=("short",)), "too easy to guess"),
])
def test_serve_refuses_an_unsafe_exposure(settings: ListenSettings, message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        check_exposure(settings)
    assert message in str(refused.value)


def test_loopback_without_a_token_and_an_exposed_address_with_tls_and_token_are_allowed(
        ) -> None:
    check_exposure(ListenSettings(host="127.0.0.1", tokens=()))
    check_exposure(ListenSettings(host="::", tokens=(TOKEN,), certfile="c", keyfile="k"))
    assert is_loopback("localhost") and is_loopback("::1") and not is_loopback("example.org")


def _certificate(tmp_path: Path, name: str, *, passphrase: bytes | None = None
                 ) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key, as NAME.crt and NAME.key."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(1).not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(days=1)).sign(key, hashes.SHA256()))
    encryption: serialization.KeySerializationEncryption = \
        serialization.BestAvailableEncryption(passphrase) if passphrase \
        else serialization.NoEncryption()
    cert_file, key_file = tmp_path / f"{name}.crt", tmp_path / f"{name}.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8, encryption))
    return cert_file, key_file


@pytest.mark.parametrize(("mistake", "option", "message"), [
    ("the key of another certificate", "--tls-key", "does not belong to"),
    ("the certificate and the key swapped", "--tls-cert", "no certificate"),
    ("the chain file as the key", "--tls-key", "not a private key"),
    ("a key protected by a passphrase", "--tls-key", "passphrase"),
])
async def test_a_tls_certificate_or_key_that_cannot_be_used_is_refused_before_serving(
        tmp_path: Path, mistake: str, option: str, message: str) -> None:
    cert, key = _certificate(tmp_path, "mine")
    _, other_key = _certificate(tmp_path, "other")
    locked_cert, locked_key = _certificate(tmp_path, "locked", passphrase=b"secret")
    chain_file = tmp_path / "chain.toml"
    chain_file.write_text("[agent]\ncommand = ['x']\n")
    certfile, keyfile = {
        "the key of another certificate": (cert, other_key),
        "the certificate and the key swapped": (key, cert),
        "the chain file as the key": (cert, chain_file),
        "a key protected by a passphrase": (locked_cert, locked_key),
    }[mistake]
    announced: list[tuple[str, str]] = []
    chain = parse_chain({"agent": {"command": [sys.executable, "-c", "pass"]}}, file="c.toml")
    settings = ListenSettings(port=0, tokens=(TOKEN,), certfile=str(certfile),
                              keyfile=str(keyfile), handle_signals=False)
    # Before the fix the server said it was serving, then failed inside hypercorn with an
    # internal error (an ExceptionGroup around an ssl.SSLError), or prompted for the
    # passphrase on the terminal.
    with pytest.raises(ConfigError) as refused:
        await serve_listener(chain, settings, ready=announced.append)
    assert not announced
    assert refused.value.field == option, str(refused.value)
    assert message in str(refused.value)


def test_a_short_token_is_refused_naming_where_it_came_from(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from conductor.cli.serve import read_tokens

    monkeypatch.setenv("ACP_CONDUCTOR_TOKEN", "short")
    with pytest.raises(ConfigError) as from_env:
        read_tokens(None, "ACP_CONDUCTOR_TOKEN", no_token=False)
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# one per person\n{TOKEN}\nshort\n")
    tokens.chmod(0o600)
    with pytest.raises(ConfigError) as from_file:
        read_tokens(str(tokens), "ACP_CONDUCTOR_TOKEN", no_token=False)
    # Before, both said only "token: a token of 5 characters is too easy to guess": which
    # token, set where (a variable exported long ago, a file's line) was the user's to find.
    assert from_env.value.field == "$ACP_CONDUCTOR_TOKEN", str(from_env.value)
    assert (from_file.value.file, from_file.value.field) == (str(tokens), "line 3")
    assert "too easy to guess" in str(from_env.value) and "secrets" in str(from_file.value)


async def test_serving_a_chain_with_an_agent_as_a_proxy_names_the_option_to_drop() -> None:
    chain = parse_chain({"agent": {"command": [sys.executable, "-c", "pass"]}}, file="c.toml")
    settings = ListenSettings(port=0, tokens=(TOKEN,), mode="proxy", handle_signals=False)
    with pytest.raises(ConfigError) as refused:
        await serve_listener(chain, settings)
    # Before, the hint said "run without `proxy`": serve has no `proxy`, it has --as-proxy.
    assert refused.value.field == "agent" and "--as-proxy" in str(refused.value)


def test_a_token_file_saved_with_a_bom_admits_its_first_token(tmp_path: Path) -> None:
    from conductor.cli.serve import read_tokens
    from conductor.transport.http import Gate

    tokens = tmp_path / "tokens"
    tokens.write_bytes(f"\ufeff{TOKEN}\n".encode())  # Notepad saves UTF-8 with a BOM
    tokens.chmod(0o600)
    gate = Gate(read_tokens(str(tokens), "ACP_CONDUCTOR_TOKEN", no_token=False))
    scope = {"type": "http", "headers": [(b"authorization", f"Bearer {TOKEN}".encode())]}
    # Before, the BOM was part of the first token: the right token got 401 "wrong bearer token".
    assert gate.admit(scope) == 0


def test_a_token_no_client_could_send_is_refused_at_start_naming_its_line(
        tmp_path: Path) -> None:
    from conductor.cli.serve import read_tokens

    tokens = tmp_path / "tokens"
    tokens.write_text(f"{TOKEN}\npässwörd-{TOKEN}\n", encoding="utf-8")
    tokens.chmod(0o600)
    # Before, it was accepted, and every client sending it got 401 "wrong bearer token":
    # a header is read as Latin-1, the file as UTF-8, so the two never compared equal.
    with pytest.raises(ConfigError) as refused:
        read_tokens(str(tokens), "ACP_CONDUCTOR_TOKEN", no_token=False)
    assert (refused.value.file, refused.value.field) == (str(tokens), "line 2")
    assert "ASCII" in str(refused.value)


def test_a_token_file_that_is_not_utf8_is_a_config_error_naming_its_line(
        tmp_path: Path) -> None:
    from conductor.cli.serve import read_tokens

    tokens = tmp_path / "tokens"
    tokens.write_bytes(f"{TOKEN}\n\xff{TOKEN}\n".encode("latin-1"))
    tokens.chmod(0o600)
    # Before, serve ended with "internal error: UnicodeDecodeError".
    with pytest.raises(ConfigError) as refused:
        read_tokens(str(tokens), "ACP_CONDUCTOR_TOKEN", no_token=False)
    assert str(refused.value) == (f"{tokens}: not UTF-8: byte 0xff on line 2 (hint: save it "
                                  "as UTF-8; a token is printable ASCII)")

"""Env-server authentication (HMAC challenge-response on a shared token) and TLS, against real
servers on loopback: right / wrong / no token, replayed handshake, mutual proof, the refusal to
listen beyond loopback without a token, the manager reading the same secret, TLS with a CA made
in the test (trustme)."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

import pytest
import trio
import trio.testing

from agentfly_jax.envs import EnvManager, EnvUnavailable
from envservers import auth, protocol
from envservers.client import AuthenticationFailed, Connection, ConnectionLost
from envservers_helpers import running_server

pytestmark = pytest.mark.timeout(120)
TOKEN = secrets.token_hex(24).encode()


@pytest.fixture(scope="module")
def token_file(tmp_path_factory):
  path = tmp_path_factory.mktemp("auth") / "token"
  path.write_bytes(TOKEN + b"\n")
  return str(path)


@pytest.fixture(scope="module")
def server(token_file):
  with running_server("echo=4:1", extra=("--token-file", token_file)) as s:
    yield s


async def _raw(address):
  host, port = protocol.parse_address(address)
  stream = await trio.open_tcp_stream(host, port)
  return stream, protocol.FrameReader(stream)


async def _next(reader) -> dict | None:
  with trio.fail_after(10):
    body = await reader.read_body()
  return None if body is None else protocol.decode_body(body)


@pytest.mark.trio
async def test_right_token_serves_and_counts(server):
  conn = await Connection.open(server.address, token=TOKEN)
  await conn.call("acquire", {"env": "echo", "chain_id": "a"})
  assert (await conn.call("step", {"env": "echo", "chain_id": "a", "action": "hi"}))["observation"] == "hi"
  stats = await conn.call("stats")
  assert stats["auth_ok"] >= 1
  await conn.aclose()


@pytest.mark.trio
async def test_no_token_gets_one_error_then_close(server):
  stream, reader = await _raw(server.address)
  hello = await _next(reader)
  assert hello["hello"]["auth"] == auth.SCHEME and len(hello["hello"]["nonce"]) == 64
  await stream.send_all(protocol.encode_frame({"id": 5, "op": "health"}))
  reply = await _next(reader)
  assert (
    reply == {"id": 5, "ok": False, "error": {"type": "AuthRequired", "message": reply["error"]["message"]}}
    and "needs authentication" in reply["error"]["message"]
  )
  assert await _next(reader) is None  # closed; the request was never run
  await stream.aclose()
  # The client library without a token: it fails at once, naming what to set.
  with pytest.raises(AuthenticationFailed, match="needs authentication: set \\$AGENTFLY_ENV_TOKEN"):
    await Connection.open(server.address, token=None)


@pytest.mark.trio
async def test_wrong_token_is_refused(server):
  before = await _stats(server)
  with pytest.raises(AuthenticationFailed, match="refused the token: AuthFailed"):
    await Connection.open(server.address, token=b"not-the-token-but-long-enough")
  after = await _stats(server)
  assert after["auth_failures"] >= before["auth_failures"] + 1


async def _stats(server):
  conn = await Connection.open(server.address, token=TOKEN)
  try:
    return await conn.call("stats")
  finally:
    await conn.aclose()


@pytest.mark.trio
async def test_replayed_handshake_fails(server):
  # A recorded, valid handshake ...
  stream, reader = await _raw(server.address)
  nonce = (await _next(reader))["hello"]["nonce"]
  client_nonce = auth.new_nonce()
  recorded = protocol.encode_frame(
    {"id": 1, "op": "auth", "args": {"client_nonce": client_nonce, "mac": auth.client_mac(TOKEN, nonce, client_nonce)}}
  )
  await stream.send_all(recorded)
  assert (await _next(reader))["ok"] is True
  await stream.aclose()
  # ... replayed byte for byte on a new connection: a new nonce, so the MAC no longer fits.
  stream, reader = await _raw(server.address)
  assert (await _next(reader))["hello"]["nonce"] != nonce
  await stream.send_all(recorded + protocol.encode_frame({"id": 2, "op": "health"}))
  reply = await _next(reader)
  assert reply["ok"] is False and reply["error"]["type"] == "AuthFailed"
  assert await _next(reader) is None  # closed; `health` never ran
  await stream.aclose()


@pytest.mark.trio
async def test_secret_never_on_the_wire_and_server_must_prove_it():
  """The client's bytes never contain the token; a server that does not know the token cannot
  complete the handshake (its proof is wrong), so the client refuses it."""
  for server_token, should_pass in ((TOKEN, True), (b"an-impostor-server-token", False)):
    client_side, server_side = trio.testing.memory_stream_pair()
    sent = bytearray()
    reader = protocol.FrameReader(server_side)

    async def fake_server():
      nonce = auth.new_nonce()
      await server_side.send_all(protocol.encode_frame({"hello": {"auth": auth.SCHEME, "nonce": nonce}}))
      body = await reader.read_body()
      sent.extend(body)
      args = protocol.decode_body(body)["args"]
      await server_side.send_all(
        protocol.encode_frame(
          {"id": 0, "ok": True, "result": {"server_mac": auth.server_mac(server_token, nonce, args["client_nonce"])}}
        )
      )

    from envservers.client import _handshake

    async with trio.open_nursery() as nursery:
      nursery.start_soon(fake_server)
      if should_pass:
        await _handshake(client_side, protocol.FrameReader(client_side), TOKEN, "test")
      else:
        with pytest.raises(AuthenticationFailed, match="could not prove"):
          await _handshake(client_side, protocol.FrameReader(client_side), TOKEN, "test")
    assert TOKEN not in sent and TOKEN.hex().encode() not in sent and b"mac" in sent


@pytest.mark.trio
async def test_client_with_token_refuses_a_server_without_auth():
  with running_server("echo=1:0") as plain:
    with pytest.raises(AuthenticationFailed, match="does not ask for authentication"):
      await Connection.open(plain.address, token=TOKEN)


def test_non_loopback_without_token_refuses_to_start(token_file, tmp_path):
  env = {k: v for k, v in os.environ.items() if k not in (auth.TOKEN_ENV, auth.TOKEN_FILE_ENV)}
  for host in ("0.0.0.0", "::", "example.org"):
    result = subprocess.run(
      [sys.executable, "-m", "envservers", "--host", host, "--port", "0"],
      capture_output=True,
      text=True,
      timeout=60,
      env=env,
    )
    assert result.returncode == 2, result
    assert f"refusing to listen on '{host}' without authentication" in result.stderr
    assert "AGENTFLY_ENV_TOKEN" in result.stderr
  short = tmp_path / "short"
  short.write_text("abc")
  result = subprocess.run(
    [sys.executable, "-m", "envservers", "--token-file", str(short)],
    capture_output=True,
    text=True,
    timeout=60,
    env=env,
  )
  assert result.returncode == 2 and "at least 16" in result.stderr and "short" in result.stderr
  # With a token it starts on all interfaces.
  with running_server("echo=1:0", extra=("--host", "0.0.0.0", "--token-file", token_file)) as s:

    async def ping():
      conn = await Connection.open(f"127.0.0.1:{s.address.rsplit(':', 1)[1]}", token=TOKEN)
      return (await conn.call("health"))["status"]

    assert trio.run(ping) == "ok"


def test_manager_reads_the_token_from_the_environment(server, monkeypatch):
  async def one_step(manager):
    env = await manager.acquire("echo", "m")
    observation = (await env.step("ok")).observation
    await manager.aclose()
    return observation

  monkeypatch.setenv(auth.TOKEN_ENV, TOKEN.decode())
  assert trio.run(one_step, EnvManager([server.address])) == "ok"
  monkeypatch.setenv(auth.TOKEN_ENV, "a-wrong-token-of-enough-length")
  with pytest.raises(EnvUnavailable, match="refused the token"):
    trio.run(one_step, EnvManager([server.address], acquire_timeout_s=600))  # fails at once
  monkeypatch.delenv(auth.TOKEN_ENV)
  with pytest.raises(EnvUnavailable, match="needs authentication: set \\$AGENTFLY_ENV_TOKEN"):
    trio.run(one_step, EnvManager([server.address], acquire_timeout_s=600))


def test_tls_with_token(token_file, tmp_path):
  trustme = pytest.importorskip("trustme")
  ca = trustme.CA()
  cert = ca.issue_cert("127.0.0.1", "localhost")
  cert_file, key_file, ca_file = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "ca.pem"
  cert.private_key_and_cert_chain_pem.write_to_path(str(cert_file))
  cert.private_key_pem.write_to_path(str(key_file))
  ca.cert_pem.write_to_path(str(ca_file))
  with running_server(
    "echo=2:1", extra=("--token-file", token_file, "--tls-cert", str(cert_file), "--tls-key", str(key_file))
  ) as s:

    async def main():
      good = await Connection.open(s.address, token=TOKEN, ssl_context=auth.client_ssl_context(str(ca_file)))
      await good.call("acquire", {"env": "echo", "chain_id": "t"})
      echoed = await good.call("step", {"env": "echo", "chain_id": "t", "action": "over tls"})
      # Plain TCP to a TLS server, and TLS that does not trust this CA: both fail to connect.
      with pytest.raises(ConnectionLost):
        await Connection.open(s.address, connect_timeout_s=2, token=TOKEN, ssl_context=None)
      with pytest.raises(ConnectionLost, match="CERTIFICATE_VERIFY_FAILED"):
        await Connection.open(s.address, token=TOKEN, ssl_context=auth.client_ssl_context(None))
      stats = await good.call("stats")
      await good.aclose()
      return echoed["observation"], stats

    observation, stats = trio.run(main)
  assert observation == "over tls" and stats["tls_failures"] >= 1


def test_manager_uses_tls_from_the_environment(token_file, tmp_path, monkeypatch):
  trustme = pytest.importorskip("trustme")
  ca = trustme.CA()
  cert = ca.issue_cert("127.0.0.1")
  cert.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "c.pem"))
  ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
  with running_server(
    "echo=1:1",
    extra=("--token-file", token_file, "--tls-cert", str(tmp_path / "c.pem"), "--tls-key", str(tmp_path / "c.pem")),
  ) as s:
    monkeypatch.setenv(auth.TOKEN_FILE_ENV, token_file)
    monkeypatch.setenv(auth.TLS_CA_ENV, str(tmp_path / "ca.pem"))

    async def main():
      manager = EnvManager([s.address])
      env = await manager.acquire("echo", "x")
      observation = (await env.step("tls manager")).observation
      await manager.aclose()
      return observation

    assert trio.run(main) == "tls manager"


@pytest.mark.trio
async def test_silent_connection_is_closed_after_the_handshake_timeout():
  import envservers.envs  # noqa: F401  (registers the built-in env types)
  from envservers.server import EnvServer

  server = EnvServer({"echo": (1, 0)}, token=TOKEN, handshake_timeout_s=0.5)
  async with trio.open_nursery() as nursery:
    port = await nursery.start(lambda task_status: server.serve("127.0.0.1", 0, task_status=task_status))
    stream, reader = await _raw(f"127.0.0.1:{port}")
    assert (await _next(reader))["hello"]["auth"] == auth.SCHEME
    reply = await _next(reader)  # says nothing: one error reply, then closed
    assert reply["ok"] is False and reply["error"]["type"] == "AuthRequired"
    assert await _next(reader) is None
    assert server.counters["auth_failures"] == 1 and server.counters["auth_ok"] == 0
    await stream.aclose()
    server.shutdown()
  with pytest.raises(auth.AuthError, match="refusing to listen on '0.0.0.0'"):
    await EnvServer({"echo": (1, 0)}).serve("0.0.0.0", 0)

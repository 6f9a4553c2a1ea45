"""Shared-secret authentication and TLS for env servers (see "Security model" in PROTOCOL.md).

The secret comes from `--token-file` / `AGENTFLY_ENV_TOKEN_FILE` (a file) or `AGENTFLY_ENV_TOKEN`.
At connection start a server that has one sends a hello frame with a fresh random nonce; the
client answers with its own nonce and HMAC-SHA256(secret, "client" | server nonce | client
nonce); the server checks it in constant time and answers with HMAC(secret, "server" | client
nonce | server nonce), so the client knows the server holds the secret too. The secret is never
on the wire, and a recorded handshake is worthless on a new connection (its nonce differs).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
import ssl

TOKEN_ENV = "AGENTFLY_ENV_TOKEN"
TOKEN_FILE_ENV = "AGENTFLY_ENV_TOKEN_FILE"
TLS_CA_ENV = "AGENTFLY_ENV_TLS_CA"
MIN_TOKEN_BYTES = 16
SCHEME = "hmac-sha256-v1"
NONCE_BYTES = 32


class AuthError(Exception):
  """A handshake that failed, or a token/TLS setting that cannot be used (message says which)."""


def load_token(token_file: str | None = None) -> bytes | None:
  """The shared secret: `token_file`, else $AGENTFLY_ENV_TOKEN_FILE, else $AGENTFLY_ENV_TOKEN
  (surrounding whitespace stripped); None if none is set. Raises AuthError naming the source if
  it is unreadable or shorter than 16 bytes."""
  token_file = token_file or os.environ.get(TOKEN_FILE_ENV) or None
  if token_file:
    source = f"token file {token_file!r}"
    try:
      with open(token_file, "rb") as f:
        token = f.read().strip()
    except OSError as e:
      raise AuthError(f"cannot read the {source}: {e.strerror or e}") from None
  else:
    text = os.environ.get(TOKEN_ENV)
    if text is None:
      return None
    source, token = f"${TOKEN_ENV}", text.strip().encode("utf-8")
  if len(token) < MIN_TOKEN_BYTES:
    raise AuthError(
      f"the {source} holds {len(token)} bytes; a token needs at least "
      f"{MIN_TOKEN_BYTES} (e.g. `python -c 'import secrets; "
      f"print(secrets.token_hex(32))'`)"
    )
  return token


def is_loopback(host: str) -> bool:
  """True for 'localhost' and loopback IP addresses (127.0.0.0/8, ::1)."""
  if host.strip("[]").lower() == "localhost":
    return True
  try:
    return ipaddress.ip_address(host.strip("[]")).is_loopback
  except ValueError:
    return False  # a host name or "" / 0.0.0.0: may be reachable from other machines


def check_bind(host: str, token: bytes | None) -> None:
  """Raises AuthError if a server on `host` would accept connections from other machines without
  a token."""
  if token is None and not is_loopback(host):
    raise AuthError(
      f"refusing to listen on {host or '(all interfaces)'!r} without authentication: anyone "
      f"who reaches the port could run code in its sandboxes. Set {TOKEN_ENV} or pass "
      f"--token-file (the same secret on every trainer), or bind to 127.0.0.1"
    )


def new_nonce() -> str:
  return secrets.token_hex(NONCE_BYTES)


def _mac(token: bytes, role: str, first: str, second: str) -> str:
  message = f"{SCHEME}|{role}|{first}|{second}".encode("ascii")
  return hmac.new(token, message, hashlib.sha256).hexdigest()


def client_mac(token: bytes, server_nonce: str, client_nonce: str) -> str:
  """What the client proves: HMAC(secret, scheme | "client" | server nonce | client nonce)."""
  return _mac(token, "client", server_nonce, client_nonce)


def server_mac(token: bytes, server_nonce: str, client_nonce: str) -> str:
  """What the server proves back (another message, so a client's MAC is no server proof)."""
  return _mac(token, "server", client_nonce, server_nonce)


def macs_equal(expected: str, got) -> bool:
  """Constant-time comparison of hex MACs (False for anything that is not a str)."""
  return isinstance(got, str) and hmac.compare_digest(expected.encode("ascii"), got.encode("utf-8", "replace"))


def server_ssl_context(cert_file: str, key_file: str) -> ssl.SSLContext:
  """A TLS server context (TLS 1.2+) from PEM files; AuthError names a file it cannot load."""
  context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
  context.minimum_version = ssl.TLSVersion.TLSv1_2
  try:
    context.load_cert_chain(cert_file, key_file)
  except (OSError, ssl.SSLError) as e:
    raise AuthError(f"cannot load the TLS certificate {cert_file!r} / key {key_file!r}: {e}") from None
  return context


def client_ssl_context(ca_file: str | None = None) -> ssl.SSLContext:
  """A TLS client context that verifies the server against `ca_file` (else the system CAs)."""
  try:
    context = ssl.create_default_context(cafile=ca_file)
  except (OSError, ssl.SSLError) as e:
    raise AuthError(f"cannot load the TLS CA file {ca_file!r}: {e}") from None
  context.minimum_version = ssl.TLSVersion.TLSv1_2
  return context


def default_client_ssl_context() -> ssl.SSLContext | None:
  """TLS for clients if $AGENTFLY_ENV_TLS_CA names a CA file, else None (plain TCP)."""
  ca_file = os.environ.get(TLS_CA_ENV)
  return client_ssl_context(ca_file) if ca_file else None

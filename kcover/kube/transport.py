"""HTTP to one API server: where it is, how to trust it, who to say we are; one aiohttp session.

Owns finding the server and its credentials (in-cluster service account; a kubeconfig's server, CA,
client certificate and token, inline or in files; insecure-skip-tls-verify) and sending a request with
them. The service-account token is re-read from its file at most every `TOKEN_REREAD_SECONDS`, as
client-go does, so a rotated (bound) token is picked up. A proxy the environment names for the server
(`HTTPS_PROXY`, `HTTP_PROXY`, `NO_PROXY`) is looked up once per session, not per request. A kubeconfig user that authenticates through
an `exec` plugin or an `auth-provider` is handed to kubernetes-asyncio's loader, imported only then:
its client package loads hundreds of generated modules (about 140 ms and 35 MiB), which the roles,
running in-cluster, never pay.

`Sender` is what a `KubeClient` sends through: `Transport` here, or the simulated cluster's
in-process transport (`kcover.sim.inprocess`), which tests and the playground use with no socket.

It does not interpret responses (`client.py` maps errors and parses JSON) and does not retry
(`retrying`). How it fails: `errors.ConfigError` for credentials that cannot be used; aiohttp errors
and timeouts from `send` propagate to the caller.
"""

from __future__ import annotations

import base64
import contextlib
import os
import ssl
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol
from urllib.parse import urlencode

import aiohttp
import orjson
import yaml
import yarl

from kcover import errors

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REREAD_SECONDS = 60.0
"""Seconds a token read from a file is reused before the file is read again (client-go: one minute)."""
READ_BUFFER_BYTES = 2**21
"""aiohttp's read buffer per response: a list page of 500 pods is about 1-2 MiB."""

TokenSource = Callable[[], Awaitable[str]]
"""Returns the `Authorization` header's value ("Bearer ..."), or "" for none."""


class Body(Protocol):
    """A response body as the client reads it (aiohttp's `StreamReader` has these)."""

    async def read(self, n: int = -1) -> bytes: ...

    def iter_any(self) -> Any:
        """Async iterator over chunks as they arrive."""
        ...

    def __aiter__(self) -> Any:
        """Async iterator over lines."""
        ...


class Response(Protocol):
    """The part of `aiohttp.ClientResponse` the client uses."""

    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def content_type(self) -> str: ...

    @property
    def content(self) -> Body: ...

    async def read(self) -> bytes: ...

    async def __aenter__(self) -> Any: ...

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> Any: ...


class Sender(Protocol):
    """Sends one request to one API server (`Transport`, or the simulated cluster's in-process transport)."""

    @property
    def host(self) -> str: ...

    async def send(self, method: str, path: str, *, query: Sequence[tuple[str, str]], headers: Mapping[str, str],
                   body: Any, timeout: float | aiohttp.ClientTimeout | None) -> Response: ...

    async def close(self) -> None: ...

    def fork(self) -> Sender:
        """The same server and credentials for another event loop (a thread); raises `errors.KcoverError`
        where that cannot be."""
        ...


class FileToken:
    """A bearer token read from a file, re-read at most every `TOKEN_REREAD_SECONDS`."""

    def __init__(self, path: str | os.PathLike[str], *, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = Path(path)
        self._clock = clock
        self._value = ""
        self._read_at = -TOKEN_REREAD_SECONDS

    async def __call__(self) -> str:
        now = self._clock()
        if now - self._read_at >= TOKEN_REREAD_SECONDS or not self._value:
            try:
                self._value = self.path.read_text(encoding="utf-8").strip()
            except OSError as exc:
                if not self._value:
                    raise errors.ConfigError(f"token file {self.path} cannot be read: {exc}") from exc
            self._read_at = now
        return f"Bearer {self._value}" if self._value else ""


def static_token(value: str) -> TokenSource:
    async def token() -> str:
        return value
    return token


class Transport:
    """One API server over one aiohttp session (connection pool). Build with `from_kubeconfig`,
    `in_cluster` or `from_configuration`; `close()` when done."""

    def __init__(self, host: str, *, ssl_context: ssl.SSLContext | None = None, token: TokenSource | None = None,
                 headers: Mapping[str, str] | None = None, server_hostname: str | None = None,
                 pool_size: int = 100) -> None:
        self.host = host.rstrip("/")
        self._ssl: ssl.SSLContext | bool = ssl_context if ssl_context is not None else False
        self._token = token
        self.headers = dict(headers or {})
        """Sent with every request (e.g. `Impersonate-User`)."""
        self._server_hostname = server_hostname
        self._pool_size = pool_size
        self._session: aiohttp.ClientSession | None = None
        self._proxy: dict[str, Any] = {}

    def fork(self) -> Transport:
        """The same server and credentials over a session of its own, for another event loop (a thread)."""
        return Transport(self.host, ssl_context=self._ssl if isinstance(self._ssl, ssl.SSLContext) else None,
                         token=self._token, headers=self.headers, server_hostname=self._server_hostname, pool_size=2)

    @property
    def session(self) -> aiohttp.ClientSession:
        """Created on first use, inside the running loop.

        The proxy the environment names for the API server (`HTTPS_PROXY`, `NO_PROXY`, ...: aiohttp's own
        reading of them) is looked up here, once: a session that trusts the environment looks it up again on
        every request, and `~/.netrc` with it, each time in a thread."""
        if self._session is None:
            with contextlib.suppress(LookupError):
                proxy, proxy_auth = aiohttp.helpers.get_env_proxy_for_url(yarl.URL(self.host))
                self._proxy = {"proxy": proxy, "proxy_auth": proxy_auth}
            connector = aiohttp.TCPConnector(limit=self._pool_size, ssl=self._ssl)
            self._session = aiohttp.ClientSession(connector=connector, read_bufsize=READ_BUFFER_BYTES)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def send(self, method: str, path: str, *, query: Sequence[tuple[str, str]], headers: Mapping[str, str],
                   body: Any, timeout: float | aiohttp.ClientTimeout | None) -> aiohttp.ClientResponse:
        """Send one request; `body` is bytes (sent as is), None, or JSON-able (encoded with orjson)."""
        url = self.host + path
        if query:
            url += "?" + urlencode(query)
        all_headers = {**self.headers, **headers}
        if self._token is not None:
            auth = await self._token()
            if auth:
                all_headers["Authorization"] = auth
        data = body if body is None or isinstance(body, bytes) else orjson.dumps(body, option=orjson.OPT_NON_STR_KEYS)
        if timeout is None or isinstance(timeout, aiohttp.ClientTimeout):
            client_timeout = timeout or aiohttp.ClientTimeout()
        else:
            client_timeout = aiohttp.ClientTimeout(total=timeout)
        session = self.session
        extra: dict[str, Any] = {"server_hostname": self._server_hostname} if self._server_hostname else {}
        return await session.request(method, yarl.URL(url, encoded=True), data=data, headers=all_headers,
                                          timeout=client_timeout, **self._proxy, **extra)

    @classmethod
    def from_configuration(cls, configuration: Any, *, headers: Mapping[str, str] | None = None) -> Transport:
        """From a kubernetes-asyncio `Configuration` (its token, refreshed through the configuration's hook)."""
        async def token() -> str:
            value = await configuration.get_api_key_with_prefix("BearerToken", alias="authorization")
            return str(value or "")

        host = str(configuration.host)
        context = None
        if host.startswith("https"):
            context = _ssl_context(cafile=configuration.ssl_ca_cert, verify=bool(configuration.verify_ssl),
                                   cert_file=configuration.cert_file, key_file=configuration.key_file)
        return cls(host, ssl_context=context, token=token, headers=headers,
                   server_hostname=getattr(configuration, "tls_server_name", None) or None)


def _ssl_context(*, cafile: str | None = None, cadata: str | None = None, verify: bool = True,
                 cert_file: str | None = None, key_file: str | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=cafile, cadata=cadata)
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if cert_file:
        context.load_cert_chain(cert_file, keyfile=key_file)
    return context


def in_cluster(environ: Mapping[str, str], *, directory: Path = SERVICE_ACCOUNT_DIR) -> Transport:
    """The pod's service account: KUBERNETES_SERVICE_HOST/PORT, its CA and its (rotating) token."""
    host, port = environ.get("KUBERNETES_SERVICE_HOST", ""), environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise errors.ConfigError("in-cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set")
    if ":" in host:
        host = f"[{host}]"
    ca = directory / "ca.crt"
    try:
        context = _ssl_context(cafile=str(ca))
    except (OSError, ssl.SSLError) as exc:
        raise errors.ConfigError(f"in-cluster: the service account CA {ca} cannot be used: {exc}") from exc
    token = directory / "token"
    if not os.access(token, os.R_OK):
        raise errors.ConfigError(f"in-cluster: the service account token {token} cannot be read")
    return Transport(f"https://{host}:{port}", ssl_context=context, token=FileToken(token))


def _named(items: Any, name: str, what: str) -> dict[str, Any]:
    for item in items or []:
        if isinstance(item, dict) and item.get("name") == name:
            found = item.get(what)
            return found if isinstance(found, dict) else {}
    raise errors.ConfigError(f"kubeconfig: no {what} named {name!r}")


def _file_or_data(entry: Mapping[str, Any], key: str, base: Path) -> tuple[str | None, bytes | None]:
    """A kubeconfig `key` (a path, relative to the file) or `key-data` (base64)."""
    data = entry.get(f"{key}-data")
    if data:
        try:
            return None, base64.b64decode(data)
        except ValueError as exc:
            raise errors.ConfigError(f"kubeconfig: {key}-data is not base64") from exc
    path = entry.get(key)
    if path:
        return str((base / os.path.expanduser(str(path))).resolve()), None
    return None, None


def needs_plugin(kubeconfig: Mapping[str, Any], context_name: str = "") -> bool:
    """Whether the current context's user authenticates through `exec` or `auth-provider`."""
    try:
        user = _user(kubeconfig, context_name)
    except errors.ConfigError:
        return False
    return bool(user.get("exec") or user.get("auth-provider"))


def _context(kubeconfig: Mapping[str, Any], context_name: str) -> dict[str, Any]:
    name = context_name or kubeconfig.get("current-context") or ""
    if not name:
        raise errors.ConfigError("kubeconfig: no current-context")
    return _named(kubeconfig.get("contexts"), str(name), "context")


def _user(kubeconfig: Mapping[str, Any], context_name: str) -> dict[str, Any]:
    user_name = _context(kubeconfig, context_name).get("user")
    return _named(kubeconfig.get("users"), str(user_name), "user") if user_name else {}


def read_kubeconfig(path: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise errors.ConfigError(f"kubeconfig {path} cannot be read: {exc}") from exc
    if not isinstance(data, dict):
        raise errors.ConfigError(f"kubeconfig {path}: not a mapping")
    return data


def from_kubeconfig(path: str, *, context_name: str = "") -> Transport:
    """The kubeconfig's current context: server, CA, client certificate, token or token file, basic auth.
    Raises ConfigError; a user with `exec` or `auth-provider` needs `client.connect` (kubernetes-asyncio)."""
    config = read_kubeconfig(path)
    base = Path(path).resolve().parent
    context = _context(config, context_name)
    cluster = _named(config.get("clusters"), str(context.get("cluster") or ""), "cluster")
    user = _user(config, context_name)
    if user.get("exec") or user.get("auth-provider"):
        raise errors.ConfigError("kubeconfig: exec and auth-provider users need kubernetes-asyncio's loader")
    server = str(cluster.get("server") or "")
    if not server:
        raise errors.ConfigError("kubeconfig: the cluster has no server")
    context_ssl = None
    if server.startswith("https"):
        ca_file, ca_data = _file_or_data(cluster, "certificate-authority", base)
        cert_file, cert_data = _file_or_data(user, "client-certificate", base)
        key_file, key_data = _file_or_data(user, "client-key", base)
        try:
            with tempfile.TemporaryDirectory(prefix="kcover-kubeconfig-") as tmp:
                if cert_data is not None:
                    cert_file = str(Path(tmp) / "cert")
                    Path(cert_file).write_bytes(cert_data)
                if key_data is not None:
                    key_file = str(Path(tmp) / "key")
                    Path(key_file).write_bytes(key_data)
                context_ssl = _ssl_context(cafile=ca_file, cadata=ca_data.decode() if ca_data else None,
                                           verify=not cluster.get("insecure-skip-tls-verify"),
                                           cert_file=cert_file, key_file=key_file)
        except (OSError, ssl.SSLError, UnicodeDecodeError) as exc:
            raise errors.ConfigError(f"kubeconfig {path}: TLS credentials cannot be used: {exc}") from exc
    token: TokenSource | None = None
    if user.get("token"):
        token = static_token(f"Bearer {user['token']}")
    elif user.get("tokenFile"):
        token = FileToken(base / os.path.expanduser(str(user["tokenFile"])))
    elif user.get("username") and user.get("password"):
        basic = base64.b64encode(f"{user['username']}:{user['password']}".encode()).decode()
        token = static_token(f"Basic {basic}")
    return Transport(server, ssl_context=context_ssl, token=token,
                     server_hostname=str(cluster.get("tls-server-name") or "") or None)

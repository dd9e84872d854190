"""The transport: kubeconfig and in-cluster credentials as kcover reads them, without kubernetes-asyncio."""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from kcover import errors
from kcover.kube import client, transport
from kcover.sim import server as simserver


def _kubeconfig(tmp_path: Path, *, user: dict[str, Any], cluster: dict[str, Any]) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "clusters": [{"name": "k", "cluster": cluster}], "users": [{"name": "u", "user": user}]}))
    return str(path)


async def test_a_token_kubeconfig_reaches_the_server(tmp_path: Path) -> None:
    async with simserver.SimServer() as srv:
        path = _kubeconfig(tmp_path, user={"token": simserver.TOKEN}, cluster={"server": srv.url})
        async with await client.connect(path) as kube:
            listed = await kube.request("GET", "/api/v1/namespaces")
    assert "default" in {ns["metadata"]["name"] for ns in listed["items"]}


def test_reading_a_kubeconfig_loads_no_kubernetes_asyncio(tmp_path: Path) -> None:
    path = _kubeconfig(tmp_path, user={"token": "t"}, cluster={"server": "http://127.0.0.1:1"})
    code = ("import sys; from kcover.kube import client, transport; transport.from_kubeconfig(sys.argv[1]); "
            "print(any(m.startswith('kubernetes_asyncio') for m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "False"


async def test_requests_carry_the_token_the_headers_and_the_body_as_sent(tmp_path: Path) -> None:
    seen: list[tuple[str, str, str, bytes]] = []

    async def echo(request: web.Request) -> web.Response:
        seen.append((request.headers.get("Authorization", ""), request.headers.get("Impersonate-User", ""),
                     request.rel_url.raw_query_string, await request.read()))
        return web.json_response({})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", echo)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        path = _kubeconfig(tmp_path, user={"token": "t0k"}, cluster={"server": f"http://127.0.0.1:{port}"})
        api = transport.from_kubeconfig(path)
        api.headers["Impersonate-User"] = "tenant"
        async with client.KubeClient(api) as kube:
            await kube.request("PATCH", "/api/v1/nodes/n", query={"labelSelector": "a in (x,y),!b"},
                               body={"k": 1})
            await kube.request("POST", "/api/v1/namespaces/d/events", body=b'{"raw":true}')
    finally:
        await runner.cleanup()
    assert seen == [("Bearer t0k", "tenant", "labelSelector=a+in+%28x%2Cy%29%2C%21b", b'{"k":1}'),
                    ("Bearer t0k", "tenant", "", b'{"raw":true}')]


async def test_the_proxy_the_environment_names_carries_the_requests(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Looked up once per session (not per request in a thread), and still honoured."""
    seen: list[str] = []

    async def proxy(request: web.Request) -> web.Response:
        seen.append(str(request.url))  # a proxied request names the whole target URL
        return web.json_response({"via": "proxy"})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", proxy)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    for name in ("NO_PROXY", "no_proxy", "HTTP_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{port}")
    try:
        path = _kubeconfig(tmp_path, user={"token": "t"}, cluster={"server": "http://apiserver.invalid:6443"})
        async with client.KubeClient(transport.from_kubeconfig(path)) as kube:
            answers = [await kube.request("GET", "/api/v1/namespaces/a"), await kube.request("GET", "/api/v1/nodes")]
    finally:
        await runner.cleanup()
    assert answers == [{"via": "proxy"}, {"via": "proxy"}]
    assert seen == ["http://apiserver.invalid:6443/api/v1/namespaces/a", "http://apiserver.invalid:6443/api/v1/nodes"]


async def test_a_token_file_is_read_again_after_a_minute(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("first\n")
    now = [0.0]
    token = transport.FileToken(token_file, clock=lambda: now[0])
    assert await token() == "Bearer first"
    token_file.write_text("second")
    now[0] = transport.TOKEN_REREAD_SECONDS - 1
    assert await token() == "Bearer first"
    now[0] = transport.TOKEN_REREAD_SECONDS
    assert await token() == "Bearer second"
    token_file.unlink()  # a failed re-read keeps the last token
    now[0] = 3 * transport.TOKEN_REREAD_SECONDS
    assert await token() == "Bearer second"


def test_insecure_skip_tls_verify_and_tls_server_name(tmp_path: Path) -> None:
    path = _kubeconfig(tmp_path, user={"username": "a", "password": "b"},
                       cluster={"server": "https://10.0.0.1:6443", "insecure-skip-tls-verify": True,
                                "tls-server-name": "kubernetes"})
    api = transport.from_kubeconfig(path)
    assert api.host == "https://10.0.0.1:6443"
    assert isinstance(api._ssl, ssl.SSLContext)
    assert api._ssl.verify_mode == ssl.CERT_NONE
    assert api._server_hostname == "kubernetes"


@pytest.mark.parametrize("user", [{"exec": {"command": "aws"}}, {"auth-provider": {"name": "oidc"}}])
def test_exec_and_auth_provider_users_are_left_to_kubernetes_asyncio(tmp_path: Path, user: dict[str, Any]) -> None:
    path = _kubeconfig(tmp_path, user=user, cluster={"server": "https://10.0.0.1:6443"})
    assert transport.needs_plugin(transport.read_kubeconfig(path))
    with pytest.raises(errors.ConfigError, match="kubernetes-asyncio"):
        transport.from_kubeconfig(path)


@pytest.mark.parametrize(("text", "problem"), [
    ("[]", "not a mapping"),
    ('{"contexts": []}', "no current-context"),
    ('{"current-context": "x", "contexts": []}', "no context named 'x'"),
])
def test_unusable_kubeconfigs_are_config_errors(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(text)
    with pytest.raises(errors.ConfigError, match=problem):
        transport.from_kubeconfig(str(path))


def test_in_cluster_needs_the_service_variables_and_the_account_files(tmp_path: Path) -> None:
    with pytest.raises(errors.ConfigError, match="KUBERNETES_SERVICE_HOST"):
        transport.in_cluster({})
    with pytest.raises(errors.ConfigError, match="CA"):
        transport.in_cluster({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"},
                             directory=tmp_path)

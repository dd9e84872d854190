"""The `conformance_api` fixture: the same assertions against the simulated and a real kube-apiserver.

Backends: "sim" (`kcover.sim.server.SimServer`) and "apiserver" (the session's `controlplane` from
tests/backends.py: etcd + kube-apiserver, no kubelet). The real backend is skipped, with the reason,
when its binaries are not built (set KCOVER_CONTROLPLANE_BIN or run tests/controlplane/build.sh),
unless CI=true, where a missing control plane fails the run instead. KCOVER_TEST_BACKENDS leaves out
the backends it does not name.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator

import backends
import pytest
from conformance_client import Api
from kubernetes_asyncio import client, config


@pytest.fixture(params=[b for b in backends.selected_backends() if b in ("sim", "apiserver")])
async def conformance_api(request: pytest.FixtureRequest) -> AsyncIterator[Api]:
    if request.param == "sim":
        from kcover.sim import server as simserver

        async with simserver.SimServer() as srv, client.ApiClient(srv.kube_configuration()) as api_client:
            yield Api(api_client, "sim", compact=srv.store.compact)
    else:
        cp = request.getfixturevalue("controlplane")  # the session's (tests/backends.py)
        cfg = client.Configuration()
        await config.load_kube_config(config_file=cp.kubeconfig_path, client_configuration=cfg)
        async with client.ApiClient(cfg) as api_client:
            yield Api(api_client, "apiserver", compact=lambda _resource: cp.compact())


@pytest.fixture
async def ns(conformance_api: Api) -> AsyncIterator[str]:
    """A fresh namespace for one test, deleted afterwards."""
    name = "conf-" + secrets.token_hex(4)
    await conformance_api.ok("POST", "/api/v1/namespaces", body={"metadata": {"name": name}})
    yield name
    await conformance_api.request("DELETE", f"/api/v1/namespaces/{name}")

"""The `conformance_api` fixture: the same assertions against the simulated and a real kube-apiserver.

Backends: "sim" (`kcover.sim.server.SimServer`, also serving the test CRDs kcover.sim does not carry, as
the real control plane installs them: `TEST_CRDS`) and "apiserver" (the session's `controlplane` from
tests/backends.py: etcd + kube-apiserver, no kubelet, with tests/controlplane/crds installed). The real
backend is skipped, with the reason, when its binaries are not built (set KCOVER_CONTROLPLANE_BIN or run tests/controlplane/build.sh),
unless CI=true, where a missing control plane fails the run instead. KCOVER_TEST_BACKENDS leaves out
the backends it does not name.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from typing import Any

import backends
import pytest
import yaml
from conformance_client import Api
from kubernetes_asyncio import client, config

TEST_CRDS = ("conformance-widgets.yaml",)
"""Test CRDs in tests/controlplane/crds that the simulated server does not serve built in."""


def _test_crds() -> list[dict[str, Any]]:
    return [yaml.safe_load((backends.CONTROLPLANE_DIR / "crds" / name).read_text()) for name in TEST_CRDS]


@pytest.fixture(params=[b for b in backends.selected_backends() if b in ("sim", "apiserver")])
async def conformance_api(request: pytest.FixtureRequest) -> AsyncIterator[Api]:
    if request.param == "sim":
        from kcover.sim import server as simserver

        async with simserver.SimServer(crds=_test_crds()) as srv, \
                client.ApiClient(srv.kube_configuration()) as api_client:
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

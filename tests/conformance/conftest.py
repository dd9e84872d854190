"""The `conformance_api` fixture: the same assertions against the simulated and a real kube-apiserver.

Backends: "sim" (`kcover.sim.server.SimServer`) and "apiserver" (`tests/controlplane/server.py`'s
`ControlPlane`: etcd + kube-apiserver, no kubelet). The real backend is skipped, with the reason,
when its binaries are not built (set KCOVER_CONTROLPLANE_BIN or run tests/controlplane/build.sh),
unless CI=true, where a missing control plane fails the run instead.
"""

from __future__ import annotations

import glob
import os
import secrets
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from conformance_client import Api
from kubernetes_asyncio import client, config

TESTS = Path(__file__).resolve().parent.parent


def _controlplane_available() -> bool:
    env = os.environ.get("KCOVER_CONTROLPLANE_BIN")
    if env and (Path(env) / "kube-apiserver").is_file():
        return True
    cache = os.environ.get("KCOVER_CACHE", str(Path.home() / ".cache" / "kcover"))
    return bool(glob.glob(os.path.join(cache, "controlplane", "k8s-*", "kube-apiserver")))


@pytest.fixture(scope="session")
def _controlplane() -> Iterator[Any]:
    if not _controlplane_available() and os.environ.get("CI") != "true":
        pytest.skip("real kube-apiserver backend: binaries not built (set KCOVER_CONTROLPLANE_BIN or run "
                    "tests/controlplane/build.sh); CI=true makes this a failure")
    sys.path.insert(0, str(TESTS / "controlplane"))
    try:
        import server as controlplane_server  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(TESTS / "controlplane"))
    cp = controlplane_server.ControlPlane()
    cp.start()
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture(params=["sim", "apiserver"])
async def conformance_api(request: pytest.FixtureRequest) -> AsyncIterator[Api]:
    if request.param == "sim":
        from kcover.sim import server as simserver

        async with simserver.SimServer() as srv, client.ApiClient(srv.kube_configuration()) as api_client:
            yield Api(api_client, "sim", compact=srv.store.compact)
    else:
        cp = request.getfixturevalue("_controlplane")
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

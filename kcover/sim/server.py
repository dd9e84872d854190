"""`SimServer`: the simulated Kubernetes API server as one async context manager, and its CLI.

    async with SimServer() as srv:              # listens on 127.0.0.1, a free port
        srv.store.create("pods", {...})         # seed directly (status kept as given)
        cfg = srv.kube_configuration()          # kubernetes_asyncio Configuration
        srv.write_kubeconfig(tmp_path / "kc")   # for kubectl or a subprocess
        srv.faults.throttle_rate = 0.2          # chaos
        srv.request_counts["LIST pods"]         # "<VERB> <resource key>[/<subresource>]"
        srv.append_log("default", "p", "c", "hello")

Owns the lifecycle (bind, serve, close every watch on exit), the wiring of store, logs, faults and
the API server, and its two fronts: loopback HTTP on aiohttp (`url`, `kubeconfig()`, for kubectl and
subprocesses) and an in-process transport with no socket (`client()`, `kcover.sim.inprocess`), which
answer from the same `apiserver.ApiServer`. `SimServer(listen=False)` serves in-process only (no
port is bound), which is what virtual-time tests use. `SimServer(crds=[...])` serves more custom resources
(CustomResourceDefinition documents, as `registry.from_crd` reads them) besides the built-in table; one of
the same group, version and plural as a built-in (kcover's own kinds) replaces it. Store resource keys are listed in `kcover.sim.store`. `python -m kcover.sim.server
--port 8001 --kubeconfig-out /tmp/kc` serves until interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml
from aiohttp import web

from kcover.aio import clock as clocks
from kcover.aio import waiting
from kcover.sim import apiserver, exchange, faults, inprocess, podlogs, registry
from kcover.sim import store as stores

TOKEN = "kcover-sim-token"


class SimServer:
    """A simulated kube-apiserver on loopback HTTP. Any bearer token (or none) is accepted."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, clock: clocks.Clock | None = None,
                 seed: int | None = None, history: int = stores.HISTORY_PER_RESOURCE,
                 bookmark_interval: float = 60.0, listen: bool = True, liveness_interval: float = 1.0,
                 crds: Sequence[Mapping[str, Any]] = ()) -> None:
        self.host = host
        self.listen = listen
        """Serve loopback HTTP too; False: in-process clients only (`client()`)."""
        self.port = port
        rng = random.Random(seed)
        given = tuple(registry.from_crd(crd) for crd in crds)
        urls = {(r.group, r.version, r.plural) for r in given}
        reg = registry.Registry(tuple(r for r in registry.RESOURCES if (r.group, r.version, r.plural) not in urls)
                                + given)
        self.store = stores.Store(reg=reg, clock=clock, history=history, rng=rng)
        self.logs = podlogs.LogBuffers(clock)
        self.faults = faults.Faults(self.store, rng=random.Random(seed))
        self.api = apiserver.ApiServer(self.store, self.logs, self.faults, rng=rng,
                                       bookmark_interval=bookmark_interval, liveness_interval=liveness_interval)
        self._runner: web.AppRunner | None = None
        self.front = inprocess.Front(self.api)
        """The in-process front: `client()` builds `KubeClient`s on it; `front.up` is False while the server
        is stopped (its clients then get connection errors, as over HTTP)."""
        self._app = web.Application(client_max_size=64 * 1024 * 1024)
        self._app.router.add_route("*", "/{tail:.*}", self._http)

    @property
    def request_counts(self) -> dict[str, int]:
        """API requests served, by "<VERB> <resource key>[/<subresource>]" (VERB: GET, LIST, WATCH, ...)."""
        return self.api.request_counts

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def client(self, *, request_timeout: float = 30.0, retry: Any = None) -> Any:
        """A `kcover.kube.client.KubeClient` talking to this server in-process (no socket, no HTTP)."""
        return self.front.client(request_timeout=request_timeout, retry=retry)

    def add_http_middleware(self, middleware: Any) -> None:
        """An aiohttp middleware in front of the loopback HTTP front (paths of the simulated cluster's own, such
        as `kcover sim inject`'s control endpoint); before `start`: aiohttp freezes its middlewares then."""
        self._app.middlewares.append(middleware)

    async def _http(self, request: web.Request) -> web.StreamResponse:
        """The loopback HTTP front: an aiohttp request in, the API server's answer out."""
        transport = request.transport
        asked = exchange.Request(request.method, request.path, request.query, request.headers, await request.read(),
                                 connected=lambda: transport is not None and not transport.is_closing())
        answer = await self.api.handle(asked)
        if isinstance(answer, exchange.Reply):
            return web.Response(status=answer.status, body=answer.body, content_type=answer.content_type,
                                headers=answer.headers)
        response = web.StreamResponse(status=answer.status, headers={"Content-Type": answer.content_type,
                                                                     **answer.headers})
        response.enable_chunked_encoding()
        await response.prepare(request)
        try:
            async for chunk in answer.chunks:
                await response.write(chunk)
            await response.write_eof()
        except (ConnectionResetError, ConnectionError):
            pass
        finally:
            await answer.chunks.aclose()  # type: ignore[attr-defined]
        return response

    async def start(self) -> None:
        self.front.up = True
        if not self.listen:
            return
        # handler_cancellation: a request whose client went away before it was served is not carried out,
        # as kube-apiserver drops a request whose context was cancelled before it reached storage
        self._runner = web.AppRunner(self._app, access_log=None, handle_signals=False,
                                     shutdown_timeout=1.0, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        server = site._server
        if self.port == 0 and server is not None:
            sockets = getattr(server, "sockets", None) or []
            self.port = int(sockets[0].getsockname()[1])
        self.api.server_address = f"{self.host}:{self.port}"

    async def restart(self, down_seconds: float = 1.0) -> None:
        """Stop serving (every watch and connection ends), stay down `down_seconds`, serve again on the same
        port with the same store, as a kube-apiserver restarted over the same etcd."""
        self.front.up = False
        self.store.close_watchers()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await asyncio.sleep(down_seconds)
        await self.start()

    async def stop(self) -> None:
        self.front.up = False
        self.store.close_watchers()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> SimServer:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()

    # --- clients ------------------------------------------------------------------------------

    def kubeconfig(self) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Config", "current-context": "kcover-sim",
                "clusters": [{"name": "kcover-sim", "cluster": {"server": self.url}}],
                "users": [{"name": "kcover-sim", "user": {"token": TOKEN}}],
                "contexts": [{"name": "kcover-sim", "context": {"cluster": "kcover-sim", "user": "kcover-sim",
                                                                "namespace": "default"}}]}

    def write_kubeconfig(self, path: str | os.PathLike[str]) -> Path:
        out = Path(path)
        out.write_text(yaml.safe_dump(self.kubeconfig(), sort_keys=False))
        return out

    def kube_configuration(self) -> Any:
        """A `kubernetes_asyncio.client.Configuration` pointing at this server."""
        from kubernetes_asyncio import client

        cfg = client.Configuration(host=self.url)
        cfg.api_key = {"authorization": TOKEN}
        cfg.api_key_prefix = {"authorization": "Bearer"}
        return cfg

    # --- custom resource definitions ----------------------------------------------------------

    def delete_crd(self, key: str) -> int:
        """Delete a custom resource's CRD, as kube-apiserver does: every object of it goes, its watches end,
        and its paths answer 404 until `create_crd`. Returns how many objects went."""
        gone = [(o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in self.store.iter_objects(key)]
        for namespace, name in gone:
            self.store.delete(key, namespace, name, grace_seconds=0)
        self.store.close_watchers(key)
        self.store.registry.unserved.add(key)
        return len(gone)

    def create_crd(self, key: str) -> None:
        """Serve a custom resource again (its CRD installed)."""
        self.store.registry.unserved.discard(key)

    # --- kubelet-side helpers -----------------------------------------------------------------

    def append_log(self, namespace: str, pod: str, container: str, text: str) -> None:
        """Append lines to the current instance of a container's log (what `pods/log` serves)."""
        self.logs.append(namespace, pod, container, text)

    def terminate_container_instance(self, namespace: str, pod: str, container: str) -> None:
        """The container's current instance ended: its log becomes `previous=true`, a new one starts."""
        self.logs.restart(namespace, pod, container)


async def _serve(host: str, port: int, kubeconfig_out: str | None) -> None:
    async with SimServer(host=host, port=port) as srv:
        if kubeconfig_out:
            srv.write_kubeconfig(kubeconfig_out)
        with waiting.process_stop_signals() as stopped:
            print(f"kcover sim API server at {srv.url}", flush=True)
            await stopped.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kcover.sim.server", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--kubeconfig-out", default=None)
    args = parser.parse_args(argv)
    try:
        asyncio.run(_serve(args.host, args.port, args.kubeconfig_out))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()

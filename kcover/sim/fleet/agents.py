"""The fleet replay's node agents: kcover's real XID judgement, DCGM reading and reporter, one node at a time.

Owns `Agent`, what kcover's agent on one simulated node does when the trace shows it something, made
of the agent's own parts: the NVML detector (its XID policy, per-GPU history and event, and its health
check of the GPU afterwards: lost, double-bit ECC, row-remap failure, read from a `FakeNvml` whose
state the XID left), the DCGM detector (reading a recorded `dcgmi diag` output, failed or passed) and
the RDMA link detector (reading the node's ports from a table the world's `link` faults leave their
`link_downed` counts in), the reporter (the Node condition and the Events with the codec's annotations,
written through the replay's in-process client), and the validator answering the controller's validation requests (a
`dcgmi diag` that takes its time and fails or passes as the world says the node is). What the agent
would publish goes through a real bus to the reporter.

What it does not run: the detectors' own loops (an NVML event wait in a worker thread, a health poll
every 10 s and DCGM checks every minute on each of 2,048 nodes would not fit the replay's budget, and a
worker thread breaks virtual time). The replay calls the detectors' per-event code instead:
`NvmlDetector._on_xid` and `_reconcile`, `DcgmDetector._diag`, private entry points (and the RDMA link
detector's public `check`, one read of the ports, at each link fault and after a repair), so a change to
them shows here (a public `on_xid(bus, event)` / `check(bus)` seam would make this cleaner); the
validator's public `validate(request)`, for the requests the replay sees on the Node (its own watch
of one Node per agent is not run). Agents
are built on a node's first signal: a node that never shows anything never runs one, which the
controller cannot tell apart, as an agent that sees nothing writes nothing but its healthy condition
(seeded on every node). How it fails: as the parts do (a failed write is the reporter's business).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from kcover import bus as bus_
from kcover import metrics as metrics_
from kcover import settings, validationcodec
from kcover.agent import reporting, validating
from kcover.aio import clock as clock_
from kcover.aio import commands
from kcover.detectors import contract, dcgm, nvml_detector, rdma_link
from kcover.kube import client as client_
from kcover.nvml import backend, fake, xid_policy
from kcover.sim import dcgmi

LOST = frozenset({79})
DOUBLE_BIT = frozenset({48})
REMAP_FAILED = frozenset({64})
"""What an XID leaves behind on the GPU, for the detector's health check to read."""


DIAG_SECONDS = {1: 30.0, 2: 180.0, 3: 1800.0, 4: 3600.0}
"""How long `dcgmi diag -r N` runs on eight GPUs (seconds at level 1, minutes at 2, up to an hour at 4)."""
_TEXTS: dict[bool, str] = {}


class _Diag:
    """A `commands.CommandRunner` answering `dcgmi diag` with the recorded failure or pass, after the time
    the diagnostic takes (virtual), as the world says the node is (`failed`); no thread, no process."""

    def __init__(self, failed: Callable[[], bool]) -> None:
        self.failed = failed
        if not _TEXTS:
            _TEXTS.update({True: dcgmi.recorded(dcgmi.FAILED), False: dcgmi.recorded(dcgmi.PASSED)})

    async def run(self, argv: Sequence[str], *, timeout_seconds: float) -> commands.CommandResult:
        args = list(argv)
        level = int(args[args.index("-r") + 1]) if "-r" in args[:-1] else 1
        await asyncio.sleep(min(DIAG_SECONDS.get(level, 30.0), timeout_seconds))
        failed = self.failed()
        return commands.CommandResult(dcgmi.FAILED_EXIT_CODE if failed else 0, _TEXTS[failed], "")


class _Links:
    """A `rdma_link.PortReader` over the node's RDMA ports as the world leaves them: one InfiniBand port per
    GPU rail (`mlx5_<i>` port 1), ACTIVE, with its `link_downed` count."""

    def __init__(self, ports: int) -> None:
        self.downed = [0] * ports

    async def read(self) -> list[rdma_link.Port]:
        return [rdma_link.Port(f"mlx5_{i}", 1, 4, "ACTIVE", "LinkUp", "InfiniBand", n)
                for i, n in enumerate(self.downed)]


class _Pods:
    def __init__(self, pods: Callable[[], Awaitable[list[str]]]) -> None:
        self._pods = pods

    async def pods_for_devices(self, device_ids: Sequence[str]) -> list[str]:
        return await self._pods()


class Agent:
    def __init__(self, node: str, gpus: int, *, client: client_.KubeClient, clock: clock_.Clock,
                 config: settings.Settings, policy: xid_policy.XidPolicy, metrics: metrics_.Metrics,
                 pods: Callable[[], Awaitable[list[str]]], diag_fails: Callable[[], bool]) -> None:
        self.node = node
        self._clock = clock
        self.nvml = fake.FakeNvml(gpus, uuid_prefix=f"GPU-{node}")
        self.nvml.init()
        self._diag_runner = _Diag(diag_fails)
        context = contract.DetectorContext(
            role=contract.Role.AGENT, metrics=metrics, clock=clock, node_name=node, nvml=self.nvml,
            command_runner=self._diag_runner, pod_lookup=_Pods(pods), xid_policy=policy)
        entries = config.detectors.entries
        self.nvml_detector = nvml_detector.NvmlDetector(
            "nvml", nvml_detector.NvmlConfig.model_validate(entries["nvml"].config), context)
        self.devices = [self.nvml.device_info(i) for i in range(gpus)]
        self.nvml_detector._devices = self.devices
        self.nvml_detector._by_uuid = {d.uuid: d for d in self.devices}
        self.dcgm_detector = dcgm.DcgmDetector("dcgm", dcgm.DcgmConfig.model_validate(entries["dcgm"].config), context)
        self.links = _Links(gpus)
        self.rdma_detector = rdma_link.RdmaLinkDetector(
            "rdma-link", rdma_link.RdmaLinkConfig.model_validate(entries["rdma-link"].config), context,
            reader=self.links)
        self._links_read = False
        self.bus = bus_.Bus(dedupe_window_seconds=config.bus.dedupe_window_seconds, clock=clock.monotonic)
        self._sub = self.bus.subscribe("reporter")
        self.reporter = reporting.Reporter(client, config.agent, node, clock)
        self.validator = validating.Validator(client, node, config.agent.validation, runner=self._diag_runner,
                                              clock=clock)
        self._later: asyncio.Task[None] | None = None
        self._validating: asyncio.Task[None] | None = None
        self.validations = 0
        """Validations the controller asked of this node that ran (the report's count)."""
        self.healthy_validations = 0
        """Those that ran while the node had no DCGM-visible fault (a validation of a healthy node)."""

    async def xid(self, gpu: int, code: int) -> None:
        """The driver raised XID `code` on GPU `gpu`: the detector judges it, then checks the GPU's health."""
        device = self.devices[gpu]
        if code in LOST:
            self.nvml.gpu_lost(gpu)
        elif code in DOUBLE_BIT:
            self.nvml.double_bit_ecc(gpu)
        elif code in REMAP_FAILED:
            self.nvml.row_remap_failure(gpu)
        await self.nvml_detector._on_xid(self.bus, backend.NvmlEvent(device.uuid, backend.EventType.XID_CRITICAL,
                                                                      code))
        await self._check(gpu)

    async def link_down(self, port: int) -> None:
        """RDMA port `port` went down and up: the detector's next read sees its `link_downed` risen."""
        if not self._links_read:  # the agent's first read, before the link went down: its baseline
            await self._read_links()
        self.links.downed[port] += 1
        await self._read_links()
        await self._report()

    async def _read_links(self) -> None:
        self._links_read = True
        await self.rdma_detector.check(self.bus, await self.links.read())

    async def _check(self, gpu: int) -> None:
        device = self.devices[gpu]
        await self.nvml_detector._reconcile(self.bus, device, nvml_detector.health_faults(self.nvml, gpu))
        await self._report()

    async def diag(self) -> None:
        """The scheduled `dcgmi diag` ran (failed or passed as the world says the node is)."""
        await self.dcgm_detector._diag(self.bus)
        await self._report()

    def validate(self, request: validationcodec.ValidationRequest) -> None:
        """The controller asked this node to validate itself: the agent's validator runs it (one at a time)."""
        if request.id in self.validator.answered or (self._validating is not None and not self._validating.done()):
            return
        self._validating = asyncio.get_running_loop().create_task(self._validate(request),
                                                                  name=f"agent:{self.node}:validate")

    async def _validate(self, request: validationcodec.ValidationRequest) -> None:
        self.validations += 1
        self.healthy_validations += not self._diag_runner.failed()
        await self.validator.validate(request)

    async def repaired(self) -> None:
        """The node came back from repair: its GPUs were reset (NVML sees them healthy again)."""
        for gpu in range(len(self.devices)):
            self.nvml.clear(gpu)
            await self.nvml_detector._reconcile(self.bus, self.devices[gpu], [])
        if self._links_read:  # cables and NICs replaced, the port counters cleared (`perfquery -R`)
            self.links.downed = [0] * len(self.links.downed)
            await self._read_links()
        await self._report()

    async def _report(self) -> None:
        events = self._sub.get_nowait()
        if events:
            await self.reporter.handle(events)
        if self._later is None or self._later.done():
            self._later = asyncio.get_running_loop().create_task(self._settle(), name=f"agent:{self.node}")

    async def _settle(self) -> None:
        """The reporter's own ticks that matter: a condition write the rate limit deferred, and the end of
        the hold after a fault cleared (`agent.condition_hold_seconds`)."""
        config = self.reporter.config
        await asyncio.sleep(config.min_write_interval_seconds + 0.5)
        await self.reporter.sync_condition()
        while any(not f.active for f in self.reporter.faults.values()):  # cleared, waiting out the hold
            await asyncio.sleep(config.condition_hold_seconds / 2)
            await self.reporter.sync_condition()

    async def close(self) -> None:
        for task in (self._later, self._validating):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

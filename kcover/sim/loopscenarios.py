"""The `kcover sim` scenarios of the closed loop: verification, return to service, pause, the latched breaker.

Owns four scenarios, played like the others (`scenarios.Run`, `scenarios.Scenario`) and listed in
`scenarios.SCENARIOS`: `restart-stalled` (a restart whose pods stay Pending is reported Stalled with
the scheduler's message, and a person is called), `node-repaired` (XID 79, cordon, the GPU recovers;
the node's agent runs the `dcgmi diag` the controller asks for, where the simulated node's
`dcgmi.FakeDcgmi` prints a recorded pass; un-cordon after the hold; an admin-cordoned bystander is
left alone), `pause` (a failure under a paused workload, namespace or global scope is held with an Event;
lifted, the held restart runs) and `breaker-latch` (the breaker latches open on a refused cordon and holds
restarts until `kcover breaker reset` and its cooldown, then runs them). How it fails: as `scenarios` does (a timed-out wait fails the run).
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from kcover import validationcodec
from kcover.aio import clock as clock_
from kcover.kube import client as client_
from kcover.kube import gateway
from kcover.recovery import controls, ledgerentries, returning
from kcover.sim import cluster as cluster_
from kcover.sim import playing
from kcover.sim import scenarios as sc

NS: str = playing.NS
STALLED = "KcoverRecoveryStalled"
ESCALATED = "KcoverEscalated"
VERIFIED = "KcoverRecoveryVerified"
UNCORDONED = "KcoverUncordonedNode"
VALIDATION = returning.VALIDATION
LATCHED = "KcoverBreakerLatched"
HELD = "KcoverRecoveryHeld"
CONTROLS = "kcover-controls"
LEDGER_NS = "kcover-system"


def _set_annotation(c: cluster_.SimCluster, resource: str, namespace: str, name: str, key: str,
                    value: str | None) -> None:
    """An operator's `kubectl annotate` (None removes the annotation)."""
    def change(obj: dict[str, Any]) -> None:
        annotations = obj["metadata"].setdefault("annotations", {}) or {}
        if value is None:
            annotations.pop(key, None)
        else:
            annotations[key] = value
        obj["metadata"]["annotations"] = annotations

    c.srv.store.mutate(resource, namespace, name, change)


def _admin_cordon(c: cluster_.SimCluster, node: str, on: bool = True) -> None:
    """`kubectl cordon` / `uncordon` by a person: spec.unschedulable only, no kcover marks."""
    c.srv.store.mutate("nodes", "", node, lambda o: o["spec"].update(unschedulable=on) if on
                       else o["spec"].pop("unschedulable", None))


def _skipped_with(run: playing.Run, name: str, text: str) -> Any:
    return lambda: next((e for e in run.api_events(playing.SKIPPED, name) if text in e.message), None)


# ---------------------------------------------------------------------------------------------- restart-stalled

async def restart_stalled(run: playing.Run) -> None:
    c = run.cluster
    job = c.jobs[0]
    pod = sc._worker(c, job)
    old = c.pod_uids(job)
    for node in c.nodes:  # no capacity left: whatever is restarted stays Pending
        _admin_cordon(c, node)
    run.note("admin", f"a person cordoned every node ({', '.join(c.nodes)})")
    f = run.fault("container-error", f"Pod {NS}/{pod}", "container pytorch exits with code 1 (Error)")
    sc._fail(c, pod, "worker group failed (exitcode: 1)")
    await run.detected(f, sc._about_pod("pod-status", pod), f"pod-status to report Pod {NS}/{pod}")
    await run.acted(f, sc._is_restart_of(job), f"a {playing.RESTARTED} Event for PyTorchJob {NS}/{job}")
    pending = await c.until(lambda: [p for p in c.job_pods(job) if p["metadata"]["uid"] not in old
                                     and (p.get("status") or {}).get("conditions")], playing.WAIT,
                            "the recreated pods to be refused by the scheduler")
    run.note("scheduler", f"Pod {NS}/{pending[0]['metadata']['name']} Pending: "
                          f"{pending[0]['status']['conditions'][-1]['message']}")
    stalled = await c.until(lambda: next(iter(run.api_events(STALLED, job)), None), playing.WAIT,
                            f"a {STALLED} Event for PyTorchJob {NS}/{job}")
    run.note("stalled", playing.clip(stalled.message, 200), stalled.at)
    run.check("the recovery is reported Stalled: Unschedulable", "Stalled: Unschedulable" in stalled.message,
              playing.clip(stalled.message, 160))
    run.check("the Stalled Event carries the scheduler's message", "0/2 nodes are available" in stalled.message
              or f"0/{len(c.nodes)} nodes are available" in stalled.message, playing.clip(stalled.message, 200))
    person = await c.until(lambda: next((e for e in run.api_events(ESCALATED, job) if "a person" in e.message), None),
                           playing.WAIT, f"a {ESCALATED} Event (a person) for PyTorchJob {NS}/{job}")
    run.note("escalated", playing.clip(person.message, 160), person.at)
    counted = c.metric("kcover_recovery_stalled_total", {"cause": "Unschedulable"})
    run.check(f"kcover_recovery_stalled_total{{cause=\"Unschedulable\"}} counted it ({counted:g})", counted == 1)
    run.check("no second restart", len(run.api_events(playing.RESTARTED, job)) == 1)


# ---------------------------------------------------------------------------------------------- node-repaired

async def node_repaired(run: playing.Run) -> None:
    c = run.cluster
    node = str(c.running_pods(c.jobs[0])[1]["spec"]["nodeName"])
    bystander = next(n for n in c.nodes if n != node)
    _admin_cordon(c, bystander)
    run.note("admin", f"a person cordoned {bystander} (maintenance)")
    gpu = 0
    f = run.fault("gpu-xid-79", f"Node {node}", "XID 79: the GPU falls off the bus")
    c.agents[node].nvml.gpu_lost(gpu)
    c.agents[node].nvml.xid(79, gpu)
    await run.acted(f, lambda e: e.reason == playing.CORDONED and e.name == node,
                    f"a {playing.CORDONED} Event for {node}")
    f.detected_at = f.detected_at or f.acted_at
    await asyncio.sleep(0.5)
    c.agents[node].nvml.clear(gpu)
    run.note("repair", f"the GPU on {node} was reset and answers again")
    back = await c.until(lambda: c.api_event(lambda e: e.reason == UNCORDONED and e.name == node, f.injected_at),
                         playing.WAIT * 2, f"a {UNCORDONED} Event for {node}")
    f.recovered_at = back.at
    run.note("uncordon", playing.clip(back.message, 160), back.at)
    await asyncio.sleep(playing.SETTLE)
    obj = c.srv.store.get("nodes", "", node)
    spec, annotations = obj["spec"], obj["metadata"].get("annotations") or {}
    taints = [t.get("key") for t in spec.get("taints") or []]
    run.check(f"Node {node} is schedulable again", not spec.get("unschedulable"))
    run.check(f"kcover's taint is gone from {node}", "kcover.io/unhealthy" not in taints, str(taints))
    run.check("kcover's cordon annotations are gone", not any(k.startswith("kcover.io/cordon") for k in annotations))
    cordoned = await c.until(
        lambda: c.api_event(lambda e: e.reason == playing.CORDONED and e.name == node, f.injected_at),
        playing.WAIT, "the cordon Event")
    hold = float(NODE_REPAIRED.overrides["detectors"]["entries"]["node-condition"]["config"]["recovered_hold_seconds"])
    run.check(f"the un-cordon came at least the hold ({hold:g}s) after the cordon",
              (back.at - cordoned.at).total_seconds() >= hold)
    _validated_before_return(run, node, obj, back)
    other = c.srv.store.get("nodes", "", bystander)["spec"]
    run.check(f"the admin-cordoned {bystander} is still cordoned", other.get("unschedulable") is True)
    run.check(f"kcover wrote nothing about {bystander}",
              not [e for e in run.api_events(UNCORDONED) + run.api_events(playing.CORDONED)
                   + run.api_events(VALIDATION) if e.name == bystander])
    run.check(f"no diagnostic ran on {bystander}", not c.agents[bystander].dcgmi.calls)


def _validated_before_return(run: playing.Run, node: str, obj: dict[str, Any], back: cluster_.ApiEvent) -> None:
    """The return-to-service validation: asked, run by the node's agent, passed, then the un-cordon."""
    c = run.cluster
    level = NODE_REPAIRED.overrides["recovery"]["return_validation"]["diag_level"]
    steps = [e for e in c.api_events if e.name == node and e.kind == "Node"
             and (e.reason == VALIDATION or e is back)]
    order = [e.action if e.reason == VALIDATION else "Uncordon" for e in steps]
    for call in c.agents[node].dcgmi.calls:
        run.note("validate", f"the agent on {node} ran `{' '.join(call.argv)}`: exit code {call.returncode}, "
                             f"printed the recorded {call.recording or 'usage error'}", call.at)
    run.check(f"{VALIDATION} RequestValidation, then ValidationPassed, then the un-cordon",
              order == ["RequestValidation", "ValidationPassed", "Uncordon"], ", ".join(order))
    asked = next((e for e in steps if e.action == "RequestValidation"), None)
    passed = next((e for e in steps if e.action == "ValidationPassed"), None)
    run.check(f"kcover asked for `dcgmi diag -r {level}`", asked is not None
              and f"dcgmi diag -r {level}" in asked.message,
              playing.clip(asked.message, 160) if asked else "no request")
    run.check("the pass names dcgmi's verdict", passed is not None and "every test passed" in passed.message,
              playing.clip(passed.message, 160) if passed else "no ValidationPassed")
    calls = c.agents[node].dcgmi.calls
    ran = [" ".join(call.argv[1:]) for call in calls]
    run.check(f"the agent on {node} ran the diagnostic once, at level {level}, and it passed",
              len(calls) == 1 and calls[0].argv[1:4] == ("diag", "-r", str(level)) and calls[0].returncode == 0,
              "; ".join(ran))
    answer: dict[str, Any] = next((cond for cond in obj.get("status", {}).get("conditions") or []
                                   if cond.get("type") == validationcodec.VALIDATION_CONDITION), {})
    run.check(f"the agent's answer: {validationcodec.VALIDATION_CONDITION}=True (Passed)",
              (answer.get("status"), answer.get("reason")) == ("True", "Passed"),
              playing.clip(str(answer.get("message", "")), 160))
    annotations = obj["metadata"].get("annotations") or {}
    run.check("the validation request annotations are gone",
              validationcodec.VALIDATE_REQUEST not in annotations and validationcodec.VALIDATE_LEVEL not in annotations)


# ---------------------------------------------------------------------------------------------- pause

async def pause(run: playing.Run) -> None:
    c = run.cluster
    first, second = c.jobs[0], c.jobs[1]
    scopes: list[tuple[str, str, str, str, str]] = [
        ("pytorchjobs.kubeflow.org", NS, first, f"PyTorchJob {NS}/{first}", first),
        ("namespaces", "", NS, f"namespace {NS}", second),
        ("configmaps", LEDGER_NS, CONTROLS, "every target", first),
    ]
    c.srv.store.create("configmaps", {"metadata": {"name": CONTROLS, "namespace": LEDGER_NS}})
    for resource, namespace, name, scope, job in scopes:
        _set_annotation(c, resource, namespace, name, controls.PAUSED, "true")
        run.note("pause", f"{controls.PAUSED}=true on {resource} {namespace + '/' if namespace else ''}{name}")
        await asyncio.sleep(playing.SETTLE)  # the controllers' caches see the annotation
        pod = sc._worker(c, job)
        old = c.pod_uids(job)
        before = len(run.api_events(playing.RESTARTED, job))
        f = run.fault("container-error", f"Pod {NS}/{pod}", f"exits with code 1 while {scope} is paused")
        sc._fail(c, pod, "worker group failed (exitcode: 1)")
        await run.detected(f, sc._about_pod("pod-status", pod), f"pod-status to report Pod {NS}/{pod}")

        def held(e: cluster_.ApiEvent, job: str = job, scope: str = scope) -> bool:
            return e.reason == HELD and e.name == job and "Paused" in e.message and scope in e.message

        found = await run.acted(f, held, f"a Paused {HELD} Event for PyTorchJob {NS}/{job}")
        run.note("held", playing.clip(found.message, 140), found.at)
        await asyncio.sleep(playing.SETTLE)
        run.check(f"nothing was restarted while {scope} was paused",
                  len(run.api_events(playing.RESTARTED, job)) == before)
        _set_annotation(c, resource, namespace, name, controls.PAUSED, None)
        run.note("resume", f"{controls.PAUSED} taken off {resource} {namespace + '/' if namespace else ''}{name}")
        await run.acted(f, sc._is_restart_of(job), f"the held restart of PyTorchJob {NS}/{job} once the pause is lifted")
        await run.recovered(f, job, old)
        await asyncio.sleep(playing.SETTLE)
        run.check(f"the held restart ran once after {scope} was resumed",
                  len(run.api_events(playing.RESTARTED, job)) == before + 1)


# ---------------------------------------------------------------------------------------------- breaker-latch

def _breaker(c: cluster_.SimCluster) -> ledgerentries.Breaker:
    """The breaker as the ledger in the simulated cluster holds it."""
    for obj in c.srv.store.iter_objects("ledgerentries.kcover.io"):
        raw = (obj.get("data") or {}).get(ledgerentries.BREAKER_KEY)
        if raw:
            return ledgerentries.Breaker.decode(orjson.loads(raw))
    return ledgerentries.Breaker()


async def breaker_latch(run: playing.Run) -> None:
    c = run.cluster
    first, second = c.nodes[0], c.nodes[1]
    f = run.fault("gpu-xid-79", f"Node {first}", "XID 79 on the first node")
    c.agents[first].nvml.xid(79, 0)
    await run.detected(f, lambda e: e.reason == "XID79" and first in (e.target.node, e.target.name),
                       f"the agent on {first} to report XID 79")
    await run.acted(f, lambda e: e.reason == playing.CORDONED and e.name == first,
                    f"a {playing.CORDONED} Event for {first}")
    await asyncio.sleep(playing.SETTLE)
    g = run.fault("gpu-xid-79", f"Node {second}", "XID 79 on the second node: past max_cordoned_fraction")
    c.agents[second].nvml.xid(79, 0)
    latched = await run.acted(g, lambda e: e.reason == LATCHED, f"a {LATCHED} Event")
    run.note("latched", playing.clip(latched.message, 160), latched.at)
    run.check("the ledger holds the latched breaker", _breaker(c).latched)
    await asyncio.sleep(playing.SETTLE)
    job = c.jobs[0]
    pod = sc._worker(c, job)
    h = run.fault("container-error", f"Pod {NS}/{pod}", "exits with code 1 while the breaker is latched")
    sc._fail(c, pod, "worker group failed (exitcode: 1)")
    await run.acted(h, lambda e: e.reason == HELD and e.name == job and "BreakerLatched" in e.message,
                    f"a BreakerLatched {HELD} Event for PyTorchJob {NS}/{job}")
    cordoned = [n for n in c.nodes if c.srv.store.get("nodes", "", n)["spec"].get("unschedulable")]
    run.check(f"only {first} was cordoned", cordoned == [first], ", ".join(cordoned))
    async with client_.from_configuration(c.srv.kube_configuration()) as kube:
        await controls.request_reset(gateway.Http(kube), namespace=LEDGER_NS, name=CONTROLS, now=clock_.utcnow())
    run.note("reset", "a person ran `kcover breaker reset`")
    await c.until(lambda: not _breaker(c).latched, 10.0, "the leader to close the breaker")
    run.check("`kcover breaker reset` closed it", not _breaker(c).latched)
    pod = sc._worker(c, job)
    i = run.fault("container-error", f"Pod {NS}/{pod}", "exits with code 1 during the breaker's cooldown")
    sc._fail(c, pod, "worker group failed (exitcode: 1)")
    await run.acted(i, lambda e: e.reason == HELD and e.name == job and "BreakerCooldown" in e.message,
                    f"a BreakerCooldown {HELD} Event for PyTorchJob {NS}/{job}")
    cooldown = float(BREAKER_LATCH.overrides["recovery"]["breaker_cooldown_seconds"])
    await asyncio.sleep(cooldown)
    pod = sc._worker(c, job)
    old = c.pod_uids(job)
    k = run.fault("container-error", f"Pod {NS}/{pod}", "exits with code 1 after the cooldown")
    sc._fail(c, pod, "worker group failed (exitcode: 1)")
    await run.acted(k, sc._is_restart_of(job), f"a {playing.RESTARTED} Event for PyTorchJob {NS}/{job}")
    await run.recovered(k, job, old)
    # as every scenario: watch for a second restart, and let kcover finish recording this one (stopping it
    # mid-write dropped the Recovery record with an error-level log)
    await asyncio.sleep(playing.SETTLE)
    restarted = [e for e in run.api_events(playing.RESTARTED, job) if e.at >= latched.at]
    run.check("restarted exactly once after the latch (after the reset and cooldown)", len(restarted) == 1,
              str(len(restarted)))


RESTART_STALLED = playing.Scenario(
    "restart-stalled", "a restarted job's pods stay Pending (every node cordoned by a person): the recovery is "
    "reported Stalled with the scheduler's message and a person is called", restart_stalled,
    overrides={"recovery": {"verify": {"deadline_seconds": 1.5}, "resume_interval_seconds": 0.3}})
NODE_REPAIRED = playing.Scenario(
    "node-repaired", "XID 79: the node is cordoned; the GPU recovers, passes its `dcgmi diag` validation and the "
    "node returns to service after the hold; a node a person cordoned is left alone", node_repaired, nodes=3,
    overrides={"recovery": {"uncordon_enabled": True, "resume_interval_seconds": 0.3,
                            "return_validation": {"enabled": True, "diag_level": 3, "timeout_seconds": 15.0}},
               "detectors": {"entries": {"node-condition": {"config": {"recovered_hold_seconds": 1.0}}}}},
    agent_overrides={"agent": {"condition_hold_seconds": 0.5, "validation": {"enabled": True, "timeout_seconds": 10.0}},
                     "detectors": {"entries": {"nvml": {"config": {"health_interval_seconds": 0.2}}}}})
PAUSE = playing.Scenario(
    "pause", "kcover.io/paused=true on a job, its namespace, then globally: each failure is held with a Paused "
    "Event and nothing restarts; lifted, the held restart runs, once", pause,
    overrides={"recovery": {"workload_cooldown_seconds": 0.5, "resume_interval_seconds": 0.3}})
BREAKER_LATCH = playing.Scenario(
    "breaker-latch", "a cordon past max_cordoned_fraction latches the breaker: restarts are refused until "
    "`kcover breaker reset`, then for its cooldown, then kcover acts again", breaker_latch,
    # a fraction below 1/nodes: the first cordon passes (0 held) and the second is past it at any size the
    # CLI offers (the simulated cluster's own 0.5 let the second through on more than two nodes)
    overrides={"recovery": {"breaker_latch": True, "breaker_cooldown_seconds": 1.5,
                            "workload_cooldown_seconds": 0.5, "max_cordoned_fraction": 0.01}})
SCENARIOS: tuple[playing.Scenario, ...] = (RESTART_STALLED, NODE_REPAIRED, PAUSE, BREAKER_LATCH)

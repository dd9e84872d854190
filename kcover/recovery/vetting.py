"""Vetting a ledger intent before a successor acts on it: the ledger is data, not commands.

Owns one pure rule, `problem(key, intent, snapshot, settings)`: a pending restart intent read back
from the ledger ConfigMap (which anyone allowed to update that ConfigMap could have written) is acted
on only when the cluster, as the cache shows it now, agrees with it:
* the workload it names exists, with the recorded uid, kind, namespace and name, and the ledger key
  is that workload's (or one of its LeaderWorkerSet groups');
* its namespace is allowed (`recovery.namespaces_allow/deny`) and it is opted in;
* a live pod of that restart unit exists, and the selector the adapter computes for it now is
  non-empty and equal to the recorded one;
* every pod the intent names for uid-preconditioned deletes that is still cached belongs to the
  workload.
Anything else is a refusal (a sentence saying what disagreed), and the executor drops the intent.
It does no I/O and never raises on odd intents.
"""

from __future__ import annotations

from kcover import settings
from kcover.kube import ownership
from kcover.kube import projections as proj
from kcover.recovery import adapters, ledger, policy


def problem(key: str, intent: ledger.Intent, snapshot: policy.ClusterSnapshot,
            rs: settings.RecoverySettings) -> str:
    """'' when the intent may be acted on, else why not."""
    kind, _api_version, namespace, name, uid = intent.workload
    what = f"{kind or '?'} {namespace or '?'}/{name or '?'} (uid {uid or 'unset'})"
    if not uid or not (key == f"w.{uid}" or key.startswith(f"w.{uid}.g")):
        return f"ledger key {key} does not belong to {what}"
    w = snapshot.workload(uid)
    if w is None:
        return f"{what} is not in the cluster"
    if (w.kind, w.namespace, w.name) != (kind, namespace, name):
        return f"the workload with uid {uid} is {w.kind} {w.namespace}/{w.name}, not {what}"
    if not policy.namespace_allowed(w.namespace, rs):
        return f"namespace {w.namespace} is not acted on (recovery.namespaces_allow/deny)"
    pods = [p for p in snapshot.pods_of_workload(uid) if not p.deleting]
    if intent.pod is not None:  # the faulting pod first: its unit is the one recorded
        pods.sort(key=lambda p: p.uid != intent.pod[2] if intent.pod else True)
    opted = False
    for pod in pods:
        resolved = adapters.resolve(snapshot, pod)
        if not isinstance(resolved, adapters.Resolved) or resolved.workload.uid != uid:
            continue
        opted = opted or ownership.opted_in(pod, resolved)
        unit = adapters.restart_unit(resolved, pod)
        if unit.ledger_key != key:
            continue
        if not ownership.opted_in(pod, resolved):
            return f"{what} is not opted in ({proj.OPT_IN_LABEL})"
        now = unit.selector.render()
        if not now:
            return f"{what} has no pod selector"
        if now != intent.selector:
            return f"the recorded selector {intent.selector!r} is not {what}'s ({now!r})"
        for ns, pod_name, pod_uid in intent.pods or ():
            named = snapshot.pod(pod_uid)
            if named is None:
                continue  # gone: nothing to delete
            found = adapters.resolve(snapshot, named)
            if (ns, pod_name) != (named.namespace, named.name) or not isinstance(found, adapters.Resolved) \
                    or found.workload.uid != uid:
                return f"pod {ns}/{pod_name} (uid {pod_uid}) does not belong to {what}"
        return ""
    if pods and not opted:
        return f"{what} is not opted in ({proj.OPT_IN_LABEL})"
    return f"{what} has no live pod of the unit {key}"

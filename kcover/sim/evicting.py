"""The Eviction API of the simulated cluster: `POST pods/{name}/eviction` honouring PodDisruptionBudgets.

Owns what kube-apiserver's eviction handler decides (pkg/registry/core/pod/storage/eviction.go), pinned
by tests/conformance/test_eviction.py on both backends:

* the Eviction's `metadata.name` must be the URL's (400); a missing pod is 404;
* a pod that is Pending, Succeeded, Failed or already terminating is deleted whatever its budgets say;
* otherwise the budgets of the pod's namespace whose non-empty selector matches its labels decide: more
  than one is a 500; none lets it go; a pod that is not Ready while the budget has its healthy pods
  (`currentHealthy >= desiredHealthy > 0`) goes without using the budget; a budget whose
  `status.observedGeneration` is behind its generation (the disruption controller has not processed
  it, as on a server where none runs) answers 429 "still being processed"; one with
  `disruptionsAllowed` 0 answers 429 with the same cause text the real server writes; else the budget
  is decremented, records the pod in `disruptedPods` (and `DisruptionAllowed=False` once at 0);
* the pod then gets the `DisruptionTarget` condition (reason `EvictionByEvictionAPI`) and is deleted
  with the Eviction's `deleteOptions` (grace, uid and resourceVersion preconditions: 409 on mismatch).

It does not compute a budget's status: that is the disruption controller's job, which runs on neither
backend; a test that wants a processed budget writes its status itself. It fails with the
`status.ApiError` a real server would answer.
"""

from __future__ import annotations

from typing import Any

from kcover.sim import selectors, status
from kcover.sim import store as stores

Obj = dict[str, Any]
VIOLATION = "Cannot evict pod as it would violate the pod's disruption budget."
PDBS = "poddisruptionbudgets.policy"


def _too_many(cause: str, retry_after: int) -> status.ApiError:
    details: Obj = {"causes": [{"reason": "DisruptionBudget", "message": cause}]}
    if retry_after:
        details["retryAfterSeconds"] = retry_after
    return status.ApiError(status.status(429, "TooManyRequests", VIOLATION, details))


def label_selector(selector: Obj | None) -> selectors.LabelSelector:
    """A `metav1.LabelSelector` (matchLabels, matchExpressions) as the sim's selector."""
    selector = selector or {}
    reqs = [selectors.Requirement(str(k), "=", (str(v),)) for k, v in (selector.get("matchLabels") or {}).items()]
    ops = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}
    for expr in selector.get("matchExpressions") or []:
        op = ops.get(str(expr.get("operator")))
        if op is not None:
            reqs.append(selectors.Requirement(str(expr.get("key")), op, tuple(str(v) for v in expr.get("values") or ())))
    return selectors.LabelSelector(tuple(reqs))


def _ready(pod: Obj) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def _denied(pdb: Obj) -> str:
    name, st = pdb["metadata"]["name"], pdb.get("status") or {}
    cond = next((c for c in st.get("conditions") or [] if c.get("type") == "DisruptionAllowed"), None)
    failed = cond is not None and cond.get("status") == "False" and bool(cond.get("message"))
    current, desired = int(st.get("currentHealthy", 0)), int(st.get("desiredHealthy", 0))
    if failed and cond is not None and cond.get("reason") == "SyncFailed":
        return f"The disruption budget {name} does not allow evicting pods currently because it failed sync: " \
               f"{cond.get('message')}"
    if current <= desired:
        return f"The disruption budget {name} needs {desired} healthy pods and has {current} currently"
    if failed and cond is not None:
        return f"The disruption budget {name} does not allow evicting pods currently ({cond.get('reason')}): " \
               f"{cond.get('message')}"
    return f"The disruption budget {name} does not allow evicting pods currently"


def _take(store: stores.Store, pdb: Obj, pod_name: str, now: str) -> None:
    """checkAndDecrement: refuse, or use one disruption of `pdb` for `pod_name`."""
    name, st = pdb["metadata"]["name"], dict(pdb.get("status") or {})
    if int(st.get("observedGeneration", 0)) < int(pdb["metadata"].get("generation", 1)):
        raise _too_many(f"The disruption budget {name} is still being processed by the server.", 10)
    allowed = int(st.get("disruptionsAllowed", 0))
    if allowed < 0:
        raise status.forbidden("poddisruptionbudget", "policy", name, "pdb disruptions allowed is negative")
    if allowed == 0:
        raise _too_many(_denied(pdb), 0)
    st["disruptionsAllowed"] = allowed - 1
    if allowed - 1 == 0:
        conds = [c for c in st.get("conditions") or [] if c.get("type") != "DisruptionAllowed"]
        st["conditions"] = [*conds, {"type": "DisruptionAllowed", "status": "False", "reason": "InsufficientPods",
                                     "message": "", "observedGeneration": st.get("observedGeneration", 0),
                                     "lastTransitionTime": now}]
    st["disruptedPods"] = {**(st.get("disruptedPods") or {}), pod_name: now}
    pdb["status"] = st
    store.update(PDBS, pdb)


def evict(store: stores.Store, namespace: str, name: str, body: Obj, now: str) -> tuple[Obj, bool]:
    """Evict pod `namespace/name` as `body` (a policy/v1 Eviction) asks; returns `store.delete`'s answer."""
    if str((body.get("metadata") or {}).get("name") or "") != name:
        raise status.bad_request("name in URL does not match name in Eviction object")
    options = body.get("deleteOptions") or {}
    pre = options.get("preconditions") or {}
    grace = options.get("gracePeriodSeconds")
    pod = store.get("pods", namespace, name)
    phase = (pod.get("status") or {}).get("phase") or "Pending"
    if phase not in ("Pending", "Succeeded", "Failed") and not pod["metadata"].get("deletionTimestamp"):
        labels = pod["metadata"].get("labels") or {}
        budgets = []
        for pdb in store.iter_objects(PDBS):
            sel = label_selector((pdb.get("spec") or {}).get("selector"))
            if pdb["metadata"].get("namespace") == namespace and not sel.empty and sel.matches(labels):
                budgets.append(pdb)
        if len(budgets) > 1:
            raise status.ApiError({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                   "message": "This pod has more than one PodDisruptionBudget, which the eviction "
                                              "subresource does not support.", "code": 500})
        if budgets:
            pdb, st = budgets[0], budgets[0].get("status") or {}
            desired = int(st.get("desiredHealthy", 0))
            if _ready(pod) or int(st.get("currentHealthy", 0)) < desired or desired <= 0:
                _take(store, pdb, name, now)  # as the real server: before the delete's preconditions
    if pre.get("uid") and pre["uid"] != pod["metadata"]["uid"]:
        return store.delete("pods", namespace, name, uid=pre["uid"])  # raises the 409
    conditions = [c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") != "DisruptionTarget"]
    pod.setdefault("status", {})["conditions"] = [*conditions, {
        "type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
        "message": "Eviction API: evicting", "lastTransitionTime": now}]
    store.update("pods", pod)
    return store.delete("pods", namespace, name, grace_seconds=None if grace is None else max(0, int(grace)),
                        uid=pre.get("uid"), resource_version=pre.get("resourceVersion"))

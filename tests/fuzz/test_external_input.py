"""Property tests: every function that parses or judges input from outside kcover gives an answer or a clear
refusal, never an unexpected exception.

Outside input: Events and their annotations (anyone who may create Events writes them), the ledger
ConfigMap (anyone who may update it), configuration files and the XID policy, the output of `dcgmi`,
dcgm-exporter, `mx-smi`, check scripts and container logs. For each, hypothesis generates structured
garbage near the real shapes (the keys the parser looks for, wrong types, odd text) and the test states
what a clear refusal is: `None`, a refusal value, `errors.ConfigError`, the parser's own `ParseError`,
or `ValueError` where the caller catches exactly that. Judgements also keep their invariants: an
accepted Event never targets another namespace, a Node Event is accepted only from an allowed namespace
for a node whose agent runs there.

Budget: derandomized, no example database, `EXAMPLES` per test: 15 tests, 3,750 examples, about 10 s on
one core (`pytest tests/fuzz --hypothesis-show-statistics` shows each stopping at its budget).
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kcover import checking, codec, errors, layering, model
from kcover import settings as settings_
from kcover.detectors import event_watcher
from kcover.kube import caching, projecting
from kcover.kube import projections as proj
from kcover.nvml import dcgmi, xid_policy
from kcover.recovery import ledger, ledgerentries, restarting

EXAMPLES = 250
FUZZ = settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])
NOW = dt.datetime(2026, 6, 1, 12, 0, 0, tzinfo=dt.UTC)

text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
words = st.sampled_from(["", "ml", "kcover-system", "default", "other", "n1", "n2", "p", "gpu-1", "kcover.io/agent",
                         "someone", "u", "Pod", "Node", "Deployment", "PyTorchJob", "true", "false", "-1", "0", "1"])
stamps = st.one_of(st.sampled_from(["", "2026-06-01T11:59:00Z", "2026-06-01T12:00:30.000000Z", "2099-01-01T00:00:00Z",
                                    "1970-01-01T00:00:00Z", "2026-06-01T11:00:00+01:00", "not a time",
                                    "2026-06-01T12:00:00"]), text)
leaf = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True), text, words)


def json_like(keys: list[str]) -> st.SearchStrategy[Any]:
    return st.recursive(leaf, lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.one_of(st.sampled_from(keys), text), inner, max_size=5)),
        max_leaves=20)


# ------------------------------------------------------------------------------------------ Events

ANNOTATIONS = [codec.NEED_RECOVERY, codec.RECOMMENDED_ACTION, codec.FAULT_CLEARED, codec.PODS, "kcover.io/xid", "kcover.io/gpu-index",
               "kcover.io/occurrences", "kcover.io/window-seconds", "kcover.io/detector", "kcover.io/check"]


@st.composite
def raw_events(draw: st.DrawFn) -> dict[str, Any]:
    annotations = draw(st.dictionaries(st.sampled_from(ANNOTATIONS), st.one_of(words, text), max_size=5))
    annotations[codec.NEED_RECOVERY] = "true"
    involved = {k: draw(st.one_of(words, leaf)) for k in ("kind", "namespace", "name", "uid")
                if draw(st.booleans())}
    body: dict[str, Any] = {
        "metadata": {"uid": draw(words), "name": draw(words), "namespace": draw(words), "annotations": annotations},
        "involvedObject": draw(st.one_of(st.just(involved), leaf)),
        "reason": draw(st.one_of(words, leaf)), "message": draw(st.one_of(text, leaf)),
        "count": draw(st.one_of(st.integers(-5, 5), leaf)),
        "series": draw(st.one_of(st.none(), st.fixed_dictionaries({"count": st.integers(-5, 5),
                                                                   "lastObservedTime": stamps}))),
        "lastTimestamp": draw(stamps), "eventTime": draw(stamps), "firstTimestamp": draw(stamps),
        "reportingComponent": draw(words), "reportingInstance": draw(words),
        "source": draw(st.one_of(st.fixed_dictionaries({"component": words, "host": words}), leaf)),
    }
    return body


AGENT = proj.Pod("a", "1", "kcover-system", "agent", "n1", "Running",
                 (("app.kubernetes.io/component", "agent"), ("app.kubernetes.io/name", "kcover")), (), None, "",
                 "Always", ())
POD = proj.Pod("u", "1", "ml", "p", "n1", "Running", (), (), None, "", "Always", ())
NODES = {"n1": proj.Node("n1-uid", "1", "n1", False, (), (), (), ()),
         "n2": proj.Node("n2-uid", "1", "n2", False, (), (), (), ())}
LOOKUPS = event_watcher.Lookups(
    pod=lambda ns, name: POD if (ns, name) == ("ml", "p") else None, node=NODES.get,
    agent_on_node=lambda ns, node: event_watcher.agent_on_node(lambda n: [AGENT] if n == "n1" else [],
                                                               event_watcher.AGENT_POD_LABELS, ns, node),
    namespace="kcover-system")


@FUZZ
@given(raw_events(), st.sampled_from([{}, {"require_agent_pod": False}, {"node_event_namespaces": ["default", "ml"]},
                                      {"max_clock_skew_seconds": 0}]))
def test_judge_answers_every_event_and_never_crosses_a_namespace(raw: dict[str, Any], config: dict[str, Any]) -> None:
    ev = projecting.recovery_event(raw)
    assert ev is not None
    cfg = event_watcher.EventWatcherConfig.model_validate(config)
    verdict = event_watcher.judge(ev, now=NOW, config=cfg, lookups=LOOKUPS)
    assert isinstance(verdict.reason, str)
    decoded = codec.decode_annotations(dict(ev.annotations))
    assert isinstance(decoded, codec.Decoded | codec.Refused)
    assert event_watcher.signal_of(ev)
    if verdict.target is None:
        assert verdict.reason
        return
    seen = event_watcher.observed_at(ev)
    assert seen is not None
    assert (seen - NOW).total_seconds() <= cfg.max_clock_skew_seconds
    if verdict.target.kind is model.TargetKind.POD:
        assert verdict.target.namespace == ev.namespace == "ml"
    else:
        allowed = cfg.node_event_namespaces if cfg.node_event_namespaces is not None else ["kcover-system"]
        assert ev.namespace in allowed
        assert ev.reporting_controller == "kcover.io/agent" or ev.source_component == "kcover.io/agent"
        if cfg.require_agent_pod:
            assert (event_watcher.identity_of(ev), ev.namespace, verdict.target.name) == (
                "n1", "kcover-system", "n1")


@FUZZ
@given(st.dictionaries(st.one_of(st.sampled_from(ANNOTATIONS), text), st.one_of(words, text), max_size=8))
def test_annotations_decode_to_a_fault_or_a_refusal(annotations: dict[str, str]) -> None:
    decoded = codec.decode_annotations(annotations)
    if isinstance(decoded, codec.Refused):
        assert decoded.reason
    else:
        assert decoded.occurrences >= 1


# ------------------------------------------------------------------------------------------ the ledger

LEDGER_KEYS = ["i", "f", "l", "e", "t", "w", "u", "m", "s", "p", "n", "d", "c", "r", "h", "x", "o", "k", "a", "j", "v"]
ledger_entries = json_like(LEDGER_KEYS)


@FUZZ
@given(st.dictionaries(st.one_of(st.sampled_from(["w.w1", "w.w1.g0", "n.n1", "breaker", "signals", "junk"]), text),
                       st.one_of(ledger_entries.map(lambda v: orjson.dumps(v, default=str).decode()
                                                    if not isinstance(v, float) or v == v else "NaN"), text),
                       max_size=6))
def test_a_ledger_entry_decodes_anything_into_an_entry_it_can_write_again(data: dict[str, str]) -> None:
    """Any LedgerEntry data (anyone allowed to write one could have written it) reads as an entry, or as
    nothing, and never raises; what it reads writes back to the same entry."""
    item: dict[str, Any] = {"metadata": {"name": "kcover-ledger.x", "resourceVersion": "1"}, "data": data}
    book = ledger.Ledger.offline()
    parsed = ledgerentries.parse_body(item)  # the one read path of every entry
    if parsed is None:
        return
    key, held = parsed
    again = ledgerentries.decode_entry(key, orjson.loads(orjson.dumps(held.entry.encode())))
    assert again == held.entry
    assert book.acted_on("", key) is None


@FUZZ
@given(json_like(LEDGER_KEYS))
def test_an_intent_decodes_or_is_absent(raw: Any) -> None:
    intent = ledgerentries.Intent.decode(raw)
    if intent is not None:
        assert ledgerentries.Intent.decode(intent.encode()) == intent


def _cache() -> caching.ClusterCache:
    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
           "metadata": {"name": "train", "namespace": "ml", "uid": "w1", "labels": {proj.OPT_IN_LABEL: "true"}}}
    pods = [{"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": f"train-worker-{i}", "namespace": "ml", "uid": f"p{i}",
        "labels": {"training.kubeflow.org/job-name": "train"},
        "ownerReferences": [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "train", "uid": "w1",
                             "controller": True}]}, "spec": {"nodeName": "n1"}} for i in range(2)]
    return caching.ClusterCache.offline([job, *pods])


CACHE = _cache()


@FUZZ
@given(st.sampled_from(["w.w1", "w.w2", "w.w1.g0", "n.n1", ""]),
       st.fixed_dictionaries({"i": words, "l": words, "e": st.integers(0, 3), "t": st.floats(0, 1e10),
                              "w": st.lists(st.one_of(words, st.just("w1"), st.just("train")), min_size=5, max_size=5),
                              "u": st.lists(st.sampled_from(["p0", "p1", "x"]), max_size=3),
                              "s": st.sampled_from(["", "training.kubeflow.org/job-name=train", "a=b"])},
                             optional={"sp": st.lists(st.lists(st.sampled_from(["ml", "train-worker-0", "p0", "x"]),
                                                               min_size=3, max_size=3), max_size=2),
                                       "p": st.lists(words, min_size=3, max_size=3)}))
def test_vetting_answers_every_intent(key: str, raw: dict[str, Any]) -> None:
    intent = ledgerentries.Intent.decode(raw)
    assert intent is not None
    rebuilt = restarting.vet(key, intent, CACHE, settings_.RecoverySettings())
    if not isinstance(rebuilt, str):  # only the real workload, with the selector its kind gives, passes
        assert intent.workload[4] == "w1"
        assert intent.selector == "training.kubeflow.org/job-name=train"
        assert rebuilt.workload.uid == "w1"
        assert {m.uid for m in rebuilt.members} <= {"p0", "p1"}, "only the workload's own pods"
    else:
        assert rebuilt


# ------------------------------------------------------------------------------------------ configuration

SETTING_KEYS = ["recovery", "detectors", "entries", "lease", "agent", "kube", "bus", "server", "rules", "action",
                "dry_run", "workload_cooldown_seconds", "namespaces_allow", "lease_duration_seconds",
                "renew_deadline_seconds", "event-watcher", "config", "enabled", "node_event_namespaces",
                "max_clock_skew_seconds", "delete_concurrency", "event_namespace"]


@FUZZ
@given(st.dictionaries(st.sampled_from(SETTING_KEYS[:8]), json_like(SETTING_KEYS), max_size=3))
def test_a_config_file_gives_settings_or_field_level_errors(data: dict[str, Any]) -> None:
    try:
        layered = layering.layer(file_data=data, file_name="config.yaml")
    except errors.ConfigError:
        return  # field-level lines: a clear refusal
    assert isinstance(layered.settings, settings_.Settings)
    assert isinstance(checking.rule_problems(layered.settings.recovery.rules), list)


@FUZZ
@given(st.lists(json_like(["detector", "reason", "severity", "target", "action"]), max_size=3))
def test_recovery_rules_are_checked_not_crashed_on(rules: list[Any]) -> None:
    assert all(isinstance(p, str) for p in checking.rule_problems(rules))


XID_KEYS = ["unknown", "xids", "action", "severity", "class", "name", "threshold", "count", "window_seconds",
            "escalate", "79", "13", "-1", "x"]


@FUZZ
@given(json_like(XID_KEYS))
def test_an_xid_policy_loads_or_says_why(data: Any) -> None:
    if not isinstance(data, dict):
        data = {"xids": data}
    try:
        policy = xid_policy.XidPolicy.from_mapping(data)
    except errors.ConfigError:
        return
    decision = policy.decide(79, [0.0, 1.0], 2.0)
    assert decision.occurrences >= 0


@FUZZ
@given(st.one_of(text, st.builds(lambda code, rest: f"NVRM: Xid (PCI:{rest}): {code}, pid={rest}, {rest}",
                                 st.integers(-5, 10**12), text)))
def test_kernel_lines_give_an_xid_or_none(line: str) -> None:
    found = xid_policy.parse_xid(line)
    assert found is None or found.code >= 0
    xid_policy.parse_gpu_at(line)


# ------------------------------------------------------------------------------------------ DCGM

DCGM_KEYS = ["DCGM GPU Diagnostic", "DCGM Diagnostic", "test_categories", "tests", "results", "status", "gpu_ids",
             "gpu_id", "warnings", "warning", "name", "GPU", "Health", "Error", "entity_group", "health",
             "incidents", "error_message", "FAIL", "Fail", "Warning", "Failure"]
TABLE = ["+---------------------------+------------------------------------------------+",
         "| Diagnostic                | Result                                         |",
         "|-----  Hardware  ----------+------------------------------------------------|",
         "| GPU Memory                | Fail - GPU: 0                                  |",
         "| Warning                   | GPU 0 Thermal violations totaling 1.0 s.       |",
         "| Memory                    | GPU0: Fail                                     |", "| x | y |", "|"]


@FUZZ
@given(st.one_of(json_like(DCGM_KEYS).map(lambda v: json.dumps(v, default=str)), text))
def test_dcgm_json_gives_findings_or_a_value_error(doc: str) -> None:
    for parse in (dcgmi.parse_diag_json, dcgmi.parse_health_json):
        try:
            found = parse(doc)
        except ValueError:
            continue
        assert all(isinstance(f, dcgmi.Finding) for f in found)


@FUZZ
@given(st.lists(st.one_of(st.sampled_from(TABLE), text), max_size=12))
def test_a_dcgm_table_gives_findings(lines: list[str]) -> None:
    found = dcgmi.parse_diag("\n".join(lines))
    assert all(isinstance(f, dcgmi.Finding) for f in found)


POLICY = xid_policy.load()
EXPORTER = ['DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-a"} 79', 'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="1"} 2',
            "# TYPE DCGM_FI_DEV_XID_ERRORS gauge", 'DCGM_FI_DEV_XID_ERRORS{gpu="x"} -3', "garbage {", ""]


@FUZZ
@given(st.lists(st.one_of(st.sampled_from(EXPORTER), text), max_size=6))
def test_exporter_metrics_give_findings_or_a_value_error(lines: list[str]) -> None:
    try:
        found = dcgmi.parse_exporter("\n".join(lines) + "\n", POLICY)
    except ValueError:
        return
    assert all(isinstance(f, dcgmi.Finding) for f in found)


# ------------------------------------------------------------------------------------------ plugins

MX = ["GPU#0  MXC500  0000:0f:00.0", "Attached GPUs : 8", "GPU#1", "hotspot : 45 C", "hotspot_temperature : x",
      "Double-bit ECC : 3", "hca_id: mlx5_0", "port 1 state : ACTIVE", ":", "GPU#2 x", "value : 12"]


@FUZZ
@given(st.lists(st.one_of(st.sampled_from(MX), text), max_size=10))
def test_mx_smi_output_parses_or_raises_parse_error(lines: list[str]) -> None:
    parsing = pytest.importorskip("kcover_metax.parsing")
    out = "\n".join(lines)
    for parse in (parsing.parse_gpu_list, parsing.parse_attached_gpus, parsing.parse_hotspot_temperatures,
                  parsing.parse_double_bit_ecc, parsing.parse_port_states):
        try:
            parse(out)
        except parsing.ParseError:
            pass


@FUZZ
@given(st.binary(max_size=200), st.integers(0, 300), st.one_of(st.none(), st.integers(-300, 300)))
def test_script_output_gives_a_status_and_a_bounded_message(output: bytes, limit: int, code: int | None) -> None:
    checking_ = pytest.importorskip("kcover_script_detector.checking")
    assert len(checking_.message_from_output(output, limit)) <= limit
    assert checking_.status_from_exit(code) in set(checking_.Status)


@FUZZ
@given(st.lists(st.one_of(text, st.sampled_from(["NCCL WARN Call to recv failed", "CUDA error: out of memory",
                                                 "RuntimeError: NCCL communicator was aborted",
                                                 "torch.distributed.elastic", "Xid 79"])), max_size=8))
def test_log_tails_classify_or_give_none(lines: list[str]) -> None:
    classifying = pytest.importorskip("kcover_logscan.classifying")
    found = classifying.classify("\n".join(lines))
    assert found is None or classifying.reason_for(found.failure_class)


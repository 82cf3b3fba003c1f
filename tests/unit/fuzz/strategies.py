"""Hypothesis strategies for hostile input: values that are valid, at a bound,
beyond it, of the wrong type, or crafted against a parser (issue 17, item 7).

The objects are built as the API server would hand them to the operator
(JSON-like dicts, parsed by the operator's own index entries), except where a
test builds models without validation to stand for objects stored under an
older CRD."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

# --- leaves ----------------------------------------------------------------------------------

VALID_QUANTITIES = ["40Gi", "1Mi", "8Pi", "512Mi", "10G", "1.5Gi", "100m", "2", "0.5", "1e3", "1E9", "64Ki"]
BOUNDARY_QUANTITIES = ["1048576", "1048575", "9007199254740992", "9007199254740993", "8Pi", "8193Ti", "1m", "1024",
                       "1025", "0.001", "1n", "999999999999999999999", "1e99", "1e-99", "1e100", "1e-100"]
HOSTILE_QUANTITIES = ["1e400", "2e308", "1E400", "1e9999999", "1.0000000000000000001e9999999", "-1", "0", "10m",
                      "NaN", "nan", "inf", "Infinity", "", " 1", "1 ", "1_000", "١٢", "0x10", "1Gi ", "+1Gi",
                      "1gi", "1GiB", "--1", "1e", "e1", ".", "1..2", "9" * 70, "1" + "0" * 400, "1e-9999999",
                      "\u0000", "1\n"]
VALID_DURATIONS = ["0s", "30s", "5m", "1h30m", "720h", "1.5h", "100ms", "10m", "2h"]
HOSTILE_DURATIONS = ["99999999999999h", "2562048h", "721h", "-1s", "1", "", "1d", "1y", "NaN", "1e3s", "∞",
                     "9" * 80 + "ns", "1h-1m", "0.000000000000001ns", " 1s", "1s ", "5m5m5m5m5m5m5m5m5m5m5m5m5m"]
JUNK = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                 st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20),
                 st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(), max_size=2))


def mostly(main: st.SearchStrategy[Any], rare: st.SearchStrategy[Any], one_in: int = 8) -> st.SearchStrategy[Any]:
    """``main``, and ``rare`` about one time in ``one_in`` (``one_of`` weighs its
    branches alike, and merges repeated ones)."""

    @st.composite
    def pick(draw: Any) -> Any:
        return draw(rare if draw(st.integers(1, one_in)) == 1 else main)

    return pick()


def quantity() -> st.SearchStrategy[Any]:
    """A quantity field: valid, at a bound, hostile, random text, or junk."""
    return st.one_of(
        st.sampled_from(VALID_QUANTITIES),
        st.sampled_from(BOUNDARY_QUANTITIES),
        st.sampled_from(HOSTILE_QUANTITIES),
        st.from_regex(r"[0-9]{1,30}(\.[0-9]{1,10})?([eE][+-]?[0-9]{1,8}|[KMGTPE]i?|[munkMGTPE])?", fullmatch=True),
        JUNK,
    )


def duration() -> st.SearchStrategy[Any]:
    """A duration field."""
    return st.one_of(
        st.sampled_from(VALID_DURATIONS),
        st.sampled_from(HOSTILE_DURATIONS),
        st.from_regex(r"([0-9]{1,20}(\.[0-9]{1,5})?(ns|us|µs|ms|s|m|h)){1,4}", fullmatch=True),
        JUNK,
    )


def fraction() -> st.SearchStrategy[Any]:
    return st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0, 1, 0.5, 1e-300, 1.0000001]),
                     JUNK)


LABEL_KEYS = ["app", "team", "kubernetes.io/metadata.name", "a" * 64, "bad key", "", "-x", "x/", "/x",
              "example.com/" + "b" * 63, "UPPER", "a.b/c.d", "é"]


def selector() -> st.SearchStrategy[Any]:
    """A label selector, valid or not (the core API's rules)."""
    requirement = st.fixed_dictionaries(
        {"key": st.sampled_from(LABEL_KEYS),
         "operator": st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist", "Equals", "", "in"])},
        optional={"values": st.lists(st.sampled_from(["train", "x" * 64, "", "a b", "v1"]), max_size=3)},
    )
    return st.one_of(
        st.just({}),
        st.fixed_dictionaries({}, optional={
            "matchLabels": st.dictionaries(st.sampled_from(LABEL_KEYS), st.sampled_from(["train", "", "x" * 64, "é"]),
                                           max_size=3),
            "matchExpressions": st.lists(requirement, max_size=3),
        }),
        JUNK,
    )


# --- objects ---------------------------------------------------------------------------------


def mutated(template: dict[str, Any], leaves: dict[str, st.SearchStrategy[Any]],
            most: int = 3) -> st.SearchStrategy[dict[str, Any]]:
    """``template`` (a valid object) with up to ``most`` of its ``leaves`` (dotted
    paths; missing parents are made) replaced by drawn values: valid objects,
    boundary values and hostile ones, in one stream."""
    return mutated_from([template], leaves, most)


def mutated_from(templates: list[dict[str, Any]], leaves: dict[str, st.SearchStrategy[Any]],
                 most: int = 3) -> st.SearchStrategy[dict[str, Any]]:
    """``mutated`` of one of ``templates``."""
    import copy

    paths = sorted(leaves)

    @st.composite
    def build(draw: Any) -> dict[str, Any]:
        out = copy.deepcopy(draw(st.sampled_from(templates)))
        chosen = draw(st.lists(st.sampled_from(paths), max_size=most, unique=True))
        for path in chosen:
            *parents, last = path.split(".")
            node: Any = out
            for p in parents:
                if not isinstance(node.get(p), dict):
                    node[p] = {}
                node = node[p]
            value = draw(leaves[path])
            if value is DELETE:
                node.pop(last, None)
            else:
                node[last] = value
        return out

    return build()


DELETE = object()
"""A drawn leaf that removes the key."""


def step() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"action": st.sampled_from(["Annotate", "Throttle", "Evict", "Delete", ""])},
        optional={"after": duration(), "cpuLimit": quantity()},
    )


BUDGET_SPEC = {
    "selector": {"matchLabels": {"app": "train"}},
    "limits": {"perPod": {"vram": "40Gi"}},
    "enforcement": {"mode": "Enforce", "escalation": [
        {"action": "Annotate", "after": "0s"}, {"action": "Throttle", "after": "5m", "cpuLimit": "100m"},
        {"action": "Evict", "after": "10m"}]},
}


def budget_spec() -> st.SearchStrategy[dict[str, Any]]:
    """A GPUMemoryBudget spec: a valid one with up to three fields drawn from
    valid, boundary and hostile values (or removed)."""
    gone = st.just(DELETE)
    leaves = {
        "selector": st.one_of(selector(), gone),
        "limits": st.one_of(JUNK, gone),
        "limits.perPod.vram": st.one_of(quantity(), gone),
        "limits.perPod.ram": quantity(),
        "limits.perDevice.vram": quantity(),
        "limits.perDevice.fraction": fraction(),
        "limits.total.vram": quantity(),
        "limits.total.ram": quantity(),
        "tolerance.overshootPercent": st.one_of(st.integers(-5, 200), JUNK),
        "tolerance.duration": duration(),
        "warningThreshold": fraction(),
        "leakDetection.enabled": st.one_of(st.booleans(), JUNK),
        "leakDetection.minGrowthPerHour": quantity(),
        "leakDetection.minWindow": duration(),
        "leakDetection.minEvidence": duration(),
        "leakDetection.evictBefore": duration(),
        "enforcement.mode": st.sampled_from(["Enforce", "DryRun", "Audit", ""]),
        "enforcement.escalation": st.one_of(st.lists(step(), max_size=4), JUNK),
    }
    templates = [BUDGET_SPEC, {**BUDGET_SPEC, "limits": {"perDevice": {"fraction": 0.25}, "total": {"vram": "60Gi"}}},
                 {**BUDGET_SPEC, "leakDetection": {"enabled": True, "minWindow": "10m", "evictBefore": "5m"}}]
    return st.one_of(mutated_from(templates, leaves, most=1), mutated_from(templates, leaves, most=3))


def budget_body(ns: str, name: str, uid: str) -> st.SearchStrategy[dict[str, Any]]:
    """A GPUMemoryBudget as a watch would deliver it (a spec drawn by
    ``budget_spec``, rarely junk; maybe a status holding junk)."""
    return st.fixed_dictionaries(
        {"apiVersion": st.just("vramguard.io/v1alpha1"), "kind": st.just("GPUMemoryBudget"),
         "metadata": st.just({"name": name, "namespace": ns, "uid": uid, "generation": 1, "resourceVersion": "1"}),
         "spec": mostly(budget_spec(), JUNK)},
        optional={"status": st.one_of(JUNK, st.fixed_dictionaries({}, optional={
            "violations": st.lists(st.fixed_dictionaries({
                "kind": st.sampled_from(["PodVRAM", "TotalVRAM", "Leak", "Nope"]),
                "pod": st.sampled_from(["h0", "h1", None]), "observedBytes": st.integers(-1, 2**64),
                "limitBytes": st.integers(-1, 2**64), "since": st.sampled_from(
                    ["2024-05-01T09:00:00Z", "0001-01-01T00:00:00Z", "9999-12-31T23:59:59Z", "junk"]),
                "step": st.sampled_from(["Annotate", "Throttle", "Evict", None]),
                "message": st.just("m")}), max_size=3)}))},
    )


BIG = mostly(
    st.one_of(st.integers(min_value=0, max_value=2**53), st.sampled_from([0, 1, 80 << 30, 2**53]),
              st.integers(min_value=0, max_value=100 << 30)),
    st.one_of(st.sampled_from([2**53 + 1, 2**63 - 1, 2**64, -1]), st.integers(min_value=-(2**64), max_value=2**70),
              JUNK),
    one_in=6,
)
"""A byte count: mostly within the API's bound (0 to 2^53), sometimes beyond it or junk."""


def device_usage(uuids: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({"uuid": st.sampled_from(uuids)}, optional={"usedBytes": BIG})


def report_status(pod_uids: list[str], uuids: list[str], sample_times: list[str]) -> st.SearchStrategy[Any]:
    """A NodeGPUUsage status with hostile numbers, duplicates and times."""
    memory = st.fixed_dictionaries({"totalBytes": BIG, "usableBytes": BIG},
                                   optional={"reservedBytes": BIG, "usedBytes": BIG, "freeBytes": BIG})
    device = st.fixed_dictionaries(
        {"uuid": st.sampled_from(uuids), "index": st.integers(-1, 8)},
        optional={"memory": memory, "processesComplete": st.booleans(),
                  "health": st.sampled_from(["Healthy", "Lost", "Error", "Bad"])})
    trend = st.fixed_dictionaries({}, optional={
        "growthBytesPerHour": st.one_of(st.floats(allow_nan=True), BIG),
        "growthLowBytesPerHour": st.one_of(st.floats(allow_nan=True), BIG),
        "windowSeconds": st.one_of(st.floats(allow_nan=True), BIG), "points": st.integers(-1, 500),
        "onsetSeconds": st.one_of(st.floats(allow_nan=True), BIG), "riseSeconds": st.floats(allow_nan=True),
        "floorRiseBytes": BIG})
    pod = st.fixed_dictionaries(
        {"uid": st.sampled_from(pod_uids)},
        optional={"attribution": st.sampled_from(["Measured", "Unknown", "Guess"]), "vramBytes": BIG,
                  "ramWorkingSetBytes": BIG, "devices": st.lists(device_usage(uuids), max_size=3), "trend": trend},
    )
    return mostly(
        st.fixed_dictionaries(
            {"sampleTime": mostly(st.just(sample_times[0]), st.sampled_from(sample_times), one_in=3)},
            optional={"devices": st.lists(device, max_size=3), "pods": st.lists(pod, max_size=4),
                      "truncated": st.booleans()}),
        JUNK,
    )


def violations_annotation() -> st.SearchStrategy[str]:
    """A ``vramguard.io/violations`` value: records, forged or malformed, or junk."""
    entry = st.fixed_dictionaries(
        {"budget": st.sampled_from(["b0", "b1", "gone", "", 7]),
         "kind": st.sampled_from(["PodVRAM", "DeviceVRAM", "TotalVRAM", "Leak", "X", None])},
        optional={"budgetUID": st.sampled_from(["uid-b0", "uid-b1", "other", 3]),
                  "device": st.sampled_from(["GPU-0", None, 1]),
                  "since": st.sampled_from(["2024-05-01T09:00:00Z", "1969-01-01T00:00:00Z", "3000-01-01T00:00:00Z",
                                            "junk", 0]),
                  "openedAt": st.sampled_from(["2024-05-01T09:00:00Z", "2024-05-01T10:00:00Z", "junk"]),
                  "step": st.sampled_from(["Annotate", "Throttle", "Evict", "Delete", None]),
                  "stepTime": st.sampled_from(["2024-05-01T09:05:00Z", "9999-01-01T00:00:00Z"]),
                  "observedBytes": BIG, "limitBytes": BIG, "eventsPosted": st.one_of(st.booleans(), JUNK),
                  "evictTargetUID": st.sampled_from(["uid-h0", "uid-c0", 1])})
    import json

    return st.one_of(
        st.lists(st.one_of(entry, JUNK), max_size=4).map(lambda v: json.dumps(v)),
        st.sampled_from(["", "[", "{}", "null", "[[[[" * 300 + "]]]]" * 300, "[" * 100000, '"x"', "[1e999999]"]),
        st.text(max_size=50),
    )


def original_cpu_annotation() -> st.SearchStrategy[str]:
    import json

    res = st.fixed_dictionaries({}, optional={"limit": st.one_of(quantity(), JUNK), "request": st.one_of(quantity(),
                                                                                                       JUNK)})
    return st.one_of(st.dictionaries(st.sampled_from(["main", "side", ""]), st.one_of(res, JUNK), max_size=2).map(
        json.dumps), st.text(max_size=30), st.sampled_from(["{", "[]", "null"]))

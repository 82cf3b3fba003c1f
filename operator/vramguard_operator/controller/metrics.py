"""Prometheus metrics of the operator (prometheus-client).

- ``vramguard_budget_violations{kind,namespace,budget}`` (gauge): open violations per
  budget and kind (PodVRAM, PodRAM, DeviceVRAM, TotalVRAM, TotalRAM, Leak, RAMLeak), as in
  the budget's ``status.violations`` (pending ones, still within the tolerance,
  are not counted).
- ``vramguard_budget_usage_ratio{namespace,budget,pod,resource}`` (gauge): measured
  usage / limit for every limit at or above the budget's warning threshold or
  violated (``resource`` is the limit kind, ``pod`` empty for a total; leak
  violations are not ratios and are left out). Limits below the threshold have
  no series, which keeps the cardinality to the pods that matter.
- ``vramguard_leak_suspected{namespace,budget,pod,memory}`` (gauge, 1): a leak
  violation is open on the pod, in ``memory`` VRAM (Leak) or RAM (RAMLeak).
- ``vramguard_actions_total{action,result,namespace}`` (counter): actions taken
  or attempted. ``action``: Warn, Annotate, Throttle, Cap, Evict, Recover.
  ``result``: ``success``, ``failed`` (the API refused, or did not answer), ``impossible`` (no
  container can be throttled in place; no device of the pod can hold a memory limit), ``blocked`` (a PodDisruptionBudget
  refused the eviction: HTTP 429), ``rate_limited`` (the eviction rate limit),
  ``backoff`` (waiting to retry a blocked eviction), ``dry_run`` (mode DryRun or
  exempt namespace: Event only), ``skipped`` (refused by the actions layer's own
  safety checks).
- ``vramguard_pod_memory_limits{namespace,limit}`` (gauge): pods whose
  ``vramguard.io/memory-limits`` sets a ``hard`` limit (a Cap) or a ``soft``
  limit (their share) on some device, as the last evaluation left them.
- ``vramguard_pod_memory_limits_not_held{namespace}`` (gauge): pods with a hard
  limit that their node agent reports it could not apply (Failed, Unsupported
  or Disabled; the Cap then does not bind, and the ladder goes on).
- ``vramguard_decision_latency_seconds`` (histogram): from the change that
  triggered an evaluation being seen by the operator (a node report, pod,
  budget or policy event; or the evaluation timer) to the end of applying its
  decisions.
- ``vramguard_evaluation_seconds`` (histogram): one evaluation pass (taking
  the changes, evaluating what they affect, applying the decisions; the status
  writes are the writer's, ``status_writer``).
- ``vramguard_status_writes_total{kind}`` (counter): budget status writes,
  ``at_once`` (anything but figures changed) or ``refresh`` (figures only).
- ``vramguard_shards_owned`` (gauge): namespace shards this replica holds
  (1 without shards).
- ``vramguard_node_report_age_seconds{node}`` (gauge): age of each node's latest
  report (evaluation time minus ``status.sampleTime``) at the last evaluation.
- ``vramguard_device_pressure_events_total{outcome,namespace}`` (counter):
  device-pressure actions (docs/device-pressure.md). ``outcome``: ``evicted``,
  ``gone`` (the pod went meanwhile), ``dry_run`` (would evict: Event only),
  ``exhausted`` (no pod above its share could be evicted: the device will run
  out); ``namespace`` the pod's.
- ``vramguard_device_free_bytes{node,device}``, ``vramguard_device_min_free_bytes{node,device}``
  (gauges): free memory (usable minus used) of each device a device-pressure
  rule applies to, and the free memory the rule keeps there, at the last
  evaluation; ``vramguard_device_pressure_state{node,device,state}`` (gauge, 1):
  what the rule found (``Clear``, ``Act``, ``Waiting``, ``NoCandidate``,
  ``Unknown``).
- ``vramguard_evaluation_errors_total{stage}`` (counter): evaluations of a group
  of namespaces that raised (``stage``: ``evaluate``, the engine; ``apply``, the
  actions; ``timeout``, an evaluation stopped at its time limit); the other
  groups go on, and the traceback is in the log.
- ``vramguard_object_problems_total{kind,reason}`` (counter): objects that
  affect only themselves, once per object and problem: a budget held
  (``InvalidSpec``, ``EvaluationFailed``, ``EvaluationTimeout``), a node report
  not believed (``ReportInvalid``), escalation state on a pod not obeyed
  (``StateRejected``); each is also a Warning Event on the object.
"""

from __future__ import annotations

import logging
from collections import Counter as _Tally
from collections.abc import Iterable, Mapping
from datetime import datetime

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from vramguard_api.budget import LEAK_MEMORY, GPUMemoryBudgetStatus
from vramguard_operator.engine.types import DevicePressureReport, PodMemoryLimits

log = logging.getLogger("vramguard.operator")

# From 5 ms (an evaluation with nothing to do) to 10 s (a slow API server).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    """The operator's metrics, registered on ``registry`` (the process-wide
    default registry unless given; tests pass their own ``CollectorRegistry``)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = REGISTRY if registry is None else registry
        self.violations = Gauge(
            "vramguard_budget_violations",
            "Open violations per budget and kind.",
            ["kind", "namespace", "budget"],
            registry=self.registry,
        )
        self.actions = Counter(
            "vramguard_actions",
            "Actions taken or attempted, by action and result.",
            ["action", "result", "namespace"],
            registry=self.registry,
        )
        self.decision_latency = Histogram(
            "vramguard_decision_latency_seconds",
            "Seconds from a triggering change being seen to its decisions being applied.",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.usage_ratio = Gauge(
            "vramguard_budget_usage_ratio",
            "Measured usage / limit, for limits at or above the warning threshold or violated.",
            ["namespace", "budget", "pod", "resource"],
            registry=self.registry,
        )
        self.leak = Gauge(
            "vramguard_leak_suspected",
            "1 while a leak violation is open on the pod; memory: VRAM (Leak) or RAM (RAMLeak).",
            ["namespace", "budget", "pod", "memory"],
            registry=self.registry,
        )
        self.evaluation_errors = Counter(
            "vramguard_evaluation_errors",
            "Evaluations of a group of namespaces that raised, by stage (evaluate, apply).",
            ["stage"],
            registry=self.registry,
        )
        self._init_pressure()
        self._device_series: dict[tuple[str, str], str] = {}
        self.memory_limits, self.memory_limits_not_held = self._memory_limit_gauges()
        self._limits_series: set[tuple[str, str]] = set()
        self.object_problems = Counter(
            "vramguard_object_problems",
            "Objects held, not believed or not obeyed (each affects only itself), by kind and reason.",
            ["kind", "reason"],
            registry=self.registry,
        )
        self._scale_metrics()
        self._violation_series: dict[tuple[str, str], set[str]] = {}
        self._ratio_series: dict[tuple[str, str], set[tuple[str, str]]] = {}
        self._leak_series: dict[tuple[str, str], set[tuple[str, str]]] = {}  # (pod, memory)
        self._report_metrics()

    def _report_metrics(self) -> None:
        """What the operator notes about the node reports themselves."""
        self.report_age = Gauge(
            "vramguard_node_report_age_seconds",
            "Age of each node's latest GPU usage report at the last evaluation, seconds.",
            ["node"],
            registry=self.registry,
        )
        self.report_unknown_pods = Gauge(
            "vramguard_node_report_unknown_pods",
            "Pod uids a node's report names that are not pods on that node (past a grace period; not acted on).",
            ["node"],
            registry=self.registry,
        )
        self._report_nodes: set[str] = set()

    def _scale_metrics(self) -> None:
        """The incremental loop's pass time, the status writer's writes, the shards held."""
        self.pass_seconds = Histogram(
            "vramguard_evaluation_seconds",
            "Seconds of one evaluation pass (changes taken, what they affect evaluated, decisions applied).",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.status_writes = Counter(
            "vramguard_status_writes",
            "Budget status writes: at_once (anything but figures changed) or refresh (figures only).",
            ["kind"],
            registry=self.registry,
        )
        self.shards = Gauge(
            "vramguard_shards_owned",
            "Namespace shards this replica holds (1 without shards).",
            registry=self.registry,
        )

    def action(self, action: str, result: str, namespace: str) -> None:
        """Count one action (see the module docstring for the label values)."""
        self.actions.labels(action=action, result=result, namespace=namespace).inc()

    def _init_pressure(self) -> None:
        """The device-pressure series (see the module docstring)."""
        self.pressure_events = Counter(
            "vramguard_device_pressure_events",
            "Device-pressure actions, by outcome (evicted, gone, dry_run, exhausted).",
            ["outcome", "namespace"],
            registry=self.registry,
        )
        self.device_free = Gauge(
            "vramguard_device_free_bytes",
            "Free memory (usable minus used) of each device a device-pressure rule applies to, bytes.",
            ["node", "device"],
            registry=self.registry,
        )
        self.device_min_free = Gauge(
            "vramguard_device_min_free_bytes",
            "Free memory the device-pressure rule keeps on each device, bytes.",
            ["node", "device"],
            registry=self.registry,
        )
        self.device_state = Gauge(
            "vramguard_device_pressure_state",
            "1 for what the device-pressure rule found on each device (Clear, Act, Waiting, NoCandidate, Unknown).",
            ["node", "device", "state"],
            registry=self.registry,
        )

    def pressure_event(self, outcome: str, namespace: str) -> None:
        """Count one device-pressure action (see the module docstring)."""
        self.pressure_events.labels(outcome=outcome, namespace=namespace).inc()

    def set_devices(self, devices: Iterable[DevicePressureReport]) -> None:
        """Set the device gauges from every device's last report; series of
        devices no longer reported are removed."""
        now = {(d.node, d.device): d for d in devices}
        self.update_devices({k: now.get(k) for k in {*now, *self._device_series}})

    def update_devices(self, changed: Mapping[tuple[str, str], DevicePressureReport | None]) -> None:
        """Set the gauges of the devices whose report changed (None: no longer
        reported, its series removed); the others keep theirs (a pass touches
        the devices of the nodes it evaluated, not every device)."""
        for key, d in changed.items():
            old = self._device_series.pop(key, None)
            if old is not None and (d is None or old != d.state):
                _remove(self.device_state, (*key, old))
            if d is None:
                _remove(self.device_free, key)
                _remove(self.device_min_free, key)
                continue
            for gauge, value in ((self.device_free, d.free_bytes), (self.device_min_free, d.min_free_bytes)):
                if value is None:
                    _remove(gauge, key)
                else:
                    gauge.labels(node=d.node, device=d.device).set(value)
            self.device_state.labels(node=d.node, device=d.device, state=d.state).set(1)
            self._device_series[key] = d.state

    def evaluation_error(self, stage: str) -> None:
        """Count one group evaluation that raised at ``stage`` (evaluate or apply)."""
        self.evaluation_errors.labels(stage=stage).inc()

    def object_problem(self, kind: str, reason: str) -> None:
        """Count one object problem (see the module docstring)."""
        self.object_problems.labels(kind=kind, reason=reason).inc()

    def observe_latency(self, seconds: float) -> None:
        """Record one evaluation's decision latency, seconds (negative clamps to 0)."""
        self.decision_latency.observe(max(0.0, seconds))

    def observe_pass(self, seconds: float) -> None:
        """Record one evaluation pass's duration, seconds."""
        self.pass_seconds.observe(max(0.0, seconds))

    def status_written(self, kind: str) -> None:
        """Count one budget status write (``at_once`` or ``refresh``)."""
        self.status_writes.labels(kind=kind).inc()

    def set_budget_violations(
        self, namespace: str, budget: str, status: GPUMemoryBudgetStatus | None
    ) -> None:
        """Set the violation gauges of one budget from its status: one series per
        kind with open violations; series of kinds no longer open are removed."""
        opened = [v for v in (status.violations if status else None) or () if v.opened_at]
        counts = _Tally(v.kind for v in opened)
        key = (namespace, budget)
        for kind in self._violation_series.get(key, set()) - set(counts):
            self.violations.remove(kind, namespace, budget)
        for kind, n in counts.items():
            self.violations.labels(kind=kind, namespace=namespace, budget=budget).set(n)
        if counts:
            self._violation_series[key] = set(counts)
        else:
            self._violation_series.pop(key, None)
        self._set_ratios(namespace, budget, status)
        leaks: list[tuple[str, str]] = [(v.pod or "", LEAK_MEMORY[v.kind]) for v in opened if v.kind in LEAK_MEMORY]
        self._set_leaks(namespace, budget, leaks)

    def _set_ratios(self, namespace: str, budget: str, status: GPUMemoryBudgetStatus | None) -> None:
        entries = [*((status.warnings or ()) if status else ()), *((status.violations or ()) if status else ())]
        ratios: dict[tuple[str, str], float] = {}
        for e in entries:
            if e.kind in LEAK_MEMORY or not e.limit_bytes:
                continue
            series = (e.pod or "", e.kind)
            ratios[series] = max(ratios.get(series, 0.0), e.observed_bytes / e.limit_bytes)
        key = (namespace, budget)
        for pod, kind in self._ratio_series.get(key, set()) - set(ratios):
            self.usage_ratio.remove(namespace, budget, pod, kind)
        for (pod, kind), ratio in ratios.items():
            self.usage_ratio.labels(namespace=namespace, budget=budget, pod=pod, resource=kind).set(ratio)
        self._ratio_series[key] = set(ratios)

    def _set_leaks(self, namespace: str, budget: str, leaks: list[tuple[str, str]]) -> None:
        """One series per (pod, memory) that leaks; the others removed."""
        key = (namespace, budget)
        for pod, memory in self._leak_series.get(key, set()) - set(leaks):
            self.leak.remove(namespace, budget, pod, memory)
        for pod, memory in leaks:
            self.leak.labels(namespace=namespace, budget=budget, pod=pod, memory=memory).set(1)
        self._leak_series[key] = set(leaks)

    def _memory_limit_gauges(self) -> tuple[Gauge, Gauge]:
        pods = Gauge(
            "vramguard_pod_memory_limits",
            "Pods whose vramguard.io/memory-limits sets a hard (Cap) or soft (share) limit.",
            ["namespace", "limit"],
            registry=self.registry,
        )
        not_held = Gauge(
            "vramguard_pod_memory_limits_not_held",
            "Pods with a hard limit their node agent reports it could not apply.",
            ["namespace"],
            registry=self.registry,
        )
        return pods, not_held

    def set_memory_limits(self, namespaces: Iterable[str], pods: Iterable[PodMemoryLimits]) -> None:
        """Set the memory-limit gauges of ``namespaces`` from one evaluation's
        ``EngineOutput.memory_limits``; series that fall to 0 are removed."""
        scope = set(namespaces)
        counts: _Tally[tuple[str, str]] = _Tally()
        for p in pods:
            ns = p.pod.namespace
            if any(lim.hard_limit is not None for lim in p.limits.values()):
                counts[(ns, "hard")] += 1
            if any(lim.soft_limit for lim in p.limits.values()):
                counts[(ns, "soft")] += 1
            if p.not_held:
                counts[(ns, "not_held")] += 1
        for ns, kind in [k for k in self._limits_series if k[0] in scope and k not in counts]:
            gauge, labels = self._limits_gauge(ns, kind)
            gauge.remove(*labels)
            self._limits_series.discard((ns, kind))
        for (ns, kind), n in counts.items():
            gauge, labels = self._limits_gauge(ns, kind)
            gauge.labels(*labels).set(n)
            self._limits_series.add((ns, kind))

    def _limits_gauge(self, namespace: str, kind: str) -> tuple[Gauge, tuple[str, ...]]:
        if kind == "not_held":
            return self.memory_limits_not_held, (namespace,)
        return self.memory_limits, (namespace, kind)

    def forget_budgets(self, keep: Iterable[tuple[str, str]], namespaces: Iterable[str]) -> None:
        """Remove the series of budgets in ``namespaces`` that are not in ``keep``
        (deleted budgets)."""
        scope, alive = set(namespaces), set(keep)
        known = set(self._violation_series) | set(self._ratio_series) | set(self._leak_series)
        for key in [k for k in known if k[0] in scope and k not in alive]:
            self.set_budget_violations(key[0], key[1], None)

    def set_report_ages(self, sample_times: Mapping[str, datetime | None], now: datetime) -> None:
        """Set ``vramguard_node_report_age_seconds`` for every node with a sampled report,
        and drop the series of nodes without one."""
        ages = {n: (now - t).total_seconds() for n, t in sample_times.items() if t is not None}
        for node in self._report_nodes - set(ages):
            self.report_age.remove(node)
        for node, age in ages.items():
            self.report_age.labels(node=node).set(age)
        self._report_nodes = set(ages)

    def set_unknown_pods(self, node: str, count: int | None) -> None:
        """Set ``vramguard_node_report_unknown_pods`` for a node, or drop its
        series (None: the flag cleared)."""
        if count is None:
            _remove(self.report_unknown_pods, (node,))
        else:
            self.report_unknown_pods.labels(node=node).set(count)


def _remove(gauge: Gauge, labels: tuple[str, ...]) -> None:
    try:
        gauge.remove(*labels)
    except KeyError:  # never set
        pass


_process_metrics: Metrics | None = None
_served: tuple[str, int] | None = None


def process_metrics() -> Metrics:
    """The process's ``Metrics`` on the default registry (prometheus-client
    registers names once per registry: one ``Metrics`` per process)."""
    global _process_metrics
    if _process_metrics is None:
        _process_metrics = Metrics()
    return _process_metrics


def serve_metrics(port: int, address: str) -> None:
    """Serve ``/metrics`` of the default registry on ``address:port``
    (prometheus-client's HTTP server, in a daemon thread); port 0 serves
    nothing. Once per process: later calls do nothing. Raises ``OSError``
    when the port cannot be bound."""
    global _served
    if port == 0 or _served is not None:
        return
    start_http_server(port, addr=address)
    _served = (address, port)
    log.info("metrics on %s:%d/metrics", address, port)

"""``vramguard top``: GPU pods with their VRAM (per device) and RAM, their
effective limits and where each came from, the VRAM trend and the state vramguard
has them in, sorted by pressure (or by ``--sort-by``'s columns), narrowed by
``-l`` (a label selector, as kubectl's), the states coloured on a terminal.
Works against any cluster where vramguard runs, with the current kubeconfig
(or ``--kubeconfig``).

What is read (all through the API, nothing from the operator's memory):

- Pods of the namespace (``-n``; ``-A`` for all) and the ``NodeGPUUsage``
  reports: VRAM per device, RAM working set and trend features, by pod uid;
- ``GPUMemoryBudget``s: the budgets that select a pod give its limits, lowered
  by the ``GPUMemoryPolicy`` ceilings exactly as the operator lowers them
  (``ceilings.effective_budget``), with their sources (``gmb/<budget>``, or
  ``policy/<name>/ceiling``); their status gives open and pending violations
  and warnings;
- a pod no budget selects: its implicit limits from the annotation
  ``vramguard.io/limits`` (``node/time-slicing:4``, ``vgpu/usable``,
  ``mig/1g.5gb``, ``policy/<name>``, ...);
- the pod annotations ``vramguard.io/violations`` (open violations that reached
  a step), ``vramguard.io/original-cpu`` (throttled) and
  ``vramguard.io/memory-limits`` (capped, soft limits), with what the node
  agent reports it holds (``-o wide``: the CAPS column);
- below the pods, the devices a device-pressure rule applies to (``devices``):
  free memory, the free memory the rule keeps, and what vramguard does there.

Modules: ``model`` (the snapshot and the rows, as data), ``limits``, ``caps`` and
``rows`` (``build_rows``: a ``Snapshot`` in, ``Row``s out; pure), ``devices``
(``build_devices``: the device-pressure table; pure), ``selection``
(``-l`` and ``--sort-by``; pure), ``render`` (text, colours and JSON; pure), ``command`` (the flags, the reads through
``controller.cluster_reads``, the refresh loop).
"""

"""The sharers' one table (policy.sharers.SHARERS): the informer's kept
annotations and admission's 'uses a GPU' derive from its rows."""

from __future__ import annotations

from vramguard_operator.policy.sharers import SHARERS, declares_grant, grant_annotations, may_use_gpu


def test_every_annotation_a_sharer_reads_is_kept_and_no_other():
    annotations = {k: "x" for s in SHARERS for k in s.reads}
    annotations["nvidia.com/container.main.gpus.devices"] = "GPU-1"
    annotations["example.com/unrelated"] = "y"
    kept = grant_annotations(annotations)
    assert set(kept) == set(annotations) - {"example.com/unrelated"}
    assert {s.name for s in SHARERS} == {"nvfractions", "hami", "koordinator", "kai"}
    assert all(s.source.startswith("github.com/") for s in SHARERS)


def test_allocation_records_alone_make_a_gpu_pod():
    assert declares_grant({"hami.io/vgpu-devices-allocated": "GPU-1,NVIDIA,1024,0:;"})
    assert declares_grant({"scheduling.koordinator.sh/device-allocated": "{}"})
    assert declares_grant({"nvidia.com/container.main.gpu-memory.limit": "2Gi"})
    assert not declares_grant({"nvidia.com/container.main.gpus.devices": "GPU-1"})  # a device list is no grant
    assert not declares_grant({"gpu-memory": "2048"})  # KAI's: a GPU pod through its request, not as a record
    pod = {"metadata": {"annotations": {"hami.io/vgpu-devices-allocated": "GPU-1,NVIDIA,1024,0:;"}}, "spec": {}}
    assert may_use_gpu(pod)
    assert not may_use_gpu({"metadata": {"annotations": {"example.com/x": "1"}}, "spec": {"containers": []}})

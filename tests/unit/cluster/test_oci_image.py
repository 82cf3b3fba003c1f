"""The local image builder (hack/cluster/oci_image.py): the tarball is a valid OCI
image layout whose digests, sizes and diff ids hold, named as ctr import reads it."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import io
import json
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("oci_image", ROOT / "hack" / "cluster" / "oci_image.py")
assert _spec is not None and _spec.loader is not None
OCI = importlib.util.module_from_spec(_spec)
sys.modules["oci_image"] = OCI  # dataclasses look their module up while the class is made
_spec.loader.exec_module(OCI)


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@pytest.fixture
def image(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    prog = tmp_path / "prog"
    prog.write_bytes(b"\x7fELF not really")
    prog.chmod(0o755)
    out = tmp_path / "img.tar"
    rc = OCI.main(["--name", "registry.k8s.io/pause:3.10", "--out", str(out), "--add", f"{prog}=/bin/busybox",
                 "--link", "/bin/sh=busybox", "--entrypoint", '["/bin/busybox", "sleep", "infinity"]'])
    assert rc == 0
    with tarfile.open(out) as tar:
        entries = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    return out, entries


def test_layout_digests_and_sizes_hold(image: tuple[Path, dict[str, bytes]]) -> None:
    _, entries = image
    assert json.loads(entries["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads(entries["index.json"])
    [desc] = index["manifests"]
    manifest_bytes = entries["blobs/sha256/" + desc["digest"][7:]]
    assert (sha(manifest_bytes), len(manifest_bytes)) == (desc["digest"], desc["size"])
    manifest = json.loads(manifest_bytes)
    for d in [manifest["config"], *manifest["layers"]]:
        blob = entries["blobs/sha256/" + d["digest"][7:]]
        assert (sha(blob), len(blob)) == (d["digest"], d["size"])
    config = json.loads(entries["blobs/sha256/" + manifest["config"]["digest"][7:]])
    layer = entries["blobs/sha256/" + manifest["layers"][0]["digest"][7:]]
    assert config["rootfs"]["diff_ids"] == [sha(gzip.decompress(layer))]
    assert config["config"]["Entrypoint"] == ["/bin/busybox", "sleep", "infinity"]
    assert desc["annotations"] == {"io.containerd.image.name": "registry.k8s.io/pause:3.10",
                                   "org.opencontainers.image.ref.name": "3.10"}
    assert desc["platform"]["os"] == "linux" == config["os"]


def test_layer_holds_the_files_links_and_parents(image: tuple[Path, dict[str, bytes]]) -> None:
    _, entries = image
    manifest = json.loads(entries["blobs/sha256/" + json.loads(entries["index.json"])["manifests"][0]["digest"][7:]])
    layer = gzip.decompress(entries["blobs/sha256/" + manifest["layers"][0]["digest"][7:]])
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert tar.extractfile(members["bin/busybox"]).read() == b"\x7fELF not really"  # type: ignore[union-attr]
    assert members["bin"].isdir()
    assert members["bin/busybox"].mode == 0o755
    assert members["bin/sh"].issym() and members["bin/sh"].linkname == "busybox"
    assert {m.mtime for m in members.values()} == {0}


def test_docker_manifest_points_at_the_same_blobs(image: tuple[Path, dict[str, bytes]]) -> None:
    _, entries = image
    [docker] = json.loads(entries["manifest.json"])
    assert docker["RepoTags"] == ["registry.k8s.io/pause:3.10"]
    assert docker["Config"] in entries and all(layer in entries for layer in docker["Layers"])


def test_same_inputs_give_the_same_digest(tmp_path: Path) -> None:
    prog = tmp_path / "p"
    prog.write_bytes(b"x")
    spec = OCI.ImageSpec("vramguard.local/busybox:1", ["/p"], files={"p": prog})
    first = OCI.write_image(spec, tmp_path / "a.tar")
    assert OCI.write_image(spec, tmp_path / "b.tar") == first
    prog.write_bytes(b"y")
    assert OCI.write_image(spec, tmp_path / "c.tar") != first


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--add", "nothing-here=/bin/x", "--entrypoint", '["/x"]'], "is not a file"),
        (["--add", "/bin/x", "--entrypoint", '["/x"]'], "--add wants PATH=VALUE"),
        (["--entrypoint", "/x"], "--entrypoint is not JSON"),
        (["--entrypoint", '"/x"'], "non-empty JSON list of strings"),
    ],
)
def test_bad_arguments_name_the_argument(tmp_path: Path, args: list[str], message: str) -> None:
    with pytest.raises(SystemExit, match=message):
        OCI.main(["--name", "a/b:c", "--out", str(tmp_path / "o.tar"), *args])
    assert not (tmp_path / "o.tar").exists()

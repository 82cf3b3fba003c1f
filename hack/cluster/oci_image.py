#!/usr/bin/env python3
"""Write a one-layer OCI image as a tarball, without a registry or a container engine.

The real node (docs/real-node.md) reaches no registry, so its images are made
here from files on this machine and imported with ``ctr images import``. The
tarball is an OCI image layout (image-spec v1.1, ``image-layout.md``:
``oci-layout``, ``index.json``, ``blobs/sha256/<hex>``) that also carries a
Docker ``manifest.json`` (the ``docker save`` format), so either importer reads
it. Output is reproducible: every mtime is 0 and every owner root, so the same
inputs give the same digests.

Usage::

    oci_image.py --name registry.k8s.io/pause:3.10 --out pause.tar \\
        --add /bin/busybox=bin/busybox --link bin/sleep=busybox \\
        --entrypoint '["/bin/busybox", "sleep", "infinity"]'

Errors: a missing ``--add`` source, a bad ``SRC=DEST`` pair or an entrypoint
that is not a JSON list of strings exit with a message naming the argument.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import platform
import sys
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
INDEX = "application/vnd.oci.image.index.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
# Go's GOARCH names, which image configs use (image-spec config.md, "architecture").
ARCHITECTURES = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le", "s390x": "s390x"}


@dataclass
class ImageSpec:
    """What goes into the image.

    ``files`` maps a path inside the image (no leading slash) to a host file,
    copied with its mode; ``links`` maps a path to a symlink target; directories
    are created as needed. ``entrypoint`` is the process's argv.
    """

    name: str
    entrypoint: list[str]
    files: dict[str, Path] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)
    env: list[str] = field(default_factory=lambda: ["PATH=/bin"])
    architecture: str = field(default_factory=lambda: ARCHITECTURES.get(platform.machine(), platform.machine()))


def _info(name: str, kind: bytes, mode: int, size: int = 0, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.linkname = kind, mode, size, link
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "root", "root"
    return info


def layer_tar(spec: ImageSpec) -> bytes:
    """The uncompressed layer: parent directories, files and links, sorted by path."""
    dirs = {str(p) for path in [*spec.files, *spec.links] for p in Path(path).parents if str(p) != "."}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in sorted(dirs):
            tar.addfile(_info(d + "/", tarfile.DIRTYPE, 0o755))
        for path in sorted([*spec.files, *spec.links]):
            if path in spec.links:
                tar.addfile(_info(path, tarfile.SYMTYPE, 0o777, link=spec.links[path]))
                continue
            source = spec.files[path]
            data = source.read_bytes()
            tar.addfile(_info(path, tarfile.REGTYPE, source.stat().st_mode & 0o7777, len(data)), io.BytesIO(data))
    return buf.getvalue()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _descriptor(media_type: str, data: bytes) -> dict[str, object]:
    return {"mediaType": media_type, "digest": _digest(data), "size": len(data)}


def image_blobs(spec: ImageSpec) -> tuple[dict[str, bytes], dict[str, object], dict[str, object]]:
    """The image's blobs by digest, its index.json and its Docker manifest.json entry.

    The index names the image twice: ``io.containerd.image.name`` (the full
    reference, which ``ctr images import`` uses as the image's name) and
    ``org.opencontainers.image.ref.name`` (the tag, as image-layout.md asks).
    """
    raw = layer_tar(spec)
    layer = gzip.compress(raw, mtime=0)
    config = _json({
        "architecture": spec.architecture,
        "os": "linux",
        "config": {"Entrypoint": spec.entrypoint, "Env": spec.env, "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [_digest(raw)]},
        "history": [{"created_by": "hack/cluster/oci_image.py", "created": "1970-01-01T00:00:00Z"}],
        "created": "1970-01-01T00:00:00Z",
    })
    manifest = _json({
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": _descriptor(CONFIG, config),
        "layers": [_descriptor(LAYER, layer)],
    })
    tag = spec.name.rsplit(":", 1)[1] if ":" in spec.name.rsplit("/", 1)[-1] else "latest"
    index = {
        "schemaVersion": 2,
        "mediaType": INDEX,
        "manifests": [{
            **_descriptor(MANIFEST, manifest),
            "platform": {"architecture": spec.architecture, "os": "linux"},
            "annotations": {"io.containerd.image.name": spec.name, "org.opencontainers.image.ref.name": tag},
        }],
    }
    blobs = {_digest(b): b for b in (layer, config, manifest)}
    docker = {"Config": "blobs/sha256/" + _digest(config)[7:], "RepoTags": [spec.name],
              "Layers": ["blobs/sha256/" + _digest(layer)[7:]]}
    return blobs, index, docker


def write_image(spec: ImageSpec, out: Path) -> str:
    """Write the image tarball to ``out`` (atomically); returns the manifest digest."""
    blobs, index, docker = image_blobs(spec)
    entries = {"oci-layout": _json({"imageLayoutVersion": "1.0.0"}), "index.json": _json(index),
               "manifest.json": _json([docker])}
    entries.update({"blobs/sha256/" + d[7:]: b for d, b in blobs.items()})
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("blobs/", "blobs/sha256/"):
            tar.addfile(_info(d, tarfile.DIRTYPE, 0o755))
        for name in sorted(entries):
            tar.addfile(_info(name, tarfile.REGTYPE, 0o644, len(entries[name])), io.BytesIO(entries[name]))
    tmp.replace(out)
    manifests = index["manifests"]
    assert isinstance(manifests, list)
    return str(manifests[0]["digest"])


def _pairs(values: Sequence[str], flag: str) -> dict[str, str]:
    pairs = {}
    for value in values:
        left, sep, right = value.partition("=")
        if not sep or not left or not right:
            raise SystemExit(f"oci_image: {flag} wants PATH=VALUE, got {value!r}")
        pairs[left] = right
    return pairs


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module docstring); prints the manifest digest."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", required=True, help="image reference, e.g. registry.k8s.io/pause:3.10")
    parser.add_argument("--out", required=True, type=Path, help="tarball to write")
    parser.add_argument("--add", action="append", default=[], help="HOST_FILE=PATH_IN_IMAGE (repeatable)")
    parser.add_argument("--link", action="append", default=[], help="PATH_IN_IMAGE=TARGET symlink (repeatable)")
    parser.add_argument("--entrypoint", required=True, help="JSON list of strings")
    args = parser.parse_args(argv)
    try:
        entrypoint = json.loads(args.entrypoint)
    except json.JSONDecodeError as err:
        raise SystemExit(f"oci_image: --entrypoint is not JSON ({err}): {args.entrypoint!r}") from None
    if not isinstance(entrypoint, list) or not entrypoint or not all(isinstance(a, str) for a in entrypoint):
        raise SystemExit(f"oci_image: --entrypoint must be a non-empty JSON list of strings, got {args.entrypoint!r}")
    files = {dest.lstrip("/"): Path(src) for src, dest in _pairs(args.add, "--add").items()}
    for dest, src in files.items():
        if not src.is_file():
            raise SystemExit(f"oci_image: --add {src}={dest}: {src} is not a file")
    links = {path.lstrip("/"): target for path, target in _pairs(args.link, "--link").items()}
    spec = ImageSpec(args.name, entrypoint, files=files, links=links)
    print(write_image(spec, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

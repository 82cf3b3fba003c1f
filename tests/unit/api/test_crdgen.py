from __future__ import annotations

from pathlib import Path

from vramguard_api import crdgen

ROOT = Path(__file__).resolve().parents[3]


def test_checked_in_crds_match_models():
    """`make verify` in test form: regenerating changes nothing."""
    assert crdgen.main(["--check", str(ROOT / "crds")]) == 0


def test_check_reports_drift(tmp_path, capsys):
    crdgen.main([str(tmp_path)])
    path = next(tmp_path.glob("*budgets.yaml"))
    path.write_text(path.read_text().replace("gmb", "gmx"))
    assert crdgen.main(["--check", str(tmp_path)]) == 1
    assert path.name in capsys.readouterr().err


def _walk(node, path=""):
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from _walk(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from _walk(node["items"], path + "[]")


def test_schemas_are_structural_and_described():
    for res in crdgen.RESOURCES:
        schema = crdgen.crd(res)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for path, node in _walk(schema):
            assert "$ref" not in node and "anyOf" not in node and "title" not in node, path
            assert "type" in node, f"{res.kind}{path} has no type"
            if path not in ("", ".metadata") and not path.endswith("[]"):  # list items are described by their field
                assert node.get("description"), f"{res.kind}{path} has no description"


def test_undescribed_field_is_an_error():
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    assert crdgen.undescribed(schema) == [".a"]

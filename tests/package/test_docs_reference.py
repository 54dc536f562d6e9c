"""docs/spec.md's field tables are generated from the spec's declarations (issue 49 item 4,
tools/reference.py): the page is what the generator writes, and every field of the spec has words
(its attribute docstring). Shown to fail: a planted field without a docstring is named, a planted
stale default and a section without a table fail the page's check."""

from __future__ import annotations

from dataclasses import dataclass, field

from dualtrain.spec import Experiment, LayerSpec
from tools import reference


@dataclass(frozen=True, kw_only=True)
class PlantedInner:
    depth: int = 1
    """How deep."""
    width: int = 2


@dataclass(frozen=True, kw_only=True)
class Planted:
    name: str = "x"
    """A name."""
    inner: PlantedInner = field(default_factory=PlantedInner)
    """A section with a field that has no words."""
    items: tuple[PlantedInner, ...] = ()
    rate: float | None = None
    """A rate."""


def test_the_spec_page_is_what_the_declarations_generate():
    found = reference.problems()
    assert not found, (
        "docs/spec.md's tables differ from the spec's declarations (dualtrain/spec/); run "
        "`python -m tools.reference --write`:\n" + "\n".join(found)
    )


def test_every_spec_field_has_words():
    missing = reference.missing_words()
    assert not missing, (
        "spec fields without words: give each an attribute docstring (a string literal on the "
        "line after the field): " + ", ".join(missing)
    )


def test_every_section_has_a_table_at_its_path():
    paths = [s.path for s in reference.sections()]
    assert paths[0] == reference.TOP
    for path in ("data", "model.layers[]", "optimizer.schedule", "train.early_stopping"):
        assert path in paths
    assert len(paths) == len(set(paths))
    assert {s.cls for s in reference.sections()} >= {Experiment, LayerSpec}


def test_a_field_without_a_docstring_is_named():
    assert reference.missing_words(Planted) == ["items", "inner.width"]


def test_a_planted_section_renders_its_types_defaults_and_words():
    text = reference.tables(Planted)
    assert list(text) == [reference.TOP, "inner"]
    rows = text[reference.TOP].splitlines()
    assert rows[0] == "| field | type | default | meaning |"
    assert "| `rate` | float \\| null | `null` | A rate. |" in rows
    assert "| `items` | list of `inner` | `[]` |  |" in rows
    assert "| `inner` | mapping | - | A section with a field that has no words. |" in rows


def test_a_stale_default_fails_the_check(tmp_path):
    page = tmp_path / "spec.md"
    text = reference.PAGE.read_text()
    row = "| `batch_size` | int | `128` |"
    assert text.count(row) == 1
    page.write_text(text.replace(row, "| `batch_size` | int | `256` |"))
    found = reference.problems(page)
    assert len(found) == 1 and found[0].startswith("data: the table differs"), found
    assert "python -m tools.reference --write" in found[0]
    assert reference.render(page.read_text()) == text  # --write puts it right


def test_a_section_without_its_table_fails_the_check(tmp_path):
    page = tmp_path / "spec.md"
    text = reference.PAGE.read_text()
    marker = reference.BEGIN.format("train.ema")
    page.write_text(text.replace(marker, "<!-- a table moved away -->"))
    found = reference.problems(page)
    assert any(p.startswith("train.ema: no generated table") for p in found), found


def test_the_yaml_defaults_read_as_a_spec_file_writes_them():
    assert reference.yaml_text(1e-5) == "1.0e-05"
    assert reference.yaml_text(None) == "null"
    assert reference.yaml_text((0.9, 0.999)) == "[0.9, 0.999]"
    assert reference.layer_default("units") == "required"
    assert reference.layer_default("stride") == "-"
    assert reference.layer_default("momentum") == "`0.1`"

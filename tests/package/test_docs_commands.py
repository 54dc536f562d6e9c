"""Every dualtrain command in the README and the docs is one the CLI takes (issue 49 item 6):
parsed by the real click commands, its shipped config loaded with its overrides
(tools/doc_commands.py). Shown to fail: an option renamed, a spec field renamed, a config moved,
each planted in a copy of the tutorial; and an inline command naming an option that is gone."""

from __future__ import annotations

import pytest

from tools import doc_commands
from tools.prose import ROOT

TUTORIAL = ROOT / "docs" / "tutorial-compare.md"


def test_every_documented_command_is_one_the_cli_takes():
    found = doc_commands.problems()
    assert not found, "\n".join(found)


def test_the_pages_hold_commands_to_check():
    pages = {c.page.name for p in doc_commands.PAGES for c in doc_commands.commands(p)}
    assert {"README.md", "tutorial-compare.md", "tutorial-port.md", "own-models.md"} <= pages


@pytest.mark.parametrize(
    ("old", "new", "said"),
    [
        ("--out runs/torch", "--output runs/torch", "No such option '--output'"),
        ("--set train.epochs=1", "--set train.epochz=1", "epochz"),
        ("configs/mnist_mlp.yaml", "configs/mnist_mlp_gone.yaml", "does not exist"),
        ("--backend torch", "--backend jax", "Received: 'jax'"),
    ],
)
def test_a_broken_command_is_named(tmp_path, old, new, said):
    page = tmp_path / "tutorial.md"
    lines = TUTORIAL.read_text().splitlines()
    n = next(i for i, line in enumerate(lines) if line.startswith("dualtrain run --backend torch"))
    assert old in lines[n]
    lines[n] = lines[n].replace(old, new)
    page.write_text("\n".join(lines))
    wrong = doc_commands.problems((page,))
    assert len(wrong) == 1 and said in wrong[0], wrong


def test_an_inline_command_with_a_gone_option_is_named(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("Give `dualtrain compare A B --reference-runz R1 R2` the pair.\n")
    wrong = doc_commands.problems((page,))
    assert len(wrong) == 1 and "no such option: --reference-runz" in wrong[0], wrong

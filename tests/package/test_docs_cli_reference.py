"""docs/cli.md is the command line's own declarations (issue 49 item 4): generated from the click
commands by tools/reference_cli.py, so it cannot go stale, and every command and option has words.
Shown to fail: a stale page (an option's words changed in a copy), and a planted command whose
option has no help."""

from __future__ import annotations

import click

from tools import reference_cli


def test_the_cli_page_is_what_the_commands_declare():
    found = reference_cli.problems()
    assert not found, "\n".join(found)


def test_a_stale_page_fails(tmp_path):
    page = tmp_path / "cli.md"
    page.write_text(reference_cli.PAGE.read_text().replace("Shortcut for", "A shortcut for", 1))
    assert reference_cli.problems(page) == [
        f"cli.md is not what the commands declare: {reference_cli.WRITE_HINT}"
    ]


def test_an_option_without_words_is_named(tmp_path):
    @click.command(help="A command of its own.")
    @click.option("--speed", type=int)
    @click.option("--seed", type=int, help="The seed.")
    def fast(speed, seed):
        pass

    group = click.Group(commands={"fast": fast})
    page = tmp_path / "cli.md"
    page.write_text(reference_cli.page(group))
    assert reference_cli.problems(page, group) == ["no help for: fast --speed"]
    assert "| `--seed` | INTEGER | - | The seed. |" in page.read_text()

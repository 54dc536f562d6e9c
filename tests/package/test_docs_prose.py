"""Docs a person reads (issue 49 item 5): every page of the README and the site keeps a mean under
22 words a sentence, no sentence over 50 words and no parenthesis inside a parenthesis, as
tools/prose.py counts them. Shown to fail: a 60-word sentence, a long-winded page, a nested
parenthesis, each planted in a copy of a real page."""

from __future__ import annotations

import pytest

from tools import prose

LONG = " ".join(["word"] * 59) + " end."
#: a page's worth of 30-word sentences
WORDY = "\n\n".join(" ".join(["word"] * 29) + " end." for _ in range(60))


@pytest.mark.parametrize("path", prose.PAGES, ids=lambda p: p.name)
def test_every_page_reads_in_short_sentences(path):
    page = prose.read(path)
    assert page.sentences, f"{path.name}: no prose found"
    assert page.mean < prose.MEAN_LIMIT, f"{path.name}: mean {page.mean:.1f} words a sentence"
    assert not page.too_long(), f"{path.name}: {page.too_long()[0]}"
    assert not page.nested(), f"{path.name}: a parenthesis inside a parenthesis: {page.nested()[0]}"


def _planted(tmp_path, text):
    page = tmp_path / "page.md"
    page.write_text((prose.ROOT / "docs" / "index.md").read_text() + "\n\n" + text + "\n")
    return prose.read(page)


def test_a_sixty_word_sentence_fails(tmp_path):
    page = _planted(tmp_path, LONG)
    assert page.too_long() == [LONG] and page.mean < prose.MEAN_LIMIT


def test_a_long_winded_page_fails(tmp_path):
    assert _planted(tmp_path, WORDY).mean >= prose.MEAN_LIMIT


def test_a_nested_parenthesis_fails(tmp_path):
    page = _planted(tmp_path, "A check (the fp64 pair (both backends) in float64) holds.")
    assert len(page.nested()) == 1


def test_code_and_tables_are_not_prose(tmp_path):
    text = f"```\n{LONG}\n```\n\n    {LONG}\n\n| a | {LONG} |\n\n# {LONG}"
    assert not _planted(tmp_path, text).too_long()

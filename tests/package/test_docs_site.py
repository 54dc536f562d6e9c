"""The docs build into a site (mkdocs, the Material theme; mkdocs.yml) with no warning and no
broken link: the build is strict, so a link to a page, an anchor or a repository file that is not
there fails it. Shown to fail on a planted broken link and a planted missing anchor."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

pytest.importorskip("mkdocs")
pytest.importorskip("material")

from mkdocs.commands.build import build  # noqa: E402
from mkdocs.config import load_config  # noqa: E402
from mkdocs.exceptions import Abort  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _build(root: Path, site: Path) -> tuple[bool, str]:
    """Build ``root``'s site into ``site`` in this process: (built, every warning it logged)."""
    said: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                said.append(record.getMessage())

    handler, log = Keep(), logging.getLogger("mkdocs")
    log.addHandler(handler)
    try:
        build(load_config(str(root / "mkdocs.yml"), site_dir=str(site)))
        built = True
    except Abort:
        built = False
    finally:
        log.removeHandler(handler)
    return built, "\n".join(said)


def _copy(tmp_path: Path) -> Path:
    """The docs, their config and build hook, and the repository files they link to."""
    root = tmp_path / "repo"
    for part in ("docs", "examples", "configs"):
        shutil.copytree(ROOT / part, root / part, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "tools").mkdir()
    shutil.copy(ROOT / "tools" / "docs_site.py", root / "tools" / "docs_site.py")
    shutil.copy(ROOT / "mkdocs.yml", root / "mkdocs.yml")
    return root


def test_the_docs_build_into_a_site_with_no_warning(tmp_path):
    built, said = _build(ROOT, tmp_path / "site")
    assert built and not said, said
    site = tmp_path / "site"
    assert (site / "index.html").is_file() and (site / "search" / "search_index.json").is_file()
    for job in ("spec", "own-models", "audit"):  # each job's page, in the navigation
        assert (site / job / "index.html").is_file()
    # a repository file the docs link to is in the site, the link pointed at it
    assert (site / "repo" / "examples" / "slurm" / "dualtrain.sbatch").is_file()
    page = (site / "clusters" / "index.html").read_text()
    assert 'href="../repo/examples/slurm/dualtrain.sbatch"' in page


def test_a_broken_link_or_anchor_fails_the_build(tmp_path):
    """A link to a page that is not there, to an anchor no heading makes, and to a repository
    file that is not there: each is named, and the strict build fails."""
    root = _copy(tmp_path)
    spec = root / "docs" / "spec.md"
    planted = "\nSee [the gone page](gone.md), [a lost part](#no-such), [x](../examples/gone.py).\n"
    spec.write_text(spec.read_text() + planted)
    built, said = _build(root, tmp_path / "site")
    assert not built, said
    for name in ("gone.md", "no-such", "gone.py"):
        assert name in said, said

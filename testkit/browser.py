"""A report as a person sees it: report.html opened in headless Chromium (Debian's ``chromium``),
its layout measured by the browser itself. A copy of the page gets a script that, once the page
has loaded, writes what it measured into the DOM, which ``--dump-dom`` prints: every image loaded
(with its size), every table's width against the page's, every cell whose content is wider than
the cell. A screenshot of the page is kept beside it, for a person to look at."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

#: The window the page is laid out in (a laptop's)
WIDTH, HEIGHT = 1280, 900

_PROBE = """
<script>
window.addEventListener('load', () => {
  const page = document.documentElement.clientWidth;
  const images = [...document.images].map(i => ({
    alt: i.alt, loaded: i.complete && i.naturalWidth > 0, width: i.naturalWidth,
    shown: i.getBoundingClientRect().width}));
  const tables = [...document.querySelectorAll('table')].map((t, k) => ({
    index: k, right: t.getBoundingClientRect().right, page: page}));
  const cells = [...document.querySelectorAll('td, th')]
    .filter(c => c.scrollWidth > c.clientWidth + 1)
    .map(c => ({text: c.textContent.slice(0, 80), scroll: c.scrollWidth, client: c.clientWidth}));
  const out = document.createElement('pre');
  out.id = 'dualtrain-browser-check';
  out.textContent = JSON.stringify({title: document.title, page, images, tables, cells,
    headings: [...document.querySelectorAll('h1, h2')].map(h => h.textContent)});
  document.body.appendChild(out);
});
</script>
"""


@dataclass(frozen=True)
class Seen:
    title: str
    headings: list[str]
    images: list[dict]
    wide_tables: list[dict]
    """Tables whose right edge is past the page's."""
    overflowing_cells: list[dict]
    """Cells whose content is wider than the cell."""
    screenshot: Path


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    exe = chromium()
    assert exe is not None  # the caller skips without one
    flags = [
        "--headless",
        "--no-sandbox",  # root in CI
        "--disable-gpu",
        "--hide-scrollbars",
        f"--window-size={WIDTH},{HEIGHT}",
        "--virtual-time-budget=10000",
    ]
    return subprocess.run(
        [exe, *flags, *args], capture_output=True, text=True, timeout=120, check=False
    )


def look(report: Path) -> Seen:
    """Open ``report`` (an HTML file) in headless Chromium and measure it."""
    report = Path(report)
    probe = report.with_name(report.stem + ".browser-check.html")
    page = report.read_text()
    probe.write_text(page.replace("</body>", _PROBE + "</body>"))
    dom = _run(["--dump-dom", probe.as_uri()])
    found = re.search(r'<pre id="dualtrain-browser-check">(.*?)</pre>', dom.stdout, re.S)
    if found is None:
        raise AssertionError(f"chromium did not run the page's check: {dom.stderr[-2000:]}")
    text = found.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">")
    data = json.loads(text.replace("&amp;", "&"))
    shot = report.with_name(report.stem + ".png")
    _run([f"--screenshot={shot}", report.as_uri()])
    probe.unlink()
    return Seen(
        data["title"],
        data["headings"],
        data["images"],
        [t for t in data["tables"] if t["right"] > t["page"] + 1],
        data["cells"],
        shot,
    )

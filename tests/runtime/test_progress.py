"""The chief's live progress bar on a terminal, plain lines everywhere else: the Reporter's
rendering. (Real runs on a pseudo-terminal and in a pipe:
tests/integration/test_progress_cli.py.)"""

from __future__ import annotations

import io

from dualtrain.runtime.progress import Reporter, clock
from dualtrain.spec import Progress


def test_render_fits_the_terminal_and_says_where_the_run_is():
    r = Reporter("[torch]", Progress.BAR, 200, stream=io.StringIO())
    r.start(0, 2)
    r.advance(50, 1, loss=0.4321, rate=12345.6)
    assert len(r.render(40)) < 40  # a narrow terminal gets a cut line, never a wrapped one
    for width in (80, 100, 160):
        text = r.render(width)
        assert len(text) < width
        assert "50/200" in text and "epoch 1/2" in text and "loss 0.4321" in text
        assert "12,346 samples/s" in text and "ETA" in text and "25%" in text
    assert "#" * 10 in r.render(160)  # room for a bar
    with r.busy("evaluating on 10,000 test samples"):
        assert "evaluating" in r.render(160)
    assert "evaluating" not in r.render(160)  # back to the ETA afterwards


def test_plain_mode_prints_the_logged_lines_and_no_carriage_returns():
    out = io.StringIO()
    r = Reporter("[tf]", Progress.AUTO, 10, stream=out)  # a StringIO is not a terminal
    assert not r.bar
    r.start(0, 1)
    r.advance(1, 1)
    r.logged("epoch 1/1 step 1/10 loss 2.3")
    r.line("eval after step 1")
    r.finish()
    assert out.getvalue() == "[tf] epoch 1/1 step 1/10 loss 2.3\n[tf] eval after step 1\n"


def test_bar_mode_keeps_lines_above_the_bar():
    out = io.StringIO()
    r = Reporter("[tf]", Progress.BAR, 10, stream=out)
    r.start(0, 1)
    r.advance(5, 1, loss=1.0, rate=5.0)
    r.logged("epoch 1/1 step 5/10 loss 1.0")  # the bar shows it: not printed
    r.line("eval after step 5")
    r.finish()
    text = out.getvalue()
    assert "step 5/10" not in text
    assert "\r\x1b[K[tf] eval after step 5\n\r[tf] train  50%" in text  # cleared, kept, redrawn
    assert text.endswith("\r\x1b[K")  # and cleared at the end


def test_clock():
    assert clock(0) == "0:00" and clock(61.4) == "1:01" and clock(3725) == "1:02:05"

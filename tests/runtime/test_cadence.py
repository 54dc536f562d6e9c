"""When the loop logs, evaluates, checkpoints and probes (dualtrain.runtime.cadence), without a
process: the rules as docs/configs.md states them, and against the loop's former nested epoch/step
iteration as an independent oracle."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dualtrain.runtime.cadence import Cadence, Tick
from dualtrain.spec import Every, load_spec


def _cadence(total=7, spe=3, log=2, ev=0, ckpt=None, **kw) -> Cadence:
    epochs = -(-total // spe)
    return Cadence(total, spe, epochs, log, ev, ckpt, **kw)


def test_ticks_number_steps_and_epochs_and_mark_the_ends():
    ticks = list(_cadence(total=7, spe=3).ticks(0))
    assert [t.step for t in ticks] == [1, 2, 3, 4, 5, 6, 7]
    assert [t.epoch for t in ticks] == [1, 1, 1, 2, 2, 2, 3]
    assert [t.step for t in ticks if t.end_of_epoch] == [3, 6, 7]  # max_steps cuts epoch 3
    assert [t.step for t in ticks if t.last] == [7]
    assert [t.step for t in _cadence(total=7, spe=3).ticks(4)] == [5, 6, 7]  # resumed after 4
    assert list(_cadence(total=7, spe=3).ticks(7)) == []


def test_stop_after_ends_the_run_there_as_at_its_last_step():
    c = _cadence(total=7, spe=3, ev=0, stop_after=5)
    ticks = list(c.ticks(0))
    assert [t.step for t in ticks] == [1, 2, 3, 4, 5]
    assert [t.step for t in ticks if t.last] == [5] and ticks[-1].end_of_epoch
    assert [t.step for t in c.ticks(0) if c.evaluate(t)] == [3, 5]
    assert [t.step for t in _cadence(total=7, spe=3, stop_after=5).ticks(3)] == [4, 5]
    assert [t.step for t in _cadence(total=7, stop_after=9).ticks(0)][-1] == 7  # past the end


def test_log_every_n_steps_and_every_epoch_end():
    c = _cadence(total=7, spe=3, log=2)
    assert [t.step for t in c.ticks(0) if c.log(t)] == [2, 3, 4, 6, 7]


def test_evaluate_at_epoch_ends_or_every_n_steps_and_always_last():
    c = _cadence(total=7, spe=3, ev=0)
    assert [t.step for t in c.ticks(0) if c.evaluate(t)] == [3, 6, 7]
    c = _cadence(total=7, spe=3, ev=4)
    assert [t.step for t in c.ticks(0) if c.evaluate(t)] == [4, 7]


def test_checkpoint_never_by_epoch_or_by_steps_and_at_the_last_or_a_stopping_step():
    for stopping in (False, True):
        assert not any(_cadence(ckpt=None).checkpoint(t, stopping) for t in _cadence().ticks(0))
    c = _cadence(total=7, spe=3, ckpt=Every.EPOCH)
    assert [t.step for t in c.ticks(0) if c.checkpoint(t, False)] == [3, 6, 7]
    c = _cadence(total=7, spe=3, ckpt=5)
    assert [t.step for t in c.ticks(0) if c.checkpoint(t, False)] == [5, 7]
    assert c.checkpoint(Tick(2, 1, False, False), stopping=True)


def test_probes_and_gradient_dumps_on_their_steps():
    c = _cadence(record_probes=frozenset({1, 5}), dump_grads=frozenset({2}))
    assert [t.step for t in c.ticks(0) if c.record_probe(t)] == [1, 5]
    assert [t.step for t in c.ticks(0) if c.dump_grad(t)] == [2]


def test_of_reads_the_train_section_and_spans_the_epochs_max_steps_needs():
    spec = load_spec(
        None, ["train.epochs=null", "train.max_steps=10", "train.log_every=4", "train.eval_every=5"]
    )
    c = Cadence.of(spec.train, 10, 4)
    assert (c.epochs, c.log_every, c.eval_every, c.checkpoint_every) == (3, 4, 5, None)
    spec = load_spec(None, ["train.epochs=2", "train.checkpoint_every=epoch"])
    assert Cadence.of(spec.train, 8, 4).epochs == 2
    assert Cadence.of(spec.train, 8, 4).checkpoint_every is Every.EPOCH


def _former_loop(spe, total, epochs, start, log_every, eval_every, every):
    """The loop's iteration before the cadence was its own object (runtime/loop.py at 4e9d658),
    with a fixed early stop: (step, epoch, log, evaluate, checkpoint) for each step taken."""
    out, step, stop_at = [], start, total  # no early stop
    for epoch in range(step // spe, epochs):
        for k in range(step - epoch * spe, spe):
            if step >= total:
                break
            step += 1
            end = k == spe - 1 or step == total
            log = step % log_every == 0 or end
            ev = (eval_every and step % eval_every == 0) or (not eval_every and end)
            ev = bool(ev or step == total)
            stop = step == stop_at
            ck = every is not None and (
                step == total or stop or (end if every is Every.EPOCH else step % every == 0)
            )
            out.append((step, epoch + 1, log, ev, bool(ck)))
        if step >= total:
            break
    return out


@settings(max_examples=200, deadline=None)
@given(
    spe=st.integers(1, 7),
    epochs=st.integers(1, 4),
    cut=st.integers(0, 6),
    start=st.integers(0, 30),
    log_every=st.integers(1, 9),
    eval_every=st.integers(0, 9),
    every=st.sampled_from([None, Every.EPOCH, 1, 2, 5]),
)
def test_the_same_schedule_as_the_former_loop(
    spe, epochs, cut, start, log_every, eval_every, every
):
    total = max(1, epochs * spe - cut)
    start = min(start, total)
    c = Cadence(total, spe, -(-total // spe), log_every, eval_every, every)
    got = [
        (t.step, t.epoch, c.log(t), c.evaluate(t), c.checkpoint(t, False)) for t in c.ticks(start)
    ]
    assert got == _former_loop(spe, total, c.epochs, start, log_every, eval_every, every)

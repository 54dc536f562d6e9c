"""An Accelerate loop recorded by the torch recorder: ``accelerator.prepare`` wraps the optimizer
in an AcceleratedOptimizer, which never runs torch.optim.Optimizer's constructor, so the recorder
failed to start on it (AttributeError: no _optimizer_step_pre_hooks); it records the optimizer
inside, which the wrapper steps."""

from __future__ import annotations

import pytest

accelerate = pytest.importorskip("accelerate")

import torch  # noqa: E402

import dualtrain.audit as audit  # noqa: E402
from dualtrain.audit.read import read_recorded  # noqa: E402


def test_an_accelerate_loop_records_its_steps_lrs_and_gradient_norms(tmp_path):
    acc = accelerate.Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    data = torch.utils.data.TensorDataset(torch.rand(32, 4), torch.randint(0, 3, (32,)))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    model, opt, loader, sched = acc.prepare(model, opt, loader, sched)
    assert type(opt).__name__ == "AcceleratedOptimizer"
    rec = audit.torch_recorder(
        tmp_path / "rec", model=model, optimizer=opt, loader=loader, scheduler=sched
    )
    norms = []
    for _ in range(2):
        for x, y in loader:
            rec.batch(x)
            opt.zero_grad()
            acc.backward(torch.nn.functional.cross_entropy(model(x), y))
            norms.append(float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])))
            opt.step()
            rec.step(0.0)
        sched.step()
    rec.close()
    run = read_recorded(tmp_path / "rec")
    assert len(run.steps) == 8 and [s.epoch for s in run.steps] == [1] * 4 + [2] * 4
    assert [s.lr for s in run.steps] == [0.1] * 4 + [0.05] * 4
    assert [s.grad_norm for s in run.steps] == pytest.approx(norms, rel=1e-6)
    assert (
        run.config.json["optimizer"]["type"] == "SGD"
        and run.config.json["optimizer"]["momentum"] == 0.9
    )

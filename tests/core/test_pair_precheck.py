"""A model pair's mistakes that need no framework are refused from the source alone, in one line
naming the absolute path looked at (dualtrain.core.pair.precheck); what the source does not show
plainly is left to the backend."""

import textwrap

import pytest

from dualtrain.core.pair.precheck import precheck
from dualtrain.errors import UserError
from dualtrain.spec import ModelSpec
from dualtrain.spec.load import from_dict

SOURCE = textwrap.dedent(
    """
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self, width=8, classes=10):
            super().__init__()

    def net(width=8, classes=10):
        return Net(width, classes)

    def anything(**kwargs):
        return Net()

    ALIAS = net
    """
)


def _model(tmp_path, torch="pairmod:net", args=None, weight_map=None, path=None) -> ModelSpec:
    (tmp_path / "pairmod.py").write_text(SOURCE)
    (tmp_path / "starmod.py").write_text("from pairmod import *\n")
    model = {
        "inputs": [{"name": "x", "shape": [4]}],
        "torch": torch,
        "keras": torch,
        "path": str(path or tmp_path),
        "args": args or {"width": 4},
    }
    if weight_map:
        model["weight_map"] = weight_map
    return from_dict({"model": model}).model


@pytest.mark.parametrize(
    "torch, args",
    [
        ("pairmod:net", None),
        ("pairmod:Net", None),
        ("pairmod:ALIAS", None),
        ("pairmod:anything", {"depth": 3}),
        ("starmod:whatever", {"depth": 3}),
        ("json:loads", None),
    ],
)
def test_what_the_source_allows_passes(tmp_path, torch, args):
    precheck(_model(tmp_path, torch, args))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"path": "/no/such/folder"}, "model.path: no such folder: /no/such/folder."),
        ({"torch": "nosuch:f"}, "model.torch: module 'nosuch' not found (no nosuch.py in {tmp}"),
        ({"torch": "pairmod:nosuch"}, "model.torch: {tmp}/pairmod.py defines no 'nosuch'"),
        ({"args": {"depth": 3}}, "model.torch: net in {tmp}/pairmod.py does not take model.args"),
        ({"torch": "pairmod:Net", "args": {"depth": 3}}, "does not take model.args ['depth']"),
        ({"weight_map": "nomap.yaml"}, "model.weight_map: file not found: /"),
    ],
)
def test_mistakes_are_one_line_with_the_absolute_path(tmp_path, kwargs, message):
    with pytest.raises(UserError) as err:
        precheck(_model(tmp_path, **kwargs))
    text = str(err.value)
    assert "\n" not in text and message.format(tmp=tmp_path) in text, text

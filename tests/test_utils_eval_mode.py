"""``taskloss.validation.eval_mode``: eval mode inside the block, every submodule's own flag restored after it (also on
error, also through a module that overrides ``train``). Used by MGS's candidate scoring, greedy decoding, the
completion metrics and the held-out NLL of the gradient-flow notebooks."""
from __future__ import annotations

import pytest
from torch import nn

from taskloss.validation import eval_mode


class _KeepsDropoutOff(nn.Sequential):
    def train(self, mode: bool = True):
        super().train(mode)
        self[1].training = False
        return self


def flags(model):
    return [m.training for m in model.modules()]


@pytest.mark.parametrize("cls", [nn.Sequential, _KeepsDropoutOff])
def test_eval_mode_restores_each_submodules_flag_also_on_error(cls):
    model = cls(nn.Linear(3, 4), nn.Dropout(0.5), nn.BatchNorm1d(4))
    model.train()
    model[2].eval()                                   # a frozen submodule of a training model
    before = flags(model)
    with eval_mode(model) as m:
        assert m is model and not any(flags(model))
    assert flags(model) == before
    with pytest.raises(RuntimeError, match="boom"):
        with eval_mode(model):
            raise RuntimeError("boom")
    assert flags(model) == before
    with eval_mode(model, enabled=False):             # disabled: the flags are not touched
        assert flags(model) == before
    model.eval()
    with eval_mode(model):
        assert not any(flags(model))
    assert not any(flags(model))

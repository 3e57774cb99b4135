"""Two MLPs of the same hidden sizes on the same input, run as one for collection (an actor and its critic).

At the batch sizes of collection (one row per env) a 64x64 MLP costs its op count, not its arithmetic: each
``linear`` or activation is several microseconds of dispatch. Run side by side, the actor's and the critic's hidden
layers become one op each: the first as one ``linear`` over both weight matrices stacked by rows, the later ones as
one batched matmul over the pair. The output layers stay separate (their widths differ, and a padded batched matmul
rounds differently). Every value is the same, bit for bit, as running the two networks one after the other
(``tests/test_twin_mlp.py`` checks it against ``evaluate_actions``, which is what the learner computes). That holds
for hidden widths that are multiples of 16 from 32 up; at narrower or odd widths (8, 16, 37) the stacked matmuls
can take another BLAS kernel and round apart, so ``fits`` refuses them and the networks run one after the other;
it refuses networks on a GPU too, where the equality is not checked.

A ``TwinMLP`` holds stacked copies of the weights as they were when it was made: make one per loop in which the
weights do not change (``Collector.collect`` makes one per rollout, through ``ActorCritic.frozen_act``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pickaxe.models.mlp import functional, hooked


class TwinMLP:
    """``(first(x), second(x))`` for two ``pickaxe.models.mlp.mlp`` networks with the same hidden layers, from a
    snapshot of their weights; for inference only (the stacked weights are detached copies)."""

    def __init__(self, first: nn.Sequential, second: nn.Sequential) -> None:
        if not self.fits(first, second):
            raise ValueError("TwinMLP takes two linear/tanh-or-relu MLPs with the same hidden layers (at least one)")
        self.activation = functional(first[1])
        with torch.no_grad():
            a, c = first[0], second[0]
            self.first_layer = (torch.cat((a.weight, c.weight)), torch.cat((a.bias, c.bias)))
            self.later_layers: list[tuple[torch.Tensor, torch.Tensor]] = []
            for i in range(2, len(first) - 1, 2):  # [2, in, out] weights (transposed views), [2, 1, out] biases
                a, c = first[i], second[i]
                weight = torch.stack((a.weight, c.weight)).transpose(1, 2)
                self.later_layers.append((weight, torch.stack((a.bias, c.bias)).unsqueeze(1)))
            self.outputs = [(net[-1].weight.clone(), net[-1].bias.clone()) for net in (first, second)]

    @staticmethod
    def fits(first: nn.Sequential, second: nn.Sequential) -> bool:
        """Whether both are ``linear, activation, ..., linear`` on the CPU with a tanh or relu, no hooks, and the
        same hidden layers, each a multiple of 16 wide and at least 32."""
        if len(first) != len(second) or len(first) < 3 or len(first) % 2 == 0:
            return False
        if any(p.device.type != "cpu" for p in (*first.parameters(), *second.parameters())):
            return False  # the same bits are checked on CPU BLAS only; GPU libraries choose kernels by shape
        for i, (a, b) in enumerate(zip(first, second, strict=True)):
            if i % 2:
                if not (type(a) is type(b) is type(first[1]) and functional(a) and functional(b)):
                    return False
            else:
                linear = type(a) is type(b) is nn.Linear and a.bias is not None and b.bias is not None
                linear = linear and not (hooked(a) or hooked(b))  # a hook must see its layer run
                if not linear or (i < len(first) - 1 and a.weight.shape != b.weight.shape):
                    return False
                if i < len(first) - 1 and (a.out_features < 32 or a.out_features % 16):
                    return False  # narrow or odd widths: the stacked matmul can take another kernel and round apart
        return True

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Both networks' outputs for ``x`` of shape ``[B, in]``."""
        weight, bias = self.first_layer
        h = self.activation(F.linear(x, weight, bias))  # [B, 2H]: both first hidden layers
        h = h.view(h.shape[0], 2, -1).transpose(0, 1)  # [2, B, H]
        for weight, bias in self.later_layers:
            h = self.activation(torch.baddbmm(bias, h, weight))
        (wa, ba), (wc, bc) = self.outputs
        return F.linear(h[0], wa, ba), F.linear(h[1], wc, bc)

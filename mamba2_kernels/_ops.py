"""What the public functions' ``torch.library`` operators share.

Each public function (the SSD call, the gated RMSNorm, the causal conv1d) is a custom operator with a fake
function and a registered autograd, its backward another operator, so that ``torch.compile`` keeps the call
in its graph (no graph break) while the operator runs the Helion kernels, with their config lookup and
binding, outside anything Dynamo traces. An operator's schema has no optional returns, and two empty
stand-ins would alias each other (which custom operators forbid), so optional results are left out of the
returned list: ``present`` drops them, ``placed`` puts them back.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def present(values: Sequence[torch.Tensor | None]) -> list[torch.Tensor]:
    """The given ones of ``values``, in order."""
    return [v for v in values if v is not None]


def placed(values: Sequence[torch.Tensor], given: Sequence[object | None]) -> list[torch.Tensor | None]:
    """``present``'s inverse: ``values`` back in the places where ``given`` is not None, None elsewhere."""
    rest = iter(values)
    return [None if g is None else next(rest) for g in given]

"""What the public functions' ``torch.library`` operators share.

Each public function (the SSD call, the gated RMSNorm, the causal conv1d) is a custom operator with a fake
function and a registered autograd, its backward another operator, so that ``torch.compile`` keeps the call
in its graph (no graph break) while the operator runs the Helion kernels, with their config lookup and
binding, outside anything Dynamo traces. An operator's schema has no optional returns, and two empty
stand-ins would alias each other (which custom operators forbid), so optional results are left out of the
returned list: ``present`` drops them, ``placed`` puts them back. The SSD call, whose eager host work
sets a short training step's time, goes through an ``autograd.Function`` over the same implementation outside
torch.compile instead (``differentiable``), and its backward skips the backward operator's dispatch there too
(``eager_or_operator``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch


def present(values: Sequence[torch.Tensor | None]) -> list[torch.Tensor]:
    """The given ones of ``values``, in order."""
    return [v for v in values if v is not None]


def placed(values: Sequence[torch.Tensor], given: Sequence[object | None]) -> list[torch.Tensor | None]:
    """``present``'s inverse: ``values`` back in the places where ``given`` is not None, None elsewhere."""
    rest = iter(values)
    return [None if g is None else next(rest) for g in given]


def differentiable(op: Any, impl: Callable[..., Any], setup_context: Callable[..., None],
                   backward: Callable[..., Any], *, grads_as_list: bool = False) -> Callable[..., Any]:
    """A call of ``op`` (the operator made of ``impl``) whose gradient is ``backward``: while torch.compile
    traces, or on a tensor subclass, the operator, with ``backward`` registered as its autograd; on plain
    tensors in eager code, a ``torch.autograd.Function`` over ``impl`` with the same context and backward.
    The operator's own autograd wrapper (schema defaults, pytree flattening, two redispatches) was a fifth of
    the SSD call's host work per training step. ``grads_as_list``: ``op`` returns a list, whose gradients
    ``backward`` takes as one list."""
    op.register_autograd(backward, setup_context=setup_context)

    def forward(ctx: Any, *inputs: Any) -> Any:
        # The forward takes ctx itself, with no separate setup_context: a Function that has one binds its
        # arguments to the forward's signature (``inspect.signature``) on every call.
        output = impl(*inputs)
        setup_context(ctx, inputs, output)
        return tuple(output) if grads_as_list else output

    eager = type(f"{impl.__name__.strip('_')}_function", (torch.autograd.Function,), {
        "forward": staticmethod(forward),
        "backward": staticmethod((lambda ctx, *grads: backward(ctx, list(grads))) if grads_as_list else backward),
    })

    return eager_or_operator(op, eager.apply)


def eager_or_operator(op: Any, eager: Callable[..., Any]) -> Callable[..., Any]:
    """A call of ``op`` that runs ``eager`` instead on plain tensors outside torch.compile, sparing the
    operator's dispatch. A tensor subclass (a fake tensor of a tracer other than torch.compile, a DTensor)
    needs the operator: its fake function, or its dispatch."""

    def call(*inputs: Any) -> Any:
        if torch.compiler.is_compiling() or type(inputs[0]) is not torch.Tensor:
            return op(*inputs)
        return eager(*inputs)

    return call

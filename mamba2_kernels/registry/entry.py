"""A registry entry: what a kernel is, how each of its three implementations is called, and how it is judged.

The key choice: mamba-ssm's wrapper, the pure-PyTorch reference and the Helion function take the same
arguments in the same order and return the same tuple, so any tool runs any implementation the same way.
``helion`` is None until the Helion implementation exists; tools then report the kernel as missing, never as
passing and never by running mamba-ssm in its place.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from mamba2_kernels import _mamba_ssm
from mamba2_kernels.suites import ShapeSpec
from mamba2_kernels.targets import load_target

Inputs = dict[str, Any]
Outputs = dict[str, torch.Tensor]
FAMILIES = ("ssd", "norm", "conv", "layer")
DEFAULT_TOLERANCE = (1e-2, 1e-2)  # (atol, rtol)
# Phases of whole calls (many kernels each): timed as users make the call, never summed with kernels.
COMPOSITE_PHASES = ("call_", "layer_")


class MissingImplementation(LookupError):
    """The entry has no implementation of the requested kind (yet)."""


class BaselineUnavailable(LookupError):
    """The comparison implementation (mamba-ssm or causal-conv1d) cannot be loaded here."""


@dataclass(frozen=True)
class KernelEntry:
    name: str
    family: str
    phase: str
    replaces: str
    make_inputs: Callable[[ShapeSpec, int, torch.device], Inputs]
    args: tuple[str, ...]
    outputs: tuple[str, ...]
    reference: str
    baseline: str | None
    helion: str | None
    bytes_moved: Callable[[ShapeSpec], int]
    flops: Callable[[ShapeSpec], int]
    tolerances: dict[str, tuple[float, float]] = field(default_factory=dict)
    # "mamba_ssm": ``baseline`` is a path inside mamba-ssm (loaded without its CUDA extension) or a "mamba2_kernels."
    # wrapper over such paths; otherwise ``baseline`` is a plain "module:function" of the package named here.
    baseline_name: str = "mamba_ssm"
    # A package the baseline needs at run time (causal-conv1d's CUDA kernels), absent on many installs.
    baseline_requires: str | None = None
    # A whole call through autograd: the outputs are the gradients of these inputs for upstream "dout" (those
    # of inputs that are None at a shape are left out).
    grad_of: tuple[str, ...] = ()
    # Outputs that concatenate quantities of different scales, judged part by part: inputs -> {output:
    # ((part, width along the last dim), ...)}; the parts replace the output as "output.part".
    output_parts: Callable[[Inputs], dict[str, tuple[tuple[str, int], ...]]] | None = None

    @property
    def has_helion(self) -> bool:
        return self.helion is not None

    def tolerance(self, output: str) -> tuple[float, float]:
        return self.tolerances.get(output, DEFAULT_TOLERANCE)

    def inputs(self, shape: ShapeSpec, seed: int, device: torch.device | str = "cpu") -> Inputs:
        return self.make_inputs(shape, seed, torch.device(device))

    def bind(self, fn: Callable[..., Any], inputs: Inputs) -> Callable[[], Any]:
        """``fn`` with this entry's arguments taken from ``inputs``: the call that gets timed.

        ``args`` items are input names passed by position, or ``"keyword=name"`` passed by keyword.
        With ``grad_of``, the call is a forward and a backward through autograd (``dout`` upstream)."""
        positional = tuple(inputs[a] for a in self.args if "=" not in a)
        keywords = {k: inputs[v] for k, v in (a.split("=", 1) for a in self.args if "=" in a)}
        if not self.grad_of:
            return lambda: fn(*positional, **keywords)
        # An optional input the shape's call leaves out (z, initial_states) has no gradient: None in its place.
        leaves = {name: inputs[name].detach().requires_grad_(True) for name in self.grad_of
                  if inputs[name] is not None}
        by_position = [name for name in self.args if "=" not in name]
        positional = tuple(leaves.get(name, value) for name, value in zip(by_position, positional, strict=True))
        keywords = {k: leaves.get(self._input_for(k), v) for k, v in keywords.items()}
        wanted, dout = tuple(leaves.values()), inputs["dout"]

        def forward_backward():
            with torch.enable_grad():
                out = fn(*positional, **keywords)
                grads = iter(torch.autograd.grad(out, wanted, dout))
                return tuple(next(grads) if name in leaves else None for name in self.grad_of)

        return forward_backward

    def outputs_at(self, inputs: Inputs) -> tuple[str, ...]:
        """The outputs a call with ``inputs`` gives: of a whole call through autograd, the gradients of the
        inputs given at the shape (``grad_of`` and ``outputs`` pair up in order)."""
        if not self.grad_of:
            return self.outputs
        return tuple(out for out, name in zip(self.outputs, self.grad_of, strict=True) if inputs[name] is not None)

    def _input_for(self, keyword: str) -> str:
        return next(a.split("=", 1)[1] for a in self.args if a.startswith(f"{keyword}="))

    def _call(self, fn: Callable[..., Any], inputs: Inputs) -> Outputs:
        result = self.bind(fn, inputs)()
        if not isinstance(result, (tuple, list)):
            result = (result,)
        if len(result) < len(self.outputs):
            raise ValueError(f"{self.name}: expected outputs {self.outputs}, got {len(result)} values")
        outputs = {name: value for name, value in zip(self.outputs, result, strict=False) if value is not None}
        return self._split_parts(outputs, inputs)

    def _split_parts(self, outputs: Outputs, inputs: Inputs) -> Outputs:
        if self.output_parts is None:
            return outputs
        for name, parts in self.output_parts(inputs).items():
            whole = outputs.pop(name)
            pieces = whole.split([width for _, width in parts], dim=-1)
            outputs.update({f"{name}.{part}": piece for (part, _), piece in zip(parts, pieces, strict=True)})
        return outputs

    def helion_fn(self) -> Callable[..., Any]:
        if self.helion is None:
            raise MissingImplementation(f"{self.name}: no Helion implementation yet")
        return load_target(self.helion)

    def baseline_fn(self) -> Callable[..., Any]:
        if self.baseline is None:
            raise BaselineUnavailable(f"{self.name}: mamba-ssm has no counterpart")
        try:
            if self.baseline_requires:
                importlib.import_module(self.baseline_requires)
            if self.baseline_name == "mamba_ssm" and not self.baseline.startswith("mamba2_kernels."):
                return _mamba_ssm.resolve(self.baseline)
            return load_target(self.baseline)
        except ImportError as exc:
            needs = self.baseline_requires or self.baseline_name
            raise BaselineUnavailable(f"{self.name}: the baseline needs {needs}, unavailable here: {exc}") from exc

    def run_helion(self, inputs: Inputs) -> Outputs:
        return self._call(self.helion_fn(), inputs)

    def run_baseline(self, inputs: Inputs) -> Outputs:
        return self._call(self.baseline_fn(), inputs)

    def run_reference(self, inputs: Inputs, dtype: torch.dtype | None = torch.float64) -> Outputs:
        """The pure-PyTorch reference; floating inputs are first cast to ``dtype`` (None: as given)."""
        if dtype is not None:
            inputs = {k: v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                      for k, v in inputs.items()}
        return self._call(load_target(self.reference), inputs)

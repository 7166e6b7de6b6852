"""Run-time dispatch of Helion kernels with configs from the config store.

A training job never autotunes: every call gets a config from ``mamba2_kernels/configs/<gpu-slug>.yaml`` (or
Helion's default config, logged and counted as a fallback). Autotuning at run time happens only when
asked for with ``MAMBA2_GUARD_AUTOTUNE=1``.

Execution modes:
  * ``compiled``: Helion's Triton backend (a GPU, or CPU tensors under ``TRITON_INTERPRET=1``);
  * ``ref``: Helion's eager reference mode, for ``HELION_INTERPRET=1`` or CPU tensors otherwise.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import logging
import sys
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any

import torch

from mamba2_kernels import _environ, config_store
from mamba2_kernels.config_store import ShapeKey

log = logging.getLogger(__name__)

AUTOTUNE_ENV = "MAMBA2_GUARD_AUTOTUNE"
# The lookup source of a config ``pinned_config`` puts in place: the call runs on it or fails. Falling back to
# the next candidate, as a stored config does, would give a tuner the time and precision of another config
# under the pinned one's name.
PINNED = "pinned"
_captured: list[tuple[TunedKernel, tuple[Any, ...]]] | None = None
# name -> kernel: every TunedKernel defined so far (the names config files may use)
TUNED_KERNELS: dict[str, TunedKernel] = {}


@contextlib.contextmanager
def capture_launches() -> Iterator[list[tuple[TunedKernel, tuple[Any, ...]]]]:
    """Record every (kernel, args) launched inside the block: how the tuner finds what a public
    function runs, with the exact arguments its host code prepares."""
    global _captured
    previous, _captured = _captured, []
    try:
        yield _captured
    finally:
        _captured = previous


def _env_true(name: str) -> bool:
    return (_environ.get(name) or "").strip().lower() in {"1", "true", "yes", "on"}


def exec_mode(device: torch.device) -> str:
    if _env_true("HELION_INTERPRET"):
        return "ref"
    if device.type == "cpu":
        return "compiled" if _env_true("TRITON_INTERPRET") else "ref"
    return "compiled"


@functools.cache
def _cuda_slug(index: int) -> str:
    return config_store.slugify(torch.cuda.get_device_name(index))


def device_slug(device: torch.device) -> str:
    """The config-file slug of a device: 'nvidia-h200', or 'cpu'."""
    override = config_store.slug_override()
    if override:
        return override
    if device.type != "cuda":
        return device.type
    return _cuda_slug(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _cuda_capability(index: int) -> str:
    major, minor = torch.cuda.get_device_capability(index)
    return f"{major}.{minor}"


def device_capability(device: torch.device) -> str | None:
    """A CUDA device's compute capability as fingerprints record it ("9.0"): which other GPUs' config files
    may serve it (``config_store.borrowable_files``). None off CUDA."""
    if device.type != "cuda":
        return None
    return _cuda_capability(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _triton_allocator_unset() -> Callable[[], bool]:
    """Whether this thread's context still has Triton's null allocator, as a function that only reads the
    context variable: Helion's setter imports three names at every call, a few microseconds per launch."""
    from triton.runtime._allocation import NullAllocator, _allocator

    return lambda: isinstance(_allocator.get(), NullAllocator)


def ensure_triton_allocator() -> None:
    """Give Triton its scratch allocator in this thread. A config with device-side tensor descriptors needs
    one; Triton keeps it in a context variable, which a new thread starts without (autograd runs the backward
    on its own). On the H200 the bench's whole call failed for the lack of it (baselines/runs/decisions.md)."""
    if _triton_allocator_unset()():
        import helion.runtime

        helion.runtime.set_triton_allocator()


def _first_device(args: tuple[Any, ...]) -> torch.device:
    for arg in args:
        if isinstance(arg, torch.Tensor):
            return arg.device
    raise TypeError("a Helion kernel needs at least one tensor argument")


def call_layout(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """The exact shapes, strides and dtypes of a call's tensors: what Helion binds a kernel to. A
    ``helion.Kernel`` keeps one prepared fast path, for the binding it ran last; called by turns at two
    layouts (the backward's two ``bmm_chunk_bwd`` launches, the second on a transposed view) it rebuilt its
    argument guard, an ``eval``, on every launch. The dispatch gives each layout a kernel object of its own."""
    return tuple((arg.shape, arg.stride(), arg.dtype) for arg in args if isinstance(arg, torch.Tensor))


def call_signature(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Everything a call's shape key and layout are made of but the device (the caller's, from its first tensor;
    a call whose tensors are on two devices fails in its kernel): each tensor's shape, strides and dtype, and
    each other argument itself. TypeError where an argument is unhashable. Each tensor's ``device`` would make a
    new ``torch.device``, and a list built then made a tuple is quicker than a generator's: a third of this
    function's time, on every launch."""
    signature = tuple([(arg.shape, arg.stride(), arg.dtype) if isinstance(arg, torch.Tensor) else arg
                       for arg in args])
    hash(signature)
    return signature


# How many call signatures a kernel remembers (``TunedKernel._by_signature``): a scalar argument that changed on
# every call would otherwise grow the map without end; past the cap, new signatures take the shape-key path.
MAX_SIGNATURES = 1024


def scaled_atol(expected: torch.Tensor, atol: float) -> float:
    """``atol`` scaled by max(1, rms(expected)), as Helion's autotuner does by default: outputs that are
    large reductions (sums over thousands of products) carry accumulation-order noise in proportion to
    their scale, and an absolute floor of 1e-2 would call that noise an error wherever they cross zero."""
    rms = expected.double().square().mean().sqrt().item() if expected.numel() else 0.0
    return atol * max(1.0, rms)


def check_outputs_against_baseline(name: str, partial_sums: dict[int, int], finish: Callable[..., Any] | None,
                                   actual: Any, expected: Any, atol: float = 1e-2, rtol: float = 1e-2) -> None:
    """Raise AssertionError when a candidate config's outputs differ from the baseline config's. With
    ``finish``, the finished outputs are compared; an output listed in ``partial_sums`` whose partial
    count differs is compared summed over that dimension."""
    if finish is not None:
        actual, expected = finish(*actual), finish(*expected)
    pairs = zip(actual, expected, strict=True) if isinstance(actual, tuple | list) else [(actual, expected)]
    for index, (got, want) in enumerate(pairs):
        if not isinstance(got, torch.Tensor):
            continue
        if got.shape != want.shape and index in partial_sums:
            got, want = got.sum(partial_sums[index]), want.sum(partial_sums[index])
        torch.testing.assert_close(got.double(), want.double(), atol=scaled_atol(want, atol), rtol=rtol,
                                   msg=lambda m, i=index: f"{name} output {i}: {m}")


class TunedKernel:
    """A Helion kernel function plus the rule that maps its arguments to a config-store shape key.

    ``partial_sums`` maps an output's position to the dimension along which it holds per-program partial
    sums (reduced on the host): their number depends on the config, so the autotuner's check against the
    default config's outputs compares those outputs summed over that dimension. ``finish`` (a module-level
    function, so that it pickles) turns the kernel's outputs into the finished ones where partials need more
    than a sum; the check then compares its results.

    ``seeds`` are partial configs (block sizes, warps, stages: mamba-ssm's own autotune lists, where it
    has them) laid over Helion's default config to start the autotuner's search in known-good regions."""

    def __init__(self, fn: Callable[..., Any], *, name: str, shape_key: Callable[..., ShapeKey],
                 partial_sums: dict[int, int] | None = None, finish: Callable[..., Any] | None = None,
                 seeds: Sequence[dict[str, Any]] = ()):
        self.fn = fn
        self.name = name
        TUNED_KERNELS[name] = self
        self.shape_key = shape_key
        self.partial_sums = dict(partial_sums or {})
        self.finish = finish
        self.seeds = [dict(seed) for seed in seeds]
        self._kernels: dict[tuple[str, str, Hashable], Any] = {}
        # (device, shape key, mode, layout) -> the helion.Kernel chosen; the layout is ``call_layout``'s
        self._dispatch: dict[tuple[torch.device, ShapeKey, str, Hashable], Any] = {}
        # (mode, device, call_signature) -> the kernel its dispatch chose: a repeated call skips the shape key, a
        # few microseconds of Python per launch that an eager training loop pays on all of them.
        self._by_signature: dict[tuple[str, torch.device, tuple[Any, ...]], Any] = {}
        functools.update_wrapper(self, fn)

    def helion_kernel(self, config: dict[str, Any] | None, mode: str = "compiled", layout: Hashable = None,
                      **settings: Any):
        """A ``helion.Kernel`` of this function pinned to ``config`` (None: Helion's default config); one per
        ``layout`` (``call_layout``) that the dispatch serves, so that each keeps Helion's fast path."""
        import helion
        import helion.exc

        cache_key = (json.dumps(config, sort_keys=True), mode + json.dumps(settings, sort_keys=True, default=str),
                     layout)
        kernel = self._kernels.get(cache_key)
        if kernel is None:
            # Host code around our kernels (allocations, sums of per-program partials) is deliberate, so
            # Helion's notice that such tensor ops are not fused into the kernel is noise here.
            options: dict[str, Any] = {"static_shapes": True, "ref_mode": _ref_mode(mode),
                                       "ignore_warnings": [helion.exc.TensorOperationInWrapper], **settings}
            if config is not None:
                options["config"] = helion.Config(**config)
            elif "autotune_effort" not in settings and not _env_true(AUTOTUNE_ENV):
                options["autotune_effort"] = "none"  # never autotune unless asked
            kernel = helion.kernel(self.fn, **options)
            self._kernels[cache_key] = kernel
        return kernel

    def bound(self, args: tuple[Any, ...]) -> Any:
        """This kernel on Helion's default config, compiled mode, bound to ``args``' exact shapes (Helion keeps
        the binding): its config spec, and the binding every config of the launch compiles on (``compiled``)."""
        return self.helion_kernel(None, "compiled").bind(args)

    def compiled(self, args: tuple[Any, ...], config: dict[str, Any]) -> Callable[..., Any]:
        """``config`` compiled for ``args``' exact shapes: call it with ``args``. Every config of one kernel and
        shape compiles on the one binding (Helion's front end, seconds of host time, runs once, not once per
        config): for tools that run many configs at one launch. A call goes through the dispatch instead."""
        import helion

        return self.bound(args).compile_config(helion.Config(**config))

    def seed_configs(self, args: tuple[Any, ...]) -> list[dict[str, Any]]:
        """The ``seeds`` that are valid configs for ``args``, each completed with the default config."""
        bound = self.bound(args)
        default = dict(bound.config_spec.default_config())
        completed = ({**default, **seed} for seed in self.seeds)
        return [config for config in completed if _config_error(bound, config) is None]

    @property
    def autotune_accuracy_check(self) -> Callable[[Any, Any], None]:
        """Helion's ``autotune_baseline_accuracy_check_fn`` for this kernel: picklable (Helion sends
        settings to its precompile subprocesses), so a module function bound to plain values."""
        return functools.partial(check_outputs_against_baseline, self.name, dict(self.partial_sums), self.finish)

    def candidates(self, *args: Any) -> list[config_store.Lookup]:
        """The stored configs to try for ``args``, in the config store's lookup order (none: Helion's
        default; also when ``MAMBA2_GUARD_AUTOTUNE`` asks Helion to tune)."""
        if _env_true(AUTOTUNE_ENV):
            return []
        device = _first_device(args)
        return config_store.stored_candidates(self.name, self.shape_key(*args), device_slug(device),
                                              capability=device_capability(device))

    def lookup(self, *args: Any) -> config_store.Lookup:
        """The first candidate for ``args`` (what a tool reports as the stored config), or the default."""
        if _env_true(AUTOTUNE_ENV):
            return config_store.Lookup(None, "autotune", None)
        ranked = self.candidates(*args)
        return ranked[0] if ranked else config_store.Lookup(None, "default", None)

    def __call__(self, *args: Any) -> Any:
        if _captured is not None:
            _captured.append((self, args))
        device = _first_device(args)
        mode = exec_mode(device)
        if device.type == "cuda":
            ensure_triton_allocator()
        elif mode == "ref":  # a plain call on CPU tensors: Helion's ref mode needs this patch (idempotent)
            from mamba2_kernels.testing import patch_mm_out_dtype

            patch_mm_out_dtype()
        try:
            signature: tuple[str, torch.device, tuple[Any, ...]] | None = (mode, device, call_signature(args))
            kernel = self._by_signature.get(signature)
        except TypeError:  # an unhashable argument: the shape key alone decides
            signature, kernel = None, None
        if kernel is not None:
            return kernel(*args)
        key, layout = self.shape_key(*args), call_layout(args)
        dispatch_key = (device, key, mode, layout)
        kernel = self._dispatch.get(dispatch_key)
        if kernel is not None:
            result = kernel(*args)
        else:
            result, kernel = self._first_that_runs(args, key, device, mode, layout)
            self._dispatch[dispatch_key] = kernel
        if signature is not None and len(self._by_signature) < MAX_SIGNATURES:
            self._by_signature[signature] = kernel
        return result

    def forget_dispatch(self, key: ShapeKey | None = None) -> None:
        """Select the configs of ``key`` (every key when None) again at their next call."""
        for dispatch_key in [k for k in self._dispatch if key is None or k[1] == key]:
            del self._dispatch[dispatch_key]
        self._by_signature.clear()  # which signatures have ``key`` is the shape key's to say again

    def _first_that_runs(self, args: tuple[Any, ...], key: ShapeKey, device: torch.device,
                         mode: str, layout: Hashable = None) -> tuple[Any, Any]:
        """Run ``args`` on the first candidate config that this helion accepts for them, adapted to the call
        (``adapt_config``); a candidate of another key is first checked by generating its code, which needs
        no GPU. A stored exact config that is rejected is drift: recorded, counted and logged, never fatal;
        a pinned one's rejection propagates. Only when no candidate runs does the call get Helion's default
        config. Returns (result, kernel)."""
        gpu_slug = device_slug(device)
        reason = None  # why the call is not served by its exact key's config, once known
        # Binding runs Helion's front end (seconds on a CPU, and on a GPU runner's CPU in a job's first step).
        # The config spec it yields is the same whatever config the kernel holds, so the first candidate's
        # binding adapts them all, and a candidate that needs no adapting runs on that binding.
        bound = None
        for found in self.candidates(*args):
            if bound is None:  # even in reference mode: a tunable there still shapes the work (heads per program)
                bound = self.helion_kernel(found.config, mode, layout).bind(args)
            own_key = found.source in ("exact", PINNED)
            config = adapt_config(bound, found.config, other_key=not own_key)
            if mode != "ref" and not own_key and _config_error(bound, config) is not None:
                continue
            kernel = self.helion_kernel(config, mode, layout)
            try:
                with _without_implicit_config_notice():
                    result = kernel(*args)
            except Exception as exc:
                if not _is_rejected_config(exc) or found.source == PINNED:
                    raise
                if found.source == "exact":
                    reason = "invalid"
                    config_store.INVALID[(gpu_slug, self.name, found.key)] = f"{type(exc).__name__}: {exc}"
                    log.warning("%s: config for %s is invalid under this helion (%s); trying related configs",
                                self.name, found.key, exc)
                continue
            if not own_key:
                config_store.note_fallback(self.name, str(key), gpu_slug, reason or found.source, found.used)
            return result, kernel
        config_store.note_fallback(self.name, str(key), gpu_slug, reason or "default", None)
        kernel = self.helion_kernel(None, mode, layout)
        with _without_implicit_config_notice():
            return kernel(*args), kernel


@contextlib.contextmanager
def _without_implicit_config_notice() -> Iterator[None]:
    """Drop Helion's "Using implicit config" line (printed on stderr when a kernel binds to its default
    config): the fallback is already logged once, and counted, by the config store. Everything else
    Helion prints goes through."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            yield
    finally:
        kept = [line for line in captured.getvalue().splitlines(keepends=True)
                if not line.startswith("Using implicit config:")]
        sys.stderr.write("".join(kept))


def _ref_mode(mode: str):
    import helion

    return helion.RefMode.EAGER if mode == "ref" else helion.RefMode.OFF


def _is_rejected_config(exc: Exception) -> bool:
    """A Helion error while compiling a stored config (it does not fit this kernel under this helion), or
    Triton's refusal to launch it (more shared memory or registers than the GPU has, at a larger tile
    extent than it was tuned for). If the kernel itself is broken, the default config fails too, and that
    error propagates."""
    import helion.exc
    from triton.runtime.errors import OutOfResources

    return isinstance(exc, helion.exc.BaseError | OutOfResources)


@contextlib.contextmanager
def pinned_config(kernel: TunedKernel, config: dict[str, Any], key: ShapeKey | None = None) -> Iterator[None]:
    """Inside the block ``kernel`` runs on ``config`` for shape key ``key`` (every key when None), and
    looks up the config store as usual elsewhere: how a tuner times a candidate, or a test picks a variant.
    Pins of other keys of the kernel nest: each key runs on the config of the innermost pin that names it
    (a whole call timed on every launch's winner). A pinned config that this helion or GPU rejects fails the
    call (``PINNED``)."""
    outer = vars(kernel).get("candidates")

    def candidates(*args: Any) -> list[config_store.Lookup]:
        found_key = kernel.shape_key(*args)
        if key is None or found_key == key:
            return [config_store.Lookup(dict(config), PINNED, str(found_key))]
        return outer(*args) if outer is not None else TunedKernel.candidates(kernel, *args)

    def forget() -> None:
        """Drop the pinned key's dispatch; other keys keep theirs, as selecting their configs again on every
        call (an adapted config of another key is checked by generating its code) is host work a timed call
        would carry."""
        kernel.forget_dispatch(key)

    forget()
    kernel.candidates = candidates  # type: ignore[method-assign]
    try:
        yield
    finally:
        if outer is None:
            del kernel.candidates
        else:
            kernel.candidates = outer  # type: ignore[method-assign]
        forget()


def adapt_config(bound: Any, config: dict[str, Any], other_key: bool = False) -> dict[str, Any]:
    """``config`` made to fit the kernel bound to a call:
      * the kernel's own tunables (``hl.register_tunable``) that it lacks (added to the kernel since it was
        stored) or holds at a value this call does not offer (heads per program must divide this call's heads
        per group) take their default;
      * for a config of ``other_key``, per-load and per-loop lists (indexing, eviction policies, ...) of another
        length than this call's (a flag such as seq_idx adds loads) take the default's, since their entries are
        positional. (At its own key such a list means the kernel changed since tuning: drift, left to fail.)
    Block sizes, warps and stages, the part of a config that transfers, are kept; Helion checks them (block sizes
    of another count mean a config of another kernel: invalid, not adapted)."""
    default = bound.config_spec.default_config()
    adapted = dict(config)
    for name, value in config.items():
        expected = default.get(name)
        if (other_key and name != "block_sizes" and isinstance(value, list) and isinstance(expected, list)
                and len(value) != len(expected)):
            adapted[name] = expected
    for name, fragment in bound.config_spec.user_defined_tunables.items():
        choices = getattr(fragment, "choices", None)
        if name not in adapted or (choices is not None and adapted[name] not in choices):
            adapted[name] = fragment.default()
    return adapted


def complete_config(kernel: TunedKernel, args: tuple[Any, ...], config: dict[str, Any],
                    other_key: bool = False) -> dict[str, Any] | None:
    """``adapt_config`` for ``kernel`` bound to ``args``, or None when ``config`` needs no change."""
    adapted = adapt_config(kernel.bound(args), config, other_key)
    return adapted if adapted != config else None


def validate_config(kernel: TunedKernel, args: tuple[Any, ...], config: dict[str, Any],
                    other_key: bool = False) -> str | None:
    """None if ``config`` is valid for ``kernel`` bound to ``args`` under the installed helion, else why.
    Judged as it runs: adapted to the call (``adapt_config``; ``other_key``: a config stored for another key,
    as the lookup serves it)."""
    bound = kernel.bound(args)
    return _config_error(bound, adapt_config(bound, config, other_key))


def launch_error(kernel: TunedKernel, args: tuple[Any, ...], config: dict[str, Any]) -> str | None:
    """None if ``kernel`` on ``config`` runs at ``args`` here, else why not. Generating the code does not show
    what only the launch does: Triton refuses a config that needs more shared memory or registers than this
    GPU has. The dispatch then moves on to its next candidate (``_is_rejected_config``); any other error
    propagates. ``config`` as the call runs it (adapted where it was stored for another key)."""
    try:
        kernel.compiled(args, config)(*args)
    except Exception as exc:
        if not _is_rejected_config(exc):
            raise
        return f"{type(exc).__name__}: {exc}"
    return None


def _config_error(bound: Any, config: dict[str, Any]) -> str | None:
    """Why ``config`` does not fit the bound kernel, or None. Normalizing is not enough: a config can pass it
    and still fail code generation (its per-load lists shorter than the kernel's loads, after an edit of
    the kernel), so the code is generated too; that needs no GPU."""
    import helion
    import helion.exc

    try:
        bound.config_spec.normalize(helion.Config(**config))
        bound.to_triton_code(helion.Config(**config))
    except (helion.exc.BaseError, TypeError, ValueError, KeyError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def tuned_kernel(*, name: str, shape_key: Callable[..., ShapeKey], partial_sums: dict[int, int] | None = None,
                 finish: Callable[..., Any] | None = None, seeds: Sequence[dict[str, Any]] = ()
                 ) -> Callable[[Callable[..., Any]], TunedKernel]:
    """Decorator: ``@tuned_kernel(name="chunk_state", shape_key=...)`` over a Helion kernel body."""

    def wrap(fn: Callable[..., Any]) -> TunedKernel:
        return TunedKernel(fn, name=name, shape_key=shape_key, partial_sums=partial_sums, finish=finish,
                           seeds=seeds)

    return wrap

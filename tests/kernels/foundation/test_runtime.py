"""Run-time dispatch: configs come from the store, fallbacks are counted, invalid configs never crash."""

from __future__ import annotations

import dataclasses
import pickle
import threading

import helion.language as hl
import pytest
import torch
from helion.autotuner import EnumFragment

from mamba2_kernels import _runtime, config_store, testing
from mamba2_kernels._runtime import (
    TunedKernel,
    capture_launches,
    complete_config,
    ensure_triton_allocator,
    launch_error,
    scaled_atol,
    tuned_kernel,
    validate_config,
)
from mamba2_kernels.config_store import ConfigFile, ShapeKey
from mamba2_kernels.ssd._keys import heads_per_program
from mamba2_kernels.testing import execution_mode


def _key(x, y):
    return ShapeKey.of(dtype=str(x.dtype).removeprefix("torch."), tokens=config_store.tokens_bucket(x.shape[0]))


@tuned_kernel(name="toy_exp_add", shape_key=_key)
def toy_exp_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    for tile in hl.tile(x.size()):
        out[tile] = torch.exp(x[tile]) + y[tile]
    return out


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setattr(config_store, "CONFIG_DIR", tmp_path)
    monkeypatch.setenv("MAMBA2_GUARD_GPU_SLUG", "test-gpu")
    toy_exp_add.forget_dispatch()
    return tmp_path


def _write(store, config):
    x = torch.zeros(100, 33)
    cf = ConfigFile(kernels={"toy_exp_add": {str(_key(x, x)): config}})
    config_store.save(config_store.path_for("test-gpu", store), cf)
    config_store.forget()


@pytest.mark.parametrize("mode", ["ref", "triton"])
def test_tuned_config_runs_with_small_blocks(store, mode):
    _write(store, {"block_sizes": [16, 8], "num_warps": 2})
    x, y = torch.randn(100, 33), torch.randn(100, 33)
    with execution_mode(mode):
        out = toy_exp_add(x, y)
    torch.testing.assert_close(out, x.exp() + y)
    assert toy_exp_add.lookup(x, y).source == "exact"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU interpreter's set-up")
def test_the_interpreter_builds_no_overflow_checks_whose_asserts_it_drops(monkeypatch):
    """With debug off, Triton's interpreter drops the asserts of its integer overflow checks, as a GPU build
    does, so the CPU set-up has it build no checks; with debug on, the checks assert and stay."""
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    assert not builder.options.debug and not builder.options.sanitize_overflow
    monkeypatch.setattr(builder, "options", dataclasses.replace(builder.options, debug=True, sanitize_overflow=True))
    testing._skip_unasserted_overflow_checks()
    assert builder.options.sanitize_overflow


def test_a_new_thread_gets_triton_allocator_once(monkeypatch):
    """Triton's scratch allocator lives in a context variable that a new thread (autograd's backward
    thread) starts without; the dispatch sets it there before a CUDA launch, and only there: Helion's setter
    costs a few microseconds, at every launch if called at each."""
    import helion.runtime
    from triton.runtime._allocation import NullAllocator, _allocator

    seen = {"sets": 0}
    set_allocator = helion.runtime.set_triton_allocator

    def counted():
        seen["sets"] += 1
        set_allocator()

    monkeypatch.setattr(helion.runtime, "set_triton_allocator", counted)

    def in_thread():
        seen["before"] = _allocator.get()
        for _ in range(3):
            ensure_triton_allocator()
        seen["after"] = _allocator.get()

    worker = threading.Thread(target=in_thread)
    worker.start()
    worker.join()
    assert isinstance(seen["before"], NullAllocator)
    assert not isinstance(seen["after"], NullAllocator) and seen["sets"] == 1


@pytest.mark.gpu
def test_tensor_descriptor_config_runs_in_the_backward_thread(store):
    """A config with device-side tensor descriptors runs when launched from autograd's backward thread.
    (On the H200 the bench's whole call failed with "no allocator was set" on such a config until the
    dispatch set Triton's allocator per thread; this toy runs there either way, see baselines/runs.)"""
    grad = torch.randn(128, 64, device="cuda")
    cf = ConfigFile(kernels={"toy_exp_add": {str(_key(grad, grad)): {
        "block_sizes": [32, 32], "indexing": ["tensor_descriptor"] * 3, "num_warps": 4}}})
    config_store.save(config_store.path_for("test-gpu", store), cf)
    config_store.forget()

    class ExpAddBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            return toy_exp_add(g, g)

    x = torch.zeros_like(grad, requires_grad=True)
    ExpAddBackward.apply(x).backward(grad)
    torch.testing.assert_close(x.grad, grad.exp() + grad)
    assert toy_exp_add.lookup(grad, grad).source == "exact"


def test_missing_config_falls_back_to_default_and_is_counted(store):
    x, y = torch.randn(40, 8), torch.randn(40, 8)
    before = config_store.FALLBACKS[("toy_exp_add", "default")]
    with execution_mode("ref"):
        torch.testing.assert_close(toy_exp_add(x, y), x.exp() + y)
    assert config_store.FALLBACKS[("toy_exp_add", "default")] == before + 1


def test_invalid_config_is_reported_not_fatal(store, caplog):
    _write(store, {"block_sizes": [16, 8, 4]})  # a third block size: the spec of this kernel has two
    x, y = torch.randn(100, 33), torch.randn(100, 33)
    before = config_store.FALLBACKS[("toy_exp_add", "invalid")]
    with execution_mode("triton"), caplog.at_level("WARNING"):
        torch.testing.assert_close(toy_exp_add(x, y), x.exp() + y)
    assert config_store.FALLBACKS[("toy_exp_add", "invalid")] == before + 1
    (why,) = [v for (slug, name, _), v in config_store.INVALID.items() if (slug, name) == ("test-gpu", "toy_exp_add")]
    assert "Too many values" in why  # recorded for the guard's drift report
    assert any("invalid under this helion" in r.message for r in caplog.records)
    assert "Too many values" in validate_config(toy_exp_add, (x, y), {"block_sizes": [16, 8, 4]})
    assert validate_config(toy_exp_add, (x, y), {"block_sizes": [16, 8]}) is None


def test_capture_records_launches(store):
    x, y = torch.randn(16, 4), torch.randn(16, 4)
    with execution_mode("ref"), capture_launches() as launches:
        toy_exp_add(x, y)
        toy_exp_add(x, y)
    assert [k.name for k, _ in launches] == ["toy_exp_add", "toy_exp_add"]
    assert launches[0][1][0] is x


def test_never_autotunes_unless_asked(store, monkeypatch):
    monkeypatch.setenv("HELION_DISALLOW_AUTOTUNING", "1")
    x, y = torch.randn(16, 4), torch.randn(16, 4)
    with execution_mode("triton"):
        torch.testing.assert_close(toy_exp_add(x, y), x.exp() + y)
    kernel = toy_exp_add.helion_kernel(None, "compiled")
    assert kernel.settings.autotune_effort == "none"
    # the tuner asks explicitly, and gets what it asked for
    assert toy_exp_add.helion_kernel(None, "compiled", autotune_effort="quick").settings.autotune_effort == "quick"


def test_autotune_accuracy_check_sums_partials_whose_count_depends_on_the_config():
    checker = TunedKernel(toy_exp_add.fn, name="toy_partials", shape_key=_key, partial_sums={1: 0})
    gen = torch.Generator().manual_seed(0)
    out = torch.randn(4, 3, generator=gen)
    total = torch.randn(5, 7, generator=gen) * 1000
    two_partials = torch.stack([0.25 * total, 0.75 * total])
    three_partials = torch.stack([0.5 * total, 0.25 * total, 0.25 * total])
    checker.autotune_accuracy_check((out, two_partials), (out, three_partials))
    assert pickle.loads(pickle.dumps(checker.autotune_accuracy_check)).args[0] == "toy_partials"  # Helion pickles it

    wrong = three_partials.clone()
    wrong[0, 2, 3] += 200.0  # far above 1e-2 * rms (~10) + 1e-2 * |value|
    with pytest.raises(AssertionError, match="toy_partials output 1"):
        checker.autotune_accuracy_check((out, two_partials), (out, wrong))
    with pytest.raises(AssertionError, match="toy_partials output 0"):  # not declared partial: shapes must match
        checker.autotune_accuracy_check((out[:2], two_partials), (out, three_partials))


def test_scaled_atol_grows_with_the_output_but_never_below_atol():
    assert scaled_atol(torch.full((8,), 0.5), 1e-2) == pytest.approx(1e-2)
    assert scaled_atol(torch.full((8,), -300.0), 1e-2) == pytest.approx(3.0)
    assert scaled_atol(torch.empty(0), 1e-2) == pytest.approx(1e-2)


def test_default_config_notice_is_dropped_also_when_helion_binds_again(store, capfd):
    # Two exact shapes in one shape key: the second call reuses the dispatch entry and Helion binds anew.
    x, y = torch.randn(100, 33), torch.randn(100, 33)
    assert _key(x, x) == _key(x[:99], x[:99])
    with execution_mode("triton"):
        torch.testing.assert_close(toy_exp_add(x, y), x.exp() + y)
        torch.testing.assert_close(toy_exp_add(x[:99], y[:99]), x[:99].exp() + y[:99])
    assert "Using implicit config" not in capfd.readouterr().err


@tuned_kernel(name="toy_two_ways", shape_key=lambda x: _key(x, x))
def toy_two_ways(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    doubled = hl.register_tunable("doubled", EnumFragment((False, True)))  # a tunable added after a tuning
    for tile in hl.tile(x.size()):
        if doubled:
            out[tile] = x[tile] * 2
        else:
            out[tile] = x[tile] + x[tile]
    return out


def test_config_written_before_a_tunable_existed_runs_with_its_default(store):
    x = torch.randn(100, 33)
    cf = ConfigFile(kernels={"toy_two_ways": {str(_key(x, x)): {"block_sizes": [16, 16], "num_warps": 4}}})
    config_store.save(config_store.path_for("test-gpu", store), cf)
    config_store.forget()
    toy_two_ways.forget_dispatch()
    before = dict(config_store.FALLBACKS)
    with execution_mode("triton"):
        torch.testing.assert_close(toy_two_ways(x), 2 * x)
        torch.testing.assert_close(toy_two_ways(x), 2 * x)  # the completed config is the one cached
    assert before == config_store.FALLBACKS  # the stored config ran: not a fallback to the default
    assert complete_config(toy_two_ways, (x,), {"block_sizes": [16, 16]})["doubled"] is False
    assert complete_config(toy_two_ways, (x,), {"doubled": True}) is None


@pytest.mark.parametrize("mode", ["ref", "triton"])
def test_a_call_on_a_stored_config_runs_helions_front_end_once(store, helion_bindings, mode):
    """Binding a kernel to a shape runs Helion's front end: seconds per kernel and shape on a CPU, and on a GPU
    runner's CPU in a training job's first step. A call on a stored config that needs no adapting runs on the
    one binding that checked it; a call with no stored config binds only its default."""

    def bindings_of_a_call(stored):
        x = torch.randn(100, 33)
        if stored is not None:
            cf = ConfigFile(kernels={"toy_two_ways": {str(_key(x, x)): stored}})
            config_store.save(config_store.path_for("test-gpu", store), cf)
        config_store.forget()
        toy_two_ways.forget_dispatch()
        toy_two_ways._kernels.clear()  # Helion's kernels, and the bindings each holds
        helion_bindings.clear()
        with execution_mode(mode):
            torch.testing.assert_close(toy_two_ways(x), 2 * x)
        return len(helion_bindings)

    assert bindings_of_a_call(None) == 1
    assert bindings_of_a_call({"block_sizes": [16, 16], "num_warps": 4, "doubled": True}) == 1


def test_config_missing_a_tunable_and_invalid_falls_back_to_the_default(store):
    x = torch.randn(100, 33)
    stored = {"block_sizes": [16, 8, 4], "num_warps": 4}  # no "doubled", and one block size too many
    cf = ConfigFile(kernels={"toy_two_ways": {str(_key(x, x)): stored}})
    config_store.save(config_store.path_for("test-gpu", store), cf)
    config_store.forget()
    toy_two_ways.forget_dispatch()
    before = config_store.FALLBACKS[("toy_two_ways", "invalid")]
    with execution_mode("triton"):
        torch.testing.assert_close(toy_two_ways(x), 2 * x)
    assert config_store.FALLBACKS[("toy_two_ways", "invalid")] == before + 1


def test_seed_configs_complete_each_seed_and_drop_those_this_kernel_rejects():
    x = torch.randn(100, 33)
    seeded = TunedKernel(toy_exp_add.fn, name="toy_seeded", shape_key=_key,
                         seeds=[{"block_sizes": [32, 16], "num_warps": 8},
                                {"block_sizes": [16, 8, 4]},  # one block size too many: dropped
                                {"num_stages": 2}])
    default = dict(seeded.bound((x, x)).config_spec.default_config())
    configs = seeded.seed_configs((x, x))
    assert configs == [{**default, "block_sizes": [32, 16], "num_warps": 8}, {**default, "num_stages": 2}]
    assert all(validate_config(seeded, (x, x), config) is None for config in configs)
    with execution_mode("triton"):
        out = seeded.helion_kernel(configs[0])(x, x)
    torch.testing.assert_close(out, x.exp() + x)


def test_every_ssd_and_conv_seed_fits_its_kernel_at_a_suite_shape():
    """The seeds name block sizes by position: a kernel that registers its blocks in another order, or
    another number of them, must fail here rather than seed the tuner with nonsense. Every SSD and conv
    kernel the registry runs is seeded."""
    from mamba2_kernels import registry, suites

    shape = suites.load().shape("smoke")
    checked = set()
    for entry in registry.ENTRIES:
        if entry.family not in ("ssd", "conv") or entry.phase.startswith(registry.COMPOSITE_PHASES):
            continue
        with capture_launches() as launches, execution_mode("ref"):
            entry.run_helion(entry.inputs(shape, 0, torch.device("cpu")))
        for kernel, args in launches:
            if kernel.name in checked:
                continue
            checked.add(kernel.name)
            assert kernel.seeds, kernel.name
            spec = kernel.bound(args).config_spec
            blocks = len(spec.default_config()["block_sizes"])
            assert all(len(seed["block_sizes"]) == blocks for seed in kernel.seeds), kernel.name


def test_config_that_normalizes_but_fails_codegen_is_invalid_and_runs_on_the_default(store):
    """After an edit adds loads to a kernel, a stored per-load list (indexing) is too short: Helion's
    normalize accepts it, its code generation does not. Both the validation and the run-time path must
    call it invalid; the run falls back to the default config instead of crashing."""
    x = torch.randn(100, 33)
    short = {"block_sizes": [16, 8], "indexing": ["pointer"]}  # toy_exp_add has 3 loads and stores
    assert "exceeds indexing config length" in validate_config(toy_exp_add, (x, x), short)
    assert validate_config(toy_exp_add, (x, x), {"block_sizes": [16, 8]}) is None
    _write(store, short)
    before = config_store.FALLBACKS[("toy_exp_add", "invalid")]
    with execution_mode("triton"):
        torch.testing.assert_close(toy_exp_add(x, x), x.exp() + x)
    assert config_store.FALLBACKS[("toy_exp_add", "invalid")] == before + 1


def _save(store, kernel: str, configs: dict[ShapeKey, dict]):
    cf = ConfigFile(kernels={kernel: {str(key): config for key, config in configs.items()}})
    config_store.save(config_store.path_for("test-gpu", store), cf)
    config_store.forget()


def _served_block_sizes() -> list[int] | None:
    """The block sizes of the one kernel toy_exp_add's dispatch chose; None: Helion's default config."""
    (kernel,) = toy_exp_add._dispatch.values()
    return kernel.configs[0]["block_sizes"] if kernel.configs else None


def test_a_key_nobody_tuned_runs_on_a_related_config_not_the_default(store):
    """Another dtype is another code path (a flag): the config tuned for it still generates code here,
    so the call runs on it, counted as related, and never on Helion's default."""
    x = torch.randn(100, 33, dtype=torch.float16).float()
    tuned = ShapeKey.of(dtype="float16", tokens=config_store.tokens_bucket(100))
    _save(store, "toy_exp_add", {tuned: {"block_sizes": [16, 8], "num_warps": 2}})
    before = dict(config_store.FALLBACKS)
    with execution_mode("triton"):
        torch.testing.assert_close(toy_exp_add(x, x), x.exp() + x)
    assert config_store.FALLBACKS[("toy_exp_add", "related")] == before.get(("toy_exp_add", "related"), 0) + 1
    assert config_store.FALLBACKS[("toy_exp_add", "default")] == before.get(("toy_exp_add", "default"), 0)
    assert _served_block_sizes() == [16, 8]


def test_a_gpu_nobody_tuned_runs_on_a_same_architecture_gpus_configs(store, monkeypatch):
    """No file of its own, and the file of a GPU of the same compute capability beside it: the call runs on
    that GPU's config, counted as other-gpu; on another architecture it runs on Helion's default."""
    x = torch.randn(100, 33)
    cf = ConfigFile(fingerprint={"compute_capability": "9.0"},
                    kernels={"toy_exp_add": {str(_key(x, x)): {"block_sizes": [16, 8], "num_warps": 2}}})
    config_store.save(config_store.path_for("tuned-gpu", store), cf)
    config_store.forget()
    for capability, on_default_expected, source in (("9.0", False, "other-gpu"), ("8.0", True, "default")):
        monkeypatch.setattr(_runtime, "device_capability", lambda _device, c=capability: c)
        toy_exp_add.forget_dispatch()
        before = config_store.FALLBACKS[("toy_exp_add", source)]
        with execution_mode("triton"):
            torch.testing.assert_close(toy_exp_add(x, x), x.exp() + x)
        assert config_store.FALLBACKS[("toy_exp_add", source)] == before + 1
        assert _served_block_sizes() == (None if on_default_expected else [16, 8])


def test_a_related_config_that_does_not_generate_code_is_skipped_for_the_next(store):
    x = torch.randn(100, 33)
    tokens = config_store.tokens_bucket(100)
    _save(store, "toy_exp_add", {
        ShapeKey.of(dtype="float16", tokens=tokens): {"block_sizes": [16, 8, 4]},  # nearest, but invalid here
        ShapeKey.of(dtype="bfloat16", tokens=tokens * 64): {"block_sizes": [32, 32], "num_warps": 4},
    })
    with execution_mode("triton"):
        torch.testing.assert_close(toy_exp_add(x, x), x.exp() + x)
    assert _served_block_sizes() == [32, 32]
    assert not config_store.INVALID  # a candidate of another key is no drift of the stored configs


def test_an_exact_config_this_helion_rejects_is_drift_and_a_related_one_serves(store):
    x = torch.randn(100, 33)
    exact, other = _key(x, x), ShapeKey.of(dtype="float16", tokens=config_store.tokens_bucket(100))
    _save(store, "toy_exp_add", {exact: {"block_sizes": [16, 8, 4]}, other: {"block_sizes": [16, 16]}})
    before = dict(config_store.FALLBACKS)
    with execution_mode("triton"):
        torch.testing.assert_close(toy_exp_add(x, x), x.exp() + x)
    assert config_store.FALLBACKS[("toy_exp_add", "invalid")] == before.get(("toy_exp_add", "invalid"), 0) + 1
    assert config_store.FALLBACKS[("toy_exp_add", "related")] == before.get(("toy_exp_add", "related"), 0)
    assert ("test-gpu", "toy_exp_add", str(exact)) in config_store.INVALID
    assert _served_block_sizes() == [16, 16]


@tuned_kernel(name="toy_split", shape_key=lambda x, rows: ShapeKey.of(hpg=rows, tokens=x.size(1)))
def toy_split(x: torch.Tensor, rows: hl.constexpr) -> torch.Tensor:
    # the SSD backward's tunable: its choices are the divisors of the call's heads per group
    split = hl.register_tunable("split", heads_per_program(rows))
    out = torch.empty_like(x)
    for tile in hl.tile(x.size()):
        out[tile] = x[tile] * split
    return out


def test_a_tunable_value_this_call_does_not_offer_takes_its_default():
    odd, even = torch.randn(3, 8), torch.randn(4, 8)
    bound_odd = toy_split.bound((odd, 3))
    from mamba2_kernels._runtime import adapt_config

    assert adapt_config(bound_odd, {"block_sizes": [1, 8], "split": 4}) == {"block_sizes": [1, 8], "split": 3}
    assert adapt_config(toy_split.bound((even, 4)), {"split": 2}) == {"split": 2}
    assert complete_config(toy_split, (odd, 3), {"split": 1}) is None


def test_tools_compile_every_config_of_a_launch_on_one_binding(helion_bindings):
    """What a tool runs many configs through (the tuner's launch check, the selection measurement): each config
    runs as configured, and Helion's front end runs once for them all."""
    toy_split._kernels.clear()
    x = torch.randn(4, 24)
    with execution_mode("triton"):
        for split in (1, 2, 4):
            for block_sizes in ([1, 8], [2, 16]):
                config = {"block_sizes": block_sizes, "num_warps": 4, "split": split}
                torch.testing.assert_close(toy_split.compiled((x, 4), config)(x, 4), x * split)
                assert launch_error(toy_split, (x, 4), config) is None
    assert len(helion_bindings) == 1


def test_per_load_lists_of_another_length_take_the_default():
    """A flag such as seq_idx adds loads: a config of the key without it has a shorter indexing list, whose
    entries are positional, so the call's default list replaces it; block sizes are kept."""
    from mamba2_kernels._runtime import adapt_config

    x = torch.randn(100, 33)
    bound = toy_exp_add.bound((x, x))
    default_indexing = bound.config_spec.default_config()["indexing"]
    short = {"block_sizes": [32, 16], "indexing": ["tensor_descriptor"]}
    assert adapt_config(bound, short, other_key=True) == {"block_sizes": [32, 16], "indexing": default_indexing}
    assert adapt_config(bound, short) == short  # at its own key: drift, reported rather than adapted
    assert validate_config(toy_exp_add, (x, x), adapt_config(bound, short, other_key=True)) is None


def test_a_pinned_config_this_helion_rejects_fails_the_call_rather_than_running_another(store):
    """A tuner times and judges a candidate under pinned_config: had the call fallen back to the default as
    for a stored config, the default's time and precision would have been recorded as the candidate's."""
    import helion.exc

    from mamba2_kernels._runtime import pinned_config

    x = torch.randn(100, 33)
    before = dict(config_store.FALLBACKS)
    with (execution_mode("triton"), pinned_config(toy_exp_add, {"block_sizes": [16, 8, 4]}, _key(x, x)),
          pytest.raises(helion.exc.BaseError, match="Too many values")):
        toy_exp_add(x, x)
    assert before == config_store.FALLBACKS and not config_store.INVALID  # no drift of the stored configs
    with execution_mode("triton"), pinned_config(toy_exp_add, {"block_sizes": [16, 16]}, _key(x, x)):
        torch.testing.assert_close(toy_exp_add(x, x), x.exp() + x)
        kernel = toy_exp_add._dispatch[(x.device, _key(x, x), "compiled", _runtime.call_layout((x, x)))]
    assert kernel.configs[0]["block_sizes"] == [16, 16]


def test_a_pin_for_one_key_leaves_the_other_keys_dispatch(store, monkeypatch):
    """A tuner pins a candidate for one key around every timed call; a kernel launched at other keys in the
    same call (the state pass, forward and backward recompute) must not select their configs again each
    time: on the H200 that host work swamped the whole call's time and hid wins of 2-5 %."""
    from mamba2_kernels._runtime import TunedKernel, pinned_config

    small, large = torch.randn(100, 33), torch.randn(5000, 33)
    assert _key(small, small) != _key(large, large)
    selections = []
    real = TunedKernel._first_that_runs
    monkeypatch.setattr(TunedKernel, "_first_that_runs",
                        lambda self, args, key, *rest: (selections.append(key), real(self, args, key, *rest))[1])
    with execution_mode("ref"):
        toy_exp_add(large, large)
        for _ in range(3):
            with pinned_config(toy_exp_add, {"block_sizes": [16, 8]}, _key(small, small)):
                torch.testing.assert_close(toy_exp_add(small, small), small.exp() + small)
                toy_exp_add(large, large)
        toy_exp_add(small, small)
    # the large key selected once; the pinned key once per pin, and once more after it (the store again)
    assert selections == [_key(large, large)] + [_key(small, small)] * 4


def test_pins_of_two_keys_of_one_kernel_nest_and_each_key_runs_its_own(store):
    """A whole call is timed on every launch's winner, and the forward's state pass launches two keys of one
    kernel: the inner pin must not send the outer pin's key back to the store."""
    from mamba2_kernels._runtime import pinned_config

    small, large = torch.randn(100, 33), torch.randn(5000, 33)

    def ran(x):
        return toy_exp_add._dispatch[(x.device, _key(x, x), "compiled", _runtime.call_layout((x, x)))].configs[0]

    with (execution_mode("triton"), pinned_config(toy_exp_add, {"block_sizes": [16, 16]}, _key(small, small)),
          pinned_config(toy_exp_add, {"block_sizes": [32, 8]}, _key(large, large))):
        torch.testing.assert_close(toy_exp_add(small, small), small.exp() + small)
        torch.testing.assert_close(toy_exp_add(large, large), large.exp() + large)
        assert (ran(small)["block_sizes"], ran(large)["block_sizes"]) == ([16, 16], [32, 8])
    assert "candidates" not in vars(toy_exp_add)  # both pins gone: the store answers again


def test_a_kernel_called_by_turns_at_two_layouts_keeps_helions_fast_path_for_each(store, monkeypatch):
    """The backward launches bmm_chunk_bwd twice per step, the second time on a transposed view. One
    ``helion.Kernel`` keeps one prepared fast path, so it rebuilt its argument guard (an ``eval``) on every
    launch: a cost on the host each step, which an eager training loop pays in full."""
    import importlib

    kernel_module = importlib.import_module("helion.runtime.kernel")
    guards = []
    real = kernel_module._make_prepared_arg_guard
    monkeypatch.setattr(kernel_module, "_make_prepared_arg_guard",
                        lambda kernel, args: (guards.append(args), real(kernel, args))[1])
    rows = torch.randn(100, 33)
    columns = torch.randn(33, 100).t()  # the same shape and values' layout transposed
    toy_exp_add._kernels.clear()  # no kernel object of an earlier test, its guards built already
    with execution_mode("triton"):
        for _ in range(4):
            for x in (rows, columns):
                torch.testing.assert_close(toy_exp_add(x, x), x.exp() + x)
    assert len(guards) == 2  # one per layout, built once


def test_a_repeated_call_skips_the_shape_key_and_a_pin_or_a_new_signature_asks_it_again(store, monkeypatch):
    """The shape key costs a few microseconds of Python per launch, which an eager training loop pays on every
    one: a call with a signature seen before runs the kernel its dispatch chose then."""
    from mamba2_kernels._runtime import pinned_config

    asked = []
    real = toy_exp_add.shape_key
    monkeypatch.setattr(toy_exp_add, "shape_key", lambda *args: (asked.append(args[0].shape), real(*args))[1])
    small, large = torch.randn(100, 33), torch.randn(300, 33)
    with execution_mode("ref"):
        toy_exp_add(small, small)
        first = len(asked)  # the dispatch and the config store's lookup
        toy_exp_add(small, small)
        toy_exp_add(small, small)
        assert len(asked) == first
        toy_exp_add(large, large)  # another signature
        assert asked[first:] and set(asked[first:]) == {large.shape}
        seen = len(asked)
        with pinned_config(toy_exp_add, {"block_sizes": [16, 16]}, _key(small, small)):
            torch.testing.assert_close(toy_exp_add(small, small), small.exp() + small)
        assert len(asked) > seen  # the pin asked the key again, to know whether the call has it

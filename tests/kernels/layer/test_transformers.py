"""Hugging Face transformers 5's Mamba-2 models, patched: their modeling files take mamba-ssm's functions when
imported (bound in the closures of their hub-kernel fallback wrappers), and a patched model must train on ours
and agree with transformers' own PyTorch path.

Here each modeling file is imported afresh so that its wrappers call what they bound: mamba-ssm's functions,
with the test's device let through where transformers sends only CUDA inputs to them (5.25 does; 5.17 sends
every input). The PyTorch path, the reference, comes from a second fresh import that finds no mamba-ssm,
as on a machine without it.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import sys

import pytest
import torch

import mamba2_kernels
from mamba2_kernels import _mamba_ssm
from mamba2_kernels.layer import is_patched
from mamba2_kernels.testing import execution_mode

# The dev extra installs transformers (tests/kernels/foundation/test_environment.py fails without it). Where it
# is missing, as on a GPU runner set up from the guard's wheel folder (scripts/gpu-wheels.sh), these skip
# rather than fail the collection of a `pytest -m gpu` run.
transformers = pytest.importorskip("transformers", reason="transformers is not installed (the dev extra has it)")
hub_kernels = pytest.importorskip("transformers.integrations.hub_kernels")

MODELS = ("mamba2", "bamba", "nemotron_h", "zamba2", "falcon_h1", "granitemoehybrid")

# Tiny configs: 8 heads of 16, 2 groups, state 16, chunk 16 (3 chunks of a 40-token sequence), two Mamba layers.
_COMMON = {"vocab_size": 128, "hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 2,
           "num_key_value_heads": 1, "use_cache": False}
_MAMBA = {"mamba_n_heads": 8, "mamba_d_head": 16, "mamba_n_groups": 2, "mamba_d_state": 16, "mamba_d_conv": 4,
          "mamba_expand": 2, "mamba_chunk_size": 16}
CONFIGS = {
    "mamba2": ("Mamba2Config", "Mamba2ForCausalLM",
               {"vocab_size": 128, "hidden_size": 64, "num_hidden_layers": 2, "num_heads": 8, "head_dim": 16,
                "n_groups": 2, "state_size": 16, "conv_kernel": 4, "expand": 2, "chunk_size": 16, "use_cache": False}),
    "bamba": ("BambaConfig", "BambaForCausalLM", {**_COMMON, "num_hidden_layers": 2, "attn_layer_indices": [],
                                                  **_MAMBA}),
    "nemotron_h": ("NemotronHConfig", "NemotronHForCausalLM",
                   {**_COMMON, "layers_block_type": ["mamba", "mlp", "mamba"], "head_dim": 32, "ssm_state_size": 16,
                    "mamba_num_heads": 8, "mamba_head_dim": 16, "n_groups": 2, "conv_kernel": 4, "chunk_size": 16,
                    "expand": 2}),
    "zamba2": ("Zamba2Config", "Zamba2ForCausalLM",
               {**_COMMON, "num_hidden_layers": 2, "layers_block_type": ["mamba", "mamba"], "mamba_d_state": 16,
                "mamba_d_conv": 4, "mamba_expand": 2, "mamba_ngroups": 2, "n_mamba_heads": 8, "chunk_size": 16,
                "attention_head_dim": 32}),
    "falcon_h1": ("FalconH1Config", "FalconH1ForCausalLM",
                  {**_COMMON, "num_hidden_layers": 2, "head_dim": 32, "mamba_d_ssm": 128, **_MAMBA}),
    "granitemoehybrid": ("GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM",
                         {**_COMMON, "num_hidden_layers": 2, "layer_types": ["mamba", "mamba"],
                          "num_local_experts": 0, "shared_intermediate_size": 96, **_MAMBA}),
}


@pytest.fixture
def modeling(monkeypatch):
    """``modeling(model, to_mamba_ssm, device="cpu")``: the model's modeling file, imported afresh and
    unpatched, as a job does when it loads its model before it patches; with ``to_mamba_ssm`` its wrappers
    call what they bound for inputs on ``device``, without it they take transformers' PyTorch path."""
    _mamba_ssm.module(_mamba_ssm.SSD_COMBINED)  # importable, as on a GPU: transformers binds mamba-ssm's functions
    assert not is_patched()

    def load(model: str, to_mamba_ssm: bool, device: str = "cpu"):
        if to_mamba_ssm and hasattr(hub_kernels, "_PACKAGE_SUPPORTED_DEVICES"):  # a version that filters devices
            monkeypatch.setitem(hub_kernels._PACKAGE_SUPPORTED_DEVICES, "mamba_ssm", (device,))
        name = f"transformers.models.{model}.modeling_{model}"
        monkeypatch.delitem(sys.modules, name, raising=False)
        if to_mamba_ssm:
            return importlib.import_module(name)
        with monkeypatch.context() as hidden:  # its wrappers find no mamba-ssm and bind the PyTorch path
            hidden.setitem(sys.modules, "mamba_ssm", None)
            return importlib.import_module(name)

    yield load
    mamba2_kernels.unpatch_mamba_ssm()


@pytest.fixture
def ssd_calls(monkeypatch):
    """The modules (our SSD call, our layer) whose SSD forward ran, in order."""
    import mamba2_kernels.layer_fn as layer_fn
    from mamba2_kernels.ssd import combined

    calls = []
    for module in (combined, layer_fn):
        original = module.ssd_forward
        monkeypatch.setattr(module, "ssd_forward",
                            lambda *a, _f=original, _m=module.__name__, **k: (calls.append(_m), _f(*a, **k))[1])
    return calls


def _scan_inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, 32, 4, 8, generator=g)
    dt = torch.randn(1, 32, 4, generator=g)
    B, C = torch.randn(1, 32, 2, 8, generator=g), torch.randn(1, 32, 2, 8, generator=g)
    A = -torch.rand(4, generator=g) - 0.5
    return (x, dt, A, B, C, 16), {"D": torch.randn(4, generator=g), "dt_bias": torch.randn(4, generator=g),
                                  "dt_softplus": True}


def _layer_inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    d_inner, conv_dim, nheads = 32, 32 + 2 * 2 * 8, 4
    zxbcdt = torch.randn(1, 32, 2 * d_inner + 2 * 2 * 8 + nheads, generator=g)
    args = (zxbcdt, torch.randn(conv_dim, 4, generator=g) * 0.3, torch.randn(conv_dim, generator=g),
            torch.randn(nheads, generator=g), -torch.rand(nheads, generator=g) - 0.5, torch.randn(nheads, generator=g),
            16)
    return args, {"headdim": 8, "ngroups": 2, "rmsnorm_weight": torch.ones(d_inner), "norm_before_gate": False}


@pytest.mark.parametrize("model", MODELS)
def test_patch_reaches_the_functions_a_modeling_file_bound_before_it(modeling, ssd_calls, model):
    """transformers 5 resolves mamba-ssm's SSD and layer functions when a modeling file is imported and keeps
    them in its fallback wrappers' closures (under a function-like module's forward, with Hugging Face's
    `kernels`, which it requires). A job that patched after loading its model silently trained on mamba-ssm's
    kernels. Now the wrappers call ours, and mamba-ssm's again after unpatch (once, however often patched)."""
    file = modeling(model, True)
    scan_args, scan_kwargs = _scan_inputs()
    layer_args, layer_kwargs = _layer_inputs()
    patched = mamba2_kernels.patch_mamba_ssm()
    assert file.__name__ in patched and mamba2_kernels.patch_mamba_ssm() == patched  # idempotent
    with execution_mode("ref"):
        scanned = file.mamba2_chunk_scan(*scan_args, **scan_kwargs)
        layered = file.mamba2_split_conv1d_scan_combined(*layer_args, **layer_kwargs)
        assert ssd_calls == ["mamba2_kernels.ssd.combined", "mamba2_kernels.layer_fn"]
        mamba2_kernels.unpatch_mamba_ssm()
        direct = mamba2_kernels.mamba_split_conv1d_scan_combined(*layer_args, **layer_kwargs)
    torch.testing.assert_close(layered, direct)
    ssd_calls.clear()
    theirs = file.mamba2_chunk_scan(*scan_args, **scan_kwargs)  # mamba-ssm's, in Triton's interpreter
    assert ssd_calls == []
    torch.testing.assert_close(scanned, theirs, atol=1e-4, rtol=1e-4)


_GROUP_FIELDS = ("n_groups", "mamba_n_groups", "mamba_ngroups")


def _norms_per_group(file) -> bool:
    """Whether the modeling file's PyTorch path normalizes the gated RMSNorm per group, as mamba-ssm's fused
    path does (in transformers 5.17 mamba2's, bamba's and granitemoehybrid's normalized over all groups at
    once: no reference for a model of several groups)."""
    norms = [cls for name, cls in vars(file).items() if name.endswith("RMSNormGated") and isinstance(cls, type)]
    return all({"group_size", "n_groups"} & set(inspect.signature(cls.__init__).parameters) for cls in norms)


def _build(modeling, model: str, to_mamba_ssm: bool, device: str = "cpu"):
    """A tiny model of ``model``'s family (``CONFIGS``), seeded, from a fresh import of its modeling file; of
    one group where that file's PyTorch path cannot take several (``_norms_per_group``)."""
    config_name, model_name, kwargs = CONFIGS[model]
    torch.manual_seed(0)
    file = modeling(model, to_mamba_ssm, device)
    if not _norms_per_group(file):
        kwargs = {**kwargs, **{field: 1 for field in _GROUP_FIELDS if field in kwargs}}
    return getattr(file, model_name)(getattr(transformers, config_name)(**kwargs)).to(device)


def _reference_and_patched(modeling, model: str, device: str = "cpu"):
    """The model on transformers' PyTorch path, and a copy of it whose wrappers call what they bound, patched
    after it was built."""
    reference = _build(modeling, model, False, device)
    patched = _build(modeling, model, True, device)
    patched.load_state_dict(reference.state_dict())
    mamba2_kernels.patch_mamba_ssm()
    return reference, patched


def _train_step(model, ids):
    model.zero_grad()
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    return out.loss.detach(), {name: p.grad for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("model", MODELS)
def test_a_patched_model_trains_as_transformers_pytorch_path(modeling, ssd_calls, model, device):
    """A tiny model of each family, patched after it was built: a training step runs our whole layer in each
    Mamba layer (transformers' fused path), evaluation our SSD call (its unfused path), and the loss, every
    parameter's gradient and the logits agree with transformers' own PyTorch implementation. On a GPU the
    kernels' fp32 dots may round as TF32 does, hence the looser tolerance there."""
    reference, patched = _reference_and_patched(modeling, model, device)
    reference.train()
    patched.train()
    ids = torch.randint(0, 128, (2, 40), generator=torch.Generator().manual_seed(1)).to(device)
    ours = (lambda: execution_mode("ref")) if device == "cpu" else contextlib.nullcontext
    tolerance = 1e-4 if device == "cpu" else 5e-3

    with ours():
        loss, grads = _train_step(patched, ids)
    assert ssd_calls == ["mamba2_kernels.layer_fn"] * 2
    ref_loss, ref_grads = _train_step(reference, ids)
    torch.testing.assert_close(loss, ref_loss, atol=tolerance / 10, rtol=tolerance / 10)
    assert set(grads) == set(ref_grads)
    for name, grad in grads.items():
        scale = ref_grads[name].abs().max().item() + 1e-12
        torch.testing.assert_close(grad / scale, ref_grads[name] / scale, atol=tolerance, rtol=0, msg=f"d{name}")

    ssd_calls.clear()
    with torch.no_grad(), ours():
        logits = patched.eval()(input_ids=ids).logits
        ref_logits = reference.eval()(input_ids=ids).logits
    assert ssd_calls == ["mamba2_kernels.ssd.combined"] * 2
    torch.testing.assert_close(logits, ref_logits, atol=tolerance, rtol=tolerance)


def test_a_patched_model_compiles(modeling, ssd_calls):
    """torch.compile(fullgraph=True) around a patched transformers model: Dynamo traces transformers' wrapper
    and our layer without a graph break (eagerly the fused layer runs; compiled, the layer is composed of the
    SSD, conv and norm operators), with the eager results."""
    model = _build(modeling, "bamba", True).train()
    mamba2_kernels.patch_mamba_ssm()
    ids = torch.randint(0, 128, (2, 40), generator=torch.Generator().manual_seed(1))
    torch._dynamo.reset()
    with execution_mode("ref"):
        loss, grads = _train_step(model, ids)
        grads = {name: grad.clone() for name, grad in grads.items()}
        compiled_loss, compiled_grads = _train_step(torch.compile(model, backend="aot_eager", fullgraph=True), ids)
    assert ssd_calls == ["mamba2_kernels.layer_fn"] * 2 + ["mamba2_kernels.ssd.combined"] * 2
    torch.testing.assert_close(compiled_loss, loss)
    for name, grad in compiled_grads.items():
        torch.testing.assert_close(grad, grads[name.removeprefix("_orig_mod.")], msg=f"d{name}")


@pytest.mark.parametrize("model", MODELS)
def test_packed_documents_train_as_the_documents_one_by_one(modeling, ssd_calls, model, monkeypatch):
    """Packed training (transformers' DataCollatorWithFlattening with return_seq_idx=True: one row of several
    documents, with ``seq_idx`` and restarted ``position_ids``) reaches our layer through the model's keyword
    arguments: each document's logits are those of the document alone on transformers' PyTorch path."""
    reference, patched = _reference_and_patched(modeling, model)
    patched.train()
    file = sys.modules[patched.__module__]
    passed, wrapper = [], file.mamba2_split_conv1d_scan_combined
    monkeypatch.setattr(file, "mamba2_split_conv1d_scan_combined",
                        lambda *a, **k: (passed.append(k.get("seq_idx") is not None), wrapper(*a, **k))[1])
    g = torch.Generator().manual_seed(1)
    documents = [torch.randint(0, 128, (1, length), generator=g) for length in (23, 17)]  # 23: inside a chunk
    seq_idx = torch.cat([torch.full((1, len(d[0])), i, dtype=torch.int32) for i, d in enumerate(documents)], 1)
    position_ids = torch.cat([torch.arange(len(d[0])) for d in documents])[None]
    with torch.no_grad(), execution_mode("ref"):
        packed = patched(input_ids=torch.cat(documents, 1), seq_idx=seq_idx, position_ids=position_ids).logits
        alone = torch.cat([reference.eval()(input_ids=d).logits for d in documents], 1)
    if passed == [False, False]:
        pytest.skip(f"transformers {transformers.__version__}'s {type(patched).__name__} does not pass seq_idx to "
                    "its Mamba layers, so no kernel can keep the documents apart")
    assert ssd_calls == ["mamba2_kernels.layer_fn"] * 2
    torch.testing.assert_close(packed, alone, atol=1e-4, rtol=1e-4)

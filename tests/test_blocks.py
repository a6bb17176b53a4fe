"""Every block: shapes, gradients to every parameter, determinism, exact FLOPs and params."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from torchrec.modules import crossnet

from search_space.blocks import OPS
from search_space.params import validate_params
from search_space.shapes import Dense, Sparse

BATCH = 8
# (op, input shape, params): each op on the inputs it is meant for, with its variants.
CASES = [
    ("mlp", Dense(12), {"widths": [16, 8]}),
    ("mlp", Dense(5), {"widths": [3]}),
    ("cross", Dense(12), {"num_layers": 2}),
    ("cross", Dense(12), {"num_layers": 2, "low_rank": 4}),
    ("cross", Dense(12), {"num_layers": 3, "low_rank": 4, "num_experts": 3}),
    ("concat", Dense(7), {}),
    ("gating", (Dense(6), Dense(10)), {}),
    ("gating", (Dense(6),), {}),
    ("gating", (Dense(6), Dense(3), Dense(2)), {}),
    ("sum", (Dense(6), Dense(6)), {}),
    ("sum", (Dense(6), Dense(9)), {"width": 6}),
    ("sum", (Dense(6), Dense(9)), {"width": 4}),
    ("dot", Sparse(5, 4), {}),
    ("dot", Sparse(1, 4), {"self_interaction": True}),
    ("fm", Sparse(5, 4), {}),
    ("fm", Sparse(5, 4), {"reduce": False}),
    ("efc", Sparse(5, 4), {"num_out": 3}),
    ("attention", Sparse(5, 8), {"num_heads": 2}),
    ("attention", Sparse(5, 8), {"num_heads": 3, "head_dim": 4}),
    ("wukong", Sparse(6, 4), {"num_fm": 3, "num_lc": 3, "rank": 2, "fmb_widths": [8]}),
    ("wukong", Sparse(6, 4), {"num_fm": 2, "num_lc": 5, "rank": 3, "fmb_widths": [8, 4]}),
    ("dhen", Sparse(5, 4), {"modules": ["dot", "attention"]}),
    ("dhen", Sparse(5, 4), {"modules": ["dcn", "conv", "linear"], "aggregation": "concat"}),
    (
        "dhen",
        Sparse(5, 4),
        {"modules": ["dot", "dcn"], "aggregation": "weighted_sum", "num_out": 3},
    ),
    ("dhen", Sparse(5, 4), {"modules": ["attention", "conv"], "num_out": 7, "num_heads": 2}),
    ("dhen", Sparse(5, 4), {"modules": ["linear"], "aggregation": "concat", "num_out": 2}),
]
IDS = [f"{op}-{i}" for i, (op, _, _) in enumerate(CASES)]


def _inputs(shape, seed: int):
    generator = torch.Generator().manual_seed(seed)
    if isinstance(shape, tuple):
        return [torch.randn(BATCH, s.width, generator=generator, requires_grad=True) for s in shape]
    dims = (shape.width,) if isinstance(shape, Dense) else (shape.count, shape.dim)
    return torch.randn(BATCH, *dims, generator=generator, requires_grad=True)


def _build(op, shape, given, seed=0):
    cls = OPS[op]
    params, problems = validate_params(cls.PARAMS, given, op)
    assert not problems
    assert cls.check(shape, params) is None
    torch.manual_seed(seed)
    return cls, params, cls(shape, **params)


@pytest.mark.parametrize(("op", "shape", "given"), CASES, ids=IDS)
def test_forward_backward_shapes_and_gradients(op, shape, given):
    cls, params, block = _build(op, shape, given)
    x = _inputs(shape, seed=1)
    out = block(x)
    expected = cls.output_shape(shape, params)
    dims = (expected.width,) if isinstance(expected, Dense) else (expected.count, expected.dim)
    assert out.shape == (BATCH, *dims)
    assert expected.kind == cls.output_kind
    out.square().sum().backward()
    for name, parameter in block.named_parameters():
        assert parameter.grad is not None, f"{op}: no gradient reaches {name}"
        assert torch.isfinite(parameter.grad).all()
        assert parameter.grad.abs().sum() > 0, f"{op}: zero gradient at {name}"
    inputs = x if isinstance(x, list) else [x]
    assert all(t.grad is not None and t.grad.abs().sum() > 0 for t in inputs)


@pytest.mark.parametrize(("op", "shape", "given"), CASES, ids=IDS)
def test_analytic_flops_and_params_match_torch(op, shape, given):
    cls, params, block = _build(op, shape, given)
    with FlopCounterMode(display=False) as counter:
        block(_inputs(shape, seed=1))
    assert counter.get_total_flops() == cls.flops(shape, params) * BATCH
    assert sum(p.numel() for p in block.parameters()) == cls.num_params(shape, params)


@pytest.mark.parametrize(("op", "shape", "given"), CASES, ids=IDS)
def test_deterministic_given_seed(op, shape, given):
    outputs = [_build(op, shape, given, seed=7)[2](_inputs(shape, seed=3)) for _ in range(2)]
    torch.testing.assert_close(outputs[0], outputs[1], rtol=0, atol=0)
    block = _build(op, shape, given, seed=8)[2]
    if list(block.parameters()):
        assert not torch.equal(outputs[0], block(_inputs(shape, seed=3)))


def test_every_op_has_a_case_and_declares_its_kinds():
    assert {op for op, _, _ in CASES} == set(OPS)
    for cls in OPS.values():
        assert cls.input_kind in ("dense", "sparse") and cls.output_kind in ("dense", "sparse")
        assert cls.doc


@pytest.mark.parametrize(
    ("params", "theirs"),
    [
        ({}, lambda: crossnet.CrossNet(8, 2)),
        ({"low_rank": 2}, lambda: crossnet.LowRankCrossNet(8, 2, 2)),
        ({"low_rank": 2, "num_experts": 3}, lambda: crossnet.LowRankMixtureCrossNet(8, 2, 3, 2)),
    ],
)
def test_cross_computes_what_torchrecs_crossnet_does_with_its_weights(params, theirs):
    ours, reference = _build("cross", Dense(8), params)[2].net, theirs()
    with torch.no_grad():  # torchrec starts them at zero: a misplaced bias would not show
        for bias in reference.bias:
            bias.normal_()
    ours.load_state_dict(reference.state_dict())  # same names and shapes
    x = torch.randn(16, 8)
    torch.testing.assert_close(ours(x), reference(x), rtol=1e-5, atol=1e-6)


def test_fm_matches_the_pairwise_definition():
    x = torch.randn(3, 4, 5)
    fm = OPS["fm"](Sparse(4, 5), reduce=True)(x)
    pairwise = sum((x[:, i] * x[:, j]).sum(-1) for i in range(4) for j in range(i + 1, 4))
    torch.testing.assert_close(fm.squeeze(1), pairwise)


def test_dot_product_is_the_upper_triangle_of_inner_products():
    x = torch.randn(2, 3, 4)
    out = OPS["dot"](Sparse(3, 4), self_interaction=False)(x)
    expected = torch.stack(
        [(x[:, 0] * x[:, 1]).sum(-1), (x[:, 0] * x[:, 2]).sum(-1), (x[:, 1] * x[:, 2]).sum(-1)], 1
    )
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("self_interaction", [False, True])
def test_dot_product_and_its_gradient_match_the_pairs_one_by_one(self_interaction):
    """The flat index_select of the products gives each pair's inner product in row order,
    and the gradient of the pairs computed one by one."""
    x = torch.randn(4, 6, 3, requires_grad=True)
    out = OPS["dot"](Sparse(6, 3), self_interaction=self_interaction)(x)
    start = 0 if self_interaction else 1
    pairs = [(i, j) for i in range(6) for j in range(i + start, 6)]
    expected = torch.stack([(x[:, i] * x[:, j]).sum(-1) for i, j in pairs], 1)
    torch.testing.assert_close(out, expected)
    weights = torch.randn_like(out)
    (grad,) = torch.autograd.grad((out * weights).sum(), x)
    (grad_expected,) = torch.autograd.grad((expected * weights).sum(), x)
    torch.testing.assert_close(grad, grad_expected)


def test_under_autocast_the_network_runs_in_its_dtype():
    """A cat of a bf16 block output with the fp32 inputs promoted the rest of the network
    (its elementwise work and the activations kept for backward) to fp32: the inputs are
    cast first."""
    from search_space.builder import build_model
    from search_space.presets import preset
    from trainers.data import SyntheticConfig, generate_synthetic

    data = generate_synthetic(SyntheticConfig(rows=64))
    batch = next(iter(data.loader(64)))
    seen = {}
    for name in ("dcnv2", "deepfm"):
        model = build_model(preset(name).bind(data.schema), seed=0)
        for block, module in model.blocks.items():
            module.register_forward_hook(
                lambda m, args, out, key=(name, block): seen.update({key: (args[0], out)})
            )
        with torch.autocast("cpu", torch.bfloat16):
            model(batch.dense, batch.sparse).float().sum().backward()
    cross_in, cross_out = seen["dcnv2", "cross"]  # on the dense features and the embeddings
    assert cross_in.dtype == cross_out.dtype == torch.bfloat16
    assert seen["deepfm", "fm"][1].dtype == torch.bfloat16


def test_fm_cancels_in_fp32_given_bf16():
    """0.5 * ((sum e)^2 - sum e^2) loses its digits to cancellation in bf16: it is computed
    in fp32 and rounded once."""
    x = (torch.randn(64, 26, 16, generator=torch.Generator().manual_seed(0)) + 3).bfloat16()
    fm = OPS["fm"](Sparse(26, 16), reduce=False)
    exact = fm(x.double()).to(torch.bfloat16)
    torch.testing.assert_close(fm(x), exact, rtol=0, atol=0)

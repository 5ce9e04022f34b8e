"""torch.compile: the attention layers compile as ONE graph (fullgraph=True), do not recompile
across training steps, and give the outputs and gradients of eager mode.

The default tests use the "aot_eager" backend: Dynamo capture plus AOTAutograd on fake tensors,
which is where graph breaks, recompilations and fake/real mismatches of the custom ops show;
inductor code generation adds ~1 minute of C++ compilation on CPU, so the inductor test is slow.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo as dynamo

from fpa.layers.attention import TransformerBlock
from fpa.models import FPAConfig, FPAForCausalLM

TYPES = [("fpa", {"fpa": {"mode": "walk"}}), ("fpa", {"fpa": {"mode": "free"}}), ("fox", {})]
IDS = ["fpa-walk", "fpa-free", "fox"]
BLOCK_TYPES = TYPES + [("fpa", {"fpa": {"mode": "walk", "level_offset": "token"}})]  # make_attention's arguments


def _grads(f, x: torch.Tensor, params: list[torch.Tensor]) -> list[torch.Tensor]:
    y = f(x)
    y = y[0] if isinstance(y, tuple) else y
    return [y.detach(), *torch.autograd.grad((y * torch.sin(y)).sum(), [x, *params])]


@pytest.mark.parametrize("att, kw", BLOCK_TYPES, ids=IDS + ["fpa-walk-token"])
def test_attention_block_compiles_fullgraph_without_recompiles(att, kw):
    dynamo.reset()
    torch.manual_seed(0)
    blk = TransformerBlock(32, 64, attention=att, num_heads=4, num_kv_heads=2, **kw)
    params = list(blk.parameters())
    compiled = torch.compile(blk, fullgraph=True, backend="aot_eager", dynamic=False)
    with dynamo.config.patch(error_on_recompile=True):
        for step in range(3):  # new data every step: a data-dependent guard would recompile here
            x = torch.randn(2, 37, 32, requires_grad=True) * (1 + step)
            want, got = _grads(blk, x, params), _grads(compiled, x, params)
            for i, (a, b) in enumerate(zip(want, got)):
                assert torch.allclose(a, b, rtol=1e-6, atol=1e-6), f"step {step} tensor {i}: {(a - b).abs().max():.2e}"


def test_block_under_the_training_eviction_rule_compiles_fullgraph_without_recompiles():
    """Training under the threshold rule (the chunked op with its ``hide`` argument): one graph, no
    recompilation, eager's outputs and gradients; the rule hides keys here (the output moves)."""
    dynamo.reset()
    torch.manual_seed(0)
    blk = TransformerBlock(32, 64, attention="fpa", num_heads=4, num_kv_heads=2, fpa={"mode": "walk"})
    with torch.no_grad():
        blk.attn.increment_proj.weight.normal_(0, 0.5)  # a walk that dips, so that the rule hides keys
    x0 = torch.randn(2, 37, 32)
    with torch.no_grad():
        plain = blk(x0)
    blk.attn.set_training_eviction(0.05)
    with torch.no_grad():
        assert (blk(x0) - plain).abs().max() > 1e-3
    params = list(blk.parameters())
    compiled = torch.compile(blk, fullgraph=True, backend="aot_eager", dynamic=False)
    with dynamo.config.patch(error_on_recompile=True):
        for step in range(3):
            x = torch.randn(2, 37, 32, requires_grad=True) * (1 + step)
            want, got = _grads(blk, x, params), _grads(compiled, x, params)
            for i, (a, b) in enumerate(zip(want, got)):
                assert torch.allclose(a, b, rtol=1e-6, atol=1e-6), f"step {step} tensor {i}: {(a - b).abs().max():.2e}"


def test_model_graph_breaks_are_outside_attention():
    """The whole model under dynamo: any graph break must come from outside the attention code."""
    dynamo.reset()
    torch.manual_seed(0)
    model = FPAForCausalLM(FPAConfig.from_preset("tiny", attention="fpa", fpa={"mode": "walk"}, num_hidden_layers=2))
    ids = torch.randint(0, model.config.vocab_size, (2, 48))
    explained = dynamo.explain(lambda i: model(input_ids=i, labels=i).loss)(ids)
    for br in explained.break_reasons:
        files = [f.filename for f in br.user_stack]
        inside = [f for f in files if "/fpa/layers/" in f or "/fpa/ops/" in f]
        assert not inside, f"graph break inside the attention code: {br.reason[:200]} at {inside}"


def _train(model: torch.nn.Module, batches: list[torch.Tensor]) -> tuple[list[float], list[torch.Tensor]]:
    """AdamW steps over parameter_groups; -> the losses and the gradients of the FIRST step."""
    from fpa.train import parameter_groups

    opt = torch.optim.AdamW(parameter_groups(model, 0.0), lr=1e-2)
    for g in opt.param_groups:
        g["lr"] = 1e-2 * g["lr_multiplier"]
    losses: list[float] = []
    first: list[torch.Tensor] = []
    for ids in batches:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        if not first:
            for p in model.parameters():
                assert p.grad is not None
                first.append(p.grad.clone())
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses, first


def _compiled_training_matches_eager(backend: str, att: str, kw: dict, layers: int, T: int, tol: float) -> None:
    """Equal loss and gradients at the first step (same parameters), then no recompilation over the
    next steps and losses that stay with eager's (Adam turns rounding-level gradient differences of
    near-zero gradients into lr-sized parameter differences, so later parameters are not compared)."""
    dynamo.reset()
    torch.manual_seed(0)
    cfg = FPAConfig.from_preset("tiny", attention=att, num_hidden_layers=layers, **kw)
    eager = FPAForCausalLM(cfg)
    comp = FPAForCausalLM(cfg)
    comp.load_state_dict(eager.state_dict())
    batches = [torch.randint(0, cfg.vocab_size, (2, T)) for _ in range(3)]
    want, want_g = _train(eager, batches)
    # Each decoder block compiled whole (the model's own input-id value check, outside the blocks,
    # is a host sync: compiling the whole model breaks the graph there and recompiles per value).
    for block in comp.model.layers:
        block.compile(fullgraph=True, backend=backend, dynamic=False)
    with dynamo.config.patch(error_on_recompile=True):
        got, got_g = _train(comp, batches)
    assert got[0] == pytest.approx(want[0], rel=tol, abs=tol)
    for (n, _), a, b in zip(eager.named_parameters(), got_g, want_g):
        assert torch.allclose(a, b, rtol=100 * tol, atol=tol * b.abs().max().item()), f"d{n}: {(a - b).abs().max():.2e}"
    assert got == pytest.approx(want, rel=100 * tol)


@pytest.mark.parametrize("att, kw", TYPES, ids=IDS)
def test_compiled_model_training_matches_eager(att, kw):
    _compiled_training_matches_eager("aot_eager", att, kw, layers=2, T=40, tol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("att, kw", TYPES, ids=IDS)
def test_inductor_model_training_matches_eager(att, kw):
    _compiled_training_matches_eager("inductor", att, kw, layers=2, T=64, tol=1e-5)

import pytest
import torch

from fpa.eval.example import fpa_head_maps, passkey_example
from fpa.ops import first_passage_attention


@pytest.mark.parametrize("mode", ["free", "walk"])
def test_answer_attention_is_the_layers_own_attention(tiny_model, mode):
    model = tiny_model("fpa", mode)
    attn = model.model.layers[1].attn
    for p in (attn.field_proj if mode == "free" else attn.increment_proj).parameters():
        p.data.normal_(0, 0.5)  # make the penalties matter
    x = torch.randn(1, 50, 32)
    with torch.no_grad():
        field, level, w = fpa_head_maps(attn, x)
        q, k, v = attn.project(x)
        ref = first_passage_attention(q, k, v, field[None], level[None], beta=attn.beta)[0, :, -1]
    assert w.shape == (2, 50) and torch.allclose(w.sum(-1), torch.ones(2))
    torch.testing.assert_close(torch.einsum("ht,htd->hd", w, v[0]), ref, rtol=1e-4, atol=1e-5)


def test_example_picks_the_head_most_on_the_needle(tiny_model, tok):
    ex = passkey_example(tiny_model("fpa", "walk", fpa={"level_offset": "head"}), tok, 200, 0.5)
    a, b = ex["needle_start"], ex["needle_start"] + ex["needle_len"]
    assert len(ex["field"]) == len(ex["level"]) == len(ex["attention"]) == 200
    assert ex["needle_mass"] == pytest.approx(sum(ex["attention"][a:b]), rel=1e-5)
    # walk mode with a head offset, starting at 1: level = field + 1 at every position
    assert ex["level"] == pytest.approx([f + 1.0 for f in ex["field"]], abs=1e-5)
    plain = passkey_example(tiny_model("fpa", "walk", fpa={"level_offset": "none"}), tok, 200, 0.5)
    assert plain["level"] == plain["field"]
    with pytest.raises(ValueError, match="attention"):
        passkey_example(tiny_model("fox"), tok, 200, 0.5)

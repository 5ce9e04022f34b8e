"""One free-mode FPA layer cannot represent the stack: the argument behind FPA free's 0 successes.

In free mode the field phi_t and the level l_j are functions of one token, so (one layer, no
position) the dip of key j is a function of its token and of the SET of tokens after it, and the
content logit of the query on j is a function of j's token. Take (stack tokens: push b = b,
pop = 2, query = 4)

    S1 = push1 push0 pop query    (live: the push1 at position 0)
    S2 = push0 push1 pop query    (live: the push0 at position 0)

and r = w(position 0) / w(position 1) in each. In log r1 + log r2 the content logits cancel and
what remains is -beta * [dip(push1 | {push0, pop, q}) - dip(push1 | {pop, q})
+ dip(push0 | {push1, pop, q}) - dip(push0 | {pop, q})] <= 0: a minimum over a larger set is
smaller, so the dip is larger. Hence r1 * r2 <= 1: in one of the two sequences the live key gets
no more weight than the popped one, and target mass >= 0.99 (r >= 99 in both) is out of reach
for every parameter setting. A walk head (field = depth, built by ``constructed_head``) gets
r1 * r2 ~ e^40: the positive control that the measurement can fail.
"""

import math

import torch
import torch.nn.functional as F

from fpa.layers.attention import make_attention
from fpa.tasks.construct import constructed_head
from fpa.tasks.probe import attention_probs

S1 = [1, 0, 2, 4]
S2 = [0, 1, 2, 4]
VOCAB = 6


def _log_ratio_product(layer, embed) -> float:
    x = embed[torch.tensor([S1, S2])]  # (2, T, hidden)
    with torch.no_grad():
        probs, _ = attention_probs(layer, x, last_only=True)  # (2, H, 1, T)
    p = probs[:, 0, -1].double()
    return float(torch.log(p[0, 0] / p[0, 1]) + torch.log(p[1, 0] / p[1, 1]))


def test_free_mode_cannot_prefer_the_live_key_in_both_orders():
    worst = -math.inf
    for seed in range(200):
        torch.manual_seed(seed)
        hidden = 8
        layer = make_attention("fpa", hidden, 1, head_dim=4, fpa={"mode": "free"})
        scale = [0.1, 1.0, 5.0, 20.0][seed % 4]  # small to large fields, levels and logits
        with torch.no_grad():
            for p in layer.parameters():
                p.normal_(0, scale)
            layer.set_beta_(float(torch.empty(()).uniform_(0.1, 50.0)))
        embed = torch.randn(VOCAB, hidden)
        worst = max(worst, _log_ratio_product(layer, embed))
    # exact bound 0; measured float64 rounding of float32 probabilities is far below 1e-4
    assert worst <= 1e-4, worst


def test_walk_head_prefers_the_live_key_in_both_orders():
    layer = constructed_head("stack")  # hidden = vocabulary, one-hot embeddings
    assert _log_ratio_product(layer, F.one_hot(torch.arange(VOCAB), VOCAB).float()) > 2 * math.log(99)

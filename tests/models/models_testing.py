"""Shared helpers for the model tests: token comparisons between two computation paths (a uniquely
named module, so that `from models_testing import ...` cannot pick up another folder's conftest)."""

import torch

# Token comparisons between two computation paths (batched / alone, cached / not): greedy picks the
# same token on both when their logits differ by less than half the gap between the best and the
# second-best logit. The paths differ by <= 1.7e-7 here (1.5e-7 cropped / fresh, 4.8e-7 in beam
# search log-probs, measured), so a reference run whose every step has a gap >= MIN_GAP (20x the
# largest of those) makes the token equality a consequence of those tolerances, not of bit-equal
# arithmetic. The reference runs of tests/models have gaps >= 1.6e-4 (measured).
MIN_GAP = 1e-5


def greedy_gap(scores) -> float:
    """Smallest gap between the best and the second-best logit over the steps of a greedy
    ``generate(..., output_scores=True)`` (``scores``: the logits each step chose from)."""
    top = torch.stack(scores).double().topk(2, dim=-1).values
    return (top[..., 0] - top[..., 1]).min().item()


def scored(m, ids, cache=None, **kw):
    """Greedy ``m.generate`` -> (sequences, greedy_gap of its steps)."""
    from fpa.compat import CACHE_ARG

    extra = {} if cache is None else {CACHE_ARG: cache}
    out = m.generate(ids, do_sample=False, output_scores=True, return_dict_in_generate=True, **extra, **kw)
    return out.sequences, greedy_gap(out.scores)

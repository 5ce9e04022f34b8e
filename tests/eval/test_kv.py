import pytest

from fpa.eval.kv import budget_for, make_policy, policies_for


def test_policies_for_each_attention_type():
    assert policies_for("fpa")[0] == "fpa" and "fox" not in policies_for("fpa")
    assert policies_for("fox")[0] == "fox"
    assert policies_for("softmax_rope") == ["window", "streamingllm", "tova", "h2o"]
    with pytest.raises(ValueError, match="policy"):
        make_policy("lru", budget=3)
    with pytest.raises(ValueError, match="budget"):
        make_policy("tova")
    with pytest.raises(ValueError, match="threshold"):
        make_policy("fpa")


def test_budget_for():
    assert budget_for(0.25, 1024) == 256 and budget_for(0.001, 10) == 1
    with pytest.raises(ValueError, match="fraction"):
        budget_for(0.0, 10)


def test_within_rules_apply_the_threshold_inside_chunks():
    from fpa.cache import FoXEviction, FPAEviction

    p = make_policy("fpa-within", threshold=2.0)
    assert isinstance(p, FPAEviction) and p.within_chunks and p.threshold == 2.0
    q = make_policy("fox-within", threshold=3.0)
    assert isinstance(q, FoXEviction) and q.within_chunks
    assert not make_policy("fpa", threshold=2.0).within_chunks
    with pytest.raises(ValueError, match="threshold is required"):
        make_policy("fpa-within")

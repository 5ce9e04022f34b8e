import pytest

from fpa.data import prepare_corpus
from fpa.train import TrainConfig

TINY_MODEL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """A 300 KB slice of the embedded stdlib corpus, byte-level."""
    return prepare_corpus("stdlib", tmp_path_factory.mktemp("corpus"), max_bytes=300_000, val_fraction=0.1)


@pytest.fixture
def tiny_cfg(corpus, tmp_path):
    def make(**kw) -> TrainConfig:
        base = dict(
            out_dir=str(tmp_path / "run"),
            data_dir=str(corpus),
            model_overrides=dict(TINY_MODEL),
            seq_len=64,
            batch_size=4,
            steps=8,
            lr=3e-3,
            warmup_steps=2,
            ckpt_every=4,
            log_every=1,
            eval_every=4,
            eval_batches=2,
            progress=False,
        )
        return TrainConfig(**{**base, **kw})

    return make

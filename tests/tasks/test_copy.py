import re

import numpy as np
import pytest

from fpa.data import ByteTokenizer
from fpa.experiments.lm.presets import PRESETS
from fpa.tasks import TASK_PROBES, get_mixer
from fpa.tasks.copy import COPY_SHARE, copy_training_sample, passkey_or_copy_sample, random_string
from fpa.tasks.passkey import QUESTION

TOK = ByteTokenizer()
LINE = re.compile(r"([a-z0-9]{3,8}) is ([a-z0-9]{3,8})\. ")


@pytest.mark.parametrize("seq_len", [1, 7, 128, 1000])
def test_copy_sample_is_whole_lines_cut_to_length(seq_len):
    ids = copy_training_sample(np.random.default_rng(seq_len), seq_len, TOK)
    assert ids.shape == (seq_len + 1,) and ids.dtype == np.int64
    text = TOK.decode(ids.tolist())
    lines = LINE.findall(text)
    assert all(a == b for a, b in lines)
    # every complete line matches; only the last one may be cut
    assert len("".join(f"{a} is {b}. " for a, b in lines)) > len(text) - 20


def test_copy_sample_is_deterministic_per_rng_and_varies_across_rngs():
    a = copy_training_sample(np.random.default_rng([3, 1]), 128, TOK)
    assert np.array_equal(a, copy_training_sample(np.random.default_rng([3, 1]), 128, TOK))
    assert not np.array_equal(a, copy_training_sample(np.random.default_rng([3, 2]), 128, TOK))


def test_passkey_or_copy_draws_copy_at_its_share():
    n, copies = 600, 0
    for i in range(n):
        ids = passkey_or_copy_sample(np.random.default_rng([7, i]), 128, TOK)
        assert ids.shape == (129,)
        copies += QUESTION not in TOK.decode(ids.tolist())
    # binomial(600, 1/3): sd 11.5; 4 sd either side
    assert abs(copies - n * COPY_SHARE) < 4 * (n * COPY_SHARE * (1 - COPY_SHARE)) ** 0.5


def test_mixers_and_probe_are_registered():
    assert get_mixer("copy") is copy_training_sample
    assert get_mixer("passkey+copy") is passkey_or_copy_sample
    assert "passkey+copy" in TASK_PROBES


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "128"])
def test_copy_sample_rejects_bad_seq_len(bad):
    with pytest.raises(ValueError, match="seq_len"):
        copy_training_sample(np.random.default_rng(0), bad, TOK)


def test_random_string_rejects_bad_bounds():
    with pytest.raises(ValueError, match="min_len"):
        random_string(np.random.default_rng(0), 5, 3)


def test_cpu_presets_train_on_the_copy_mix():
    for name in ("cpu-tune", "cpu", "cpu-context"):
        assert PRESETS[name].mix_task == "passkey+copy" and PRESETS[name].mix_rate == 0.75

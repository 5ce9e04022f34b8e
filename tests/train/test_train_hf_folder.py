"""A trained model folder is a standard transformers folder: AutoTokenizer (byte and BPE),
a model card, and pipeline("text-generation") end to end."""

import pytest
import torch

from fpa.data import prepare_corpus
from fpa.data.tokenizer import BPETokenizer, ByteTokenizer, load_tokenizer, save_hf_tokenizer
from fpa.train import train

# 80x the measured difference between batched and alone logits (1.2e-7, below)
MIN_GAP = 1e-5

TEXTS = ["def f(x):\n    return x + 1\n", "héllo wörld ✓ naïve café", "  two  spaces\tand tabs\n\n", "ünïcödé 中文 🙂"]


@pytest.mark.parametrize("kind", ["byte", "bpe"])
def test_auto_tokenizer_encodes_as_ours(kind, tmp_path):
    from transformers import AutoTokenizer

    tok = ByteTokenizer() if kind == "byte" else BPETokenizer.train(TEXTS * 20, vocab_size=300)
    save_hf_tokenizer(tok, tmp_path)
    assert (tmp_path / "tokenizer.json").is_file() and (tmp_path / "tokenizer_config.json").is_file()
    hf = AutoTokenizer.from_pretrained(tmp_path)
    for t in TEXTS:
        assert hf(t)["input_ids"] == tok.encode(t)
        assert hf.decode(tok.encode(t)) == t
    assert hf.eos_token_id == hf.pad_token_id == tok.eos_id and hf.padding_side == "left"
    assert len(hf) == tok.vocab_size


def test_trained_folder_loads_everywhere(tiny_cfg):
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

    summary = train(
        tiny_cfg(
            steps=4,
            model_overrides=dict(
                hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=257
            ),
        )
    )
    folder = summary["model_dir"]
    card = open(f"{folder}/README.md").read()
    assert "held-out loss" in card and f"{summary['val_loss']:.4f}" in card and "| steps | 4 |" in card
    assert "Passkey retrieval" in card
    from fpa.models.card import write_model_card

    write_model_card(folder, passkey={"1x": 0.9, "8x": 0.25})  # figures known later: rewritten card
    card2 = open(f"{folder}/README.md").read()
    assert "| 1x | 90% |" in card2 and "| 8x | 25% |" in card2 and f"{summary['val_loss']:.4f}" in card2
    assert card2.count("| parameters |") == 1
    tok = AutoTokenizer.from_pretrained(folder)
    assert tok("def f")["input_ids"] == load_tokenizer(folder).encode("def f")
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert model.config.eos_token_id == tok.eos_token_id == 256
    gen = pipeline("text-generation", model=folder)
    out = gen(["def ", "import os\n"], max_new_tokens=5, do_sample=False, batch_size=2)  # one left-padded batch
    assert out[0][0]["generated_text"].startswith("def ") and out[1][0]["generated_text"].startswith("import os\n")
    alone = gen("import os\n", max_new_tokens=5, do_sample=False)
    # batched and alone are two computation paths whose logits differ by 1.2e-7 (measured): equal
    # text is a tolerance claim, made where greedy decoding alone has no step near a tie
    ref = model.generate(
        **tok(["import os\n"], return_tensors="pt"),
        max_new_tokens=5,
        do_sample=False,
        output_scores=True,
        return_dict_in_generate=True,
    )
    top = torch.stack(ref.scores).double().topk(2, dim=-1).values
    assert (top[..., 0] - top[..., 1]).min() > MIN_GAP  # measured smallest gap 0.15
    assert alone[0]["generated_text"] == out[1][0]["generated_text"]


def test_bpe_corpus_folder_has_hf_tokenizer(tmp_path):
    folder = prepare_corpus(
        "stdlib", tmp_path / "c", tokenizer="bpe", vocab_size=300, max_bytes=30_000, val_fraction=0.1
    )
    tok = load_tokenizer(folder)
    save_hf_tokenizer(tok, tmp_path / "m")
    from transformers import AutoTokenizer

    text = "for i in range(3):"
    assert AutoTokenizer.from_pretrained(tmp_path / "m")(text)["input_ids"] == tok.encode(text)

"""Is the corpus big enough for a preset's token budget? ``fpa reproduce`` asks before anything else.

A run trains on ``steps x batch_size x train_len`` tokens, a ``mix_rate`` share of the sequences
being task samples, the rest corpus text. "Big enough" means one pass: the corpus's training
split (``1 - VAL_FRACTION`` of it) holds at least the text tokens of one run, so no training
window is repeated within a run. Sizes are judged before any preparation, from bytes: a local
source's file sizes (or the standard library's, for "stdlib"), capped by ``--max-bytes``, at
``BYTES_PER_TOKEN`` of the preset's tokenizer. A Hugging Face source (``hf:NAME``) is streamed, so
its size is unknown here: only a ``--max-bytes`` cap below the need is refused.
"""

from __future__ import annotations

from fpa.experiments.lm.presets import ReproducePreset

VAL_FRACTION = 0.05  # fpa.data.prepare.prepare_corpus's default, which reproduce uses
# Bytes per token. bpe: an estimate for English prose and web text with a 32k BPE (about 4 to 4.5);
# the larger figure, so that the check errs toward asking for more text.
BYTES_PER_TOKEN = {"byte": 1.0, "bpe": 4.5}
SUGGESTED = "hf:HuggingFaceFW/fineweb-edu:sample-100BT"


def text_tokens_per_run(p: ReproducePreset) -> int:
    """Corpus tokens one training run of ``p`` reads: steps x batch_size x train_len x (1 - mix_rate)."""
    return round(p.steps * p.batch_size * p.train_len * (1 - p.mix_rate))


def bytes_needed(p: ReproducePreset) -> int:
    """Corpus bytes whose training split holds ``text_tokens_per_run(p)`` tokens (see the module docstring)."""
    return round(text_tokens_per_run(p) * BYTES_PER_TOKEN[p.tokenizer] / (1 - VAL_FRACTION))


def source_bytes(source: str) -> int | None:
    """Bytes of text in ``source`` (a file, folder, glob or "stdlib"), None for "hf:" (streamed).

    Raises:
        ValueError: ``source`` names nothing (from fpa.data.sources.resolve_files).
    """
    from fpa.data import sources

    if source.startswith("hf:"):
        return None
    files = sources.stdlib_files() if source == "stdlib" else sources.resolve_files(source)
    return sum(f.stat().st_size for f in files)


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def check_corpus_budget(p: ReproducePreset, data_source: str | None, max_bytes: int | None) -> None:
    """Refuse a corpus too small for one pass of ``p``'s training (``data_source``: the
    ``--data-source`` given, None for the preset's own; ``max_bytes``: ``--max-bytes``).

    Raises:
        ValueError: naming ``--data-source`` (and ``--max-bytes`` where that cap is the cause),
            the tokens one run reads and the bytes of text that needs.
    """
    source = data_source or p.data_source
    cap = max_bytes if data_source else p.corpus_max_bytes
    need = bytes_needed(p)
    tokens = text_tokens_per_run(p)
    budget = (
        f"preset {p.name!r} reads {tokens:,} corpus tokens per training run ({p.steps:,} steps x {p.batch_size} "
        f"sequences x {p.train_len:,} tokens, {p.mix_rate:.0%} of them task samples), so its corpus needs at "
        f"least {_gb(need)} of text ({need:,} bytes at {BYTES_PER_TOKEN[p.tokenizer]} bytes per "
        f"{p.tokenizer} token, {VAL_FRACTION:.0%} held out)"
    )
    if cap is not None and cap < need:
        flag = "--max-bytes" if data_source else f"the preset's corpus_max_bytes ({cap:,})"
        raise ValueError(f"{flag} caps the corpus at {_gb(cap)}, too little: {budget}; raise or drop it")
    try:
        have = source_bytes(source)
    except ValueError as e:
        raise ValueError(f"--data-source {source!r}: {e}") from None
    if have is not None and min(have, cap or have) < need:
        where = f"--data-source {source!r}" if data_source else f"the preset's corpus {source!r} (no --data-source)"
        raise ValueError(
            f"{where} holds {_gb(min(have, cap or have))} of text, too little: {budget}. Pass --data-source "
            f"with a corpus that large, e.g. --data-source {SUGGESTED} (docs/reproduce.md)"
        )

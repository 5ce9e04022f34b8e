"""``fpa reproduce``: the language-model reproduction (train every method on every seed, evaluate, report).

One module per job: ``cli`` (the command), ``presets`` and ``methods`` (what is trained, every
budget), ``corpus_budget`` (is the corpus big enough), ``reproduce`` (the stages in order, the 1x
control gate), ``train_eval`` (the bodies of the stages: one training run, one evaluation of one
trained model), ``tuning`` (the tuning preset's selection), ``diagnosis`` (why a walk model misses
at 8x), ``aggregate`` and ``analysis`` (stage outputs -> results.json, paired statistics),
``report`` and ``plots`` (results.json -> report.md and the figures).
"""

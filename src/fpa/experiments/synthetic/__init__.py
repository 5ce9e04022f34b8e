"""``fpa synth``: the synthetic study of one-layer heads on the nested-structure tasks.

``cli`` (the command), ``capacity`` (the training recipe and the capacity grid: packed one-head
models, ``fpa.models.packed``, per task, method, d and m), ``report`` (results.json.gz, tables and
figures), ``walk_variants`` (why FPA walk heads missed the bar: parametrisation variants, each
factor on its own; ``python -m fpa.experiments.synthetic.walk_variants``). The task generators
live in ``fpa.tasks``.
"""

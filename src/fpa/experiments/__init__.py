"""The experiment harness: everything that runs experiments rather than being a library feature.

One subpackage per pipeline, and the infrastructure they share at this level:

- ``lm``: ``fpa reproduce``, the language-model reproduction (presets, training and evaluation
  stages, tuning, the paired analysis, the report).
- ``synthetic``: ``fpa synth``, one-layer heads on the nested-structure tasks (the task
  generators live in ``fpa.tasks``, the packed heads in ``fpa.models.packed``).
- ``agent``: agent-like sessions and traces decoded with the evicting cache.
- ``stages`` (resumable stages: atomic JSON outputs and a state file), ``pool`` (run stages in
  worker processes), ``provenance`` (the commit and command behind a result): shared by the
  pipelines.
"""

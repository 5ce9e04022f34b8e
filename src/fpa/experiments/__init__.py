"""The experiment harness: everything that runs experiments rather than being a library feature.

- ``reproduce``, ``presets``, ``stages``, ``pool``, ``aggregate``, ``analysis``, ``report``,
  ``plots``: ``fpa reproduce`` (train every method on every seed, evaluate, report) and its
  tuning stage.
- ``capacity``, ``diagnostic``, ``synth_cli``, ``synth_report``: ``fpa synth``, the synthetic
  nested-structure experiments (the task generators live in ``fpa.tasks``).
- ``agent_trace``: the paged-cache agent-trace benchmark's model and trace.
"""

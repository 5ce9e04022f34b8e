"""Agent-like sessions: memory bounded by nesting depth. ``fpa agent`` (``pipeline``, ``preset``,
``workers``, ``decode``, ``analysis``, ``report``, ``cli``): language models trained on short agent
sessions, long sessions decoded with the evicting cache; ``trace``: a one-head FPA walk decoding a
long call trace."""

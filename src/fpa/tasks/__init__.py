"""Synthetic tasks: nested-structure tasks (stack retrieval, scope lookup, ...) and the passkey task.

``TASK_MIXERS`` names the task-sample generators the trainer can mix into language-model
training (``fpa train --mix-task NAME --mix-rate R``). Each entry is "module:function" (imported
lazily); the function is ``f(rng: numpy.random.Generator, seq_len: int, tokenizer) -> numpy
int64 array of seq_len + 1 token ids`` (inputs are [:-1], next-token targets [1:]).
"""

TASK_MIXERS = {
    "passkey": "fpa.tasks.passkey:passkey_training_sample",
    "copy": "fpa.tasks.copy:copy_training_sample",
    "passkey+copy": "fpa.tasks.copy:passkey_or_copy_sample",
    "agent-sessions": "fpa.tasks.agent_sessions:session_training_sample",
    "agent-sessions+copy": "fpa.tasks.agent_sessions:session_or_copy_sample",
}

# Task probes: "module:function" with f(model, tokenizer, seq_len, device=...) -> float, a loss on
# fixed task samples that the trainer logs as ``task_loss`` at every evaluation.
TASK_PROBES = {
    "passkey": "fpa.tasks.passkey:answer_loss",
    "passkey+copy": "fpa.tasks.passkey:answer_loss",
    "agent-sessions": "fpa.tasks.agent_sessions:answer_loss",
    "agent-sessions+copy": "fpa.tasks.agent_sessions:answer_loss",
}


def get_probe(name: str):
    """The task probe registered as ``name`` in TASK_PROBES, or None."""
    import importlib

    if name not in TASK_PROBES:
        return None
    module, func = TASK_PROBES[name].split(":")
    return getattr(importlib.import_module(module), func)


def get_mixer(name: str):
    """The task-sample generator registered as ``name`` in TASK_MIXERS."""
    import importlib

    if name not in TASK_MIXERS:
        raise ValueError(f"mix task must be one of {tuple(TASK_MIXERS)}, got {name!r}")
    module, func = TASK_MIXERS[name].split(":")
    return getattr(importlib.import_module(module), func)

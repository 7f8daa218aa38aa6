"""Adapters that train with TPO inside other RL libraries.

- :mod:`targetpo.integrations.trl` — ``TargetPOConfig`` / ``TargetPOTrainer`` for Hugging Face TRL 1.16.0
  (``pip install targetpo[trl]``). Not to be confused with TRL's own ``trl.experimental.tpo``, which is
  Triple Preference Optimization, a different method.
- :mod:`targetpo.integrations.verl_plugin` — a ``tpo`` policy loss and advantage estimator for verl 0.9.1,
  registered through the ``verl.plugins`` entry point (``pip install targetpo[verl]``).
- :mod:`targetpo.objectives.groups` — library-free checks that a batch layout keeps whole groups.

Nothing here is imported by ``import targetpo``: each adapter imports its library only when it is imported.
"""

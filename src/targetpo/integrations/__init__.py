"""Adapters that train with TPO inside other RL libraries.

- :mod:`targetpo.integrations.trl` — ``TargetPOConfig`` / ``TargetPOTrainer`` for Hugging Face TRL 1.16.0
  (``pip install targetpo[trl]``). Not to be confused with TRL's own ``trl.experimental.tpo``, which is
  Triple Preference Optimization, a different method.
- :mod:`targetpo.integrations.verl_plugin` — a ``tpo`` policy loss and advantage estimator for verl 0.9.1,
  registered through the ``verl.plugins`` entry point (``pip install targetpo[verl]``).
- :mod:`targetpo.integrations.verl_trainer` — verl's current trainer with groups kept whole
  (``trainer.v1.trainer_mode=tpo_sync``), the ``tpo`` config section and the launcher
  ``python -m targetpo.integrations.verl_trainer``.
- :mod:`targetpo.integrations.verl_rewards` — the App. G tasks as verl rows and their reward function.
- :mod:`targetpo.objectives.groups` — library-free checks that a batch layout keeps whole groups.

Nothing here is imported by ``import targetpo``: each adapter imports its library only when it is imported.
"""

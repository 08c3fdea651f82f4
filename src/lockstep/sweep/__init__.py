"""``lockstep sweep``: hyperparameter searches on Optuna, every trial an ordinary ``lockstep train`` run.

``spec`` reads and checks the sweep's YAML file against the config tree; ``objective`` turns a run's
metrics.csv rows into the number the search optimizes; ``runner`` holds the Optuna study, starts each
trial's runs as processes, reports their learning curves as they train and stops the hopeless ones;
``report`` writes what a sweep leaves (the trials table, best.yaml, the plots). Optuna is an extra
(``pip install -e '.[sweep]'``): only ``runner`` and ``report`` import it, when a sweep runs.
"""

"""The run layer: from a config to a finished run folder. Each module holds one job and imports
only the modules listed before it (``tests/test_architecture.py`` enforces it):

``spec`` (RunConfig) → ``checks`` (every config check, once per run) → ``names``/``configfile``
(TOML ↔ RunConfig) → ``weights`` (init_from) → ``folder`` (every file a run writes or reads) →
``build`` (data, model, algorithm, engine) → ``callbacks`` → ``loop`` (``train``) → ``recipes``
(run_experiment, resume_experiment, two stages). This package's ``__init__`` imports nothing,
so that ``fedxrisk.run.spec`` stays free of torch.
"""

"""The small-problem LM: two drivers of one set of rules (``marquardt.solver._rules``).

``single.py`` runs one fit on the host in float64 NumPy (``curve_fit``'s small path for
``"trf"`` and ``"dogbox"``); ``lm.py`` runs SciPy's ``"lm"`` there as MINPACK's ``lmder``,
its trust region, damped step and tests in ``trust.py``; ``batched.py`` runs M fits at once in torch with per-fit state (``curve_fit_batch``; its
one iteration is ``_iterate``). A new driver goes here; a new or changed rule (damping,
scaling, stopping, robust rows) goes in ``_rules``, never in a driver.
"""

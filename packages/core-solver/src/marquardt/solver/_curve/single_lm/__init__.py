"""The single-fit driver: one fit on the host in float64 NumPy, by the rules of ``marquardt.solver._rules``.

``driver.py`` runs ``curve_fit``'s small path for ``"trf"`` and ``"dogbox"``; ``minpack.py``
runs SciPy's ``"lm"`` as MINPACK's ``lmder``, its trust region, damped step and tests in
``trust.py``. A new or changed rule (damping, scaling, stopping, robust rows) goes in
``_rules``, never in a driver.
"""

"""The batched driver: M fits at once in torch with per-fit state (``curve_fit_batch``).

``driver.py`` holds the state and the loop (its one iteration is ``_iterate``),
``normal.py`` the normal equations formed without keeping J, ``estimators.py`` the costs
other than least squares; ``traced.py`` and ``unrolled.py`` are the forms of the iteration
that ``_curve.compiled_lm`` traces and compiles. Its rules are ``_rules``'s.
"""

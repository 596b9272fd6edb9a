"""The batched driver: M fits at once in torch with per-fit state (``curve_fit_batch``).

``state.py`` holds the fits' state and data, ``driver.py`` the loop, ``phases.py`` one
iteration in phases (the attempt, the model's evaluation, the decision) and the start
state, ``normal.py`` the normal equations formed without keeping J, ``estimators.py`` the
costs other than least squares; ``traced.py`` and ``unrolled.py`` are the forms of the
phases that ``_curve.compiled_lm`` traces and compiles. Its rules are ``_rules``'s.
"""

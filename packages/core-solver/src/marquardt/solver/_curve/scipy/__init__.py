"""``curve_fit``: SciPy's signature, meanings, errors and returns (``curve_fit.py``).

SciPy's arguments are checked and translated here, once, and nowhere below: a new
keyword is a line in ``args.py`` (its check) and ``curve_fit.py`` (its translation). The
providers of residuals and J (``providers.py``) serve the single-fit driver of
``_curve.small``, which ``small_path.py`` runs; ``covariance.py`` is pcov as SciPy computes it; ``engine.py`` hands a
large torch fit to ``_curve.large`` and puts its result back in SciPy's forms.
"""

"""The SciPy edge of ``curve_fit`` (the function itself is ``_curve/curve_fit.py``).

SciPy's arguments are checked (``args.py``) and translated here, once, into the
``FitOptions`` of ``options.py``, which the small path, the sliced engine and
``curve_fit_batch`` all read: a new keyword is a line in ``options.py``. The
providers of residuals and J (``providers.py``) serve the single-fit driver of
``_curve.single_lm``, to which ``to_single.py`` hands a fit; ``covariance.py`` is pcov as
SciPy computes it; ``to_large.py`` hands a large torch fit to the large-N engine
``_curve.large`` and puts its result back in SciPy's forms.
"""

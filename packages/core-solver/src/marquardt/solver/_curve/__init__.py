"""Curve fitting, laid out by entry point over one small-problem LM.

* ``curve_fit.py``: ``curve_fit``, which sends each fit to its path: the host path
  (``scipy/small_path.py``), the sliced engine (``scipy/engine.py``) or the compiled core
  of the batched fits as a batch of one (``compiled_path.py``).
* ``scipy/``: SciPy's face of ``curve_fit``: its arguments translated once into the
  ``FitOptions`` every path reads (a new SciPy keyword is a line in ``scipy/options.py``,
  its check in ``scipy/args.py``), the providers of J,
  SciPy's covariance, and the hand-over of large fits to the sliced engine.
* ``batch/``: ``curve_fit_batch``, M independent fits: its arguments, the vectorised model,
  the chunks of fits and the per-fit covariance.
* ``small/``: the drivers of the small-problem LM: one fit on the host (``small/single.py``;
  SciPy's ``"lm"`` by MINPACK's trust region, ``small/lm.py`` with ``small/trust.py``) and
  M fits at once in torch (``small/batched.py``); a new driver goes here. Their rules (λ, the scaling, the fit tests, the robust rows, the
  covariance's cut and scale) are ``marquardt.solver._rules``, where a new rule goes.
* ``large/``: ``curve_fit_result``, the sliced engine for fits of many points or on a GPU:
  `LMA` on the model with bounds by a change of variables and an active set.
* ``threads.py``: the torch thread count that the CPU paths share.
* ``bounds_rule.py``: when bounds can be used, for the three entry points alike.
"""

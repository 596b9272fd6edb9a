"""Curve fitting, laid out by what each part does, over one small-problem LM.

* ``curve_fit.py``: ``curve_fit``, which sends each fit to its path: the single-fit driver
  (``scipy/to_single.py``), the large-N engine (``scipy/to_large.py``) or the compiled core
  of the batched fits as a batch of one (``batch_of_one.py``); ``gpufit_keywords.py``: its
  keywords beyond SciPy's (``fixed``, ``estimator``).
* ``scipy/``: the SciPy edge of ``curve_fit``: its arguments translated once into the
  ``FitOptions`` every path reads (a new SciPy keyword is a line in ``scipy/options.py``,
  its check in ``scipy/args.py``), the providers of J, SciPy's covariance, and the
  hand-over of a fit to the single-fit driver or the large-N engine.
* ``batch/``: ``curve_fit_batch``, M independent fits: its arguments, the vectorised model,
  the chunks of fits and the per-fit covariance.
* ``single_lm/``: the single-fit driver, one fit on the host in float64 NumPy
  (``single_lm/driver.py``; SciPy's ``"lm"`` by MINPACK's trust region,
  ``single_lm/minpack.py`` with ``single_lm/trust.py``).
* ``batched_lm/``: the batched driver, M fits at once in torch (``batched_lm/driver.py``),
  its state, its iteration's phases, its normal equations, its estimators and the forms
  of its phases that are traced.
* ``compiled_lm.py``: the batched driver's iteration compiled into fused kernels (the
  model's, and those of no model, one per parameter count), held in the process and kept
  on disk by the kernel cache; ``compile_policy.py``: when a call compiles.
* ``kernel_cache/``: the kernel cache: the compiled kernels on disk (``artifacts``), their
  keys (``kernel_key``, ``fingerprint``), the kernels a process holds (``held``), and their
  builds (``build_lock``, ``background``, ``progress``).
* ``large/``: ``curve_fit_result``, the large-N engine for fits of many points or on a GPU:
  `LMA` on the model with bounds by a change of variables and an active set.
* ``threads.py``: the torch thread count that the CPU paths share.
* ``bounds_rule.py``: when bounds can be used, for the three entry points alike.

The drivers' rules (λ, the scaling, the fit tests, the robust rows, the covariance's cut
and scale) are ``marquardt.solver._rules``, where a new rule goes; a new driver gets a
folder of its own.
"""

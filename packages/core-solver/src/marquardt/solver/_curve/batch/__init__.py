"""``curve_fit_batch``: M independent fits of one model in one call (``curve_fit_batch.py``).

Its arguments are checked and turned into tensors in ``args.py`` (a new keyword goes
there), the model written for one fit is vectorised in ``model.py``, and the fits run in
chunks through the batched driver ``_curve.batched_lm.driver``; the per-fit covariance and the
warnings are ``curve_fit_batch.py``'s.
"""

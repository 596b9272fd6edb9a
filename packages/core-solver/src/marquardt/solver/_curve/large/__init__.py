"""``curve_fit_result``: the sliced engine for large fits, on the CPU or a GPU (``fit.py``).

The data are checked in ``inputs.py``; f becomes a module for `LMA` (``model.py``) with
the bounds kept by MINUIT's change of variables (``bounds.py``) and an active set
(``active_set.py``); passes over the data at p̂ (``point.py``) give J's factor, the
Gauss-Newton polish and the covariance.
"""

"""The kernel cache: the batched driver's compiled kernels, on disk and in the process.

``artifacts.py`` keeps and loads the compiled packages in the cache folder,
``kernel_key.py`` and ``fingerprint.py`` say what a kernel is keyed by, ``held.py`` what a
process holds, ``build_lock.py``, ``background.py`` and ``progress.py`` how a kernel is
built (one builder at a time, in the background or inline with its progress shown).
``_curve.compiled_lm`` asks it for the kernels it runs.
"""

"""Test helpers shared by the suites of the marquardt packages; also a pytest plugin.

Each helper lives in its own module (``interrupts``, ``processes``, ``models``, ``curves``,
``problems``, ``lma``, ``nist``, ``docstrings``, ``threads``) and is imported from there; this package
imports nothing itself, so that pytest loading the plugin (``marquardt.testing.plugin``)
stays cheap. ``problems`` holds the problems the benchmarks share with the tests.
"""

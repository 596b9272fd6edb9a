"""Curve fitting: ``curve_fit``'s inputs, the model wrapper, bounds, the active set and the
passes at the solution."""

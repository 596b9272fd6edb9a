"""The Levenberg-Marquardt algorithm: the step, its damping, scaling and stopping rules, the
assembly of the normal equations, LM across processes, parameter subsets and covariance."""

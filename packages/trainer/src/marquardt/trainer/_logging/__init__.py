"""What a run reports: the ``Logger`` protocol, its CSV, TensorBoard and MLflow loggers, the console."""

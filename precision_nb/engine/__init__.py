"""Engine: workloads, the training loop, metrics, checkpoints and comparisons. No UI imports."""

"""freshroll.observe: observers that send a run's figures elsewhere (exporters, Prometheus,
TensorBoard, W&B) and the progress line's pace."""

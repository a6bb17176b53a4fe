"""Architecture latency: `model` measures an architecture's forward and training-step time
on a device and learns to predict it from the spec (`LatencyPredictor`); `cli` is
`ranknas latency ...`."""

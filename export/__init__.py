"""ONNX export of the runner graphs, TensorRT engine builds, quantization."""

"""Policies leaving JAX: export to ONNX (`export`, `onnx_graph`) and run with ONNX Runtime (`policy`).

`load_policy` needs numpy and onnxruntime only; importing it does not import JAX.
"""

from qrl.deploy.policy import OnnxPolicy, load_policy

__all__ = ["OnnxPolicy", "load_policy"]

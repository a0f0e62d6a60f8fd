#!/usr/bin/env python3
"""Writes not_a_voice.onnx: a valid ONNX model (y = Identity(x)) that is not a Piper voice, for
the test that loading one fails clearly. Needs the `onnx` package."""
from pathlib import Path

import onnx
from onnx import TensorProto, helper

graph = helper.make_graph(
    [helper.make_node("Identity", ["x"], ["y"])],
    "not_a_voice",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "n"])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "n"])],
)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="llmr-tests")
model.ir_version = 8
onnx.checker.check_model(model)
onnx.save(model, Path(__file__).with_name("not_a_voice.onnx"))

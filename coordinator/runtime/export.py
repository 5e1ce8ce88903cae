"""Export a torch model to ONNX and check onnxruntime computes what torch computes.

The legacy TorchScript exporter (``dynamo=False``) is used: it needs no extra
packages and handles every layer of the spec zoo. The batch dimension is dynamic.
After the run the round loop writes what the method asks for (`export_networks` of its
`Strategy.onnx_export`: every width of FLANC, HeteroFL and FedPara with ``--option export=DIR``).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from edge_sdk.models.spec import count_params
from edge_sdk.data.preprocessing import ONNX_METADATA_KEY, Preprocessing

if TYPE_CHECKING:
    from coordinator.strategies.base import OnnxExport

__all__ = ["export_onnx", "export_networks", "onnx_max_abs_diff", "INPUT_NAME", "OUTPUT_NAME", "Normalised"]

INPUT_NAME = "input"
OUTPUT_NAME = "logits"


def _inputs(inputs: np.ndarray | torch.Tensor) -> np.ndarray:
    array = inputs.detach().cpu().numpy() if isinstance(inputs, torch.Tensor) else inputs
    if not isinstance(array, np.ndarray) or array.ndim < 2 or len(array) == 0 or array.dtype.kind not in "fiu":
        raise ValueError("inputs must be a non-empty numeric batch (N, ...)")
    array = np.ascontiguousarray(array, dtype=np.float32)
    if not np.isfinite(array).all():
        raise ValueError("inputs contain NaN or Inf")
    return array


def onnx_max_abs_diff(model: nn.Module, path: str | Path, inputs: np.ndarray | torch.Tensor) -> float:
    """Largest absolute difference between onnxruntime's and torch's (eval mode) outputs."""
    import onnxruntime

    x = _inputs(inputs)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ort_out = session.run(None, {session.get_inputs()[0].name: x})[0]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            torch_out = model(torch.from_numpy(x)).cpu().numpy()
    finally:
        model.train(was_training)
    if ort_out.shape != torch_out.shape:
        raise ValueError(f"onnxruntime output shape {ort_out.shape} != torch's {torch_out.shape}")
    return float(np.max(np.abs(ort_out.astype(np.float64) - torch_out.astype(np.float64))))


class Normalised(nn.Module):
    """``model`` after the job's per-channel normalisation: the exported graph takes raw inputs
    (with ``preprocessing.resample``, series of any length: each is first resampled to the model's
    length, linearly over its whole span, as `edge_sdk.data.sensor_datasets.resample` does; with
    ``preprocessing.repeat``, repeated end to end and cut, as `repeat_to` does)."""

    def __init__(self, model: nn.Module, preprocessing: Preprocessing) -> None:
        super().__init__()
        self.model = model
        self.length = preprocessing.input_shape[-1] if preprocessing.any_length else None
        self.repeat = preprocessing.repeat
        shape = (1, preprocessing.channels) + (1,) * (len(preprocessing.input_shape) - 1 if preprocessing.input_shape
                                                       else 2)
        self.register_buffer("mean", torch.tensor(preprocessing.mean, dtype=torch.float32).reshape(shape))
        self.register_buffer("std", torch.tensor(preprocessing.std, dtype=torch.float32).reshape(shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.length is not None and self.repeat:  # position i takes value i mod the series' length
            x = x.index_select(2, torch.arange(self.length, device=x.device) % x.shape[2])
        elif self.length is not None:
            x = nn.functional.interpolate(x, size=self.length, mode="linear", align_corners=True)
        return self.model((x - self.mean) / self.std)


def export_onnx(model: nn.Module, path: str | Path, inputs: np.ndarray | torch.Tensor,
                opset: int = 17, preprocessing: Preprocessing | None = None) -> float:
    """Write ``model`` (in eval mode) to ``path`` as ONNX; returns the max abs difference of
    onnxruntime's outputs from torch's on ``inputs`` (exported with one sample, checked on
    the whole batch, so the dynamic batch axis is exercised).

    With ``preprocessing`` the graph starts with its normalisation, so it takes *raw* inputs, and
    carries it (mean, std, class names, input shape) as metadata (`ONNX_METADATA_KEY`, JSON);
    ``inputs`` are still given normalised (as the model trained on them) and checked raw. With
    ``preprocessing.resample`` or ``repeat`` the series axis is dynamic too (any length is resampled,
    or repeated and cut)."""
    if preprocessing is not None:
        x = _inputs(inputs)
        raw = x * np.asarray(preprocessing.std, np.float32).reshape((1, -1) + (1,) * (x.ndim - 2)) \
            + np.asarray(preprocessing.mean, np.float32).reshape((1, -1) + (1,) * (x.ndim - 2))
        wrapped = Normalised(model, preprocessing).train(model.training)  # a new module is in training mode:
        # `_export` restores the mode it found, which must be the model's own
        diff = _export(wrapped, Path(path), raw, opset, dynamic_length=preprocessing.any_length)
        _add_metadata(Path(path), {ONNX_METADATA_KEY: preprocessing.to_json()})
        return diff
    return _export(model, Path(path), _inputs(inputs), opset)


def _export(model: nn.Module, path: Path, x: np.ndarray, opset: int, dynamic_length: bool = False) -> float:
    """`export_onnx` of ``model`` on the batch ``x`` (the batch axis dynamic; with
    ``dynamic_length``, the series axis too)."""
    axes = {0: "batch", 2: "length"} if dynamic_length else {0: "batch"}
    path.parent.mkdir(parents=True, exist_ok=True)
    was_training = model.training
    model.eval()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the legacy exporter's deprecation notice
            torch.onnx.export(model, (torch.from_numpy(x[:1]),), str(path), dynamo=False,
                              input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
                              dynamic_axes={INPUT_NAME: axes, OUTPUT_NAME: {0: "batch"}},
                              opset_version=opset)
    finally:
        model.train(was_training)
    return onnx_max_abs_diff(model, path, x)


def _add_metadata(path: Path, props: dict[str, str]) -> None:
    """Add key/value strings to an ONNX file's ``metadata_props`` (read back by onnxruntime's
    ``get_modelmeta().custom_metadata_map``)."""
    import onnx

    proto = onnx.load(str(path))
    for key, value in props.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save(proto, str(path))


def export_networks(export: OnnxExport, inputs: np.ndarray) -> dict[str, dict[str, Any]]:
    """Write each of a method's networks (`Strategy.onnx_export`) to ``export.out_dir`` as ONNX.

    Returns (and writes to ``export.json`` there), per label: the path, the dense parameter count,
    the largest difference between the trained and the dense network in torch
    (``precompose_max_abs_diff``) and between onnxruntime and torch (``max_abs_diff``), on ``inputs``.
    """
    x = torch.from_numpy(np.ascontiguousarray(inputs, dtype=np.float32))
    out: dict[str, dict[str, Any]] = {}
    for network in export.networks:
        with torch.no_grad():
            gap = float((network.trained(x) - network.dense(x)).abs().max())
        path = Path(export.out_dir) / network.file_name
        out[network.label] = {"path": str(path), "params": count_params(network.dense),
                              "precompose_max_abs_diff": gap, "max_abs_diff": export_onnx(network.dense, path, inputs)}
    (Path(export.out_dir) / "export.json").write_text(json.dumps(out, indent=1))
    return out

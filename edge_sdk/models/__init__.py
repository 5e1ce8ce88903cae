"""Architectures as data (:mod:`.spec`, :mod:`.layers`) and the model zoo (:mod:`.zoo`)."""
from edge_sdk.models.spec import (LAYER_TYPES, SpecError, SpecModel, build_model, count_flops,
                                  count_params, infer_shapes, layer_stats, register_layer,
                                  validate_spec)
from edge_sdk.models import lowrank  # noqa: F401  (registers the lowrank_linear layer type)
from edge_sdk.models import flanc  # noqa: F401  (registers the flanc_conv2d/flanc_linear layer types)
from edge_sdk.models import heterofl  # noqa: F401  (registers the scaler layer type)
from edge_sdk.models import fedpara, lowrank_naive  # noqa: F401  (fedpara_*, lowrank_naive_* layer types)
from edge_sdk.models.zoo import MODEL_FAMILIES, cnn4, flanc_cnn, mlp, model_for_dataset, resnet_small

__all__ = ["LAYER_TYPES", "SpecError", "SpecModel", "build_model", "count_flops", "count_params",
           "infer_shapes", "layer_stats", "register_layer", "validate_spec", "MODEL_FAMILIES",
           "cnn4", "flanc_cnn", "mlp", "model_for_dataset", "resnet_small"]

"""The `brew` helpers Caffe2's RNN cells use, with brew's argument merging.

`brew.<helper>(model, ...)` started from a copy of `model.arg_scope` (order, use_cudnn,
cudnn_exhaustive_search), kept only the helper's own parameters when it took no `**kwargs`, then
applied the caller's keywords. Whatever the helper did not consume became op arguments, in that order:
this is where the `order`/`use_cudnn`/`cudnn_exhaustive_search` arguments of FC, Sum, Concat, ...
and their argument order in Caffe2 RNN nets come from.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Sequence
from typing import Any

from ...errors import Rnn2JaxError
from .core import BlobReference
from .helpers.arg_scope import arg_scope, get_current_scope
from .model_helper import BIAS, COMPUTED_PARAM, WEIGHT, ModelHelper


def _merged(model: ModelHelper, kwargs: dict[str, Any], helper: str) -> dict[str, Any]:
    """The model's arg scope, then `brew.arg_scope([brew.<helper>], ...)` defaults, then the caller's keywords."""
    merged = dict(model.arg_scope)
    merged.update(get_current_scope().get(helper, {}))
    merged.update(kwargs)
    return merged


def fc(
    model: ModelHelper,
    blob_in: str,
    blob_out: str,
    dim_in: int,
    dim_out: int,
    weight_init: tuple[str, dict] | None = None,
    bias_init: tuple[str, dict] | None = None,
    **kwargs: Any,
) -> BlobReference:
    """`brew.fc`: XavierFill `[dim_out, dim_in]` weight `<out>_w`, ConstantFill `[dim_out]` bias `<out>_b`.
    `WeightInitializer`/`BiasInitializer` (modeling.initializers classes) are built from the fills."""
    kwargs = _merged(model, kwargs, "fc")
    weight_class, bias_class = kwargs.pop("WeightInitializer", None), kwargs.pop("BiasInitializer", None)
    if weight_class is not None or bias_class is not None:
        from .modeling import initializers

        if model.init_params:
            weight_init = initializers.update_initializer(weight_class, weight_init, ("XavierFill", {}))
            bias_init = initializers.update_initializer(bias_class, bias_init, ("ConstantFill", {}))
        else:
            weight_init = bias_init = initializers.ExternalInitializer()
    if kwargs.pop("enable_tensor_core", False):
        kwargs["engine"] = "TENSORCORE"
    if kwargs.pop("float16_compute", False):
        kwargs["float16_compute"] = True
    blob_out = blob_out or model.net.NextName()  # char_rnn passes None: `<net>_blob_<k>`, as in Caffe2
    bias_tags = [BIAS, COMPUTED_PARAM] if "freeze_bias" in kwargs else [BIAS]
    weight_initializer: Any = weight_init or ("XavierFill", {})
    bias_initializer: Any = bias_init or ("ConstantFill", {})
    weight_class, bias_class = kwargs.pop("WeightInitializer", None), kwargs.pop("BiasInitializer", None)
    if weight_class is not None or bias_class is not None:  # modeling.initializers classes, as helpers/fc.py
        from .modeling import initializers

        weight_initializer = initializers.update_initializer(weight_class, weight_init, ("XavierFill", {}))
        bias_initializer = initializers.update_initializer(bias_class, bias_init, ("ConstantFill", {}))
        if not model.init_params:
            weight_initializer = bias_initializer = initializers.ExternalInitializer()
    weight = model.create_param(blob_out + "_w", [dim_out, dim_in], weight_initializer, [WEIGHT])
    bias = model.create_param(blob_out + "_b", [dim_out], bias_initializer, bias_tags)
    return model.net.FC([blob_in, weight, bias], blob_out, **kwargs)


def sum(model: ModelHelper, blob_in: Sequence[str], blob_out: str, **kwargs: Any) -> BlobReference:
    return model.net.Sum(list(blob_in), blob_out, **_merged(model, kwargs, "sum"))


def concat(model: ModelHelper, blobs_in: Sequence[str], blob_out: str, **kwargs: Any) -> BlobReference:
    """`brew.concat`: outputs `(out, "_" + out + "_concat_dims")`; drops `order` when `axis` is given."""
    kwargs = _merged(model, kwargs, "concat")
    if kwargs.get("order") and kwargs.get("axis"):
        kwargs.pop("order")
    return model.net.Concat(list(blobs_in), [blob_out, "_" + blob_out + "_concat_dims"], **kwargs)[0]


def _cudnn_engine(kwargs: dict[str, Any]) -> dict[str, Any]:
    if kwargs.pop("use_cudnn", False):
        kwargs["engine"] = "CUDNN"
    return kwargs


def transpose(model: ModelHelper, blob_in: str, blob_out: str, **kwargs: Any) -> BlobReference:
    return model.net.Transpose(blob_in, blob_out, **_cudnn_engine(_merged(model, kwargs, "transpose")))


def softmax(model: ModelHelper, blob_in: str, blob_out: str | None = None, **kwargs: Any) -> BlobReference:
    return model.net.Softmax(blob_in, blob_out, **_cudnn_engine(_merged(model, kwargs, "softmax")))


def batch_mat_mul(model: ModelHelper, blob_in: Sequence[str], blob_out: str, **kwargs: Any) -> BlobReference:
    kwargs = _merged(model, kwargs, "batch_mat_mul")
    if kwargs.pop("enable_tensor_core", False):
        kwargs["engine"] = "TENSORCORE"
    return model.net.BatchMatMul(list(blob_in), blob_out, **kwargs)


def layer_norm(
    model: ModelHelper,
    blob_in: str,
    blob_out: str,
    dim_in: int,
    axis: int = 1,
    epsilon: float = 1e-4,
    initial_scale: float = 1.0,
    initial_bias: float = 0.0,
) -> tuple[BlobReference, BlobReference, BlobReference]:
    """`brew.layer_norm` (final Caffe2): params `<out>_scale` (ConstantFill initial_scale) and `<out>_bias`
    (ConstantFill initial_bias), then `LayerNorm([in, scale, bias]) -> (out, out_mean, out_std)` with
    `elementwise_affine=1`. (Older Caffe2 ran LayerNorm without affine, then a broadcast Mul and Add.)

    Takes no `**kwargs`, so the arg-scope arguments do not reach its ops. Returns (out, mean, std).
    """
    shape = [dim_in] if isinstance(dim_in, int) else list(dim_in)
    scale = model.create_param(f"{blob_out}_scale", shape, ("ConstantFill", {"value": initial_scale}), [WEIGHT])
    bias = model.create_param(f"{blob_out}_bias", shape, ("ConstantFill", {"value": initial_bias}), [BIAS])
    normalized, mean, std = model.net.LayerNorm(
        [blob_in, scale, bias],
        [blob_out, blob_out + "_mean", blob_out + "_std"],
        axis=axis,
        epsilon=epsilon,
        elementwise_affine=True,
    )
    return normalized, mean, std


def dropout(model: ModelHelper, blob_in: str, blob_out: str, **kwargs: Any) -> BlobReference:
    """`brew.dropout`: outputs `(out, "_" + out + "_mask")`, engine CUDNN or DEFAULT; needs `is_test`."""
    kwargs = _merged(model, kwargs, "dropout")
    kwargs["engine"] = "CUDNN" if kwargs.pop("use_cudnn", False) else "DEFAULT"
    if "is_test" not in kwargs:
        raise ValueError("Argument 'is_test' is required")
    return model.net.Dropout(blob_in, [blob_out, "_" + blob_out + "_mask"], **kwargs)[0]


# -- Caffe2 helpers implemented in rnn2jax.caffe2.python.helpers (plain, as Caffe2's), called here with
# brew's merging: arg_scope (only the helper's own parameters when it takes no **kwargs), then
# brew.arg_scope's defaults for it, then the caller's keywords. Resolved on first call, so the helper
# modules can import brew.


def _caffe2_helper(module: str, name: str) -> Callable[..., Any]:
    def helper(model: ModelHelper, *args: Any, **kwargs: Any) -> Any:
        function = getattr(importlib.import_module(f".helpers.{module}", __package__), name)
        parameters = inspect.signature(function).parameters
        merged = dict(model.arg_scope)
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
            merged = {k: v for k, v in merged.items() if k in parameters}
        merged.update(get_current_scope().get(name, {}))
        merged.update(kwargs)
        return function(model, *args, **merged)

    helper.__name__ = helper.__qualname__ = name
    return helper


relu = _caffe2_helper("nonlinearity", "relu")
tanh = _caffe2_helper("nonlinearity", "tanh")
prelu = _caffe2_helper("nonlinearity", "prelu")
reduce_sum = _caffe2_helper("algebra", "reduce_sum")
sub = _caffe2_helper("algebra", "sub")
mat_mul = _caffe2_helper("algebra", "mat_mul")
arg_min = _caffe2_helper("algebra", "arg_min")
depth_concat = _caffe2_helper("array_helpers", "depth_concat")
iter = _caffe2_helper("train", "iter")
accuracy = _caffe2_helper("train", "accuracy")
add_weight_decay = _caffe2_helper("train", "add_weight_decay")


# -- Caffe2's helper modules rnn2jax does not implement: their functions come from the Caffe2 source tree (its
# helpers/conv.py, pooling.py, ...: plain Python on top of this API), loaded when first called.


def _tree_helper(module: str, name: str) -> Callable[..., Any]:
    helper = _caffe2_helper(module, name)

    def from_tree(model: ModelHelper, *args: Any, **kwargs: Any) -> Any:
        try:
            importlib.import_module(f".helpers.{module}", __package__)
        except ModuleNotFoundError:
            raise Rnn2JaxError(
                f"brew.{name} is Caffe2's own helpers/{module}.py, which rnn2jax runs from a Caffe2 source tree: "
                "none is in use (rnn2jax.caffe2.install(source=DIR), or $RNN2JAX_CAFFE2_SOURCE)"
            ) from None
        return helper(model, *args, **kwargs)

    from_tree.__name__ = from_tree.__qualname__ = name
    return from_tree


_TREE_HELPERS = {
    "conv": ("conv_nd", "conv", "conv_transpose", "group_conv", "group_conv_deprecated"),
    "pooling": ("max_pool", "average_pool", "max_pool_with_index"),
    "elementwise_linear": ("elementwise_linear",),
    "control_ops": ("cond", "loop"),
    "db_input": ("db_input",),
    "tools": ("image_input", "video_input"),
    "quantization": ("fused_8bit_rowwise_quantized_to_float",),
    "normalization": ("lrn", "instance_norm", "spatial_bn", "spatial_gn", "moments_with_running_stats"),
}
globals().update({name: _tree_helper(module, name) for module, names in _TREE_HELPERS.items() for name in names})


# -- Caffe2's brew is a `HelperWrapper` whose registry holds every helper: `brew.Register(f)` adds a user's own,
# called as `brew.f(model, ...)` with the same arg-scope merging; a second helper of one name is refused.

_BUILTIN = (
    "fc", "sum", "concat", "transpose", "softmax", "batch_mat_mul", "layer_norm", "dropout", "relu", "tanh", "prelu",
    "reduce_sum", "sub", "mat_mul", "arg_min", "depth_concat", "iter", "accuracy", "add_weight_decay",
    *(name for names in _TREE_HELPERS.values() for name in names),
)  # fmt: skip
_registry: dict[str, Callable[..., Any]] = {"arg_scope": arg_scope, **{name: globals()[name] for name in _BUILTIN}}


def _registered(function: Callable[..., Any]) -> Callable[..., Any]:
    """A user's helper as brew calls it: the model's arg scope (only the helper's own parameters when it takes no
    `**kwargs`), then `brew.arg_scope`'s defaults for it, then the caller's keywords."""
    name = function.__name__

    def helper(*args: Any, **kwargs: Any) -> Any:
        model = args[0] if args and isinstance(args[0], ModelHelper) else kwargs.get("model")
        if model is None:
            raise RuntimeError(
                "The first input of helper function should be model. Or you can provide it in kwargs as "
                "model=<your_model>."
            )
        merged = dict(model.arg_scope)
        parameters = inspect.signature(function).parameters
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
            merged = {k: v for k, v in merged.items() if k in parameters}
        merged.update(get_current_scope().get(name, {}))
        merged.update(kwargs)
        return function(*args, **merged)

    helper.__name__ = helper.__qualname__ = name
    return helper


def Register(helper: Callable[..., Any]) -> None:
    """Caffe2's `brew.Register`: `brew.<helper.__name__>(model, ...)` calls `helper` from now on."""
    name = helper.__name__
    if name in _registry:
        raise AttributeError(f"Helper {name} already exists. Please change your helper name.")
    _registry[name] = _registered(helper)


def has_helper(helper_or_helper_name: str | Callable[..., Any]) -> bool:
    name = helper_or_helper_name if isinstance(helper_or_helper_name, str) else helper_or_helper_name.__name__
    return name in _registry


def __getattr__(name: str) -> Callable[..., Any]:
    if name in _registry:
        return _registry[name]
    raise AttributeError(f"Helper function {name} not registered.")

"""Caffe2's command-line flags (`core.GlobalInit`), as the torch 1.10.2 CPU wheel registers and parses them.

Parsing is c10's own (the wheel is built without gflags): argv[0] is skipped, `--name=value` or
`--name value`, anything not starting with `--` is ignored, an unknown flag or a bool that is not
0/1/true/false fails the call; ints and doubles are read as C's atoi/atof read them (never failing).

Each flag is one of:
* accepted: it tunes what rnn2jax has no counterpart of (threads, memory pools, executors, logging, CUDA,
  ONNXIFI, NNPACK, NUMA), so nothing rnn2jax computes or writes would differ;
* applied: rnn2jax does what it asks (floating-point exception checks, the tensor chunk size of Save);
* refused: set to anything but its default it would change results or files in a way rnn2jax does not
  implement; an `Rnn2JaxError` names the flag.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import BadArgumentError


@dataclass(frozen=True)
class Flag:
    """One flag: its C++ type ("bool", "int", "int64", "double", "string"), default, and what setting it
    does here: `apply(value)` (None: accepted as is), or `refused` (why a non-default value is refused)."""

    kind: str
    default: Any
    apply: Callable[[Any], None] | None = None
    refused: str = ""


_ACCEPTED_BOOL = ("bool", False)
_TUNING = {  # what only tunes machinery rnn2jax does not have: (type, default)
    "caffe2_gpu_memory_tracking": _ACCEPTED_BOOL,
    "caffe2_cub_max_bin": ("int", 10),
    "caffe2_cub_min_bin": ("int", 3),
    "caffe2_cub_bin_growth": ("int", 8),
    "caffe2_cuda_memory_pool": ("string", ""),
    "caffe2_cub_max_managed_mb": ("int", 10 * 1024),
    "caffe2_cub_print_allocation_events": _ACCEPTED_BOOL,
    "caffe2_gpu_memory_report_interval_mb": ("int", 128),
    "caffe2_streams_per_gpu": ("int", 1),
    "torch_jit_llvm_use_fast_intrinsics": _ACCEPTED_BOOL,
    "torch_jit_bailout_depth": ("int64", 20),
    "torch_jit_num_profiled_runs": ("int64", 1),
    "torch_jit_disable_warning_prints": _ACCEPTED_BOOL,
    "torch_jit_enable_new_executor": ("bool", True),
    "torch_jit_enable_rethrow_caught_exception": _ACCEPTED_BOOL,
    "torch_jit_disable_cat": _ACCEPTED_BOOL,
    "static_runtime_enable_fast_math": ("bool", True),
    "caffe2_profile_nnpack": _ACCEPTED_BOOL,
    "caffe2_profile_depthwise": _ACCEPTED_BOOL,
    "caffe2_force_shared_col_buffer": _ACCEPTED_BOOL,
    "onnxifi_blacklist": ("string", ""),
    "onnxifi_blacklist_ops": ("string", ""),
    "onnxifi_shape_hints": ("string", ""),
    "onnxifi_timeout_ms": ("int", 0),
    "onnxifi_min_ops": ("int", 1),
    "onnxifi_input_output_observe_list": ("string", ""),
    "onnxifi_debug_mode": _ACCEPTED_BOOL,
    "onnxifi_adjust_batch": ("bool", True),
    "use_onnxifi_batch_size": ("bool", True),
    "verify_only_single_subnet": _ACCEPTED_BOOL,
    "merge_fp32_inputs_into_fp16": _ACCEPTED_BOOL,
    "enforce_fp32_inputs_into_fp16": _ACCEPTED_BOOL,
    "caffe2_threadpool_ios_cap": ("int", 1),
    "caffe2_threadpool_macos_cap": ("int", 1),
    "caffe2_threadpool_android_cap": ("int", 1),
    "caffe2_threadpool_force_inline": _ACCEPTED_BOOL,
    "pthreadpool_size": ("int", 0),
    "caffe2_omp_num_threads": ("int", 0),
    "caffe2_mkl_num_threads": ("int", 0),
    "caffe2_net_async_profile_operators": _ACCEPTED_BOOL,
    "caffe2_net_async_tracing_nth": ("int", 100),
    "caffe2_net_async_tracing_dumping_nth": ("int", 10000),
    "caffe2_net_async_tracing_filepath": ("string", "/tmp"),
    "caffe2_net_async_names_to_trace": ("string", ""),
    "caffe2_net_async_thread_pool_size": ("int", 0),
    "caffe2_net_async_use_single_pool": _ACCEPTED_BOOL,
    "caffe2_net_async_use_per_net_pools": _ACCEPTED_BOOL,
    "caffe2_net_async_check_stream_status": _ACCEPTED_BOOL,
    "caffe2_net_async_max_gpus": ("int", 16),
    "caffe2_net_async_max_numa_nodes": ("int", 8),
    "caffe2_net_async_inference_mode": _ACCEPTED_BOOL,
    "caffe2_net_async_run_root_tasks_inline": _ACCEPTED_BOOL,
    "caffe2_task_graph_engine": ("string", "futures"),
    "caffe2_override_executor": ("string", ""),
    "caffe2_rnn_executor": ("bool", True),
    "caffe2_simple_net_benchmark_run_whole_net": ("bool", True),
    "caffe2_plan_executor_exception_timeout": ("int", 60),
    "caffe2_handle_executor_threads_exceptions": _ACCEPTED_BOOL,
    "caffe2_max_tensor_serializer_threads": ("int", 16),
    "caffe2_keep_on_shrink": ("bool", True),
    "caffe2_max_keep_on_shrink_memory": ("int64", 0x7FFFFFFFFFFFFFFF),
    # rnn2jax has no uninitialized memory: an output an op leaves unwritten holds zeros, filled or not
    "caffe2_cpu_allocator_do_zero_fill": _ACCEPTED_BOOL,
    "caffe2_cpu_allocator_do_junk_fill": _ACCEPTED_BOOL,
    "caffe2_cpu_numa_enabled": _ACCEPTED_BOOL,
    "caffe2_quit_on_unsupported_cpu_feature": _ACCEPTED_BOOL,
    "caffe2_disable_implicit_engine_preference": _ACCEPTED_BOOL,
    "caffe2_operator_max_engine_name_length": ("int", 10),
    "caffe2_workspace_stack_debug": _ACCEPTED_BOOL,
    "caffe2_print_stacktraces": _ACCEPTED_BOOL,
    "caffe2_version": _ACCEPTED_BOOL,
    "caffe2_report_cpu_memory_usage": _ACCEPTED_BOOL,
    "caffe2_print_blob_sizes_at_exit": _ACCEPTED_BOOL,
    "caffe2_log_level": ("int", 1),  # c10::GLOG_WARNING
    "minloglevel": ("int", 0),
    "v": ("int", 0),
    "logtostderr": _ACCEPTED_BOOL,
    "caffe2_dnnlowp_shared_int32_buffer": _ACCEPTED_BOOL,
    "caffe2_dnnlowp_force_slow_path": _ACCEPTED_BOOL,
    "caffe2_operator_throw_on_first_occurrence_if_fp_exceptions": _ACCEPTED_BOOL,
}
_NO_DNNLOWP = "rnn2jax has no DNNLOWP quantized ops, whose arithmetic this flag changes"
_REFUSED = {  # (type, default, why a non-default value is refused)
    "caffe2_serialize_fp16_as_bytes": ("bool", False, "rnn2jax serializes float16 tensors as Caffe2 does by default"),
    "caffe2_serialize_using_bytes_as_holder": (
        "bool",
        False,
        "rnn2jax serializes small integer and float16 tensors as Caffe2 does by default (int32_data)",
    ),
    "caffe2_use_fatal_for_enforce": ("bool", False, "rnn2jax raises errors; it never aborts the process"),
    "fake_fp16_conversion_use_fp16_acc": ("bool", False, "rnn2jax has no fake-fp16 ops"),
    "fake_fp16_conversion_use_nnpi": ("bool", False, "rnn2jax has no fake-fp16 ops"),
    "caffe2_dnnlowp_dump_tensors": ("bool", False, _NO_DNNLOWP),
    "caffe2_dnnlowp_enforce_default_operators": ("bool", False, _NO_DNNLOWP),
    "caffe2_dnnlowp_activation_p99_threshold": ("double", 0.99, _NO_DNNLOWP),
    "caffe2_dnnlowp_weight_p99_threshold": ("double", 0.99, _NO_DNNLOWP),
    "caffe2_dnnlowp_activation_quantization_kind": ("string", "min_max", _NO_DNNLOWP),
    "caffe2_dnnlowp_weight_quantization_kind": ("string", "min_max", _NO_DNNLOWP),
    "caffe2_dnnlowp_force_scale_power_of_two": ("bool", False, _NO_DNNLOWP),
    "caffe2_dnnlowp_eltwise_quantization_precision": ("int", 16, _NO_DNNLOWP),
    "caffe2_dnnlowp_requantization_multiplier_precision": ("int", 32, _NO_DNNLOWP),
    "caffe2_dnnlowp_weight_quantization_precision": ("int", 8, _NO_DNNLOWP),
    "caffe2_dnnlowp_activation_quantization_precision": ("int", 8, _NO_DNNLOWP),
    "caffe2_dnnlowp_preserve_weight_sparsity": ("bool", False, _NO_DNNLOWP),
    "caffe2_dnnlowp_preserve_activation_sparsity": ("bool", False, _NO_DNNLOWP),
    "caffe2_dnnlowp_acc16_k_threshold": ("int", 0, _NO_DNNLOWP),
    "caffe2_dnnlowp_acc16_m_threshold": ("int", 0, _NO_DNNLOWP),
    "caffe2_dnnlowp_acc16_n_threshold": ("int", 0, _NO_DNNLOWP),
    "caffe2_dnnlowp_acc16_density_threshold": ("double", 0.05, _NO_DNNLOWP),
    "caffe2_dnnlowp_copy_to_32bit_frequency": ("int", 32, _NO_DNNLOWP),
    "caffe2_dnnlowp_nbits_in_non_outlier": ("int", 8, _NO_DNNLOWP),
}


def _set_chunk_size(value: int) -> None:
    from ...storage import serialization

    serialization.DEFAULT_CHUNK_SIZE = value


def _set_fp_checks(_: bool) -> None:
    """JAX's own NaN/inf checks stand in for Caffe2's fetestexcept after each op (see `fp_exception_error`)."""
    import jax

    invalid = bool(VALUES["caffe2_operator_throw_if_fp_exceptions"])
    overflow = bool(VALUES["caffe2_operator_throw_if_fp_overflow_exceptions"])
    jax.config.update("jax_debug_nans", invalid)
    jax.config.update("jax_debug_infs", invalid or overflow)


FLAGS: dict[str, Flag] = {name: Flag(kind, default) for name, (kind, default) in _TUNING.items()}
FLAGS.update({name: Flag(kind, default, refused=why) for name, (kind, default, why) in _REFUSED.items()})
FLAGS["caffe2_tensor_chunk_size"] = Flag("int", 1_000_000, _set_chunk_size)
FLAGS["caffe2_operator_throw_if_fp_exceptions"] = Flag("bool", False, _set_fp_checks)
FLAGS["caffe2_operator_throw_if_fp_overflow_exceptions"] = Flag("bool", False, _set_fp_checks)
VALUES: dict[str, Any] = {name: flag.default for name, flag in FLAGS.items()}


def _atoi(text: str) -> int:
    """C's atoi/atoll: leading blanks, a sign and digits; 0 where there are none."""
    match = re.match(r"\s*([+-]?\d+)", text)
    return int(match.group(1)) if match else 0


def _atof(text: str) -> float:
    match = re.match(r"\s*([+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|inf(?:inity)?|nan))", text, re.I)
    return float(match.group(1)) if match else 0.0


def _parse_value(kind: str, text: str) -> Any:
    if kind == "bool":
        if text in ("false", "False", "FALSE", "0"):
            return False
        if text in ("true", "True", "TRUE", "1"):
            return True
        raise ValueError(
            f"C10 flag error: Cannot convert argument to bool: {text}. Note that if you are passing in a bool "
            "flag, you need to explicitly specify it, like --arg=True or --arg True."
        )
    if kind in ("int", "int64"):
        value = _atoi(text)
        return ((value + 2**31) % 2**32 - 2**31) if kind == "int" else value
    if kind == "double":
        return _atof(text)
    return text


def global_init(args: Sequence[str]) -> None:
    """Parse `args` (argv, its first item the program) as c10 does and set each flag in turn; the first
    bad one stops the call with an error (the flags before it stay set, as in Caffe2)."""
    args = [a.decode("utf-8") if isinstance(a, bytes) else str(a) for a in args]
    i = 1
    while i < len(args):
        arg = args[i]
        if "--help" in arg:
            print("Arguments: ")
            for name in sorted(FLAGS):
                print(f"    {name}: ({FLAGS[name].kind}, default {FLAGS[name].default!r})")
            raise SystemExit(0)
        if not arg.startswith("--"):
            i += 1
            continue
        if "=" in arg:
            key, value = arg[2:].split("=", 1)
        else:
            key = arg[2:]
            i += 1
            if i == len(args):
                _fail(f"C10 flag: reached the last commandline argument, but I am expecting a value for {arg}")
            value = args[i]
        flag = FLAGS.get(key)
        if flag is None:
            _fail(f"C10 flag: unrecognized commandline argument: {arg}")
        try:
            parsed = _parse_value(flag.kind, value)
        except ValueError as error:
            _fail(f"{error}\nC10 flag: illegal argument: {arg}")
        if flag.refused and parsed != flag.default:
            raise BadArgumentError(
                f"GlobalInit: flag --{key}={value} is not available on rnn2jax: {flag.refused} "
                f"(leave it at its default, {flag.default!r})"
            )
        VALUES[key] = parsed
        if flag.apply is not None:
            flag.apply(parsed)
        i += 1


def _fail(message: str) -> None:
    raise BadArgumentError(f"GlobalInit: {message} (Caffe2: Failed to run some init functions for caffe2.)")


def fp_exception_error(error: FloatingPointError) -> str | None:
    """The message of the Caffe2 error a NaN/inf check raised, when a floating-point exception flag is set
    (else None: the FloatingPointError is not one of ours)."""
    names = ("caffe2_operator_throw_if_fp_exceptions", "caffe2_operator_throw_if_fp_overflow_exceptions")
    set_flags = [name for name in names if VALUES[name]]
    if not set_flags:
        return None
    return (
        f"floating point exception reported ({error}) with --{set_flags[0]}: rnn2jax checks what each net "
        "writes for NaN and infinity (Caffe2 tests the CPU's exception flags after each op; an infinity from "
        "overflow, or a NaN or infinity passed through from an input, counts here too)"
    )

"""Caffe2's `workspace.FillRandomNetworkInputs` (its `emulator::TestDataRandomFiller`): random data, of the
shapes and types given per op, for every blob a net reads before any of its ops writes it.

Each op's inputs come from its schema's input fillers. The dense filler (every op's default) is Caffe2's
`TensorFiller`: floats uniform in [0, 1), integers uniform in {0, 1}, "bool" a uint8 in {0, 1, 2}.
Some ops have no fillers (Caffe2 refuses them); some have sparse fillers whose lengths and indices agree
with one another, which rnn2jax does not implement (an error naming the op). Both lists were asked of the
torch 1.10.2 wheel.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ...errors import BadArgumentError, UnsupportedOpError
from ..proto import caffe2_pb2

NO_INPUT_FILLERS = frozenset(
    [
        "BatchBucketOneHot",
        "BatchSparseToDense",
        "GatherRanges",
        "LengthsMean",
        "LengthsMeanGradient",
        "LengthsSum",
        "LengthsSumGradient",
        "LengthsToSegmentIds",
        "LengthsWeightedSum",
        "LengthsWeightedSumGradient",
        "OneHot",
        "ReduceFrontWeightedSum",
        "ReduceFrontWeightedSumGradient",
        "SegmentIdsToLengths",
        "SegmentIdsToRanges",
        "SegmentOneHot",
        "Slice",
        "SortedSegmentMean",
        "SortedSegmentMeanGradient",
        "SortedSegmentRangeLogMeanExp",
        "SortedSegmentRangeLogMeanExpGradient",
        "SortedSegmentRangeLogSumExp",
        "SortedSegmentRangeLogSumExpGradient",
        "SortedSegmentRangeMax",
        "SortedSegmentRangeMaxGradient",
        "SortedSegmentRangeMean",
        "SortedSegmentRangeMeanGradient",
        "SortedSegmentRangeSum",
        "SortedSegmentRangeSumGradient",
        "SortedSegmentSum",
        "SortedSegmentSumGradient",
        "SortedSegmentWeightedSum",
        "SortedSegmentWeightedSumGradient",
        "SparseLengthsMeanGradient",
        "SparseLengthsSumGradient",
        "SparseLengthsWeightedSumGradient",
        "SparseSortedSegmentMean",
        "SparseSortedSegmentMeanGradient",
        "SparseSortedSegmentSum",
        "SparseSortedSegmentSumGradient",
        "SparseSortedSegmentWeightedSum",
        "SparseSortedSegmentWeightedSumGradient",
        "SparseToDenseMask",
        "SparseToDenseMaskGradient",
        "SparseUnsortedSegmentMean",
        "SparseUnsortedSegmentMeanGradient",
        "SparseUnsortedSegmentSum",
        "SparseUnsortedSegmentSumGradient",
        "SparseUnsortedSegmentWeightedSum",
        "SparseUnsortedSegmentWeightedSumGradient",
        "UnsortedSegmentMean",
        "UnsortedSegmentMeanGradient",
        "UnsortedSegmentSum",
        "UnsortedSegmentSumGradient",
        "UnsortedSegmentWeightedSum",
        "UnsortedSegmentWeightedSumGradient",
    ]
)
SPARSE_INPUT_FILLERS = frozenset(
    [
        "BatchOneHot",
        "FloatToRowwiseQuantized8Bits",
        "Rowwise8BitQuantizedToFloat",
        "SparseLengthsMean",
        "SparseLengthsMean2BitRowwiseSparse",
        "SparseLengthsMean4BitRowwiseSparse",
        "SparseLengthsMean8BitRowwiseSparse",
        "SparseLengthsMean8BitsRowwise",
        "SparseLengthsMeanFused2BitRowwise",
        "SparseLengthsMeanFused4BitRowwise",
        "SparseLengthsMeanFused8BitRowwise",
        "SparseLengthsSum",
        "SparseLengthsSum2BitRowwiseSparse",
        "SparseLengthsSum4BitRowwiseSparse",
        "SparseLengthsSum8BitRowwiseSparse",
        "SparseLengthsSum8BitsRowwise",
        "SparseLengthsSumFused2BitRowwise",
        "SparseLengthsSumFused4BitRowwise",
        "SparseLengthsSumFused8BitRowwise",
        "SparseLengthsWeightedMean8BitsRowwise",
        "SparseLengthsWeightedSum",
        "SparseLengthsWeightedSum2BitRowwiseSparse",
        "SparseLengthsWeightedSum4BitRowwiseSparse",
        "SparseLengthsWeightedSum8BitRowwiseSparse",
        "SparseLengthsWeightedSum8BitsRowwise",
        "SparseLengthsWeightedSumFused2BitRowwise",
        "SparseLengthsWeightedSumFused4BitRowwise",
        "SparseLengthsWeightedSumFused8BitRowwise",
    ]
)
# type name -> (dtype, largest value) as Caffe2's fill_with_type reads the name
_TYPES = {
    "float": (np.float32, 1),
    "double": (np.float64, 1),
    "uint8_t": (np.uint8, 1),
    "unsigned char": (np.uint8, 1),
    "uint16_t": (np.uint16, 1),
    "int8_t": (np.int8, 1),
    "int16_t": (np.int16, 1),
    "int32_t": (np.int32, 1),
    "int": (np.int32, 1),
    "int64_t": (np.int64, 1),
    "long": (np.int64, 1),
    "bool": (np.uint8, 2),
}


def random_inputs(
    net: caffe2_pb2.NetDef,
    input_dims: Sequence[Sequence[Sequence[int]]],
    input_types: Sequence[Sequence[str]],
    has_schema: Callable[[str], bool],
) -> dict[str, np.ndarray]:
    """Blob name -> random array for the blobs `net` reads before writing: `input_dims[k]` and
    `input_types[k]` give the shapes and types of the k-th op that reads any such blob, in input order."""
    written = {name for op in net.op for name in op.output}
    readers = [op for op in net.op if any(name not in written for name in op.input)]
    for given, what in ((input_dims, "inputDims"), (input_types, "inputTypes")):
        if len(given) != len(readers):
            raise BadArgumentError(
                f"FillRandomNetworkInputs: {what}.size() == opWithRequiredInputs.size(). {len(given)} vs {len(readers)}"
            )
    chosen: dict[str, tuple[tuple[int, ...], str]] = {}
    for op, dims, types in zip(readers, input_dims, input_types, strict=True):
        required = [name for name in op.input if name not in written]
        for given, what in ((dims, "dimension"), (types, "type")):
            if len(given) != len(required):
                raise BadArgumentError(
                    f"FillRandomNetworkInputs: {op.name} has {len(op.input)} (required) inputs; while the input "
                    f"{what} size is {len(given)}"
                )
        if op.type in NO_INPUT_FILLERS or not has_schema(op.type):
            raise ValueError(f"{op.type} does not have input fillers")
        if op.type in SPARSE_INPUT_FILLERS:
            raise UnsupportedOpError(
                f"FillRandomNetworkInputs: {op.type}'s inputs come from Caffe2's sparse input fillers (lengths "
                "and indices that agree with its values), which rnn2jax does not implement: feed them",
                (("FillRandomNetworkInputs", op.type),),
            )
        for name, shape, type_name in zip(required, dims, types, strict=True):
            chosen[name] = (tuple(int(d) for d in shape), type_name)
    if not chosen:
        raise BadArgumentError("FillRandomNetworkInputs: inputs_.size() > 0. Empty input for run net")
    for _, type_name in chosen.values():
        if type_name not in _TYPES:
            raise ValueError(f"filler does not support type {type_name}")
    values = {}
    for name, (shape, type_name) in chosen.items():
        dtype, top = _TYPES[type_name]
        if np.issubdtype(dtype, np.floating):
            values[name] = np.random.uniform(0.0, 1.0, shape).astype(dtype)
        else:
            values[name] = np.random.randint(0, top + 1, shape).astype(dtype)
    return values

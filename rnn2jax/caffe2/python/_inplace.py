"""Caffe2's EnforceInplace schemas: which input each output of an op type must be the same blob as.

Caffe2's schema check (`OpSchema::Verify`, which memonger's `run_schema_check` runs on every op) refuses an op
whose input i and output o differ where its schema enforces them in place. The table was read from real
Caffe2 (torch 1.10.2): `C.OpSchema.get(t).inplace_enforced(i, o)` for every registered type and i, o < 8.
"""

from __future__ import annotations

# input i == output i, for every i (EnforceOneToOneInplace)
ONE_TO_ONE = frozenset(
    {
        "CollectTensor",
        "DataCouple",
        "Float16SparseNormalize",
        "Free",
        "NCCLBroadcast",
        "RowWiseCounter",
        "RowWiseSparseAdagrad",
        "RowWiseSparseAdagradFusedWithSparseLengthsMeanGradient",
        "RowWiseSparseAdagradFusedWithSparseLengthsMeanGradientApprox",
        "RowWiseSparseAdagradFusedWithSparseLengthsSumGradient",
        "RowWiseSparseAdagradFusedWithSparseLengthsSumGradientApprox",
        "SparseAdadelta",
        "SparseAdagrad",
        "SparseAdagradFusedWithSparseLengthsMeanGradient",
        "SparseAdagradFusedWithSparseLengthsMeanGradientApprox",
        "SparseAdagradFusedWithSparseLengthsSumGradient",
        "SparseAdagradFusedWithSparseLengthsSumGradientApprox",
        "SparseLpRegularizer",
        "SparseNormalize",
        "SparseStorm",
        "SparseWngrad",
        "TrimDataset",
    }
)
# input i + 1 == output i (the first input is a queue or a common world)
AFTER_FIRST = frozenset(
    {
        "Allreduce",
        "Broadcast",
        "EnqueueBlobs",
        "ReduceScatter",
        "SafeEnqueueBlobs",
    }
)
# (input, output) pairs
PAIRS: dict[str, tuple[tuple[int, int], ...]] = {
    "Append": ((0, 0),),
    "AtomicIter": ((1, 0),),
    "CopyRowsToTensor": ((0, 0),),
    "DestroyCommonWorld": ((0, 0),),
    "IndexFreeze": ((0, 0),),
    "IndexLoad": ((0, 0),),
    "Iter": ((0, 0),),
    "LastNWindowCollector": ((0, 0), (1, 1), (4, 2)),
    "ReceiveTensor": ((1, 0),),
    "ReservoirSampling": ((0, 0), (1, 1), (5, 2), (6, 3)),
    "RowWiseSparseAdagradFusedWithSparseLengthsWeightedSumGradient": ((0, 0), (1, 1)),
    "RowWiseSparseAdagradFusedWithSparseLengthsWeightedSumGradientApprox": ((0, 0), (1, 1)),
    "RowWiseSparseAdam": ((0, 0), (1, 1), (2, 2)),
    "ScatterAssign": ((0, 0),),
    "ScatterWeightedSum": ((0, 0),),
    "SmartDecaySparseAdam": ((0, 0), (1, 1), (2, 2), (3, 3)),
    "SparseAdagradFusedWithSparseLengthsWeightedSumGradient": ((0, 0), (1, 1)),
    "SparseAdagradFusedWithSparseLengthsWeightedSumGradientApprox": ((0, 0), (1, 1)),
    "SparseAdam": ((0, 0), (1, 1), (2, 2)),
    "SparseFtrl": ((0, 0), (1, 1)),
    "SparseMomentumSGDUpdate": ((1, 1), (3, 2)),
    "SpatialBN": ((3, 1), (4, 2)),
    "rnn_internal_accumulate_gradient_input": ((2, 0),),
    "rnn_internal_apply_link": ((1, 1),),
}


def inplace_enforced(op_type: str, i: int, o: int) -> bool:
    """Whether Caffe2's schema of `op_type` wants input `i` and output `o` to be one blob."""
    if op_type in ONE_TO_ONE:
        return i == o
    if op_type in AFTER_FIRST:
        return i == o + 1
    return (i, o) in PAIRS.get(op_type, ())


def inplace_violation(op_type: str, inputs: list[str], outputs: list[str]) -> str | None:
    """Caffe2's message for the first enforced pair whose blobs differ, else None."""
    for i, name_in in enumerate(inputs):
        for o, name_out in enumerate(outputs):
            if name_in != name_out and inplace_enforced(op_type, i, o):
                return (
                    f"Input index {i} ({name_in}) and output idx {o} ({name_out}) are not in-place but should be "
                    f"as required by op {op_type}"
                )
    return None

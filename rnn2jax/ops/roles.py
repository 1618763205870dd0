"""What a net uses a blob as, told by the ops that read it: sequence lengths (int32 in [0, T]) and other
integer blobs (indices, compared values). `verify`, `compare` and shape inference draw or declare such
blobs as integers instead of floats; one list of readers keeps the three in agreement."""

from __future__ import annotations

from ..ir.netdef import Net

# op type -> which of its inputs are sequence lengths
_LENGTH_INPUTS = {
    "SequenceMask": slice(1, 2),
    "PackRNNSequence": slice(1, 2),
    "UnpackRNNSequence": slice(1, 2),
    "AddPadding": slice(1, 2),
    "RemovePadding": slice(1, 2),
}
_COMPARED = ("GT", "GE", "LT", "LE")  # a value compared with a timestep or a length (step nets' masks)
_INDEXED = ("Gather", "SparseLengthsSum", "SparseLengthsMean", "LengthsSum")  # inputs after the data


def length_blobs(net: Net) -> set[str]:
    """Blobs the net (step nets included) reads as sequence lengths."""
    names = set()
    for op in net.walk():
        if op.type in ("LSTMUnit", "GRUUnit") and op.bool("sequence_lengths", True) and len(op.inputs) >= 4:
            names.add(op.inputs[-2])
        elif op.type in _LENGTH_INPUTS:
            names.update(op.inputs[_LENGTH_INPUTS[op.type]])
    return names


def integer_blobs(net: Net) -> set[str]:
    """Blobs the net (step nets included) reads as integers: lengths, compared values and indices."""
    names = length_blobs(net)
    for op in net.walk():
        if op.type in _COMPARED:
            names.add(op.inputs[0])
        elif op.type in _INDEXED:
            names.update(op.inputs[1:])
    return names

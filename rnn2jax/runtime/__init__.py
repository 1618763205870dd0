"""The runtime: what runs Caffe2 models the way Caffe2 did, around compiled nets.

`storage/` reads and writes Caffe2 databases (minidb, lmdb, leveldb, rocksdb) and serialized blobs;
`workspace.py` holds blobs by name and runs nets (jitted segments of pure ops, host ops between them);
`plan.py` runs a PlanDef's execution steps.
"""

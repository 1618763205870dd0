"""Caffe2 databases and serialized blobs.

`blobs.py` is the API (read_blobs, write_blobs, describe_blobs); `serialization.py` turns arrays into
Caffe2's BlobProto records and back; `db.py` chooses a backend by db_type (`minidb.py`, `lmdb_db.py`,
`leveldb_db.py`, `rocksdb_db.py`) and makes writes atomic. Nothing here imports the compiler.
"""

from .blobs import describe_blobs, read_blobs, write_blobs
from .db import DB_TYPES
from .serialization import BlobInfo

__all__ = ["DB_TYPES", "BlobInfo", "describe_blobs", "read_blobs", "write_blobs"]

"""Pickle-free wire protocol of edgefl: frames (msgpack header + raw data), tensors, chunking, topics.

See docs/protocol.md for the normative description.
"""

from .chunking import CHUNK_OVERHEAD, DEFAULT_CHUNK_SIZE, MIN_CHUNK_SIZE, Reassembler, split_envelope_payload
from .codec import (
    MAX_HEADER_BYTES,
    Blob,
    CodecLimits,
    DataRegion,
    check_finite,
    decode_frame,
    encode_frame,
    pack_tensor,
    pack_tensors,
    packb,
    unpack_tensor,
    unpack_tensors,
    unpackb,
)
from .errors import ERROR_CODES, ErrorCode, ProtocolError
from .messages import (
    MESSAGE_TYPES,
    SCHEMA_VERSION,
    Ack,
    Chunk,
    Envelope,
    Error,
    Evaluate,
    Evaluation,
    DataCount,
    FleetStats,
    StatsRequest,
    Message,
    Model,
    Plan,
    ProfileUpdate,
    Register,
    RoundStart,
    Status,
    Stop,
    Update,
    decode_envelope,
    encode_envelope,
    peek_header,
)
from .topics import Topics, is_valid_id, validate_id

__all__ = [
    "ProtocolError", "ERROR_CODES", "ErrorCode",
    "CodecLimits", "pack_tensor", "unpack_tensor", "pack_tensors", "unpack_tensors", "check_finite",
    "packb", "unpackb", "MAX_HEADER_BYTES", "Blob", "DataRegion", "encode_frame", "decode_frame",
    "SCHEMA_VERSION", "Message", "Register", "Plan", "RoundStart", "Update", "Ack", "Error", "Status",
    "Stop", "Chunk", "Model", "ProfileUpdate", "Evaluate", "Evaluation", "DataCount", "FleetStats", "StatsRequest",
    "MESSAGE_TYPES", "Envelope",
    "encode_envelope", "decode_envelope",
    "peek_header",
    "DEFAULT_CHUNK_SIZE", "MIN_CHUNK_SIZE", "CHUNK_OVERHEAD", "split_envelope_payload", "Reassembler",
    "Topics", "is_valid_id", "validate_id",
]

"""Tensor message codec: round trips, read-only zero-copy decode, and validation of what a peer sends."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from lockstep.envs import SpaceSpec
from lockstep.transport import lockstep_pb2 as pb
from lockstep.transport.codec import CodecError, decode, encode
from lockstep.transport.messages import step_from_proto, step_to_proto

DTYPES = ["float32", "float64", "uint8", "int64", "bool"]
SHAPES = [(), (0, 4), (3,), (2, 3, 4)]


def _sample(dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    size = int(np.prod(shape))
    values = np.arange(size) * 7 % 11 - 3  # a mix of negatives, zeros and positives
    if dtype == "bool":
        return (values > 0).reshape(shape)
    if dtype == "uint8":
        return (values % 256).astype(np.uint8).reshape(shape)
    if dtype.startswith("float"):
        return (values * 0.37).astype(dtype).reshape(shape)
    return (values * 1_000_000_007).astype(dtype).reshape(shape)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_preserves_dtype_shape_and_values(dtype, shape):
    array = _sample(dtype, shape)
    message = encode(array)
    assert message.dtype == dtype
    assert tuple(message.shape) == shape
    decoded = decode(message, "x", dtype=dtype, shape=shape)
    assert decoded.dtype == np.dtype(dtype)
    assert decoded.shape == shape
    np.testing.assert_array_equal(decoded, array)


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_through_serialized_bytes(dtype):
    """What crosses the wire is the serialized message, not the Python object."""
    array = _sample(dtype, (2, 3))
    wire = encode(array).SerializeToString()
    decoded = decode(pb.Tensor.FromString(wire), "x", dtype=dtype, shape=(2, 3))
    np.testing.assert_array_equal(decoded, array)


def test_encoded_data_is_little_endian_c_order_bytes():
    array = np.array([[1, 2, 3], [4, 5, 6]], dtype=">i4").T  # big-endian and Fortran-ordered
    message = encode(array)
    assert message.dtype == "int32"
    assert list(message.shape) == [3, 2]
    assert message.data == np.array([[1, 4], [2, 5], [3, 6]], dtype="<i4").tobytes()
    np.testing.assert_array_equal(decode(message, "x"), array)


def test_encoded_scalar_has_empty_shape_and_one_element():
    message = encode(np.float64(2.5))
    assert list(message.shape) == []
    assert message.data == np.array(2.5, "<f8").tobytes()
    decoded = decode(message, "x", shape=())
    assert decoded.shape == () and decoded[()] == 2.5


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_decoded_array_is_read_only(shape):
    decoded = decode(encode(_sample("float32", shape)), "x")
    assert not decoded.flags.writeable
    if decoded.size:
        with pytest.raises(ValueError):
            decoded.reshape(-1)[0] = 1.0


def test_decoded_array_does_not_change_when_the_source_array_does():
    array = np.arange(6, dtype=np.int64)
    message = encode(array)
    array[:] = -1
    np.testing.assert_array_equal(decode(message, "x"), np.arange(6))


@settings(max_examples=150, deadline=None)
@given(hnp.arrays(
    dtype=st.sampled_from([np.dtype(d) for d in DTYPES + ["int8", "uint16", "int32", "uint64", "float16"]]),
    shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5),
))
def test_round_trip_property(array):
    decoded = decode(encode(array), "prop", dtype=array.dtype, shape=array.shape)
    assert decoded.dtype == array.dtype
    assert decoded.shape == array.shape
    assert decoded.tobytes() == array.tobytes()  # bitwise, so NaN and -0.0 survive too
    assert not decoded.flags.writeable


@settings(max_examples=50, deadline=None)
@given(hnp.arrays(dtype=hnp.floating_dtypes(endianness=">", sizes=(32, 64)), shape=hnp.array_shapes(max_side=4)))
def test_round_trip_property_big_endian_input(array):
    decoded = decode(encode(array), "prop")
    assert decoded.dtype.name == array.dtype.name
    np.testing.assert_array_equal(decoded, array)


# --- validation -------------------------------------------------------------------------------


def test_wrong_dtype_names_field_and_both_dtypes():
    message = encode(np.zeros(3, np.float64))
    with pytest.raises(CodecError) as info:
        decode(message, "step.reward", dtype=np.float32)
    text = str(info.value)
    assert "step.reward" in text and "float64" in text and "float32" in text


def test_wrong_shape_names_field_and_both_shapes():
    message = encode(np.zeros((3, 5), np.float32))
    with pytest.raises(CodecError) as info:
        decode(message, "step.observation", shape=(3, 4))
    text = str(info.value)
    assert "step.observation" in text and "(3, 5)" in text and "(3, 4)" in text


def test_wrong_rank_is_a_shape_error():
    message = encode(np.zeros((3, 4), np.float32))
    with pytest.raises(CodecError, match="step.observation"):
        decode(message, "step.observation", shape=(None,))
    with pytest.raises(CodecError, match="step.observation"):
        decode(message, "step.observation", shape=(3, 4, 1))


@pytest.mark.parametrize("got", [(3, 4), (0, 4), (1, 4)])
def test_none_in_expected_shape_accepts_any_size(got):
    decoded = decode(encode(np.zeros(got, np.float32)), "obs", dtype="float32", shape=(None, 4))
    assert decoded.shape == got


def test_none_dims_still_check_the_other_dims():
    with pytest.raises(CodecError, match=r"\*"):  # the wildcard is shown in the message
        decode(encode(np.zeros((3, 5), np.float32)), "obs", shape=(None, 4))


@pytest.mark.parametrize("data_len", [0, 8, 11, 13, 16])
def test_data_length_mismatch_is_rejected(data_len):
    message = pb.Tensor(dtype="float32", shape=[3], data=b"\x00" * data_len)
    with pytest.raises(CodecError) as info:
        decode(message, "action.action")
    assert "action.action" in str(info.value) and "12" in str(info.value)


def test_data_for_zero_size_shape_must_be_empty():
    with pytest.raises(CodecError):
        decode(pb.Tensor(dtype="float32", shape=[0, 4], data=b"\x00" * 4), "x")


@pytest.mark.parametrize("dtype", ["object", "complex64", "complex128", "", "float", "<f4", "str", "void"])
def test_unknown_dtype_string_is_rejected(dtype):
    message = pb.Tensor(dtype=dtype, shape=[1], data=b"\x00" * 8)
    with pytest.raises(CodecError, match="field_name"):
        decode(message, "field_name")


@pytest.mark.parametrize("dtype", [np.complex64, np.object_, "U3"])
def test_encode_refuses_dtypes_that_cannot_cross_the_wire(dtype):
    with pytest.raises(CodecError):
        encode(np.zeros(2, dtype=dtype))


@pytest.mark.parametrize("shape", [[-1], [2, -3], [-4, 0]])
def test_negative_shape_is_rejected(shape):
    with pytest.raises(CodecError, match="bad.field"):
        decode(pb.Tensor(dtype="uint8", shape=shape, data=b""), "bad.field")


def test_too_many_dimensions_are_rejected():
    with pytest.raises(CodecError, match="x"):
        decode(pb.Tensor(dtype="uint8", shape=[1] * 9, data=b"\x00"), "x")


def test_codec_error_is_a_value_error():
    assert issubclass(CodecError, ValueError)


@pytest.mark.parametrize("shape", [[2**32, 2**32], [2**62, 4]])
def test_huge_shape_whose_element_count_overflows_is_a_codec_error(shape):
    with pytest.raises(CodecError, match="x"):
        decode(pb.Tensor(dtype="uint8", shape=shape, data=b""), "x")


# -- Step messages: final observations must name exactly the slots truncated without terminating ---------

OBS4 = SpaceSpec("box", (4,), "float32", low=np.full(4, -1.0, np.float32), high=np.full(4, 1.0, np.float32))


def _step_message(terminated, truncated, final_index) -> pb.Step:
    k, m = len(terminated), len(final_index)
    return step_to_proto(np.zeros((k, 4), np.float32), np.zeros(k, np.float32), np.array(terminated, bool),
                         np.array(truncated, bool), np.array(final_index, np.int64),
                         np.arange(m * 4, dtype=np.float32).reshape(m, 4), np.zeros(0), np.zeros(0, np.int64))


def test_final_index_naming_exactly_the_truncated_slots_is_accepted():
    # slot 0 terminated, slot 1 truncated, slot 2 both (a termination: no final observation), slot 3 ran on
    data = step_from_proto(_step_message([1, 0, 1, 0], [0, 1, 1, 0], [1]), 4, OBS4)
    assert data.final_index.tolist() == [1] and data.final_obs.shape == (1, 4)
    data = step_from_proto(_step_message([0, 0, 0, 0], [1, 0, 0, 1], [0, 3]), 4, OBS4)
    assert data.final_index.tolist() == [0, 3]
    assert step_from_proto(_step_message([0, 0, 0, 0], [0, 0, 0, 0], []), 4, OBS4).final_index.size == 0


@pytest.mark.parametrize("terminated, truncated, final_index, message", [
    ([0, 0, 0, 0], [0, 0, 0, 0], [2], "step.final_index: [2] names slot 2, which was not truncated"),
    ([0, 0, 1, 0], [0, 0, 1, 0], [2], "step.final_index: [2] names slot 2, which terminated"),
    ([0, 0, 0, 0], [0, 1, 0, 0], [], "step.final_index: slot 1 was truncated but has no final observation"),
    ([0, 0, 0, 0], [0, 1, 0, 1], [1], "step.final_index: slot 3 was truncated but has no final observation"),
    ([0, 0, 0, 0], [0, 1, 0, 0], [1, 1], "step.final_index: [1, 1] names slot 1 twice"),
    ([0, 0, 0, 0], [1, 1, 0, 0], [1, 0], "step.final_index: [1, 0] is not in ascending slot order"),
    ([0, 0, 0, 0], [0, 0, 0, 0], [4], "step.final_index: [4] are not env indices in [0, 4)"),
    ([0, 0, 0, 0], [0, 0, 0, 0], [-1], "step.final_index: [-1] are not env indices in [0, 4)"),
])
def test_final_index_that_disagrees_with_the_done_flags_is_refused_by_name(terminated, truncated, final_index,
                                                                           message):
    with pytest.raises(CodecError) as err:
        step_from_proto(_step_message(terminated, truncated, final_index), 4, OBS4)
    assert str(err.value).startswith(message), str(err.value)

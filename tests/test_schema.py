"""The artifact contract's one value codec (dpbert.schema): strict JSON, MLMD properties."""
import json
import math

import dp_accounting as dpa
import numpy as np
import pytest
from google.protobuf import struct_pb2
from ml_metadata.proto import metadata_store_pb2

from dpbert import schema
from dpbert.privacy import events


def test_round_trip_of_non_finite_numpy_and_dp_events():
    event = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.01, dpa.GaussianDpEvent(1.1)), 7)
    value = {"inf": math.inf, "ninf": -math.inf, "nan": math.nan, "f32": np.float32(0.5),
             "i64": np.int64(3), "b": np.bool_(True), "arr": np.arange(3), "t": (1, 2.5),
             "event": event, 4: "int key"}
    text = schema.dumps(value, sort_keys=True)
    assert "Infinity" not in text and "NaN" not in text
    assert json.loads(text)["inf"] == "inf"           # a strict parser reads it
    back = schema.loads(text)
    assert back["inf"] == math.inf and back["ninf"] == -math.inf and math.isnan(back["nan"])
    assert back["f32"] == 0.5 and back["i64"] == 3 and back["b"] is True and back["arr"] == [0, 1, 2]
    assert back["t"] == [1, 2.5] and back["4"] == "int key"
    assert events.dp_event_from_dict(back["event"]) == event
    assert type(schema.encode(np.float64(2.0))) in (float, np.float64)
    assert schema.encode(np.float32(math.inf)) == "inf"
    with pytest.raises(ValueError):     # only dp-accounting's event classes have a JSON form
        schema.encode(dpa.UnsupportedDpEvent())
    # events' JSON is this codec
    assert events.to_json(value, sort_keys=True) == text
    assert events.from_json(text).keys() == back.keys()


@pytest.mark.parametrize("value,expected", [
    (None, None),
    (True, ("int", 1)),
    (np.bool_(False), ("int", 0)),
    (7, ("int", 7)),
    (np.int32(7), ("int", 7)),
    (0.25, ("float", 0.25)),
    (np.float32(0.5), ("float", 0.5)),
    (math.inf, ("string", "inf")),
    (-math.inf, ("string", "-inf")),
    (math.nan, ("string", "nan")),
    ({"b": 1, "a": [math.inf]}, ("string", '{"a": ["inf"], "b": 1}')),
    ((1, 2), ("string", "[1, 2]")),
    (dpa.GaussianDpEvent(2.0), ("string", '{"noise_multiplier": 2.0, "type": "GaussianDpEvent"}')),
    ("text", ("string", "text")),
])
def test_property_value_kinds(value, expected):
    assert schema.property_value(value) == expected


def _value(**kwargs):
    v = metadata_store_pb2.Value()
    for key, item in kwargs.items():
        if key == "struct_value":
            v.struct_value.CopyFrom(item)
        else:
            setattr(v, key, item)
    return v


def _struct(data):
    s = struct_pb2.Struct()
    s.update(data)
    return s


def test_decode_property_on_each_value_kind():
    assert schema.decode_property(_value(int_value=3)) == 3
    assert schema.decode_property(_value(double_value=0.5)) == 0.5
    assert schema.decode_property(_value(bool_value=True)) is True
    assert schema.decode_property(_value(string_value="plain")) == "plain"
    assert schema.decode_property(_value(string_value="inf")) == math.inf
    assert schema.decode_property(_value(string_value="-inf")) == -math.inf
    assert math.isnan(schema.decode_property(_value(string_value="nan")))
    assert schema.decode_property(_value(string_value='{"a": ["inf", 1]}')) == {"a": [math.inf, 1]}
    assert schema.decode_property(_value(string_value="[not json")) == "[not json"
    assert schema.decode_property(metadata_store_pb2.Value()) is None
    # Kubeflow V2 / Vertex AI: TFX's JSON (struct) values; a non-dict is wrapped in "__value__"
    assert schema.decode_property(_value(struct_value=_struct({"a": "inf", "n": 2}))) == {"a": math.inf, "n": 2.0}
    assert schema.decode_property(_value(struct_value=_struct({"__value__": 1.5}))) == 1.5
    assert schema.decode_property(_value(struct_value=_struct({"__value__": "inf"}))) == math.inf
    assert schema.decode_property(_value(struct_value=_struct({"__value__": '[1, "nan"]'})))[0] == 1


def test_every_property_written_reads_back():
    values = {"i": 3, "f": 0.5, "inf": math.inf, "flag": True, "d": {"x": [1, -math.inf]}, "s": "text"}
    artifact = metadata_store_pb2.Artifact()
    setters = {"int": "int_value", "float": "double_value", "string": "string_value"}
    for key, value in values.items():
        kind, stored = schema.property_value(value)
        setattr(artifact.custom_properties[key], setters[kind], stored)
    assert schema.properties(artifact) == dict(values, flag=1)


def test_names():
    assert schema.type_name(schema.PRETRAINED_MODEL) == "components.PretrainedModel"
    assert schema.short_type_name("components.PretrainedModel") == schema.PRETRAINED_MODEL
    assert schema.short_type_name("other.Type") == "other.Type"
    assert schema.STEPS_TAKEN_TOTAL == "steps_taken_total" and schema.DP_EVENTS == "dp_events"
    assert schema.RUN_CONFIG_FILE == "run_config.json"
    assert schema.BOOLEAN_PROPERTIES == {"private", "non_private", "within_budget"}

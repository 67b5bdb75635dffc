"""The grammar oracle's schemas: every keyword the converter enforces, alone and combined."""

I = {"type": "integer"}
S = {"type": "string"}
N = {"type": "number"}
B = {"type": "boolean"}


def obj(props, required=(), **kw):
    return {"type": "object", "properties": props, "required": list(required), **kw}


SCHEMAS = [
    I, S, N, B, {"type": "null"}, {}, {"type": "object"}, {"type": "array"},
    {"type": "integer", "minimum": 0},
    {"type": "integer", "minimum": 7},
    {"type": "integer", "minimum": 25},
    {"type": "integer", "minimum": 1234},
    {"type": "integer", "minimum": -13},
    {"type": "integer", "maximum": 42},
    {"type": "integer", "maximum": -5},
    {"type": "integer", "maximum": -120},
    {"type": "integer", "minimum": 0, "maximum": 9},
    {"type": "integer", "minimum": 5, "maximum": 305},
    {"type": "integer", "minimum": -99, "maximum": 99},
    {"type": "integer", "minimum": -1000, "maximum": -17},
    {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 100},
    {"type": "integer", "minimum": 1.5, "maximum": 20.5},
    {"type": "string", "minLength": 1},
    {"type": "string", "maxLength": 3},
    {"type": "string", "minLength": 2, "maxLength": 5},
    {"type": "string", "format": "date"},
    {"type": "string", "format": "time"},
    {"type": "string", "format": "date-time"},
    {"type": "string", "format": "uuid"},
    {"type": "string", "pattern": "^[a-z]+$"},
    {"type": "string", "pattern": "^(abc|de)+x?$"},
    {"type": "string", "pattern": "^[0-9]{3}-[0-9]{2,4}$"},
    {"type": "string", "pattern": "^a.b$"},
    {"type": "string", "pattern": "^(?:[A-F]|x){1,3}$"},
    {"type": "string", "pattern": "^\\.\\*[^a-c]*$"},
    {"enum": ["red", "green", "blue"]},
    {"enum": [1, "one", None, True, 2.5]},
    {"const": "fixed"},
    {"const": {"a": [1, 2, {"b": None}]}},
    {"type": ["string", "integer"]},
    {"type": ["null", "number", "boolean"]},
    {"anyOf": [I, S]},
    {"oneOf": [{"type": "null"}, obj({"x": I}, ["x"])]},
    {"allOf": [obj({"a": I}), obj({"b": S})]},
    {"allOf": [{"enum": ["a", "b", "c"]}, {"enum": ["b", "c", "d"]}]},
    {"allOf": [obj({"a": I}), {"anyOf": [obj({"b": S}), obj({"c": B})]}]},
    {"type": "array", "items": I},
    {"type": "array", "items": S, "minItems": 1},
    {"type": "array", "items": B, "maxItems": 2},
    {"type": "array", "items": I, "minItems": 2, "maxItems": 4},
    {"type": "array", "prefixItems": [I, S, B]},
    {"type": "array", "items": [S, {"type": "null"}]},
    obj({"a": I}, ["a"]),
    obj({"a": I, "b": S}, ["a", "b"]),
    obj({"a": I, "b": S, "c": B}),
    obj({"a": I, "b": S, "c": B}, ["b"]),
    obj({"z": I, "y": S}, ["y"], additionalProperties=False),
    obj({"a": I}, ["a"], additionalProperties=True),
    obj({"a": I}, [], additionalProperties=S),
    {"type": "object", "additionalProperties": I},
    obj({"name": S, "tags": {"type": "array", "items": S}}, ["name"]),
    obj({"nested": obj({"x": N, "y": N}, ["x", "y"])}, ["nested"]),
    obj({"when": {"type": "string", "format": "date-time"}, "id": {"type": "string", "format": "uuid"}},
        ["when", "id"]),
    {"$defs": {"pos": {"type": "integer", "minimum": 1}}, "type": "array", "items": {"$ref": "#/$defs/pos"}},
    {"definitions": {"p": obj({"x": I}, ["x"])}, "anyOf": [{"$ref": "#/definitions/p"}, {"type": "null"}]},
    {"$defs": {"node": obj({"v": I, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, ["v"])},
     "$ref": "#/$defs/node"},
    obj({"k\u00e9y": S, "with space": I}, ["with space"]),
    obj({"status": {"enum": ["ok", "error"]}, "code": {"type": "integer", "minimum": 100, "maximum": 599}},
        ["status", "code"]),
    # The benchmark's shape: ten objects of eight fixed keys with enum and number values.
    {"type": "array", "minItems": 10, "maxItems": 10, "items": obj(
        {f"k{i}": ({"enum": ["alpha", "beta", "gamma"]} if i % 2 else N) for i in range(8)},
        [f"k{i}" for i in range(8)], additionalProperties=False)},
]

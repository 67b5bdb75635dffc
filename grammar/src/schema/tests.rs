//! The converter's languages on small schemas, judged by this crate's own matcher.

use serde_json::{json, Value};

use super::to_gbnf;
use crate::{Grammar, Matcher, TokenTrie};

fn accepts(schema: &Value, text: &str) -> bool {
    let g = to_gbnf(schema).unwrap();
    let g = Grammar::parse(&g, None).unwrap_or_else(|e| panic!("{e}\n{g}"));
    let mut m = Matcher::new(&g, std::sync::Arc::new(TokenTrie::new(0, |_| &[][..], &[])));
    m.accept_text(text) && m.accepts_end()
}

#[test]
fn objects_keep_property_order_and_optional_ones_follow() {
    let s = json!({"type": "object", "properties": {
        "b": {"type": "integer"}, "a": {"type": "string"}, "c": {"type": "boolean"}},
        "required": ["b"], "additionalProperties": false});
    assert!(accepts(&s, r#"{"b": 1}"#));
    assert!(accepts(&s, r#"{"b": 1, "a": "x", "c": true}"#));
    assert!(accepts(&s, r#"{"b": 1, "c": false}"#));
    assert!(!accepts(&s, r#"{"a": "x", "b": 1}"#));
    assert!(!accepts(&s, r#"{"b": 1, "c": true, "a": "x"}"#));
    assert!(!accepts(&s, r#"{"b": 1, "d": 2}"#));
}

#[test]
fn every_keyword_of_the_issue_converts() {
    let cases: Vec<(Value, &str, bool)> = vec![
        (json!({"enum": ["red", 1, null]}), r#""red""#, true),
        (json!({"enum": ["red", 1, null]}), "2", false),
        (json!({"const": {"k": [1, 2]}}), r#"{"k":[1,2]}"#, true),
        (
            json!({"anyOf": [{"type": "null"}, {"type": "number"}]}),
            "-1.5e3",
            true,
        ),
        (
            json!({"oneOf": [{"type": "null"}, {"type": "number"}]}),
            "true",
            false,
        ),
        (json!({"type": ["string", "null"]}), "null", true),
        (
            json!({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}},
                          {"type": "object", "properties": {"b": {"type": "integer"}}}]}),
            r#"{"a": 1, "b": 2}"#,
            true,
        ),
        (
            json!({"$defs": {"n": {"type": "integer", "minimum": 3}},
                "type": "array", "items": {"$ref": "#/$defs/n"}}),
            "[3, 40]",
            true,
        ),
        (
            json!({"$defs": {"n": {"type": "integer", "minimum": 3}},
                "type": "array", "items": {"$ref": "#/$defs/n"}}),
            "[2]",
            false,
        ),
        (
            json!({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}]}),
            r#"[1, "a"]"#,
            true,
        ),
        (
            json!({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3}),
            "[1]",
            false,
        ),
        (
            json!({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3}),
            "[1,2,3]",
            true,
        ),
        (
            json!({"type": "string", "minLength": 2, "maxLength": 3}),
            r#""abcd""#,
            false,
        ),
        (
            json!({"type": "string", "minLength": 2, "maxLength": 3}),
            r#""ab""#,
            true,
        ),
        (
            json!({"type": "string", "pattern": "^[a-c]+-\\d{2}$"}),
            r#""ab-12""#,
            true,
        ),
        (
            json!({"type": "string", "pattern": "^[a-c]+-\\d{2}$"}),
            r#""ab-1""#,
            false,
        ),
        (
            json!({"type": "string", "format": "date"}),
            r#""2024-02-29""#,
            true,
        ),
        (
            json!({"type": "string", "format": "time"}),
            r#""12:30:00Z""#,
            true,
        ),
        (
            json!({"type": "string", "format": "date-time"}),
            r#""2024-02-29T12:30:00+01:00""#,
            true,
        ),
        (
            json!({"type": "string", "format": "uuid"}),
            r#""123e4567-e89b-12d3-a456-426614174000""#,
            true,
        ),
        (
            json!({"type": "integer", "minimum": -5, "maximum": 120}),
            "-5",
            true,
        ),
        (
            json!({"type": "integer", "minimum": -5, "maximum": 120}),
            "121",
            false,
        ),
        (
            json!({"type": "integer", "exclusiveMinimum": 0}),
            "0",
            false,
        ),
        (
            json!({"type": "object", "additionalProperties": {"type": "integer"}}),
            r#"{"x": 1}"#,
            true,
        ),
    ];
    for (schema, text, want) in cases {
        assert_eq!(accepts(&schema, text), want, "{schema} on {text}");
    }
}

#[test]
fn integer_ranges_admit_exactly_their_integers() {
    for (lo, hi) in [(0, 0), (-7, 7), (3, 1234), (-1000, -17), (99, 100), (5, 5)] {
        let s = json!({"type": "integer", "minimum": lo, "maximum": hi});
        for n in lo - 30..=hi + 30 {
            assert_eq!(
                accepts(&s, &n.to_string()),
                (lo..=hi).contains(&n),
                "{n} in {lo}..{hi}"
            );
        }
    }
}

#[test]
fn what_cannot_be_enforced_is_named_with_its_path() {
    for (schema, path, keyword) in [
        (json!({"type": "number", "minimum": 1}), "#", "minimum"),
        (
            json!({"properties": {"a": {"type": "string", "format": "email"}}}),
            "#/properties/a",
            "format",
        ),
        (
            json!({"type": "array", "uniqueItems": true}),
            "#",
            "uniqueItems",
        ),
        (
            json!({"properties": {"a": {"$ref": "#/$defs/missing"}}}),
            "#/properties/a",
            "$ref",
        ),
        (
            json!({"type": "string", "pattern": "^(?=a)b$"}),
            "#",
            "pattern",
        ),
        (json!({"type": "string", "pattern": "abc"}), "#", "pattern"),
        (
            json!({"type": "object", "properties": {}, "required": ["x"]}),
            "#",
            "required",
        ),
        (
            json!({"type": "object", "minProperties": 1}),
            "#",
            "minProperties",
        ),
    ] {
        let e = to_gbnf(&schema).unwrap_err();
        assert_eq!(
            (e.path.as_str(), e.keyword.as_str()),
            (path, keyword),
            "{schema}: {e}"
        );
    }
}

#[test]
fn recursive_references_terminate() {
    let s = json!({"$defs": {"node": {"type": "object", "properties": {
        "v": {"type": "integer"}, "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}},
        "required": ["v", "next"]}}, "$ref": "#/$defs/node"});
    assert!(accepts(&s, r#"{"v": 1, "next": {"v": 2, "next": null}}"#));
}

//! The GBNF grammar of a reply made of tool calls, in each family's format: the exact text the
//! family's template writes for a call (`tool_parse.rs` reads it back), with each argument held
//! to its tool's schema. JSON arguments (Hermes, Solar) follow the whole parameters schema;
//! formats that write one parameter at a time (Qwen XML, GLM, DSML) follow each property's
//! schema, properties in their declared order with the optional ones optional, and a `string`
//! (or untyped) property's text may be anything that does not close it.

use std::collections::BTreeMap;

use bloomery_grammar::schema;
use serde_json::Value;

use super::error::ApiError;
use super::tool_parse::{DSML_OPEN, SOLAR_FRAME, SOLAR_OPEN};
use super::tools::ToolFormat;

/// One offered tool: its name and its parameters schema.
pub struct Tool<'a> {
    /// Function name.
    pub name: &'a str,
    /// The `parameters` schema (an object schema).
    pub params: Value,
}

/// The grammar (with its `root`) whose texts are one call of `tools`, or one or more of them
/// when `parallel`, as `format` writes them; with `think`, after an optional `<think>…</think>`
/// span (a model that opens its thinking itself).
pub fn calls_gbnf(
    format: ToolFormat,
    tools: &[Tool<'_>],
    parallel: bool,
    think: bool,
) -> Result<String, ApiError> {
    let mut rules = Rules::default();
    let mut calls = Vec::with_capacity(tools.len());
    for t in tools {
        calls.push(call(&mut rules, format, t)?);
    }
    let some = if parallel { "+" } else { "" };
    let root = match format {
        ToolFormat::HermesJson | ToolFormat::QwenXml if parallel => {
            "tool-calls ::= tool-call ( \"\\n\" tool-call )*\n".to_owned()
        }
        ToolFormat::GlmXml if parallel => {
            "tool-calls ::= tool-call ( \"\\n\"? tool-call )*\n".to_owned()
        }
        ToolFormat::HermesJson | ToolFormat::QwenXml | ToolFormat::GlmXml => {
            "tool-calls ::= tool-call\n".to_owned()
        }
        ToolFormat::DeepSeekDsml => format!(
            "tool-calls ::= {} tool-call{some} {}\n",
            lit(&format!("{DSML_OPEN}\n")),
            lit("</｜DSML｜tool_calls>")
        ),
        ToolFormat::Solar => format!(
            "tool-calls ::= {}? tool-call{some} {}?\nsolar-id ::= [a-z0-9]{{10}}\n",
            lit(SOLAR_FRAME[0]),
            lit(SOLAR_FRAME[1])
        ),
        ToolFormat::GenericJson => return Err(generic()),
    };
    let root = if think {
        let span = rules.until("</think>");
        format!("root ::= ( \"<think>\" {span} \"</think>\" [ \\n]* )? tool-calls\n{root}")
    } else {
        format!("root ::= tool-calls\n{root}")
    };
    let mut gbnf = format!("{root}tool-call ::= {}\n", calls.join(" | "));
    rules.write(&mut gbnf)?;
    Ok(gbnf)
}

/// A generic reply is one JSON object, whose grammar `tool_generic.rs` writes from a schema.
fn generic() -> ApiError {
    ApiError::internal("a generic tool reply's grammar comes from tool_generic, not tool_grammar")
}

/// One call of `t` as `format` writes it.
fn call(rules: &mut Rules, format: ToolFormat, t: &Tool<'_>) -> Result<String, ApiError> {
    Ok(match format {
        ToolFormat::GenericJson => return Err(generic()),
        ToolFormat::HermesJson => {
            let head = format!(
                "<tool_call>\n{{\"name\": {}, \"arguments\": ",
                Value::String(t.name.to_owned())
            );
            let args = rules.json(&t.params);
            format!("{} {args} {}", lit(&head), lit("}\n</tool_call>"))
        }
        ToolFormat::Solar => {
            let head = format!("<|tool_call:name|>{}<|tool_call:args|>", t.name);
            let args = rules.json(&t.params);
            let (open, end) = (lit(SOLAR_OPEN), lit("<|tool_call:end|>"));
            format!("{open} solar-id {} {args} {end}", lit(&head))
        }
        ToolFormat::QwenXml => {
            const END: &str = "\n</parameter>";
            let params = rules.params(&t.params, |rules, key, prop| {
                let mut value = rules.bare(prop, END)?;
                if prop.get("type").and_then(Value::as_str) == Some("boolean") {
                    // Jinja's `| string` writes Python's spelling.
                    value = format!("( {value} | \"True\" | \"False\" )");
                }
                let head = lit(&format!("<parameter={key}>\n"));
                Ok(format!("{head} {value} {}", lit(&format!("{END}\n"))))
            })?;
            let head = lit(&format!("<tool_call>\n<function={}>\n", t.name));
            format!("{head} {params} {}", lit("</function>\n</tool_call>"))
        }
        ToolFormat::GlmXml => {
            const END: &str = "</arg_value>";
            let params = rules.params(&t.params, |rules, key, prop| {
                let value = rules.bare(prop, END)?;
                let head = lit(&format!("<arg_key>{key}</arg_key><arg_value>"));
                Ok(format!("{head} {value} {}", lit(END)))
            })?;
            format!(
                "{} {params} {}",
                lit(&format!("<tool_call>{}", t.name)),
                lit("</tool_call>")
            )
        }
        ToolFormat::DeepSeekDsml => {
            const END: &str = "</｜DSML｜parameter>";
            let params = rules.params(&t.params, |rules, key, prop| {
                let head = |string: bool| {
                    lit(&format!(
                        "<｜DSML｜parameter name=\"{key}\" string=\"{string}\">"
                    ))
                };
                let value = match prop.get("type").and_then(Value::as_str) {
                    Some("string") => format!("{} {}", head(true), rules.raw_string(prop, END)?),
                    None => format!(
                        "( {} {} | {} {} )",
                        head(true),
                        rules.until(END),
                        head(false),
                        rules.json(prop)
                    ),
                    Some(_) => format!("{} {}", head(false), rules.json(prop)),
                };
                Ok(format!("{value} {}", lit(&format!("{END}\n"))))
            })?;
            // A call without arguments writes one empty line.
            let params = if params == lit("") { lit("\n") } else { params };
            let head = lit(&format!("<｜DSML｜invoke name=\"{}\">\n", t.name));
            format!("{head} {params} {}", lit("</｜DSML｜invoke>\n"))
        }
    })
}

/// The rules a call grammar refers to: JSON values by schema (named by placeholders until the
/// converter names them) and texts up to a closing tag.
#[derive(Default)]
struct Rules {
    schemas: Vec<Value>,
    untils: BTreeMap<String, String>,
}

impl Rules {
    /// A JSON value of `schema` (an empty schema: any value).
    fn json(&mut self, schema: &Value) -> String {
        self.schemas.push(schema.clone());
        format!("@json{}@", self.schemas.len() - 1)
    }

    /// A property's value written bare before `close`: text for a `string` or untyped
    /// property, else JSON of the property's schema.
    fn bare(&mut self, prop: &Value, close: &str) -> Result<String, ApiError> {
        match prop.get("type").and_then(Value::as_str) {
            None => Ok(self.until(close)),
            Some("string") => self.raw_string(prop, close),
            Some(_) => Ok(self.json(prop)),
        }
    }

    /// A `string` property written bare before `close`: one of its `enum`/`const` texts, or
    /// `minLength`..`maxLength` characters other than `close`'s first, or any text without
    /// `close`. Other string keywords (`pattern`, `format`) are refused, never dropped.
    fn raw_string(&mut self, prop: &Value, close: &str) -> Result<String, ApiError> {
        if let Some(k) = ["pattern", "format"]
            .iter()
            .find(|k| prop.get(**k).is_some())
        {
            return Err(ApiError::invalid(format!(
                "a string parameter's `{k}` cannot be enforced in this template's tool-call format (its strings are written bare)"
            )));
        }
        let texts: Option<Vec<&Value>> = match (prop.get("enum"), prop.get("const")) {
            (Some(Value::Array(e)), _) => Some(e.iter().collect()),
            (_, Some(c)) => Some(vec![c]),
            _ => None,
        };
        if let Some(texts) = texts {
            let alts: Option<Vec<String>> = texts.iter().map(|t| t.as_str().map(lit)).collect();
            return alts
                .filter(|a| !a.is_empty())
                .map(|a| format!("( {} )", a.join(" | ")))
                .ok_or_else(|| {
                    ApiError::invalid("a string parameter's `enum` must list strings".to_owned())
                });
        }
        let (min, max) = (
            prop.get("minLength").and_then(Value::as_u64),
            prop.get("maxLength").and_then(Value::as_u64),
        );
        Ok(match (min, max) {
            (None, None) => self.until(close),
            (min, max) => {
                let first = close.chars().next().map_or(String::new(), class_char);
                let max = max.map_or(String::new(), |m| m.to_string());
                format!("[^{first}]{{{},{max}}}", min.unwrap_or(0))
            }
        })
    }

    /// The properties of an object schema in declared order, each written by
    /// `one(rules, key, schema)`, the ones not `required` optional.
    fn params(
        &mut self,
        schema: &Value,
        mut one: impl FnMut(&mut Self, &str, &Value) -> Result<String, ApiError>,
    ) -> Result<String, ApiError> {
        let required: Vec<&str> = schema
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut parts = Vec::new();
        for (key, prop) in schema
            .get("properties")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            if key.contains(['<', '>', '"', '\n']) {
                return Err(ApiError::invalid(format!(
                    "parameter name {key:?} cannot be written in this template's tool-call format"
                )));
            }
            let part = one(self, key, prop)?;
            parts.push(if required.contains(&key.as_str()) {
                part
            } else {
                format!("( {part} )?")
            });
        }
        Ok(if parts.is_empty() {
            lit("")
        } else {
            parts.join(" ")
        })
    }

    /// Text that does not contain `close` (one set of rules per closing text).
    fn until(&mut self, close: &str) -> String {
        let n = self.untils.len();
        self.untils
            .entry(close.to_owned())
            .or_insert_with(|| format!("until-{n}"))
            .clone()
    }

    /// Writes the rules: the JSON converter's for every schema (placeholders replaced by its
    /// rule names), then the texts before closing tags.
    fn write(self, gbnf: &mut String) -> Result<(), ApiError> {
        let names: Vec<String> = (0..self.schemas.len())
            .map(|i| format!("tool-json-{i}"))
            .collect();
        let list: Vec<(&str, &Value)> = names
            .iter()
            .map(String::as_str)
            .zip(&self.schemas)
            .collect();
        let (rules, rule_names) = schema::rules_for(&list).map_err(|e| {
            ApiError::invalid(format!(
                "a tool's parameters: {e} (keyword `{}`)",
                e.keyword
            ))
        })?;
        for (i, rule) in rule_names.iter().enumerate() {
            *gbnf = gbnf.replace(&format!("@json{i}@"), rule);
        }
        gbnf.push_str(&rules);
        for (close, name) in &self.untils {
            gbnf.push_str(&until_rules(name, close));
        }
        Ok(())
    }
}

/// Rules `NAME` (text without `close`, possibly ending in a part of it): the automaton that
/// tracks how much of `close` the text ends in, one right-recursive rule per state (`NAME` is
/// state 0). `close`'s first character occurs nowhere else in it, so a mismatch falls back to
/// state 1 on that character and to state 0 on any other.
fn until_rules(name: &str, close: &str) -> String {
    let c: Vec<char> = close.chars().collect();
    let first = class_char(c[0]);
    let open = lit(&c[0].to_string());
    let state = |k: usize| {
        if k == 0 {
            name.to_owned()
        } else {
            format!("{name}-{k}")
        }
    };
    let mut out = format!("{name} ::= ( [^{first}] {name} | {open} {} )?\n", state(1));
    for k in 1..c.len() {
        let mut alts = vec![
            format!("[^{first}{}] {name}", class_char(c[k])),
            format!("{open} {}", state(1)),
        ];
        if k + 1 < c.len() {
            alts.push(format!("{} {}", lit(&c[k].to_string()), state(k + 1)));
        }
        out.push_str(&format!("{} ::= ( {} )?\n", state(k), alts.join(" | ")));
    }
    out
}

/// A character inside a GBNF class.
fn class_char(c: char) -> String {
    match c {
        '\n' => "\\n".into(),
        '\r' => "\\r".into(),
        '\\' | ']' | '^' | '-' | '[' => format!("\\{c}"),
        _ => c.to_string(),
    }
}

/// A GBNF string literal.
pub fn lit(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            _ => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bloomery_grammar::{Grammar, Matcher, TokenTrie};
    use serde_json::json;

    use super::*;
    use crate::server::tool_parse::tests::{rendered, Rendered};

    fn grammar_of(r: &Rendered, only: Option<&str>, parallel: bool) -> Grammar {
        grammar_thinking(r, only, parallel, false)
    }

    fn grammar_thinking(r: &Rendered, only: Option<&str>, parallel: bool, think: bool) -> Grammar {
        let list: Vec<Tool<'_>> = r
            .tools
            .as_array()
            .unwrap()
            .iter()
            .map(|t| Tool {
                name: t["function"]["name"].as_str().unwrap(),
                params: t["function"]["parameters"].clone(),
            })
            .filter(|t| only.is_none_or(|n| n == t.name))
            .collect();
        let gbnf = calls_gbnf(r.format, &list, parallel, think).unwrap();
        Grammar::parse(&gbnf, None).unwrap_or_else(|e| panic!("{e}\n{gbnf}"))
    }

    fn accepts(g: &Grammar, text: &str) -> bool {
        let vocab = Arc::new(TokenTrie::new(0, |_| &[][..], &[]));
        let mut m = Matcher::new(g, vocab);
        m.accept_text(text) && m.accepts_end()
    }

    /// The calls of a reply: from the format's first opening text on.
    fn calls_text(r: &Rendered) -> &str {
        let at = r
            .format
            .openers()
            .iter()
            .filter_map(|o| r.reply.find(o))
            .min()
            .unwrap();
        &r.reply[at..]
    }

    #[test]
    fn required_grammars_accept_every_rendered_reply_of_calls() {
        for r in rendered() {
            let at = format!("{}/{}", r.template, r.case);
            let text = calls_text(&r);
            let all = grammar_of(&r, None, true);
            assert!(accepts(&all, text), "{at}: {text}");
            let single = grammar_of(&r, None, false);
            assert_eq!(accepts(&single, text), r.calls.len() == 1, "{at}: {text}");
            if r.calls.len() == 1 {
                let name = r.calls[0]["name"].as_str().unwrap();
                assert!(accepts(&grammar_of(&r, Some(name), true), text), "{at}");
                let other = if name == "ping" { "search" } else { "ping" };
                assert!(!accepts(&grammar_of(&r, Some(other), true), text), "{at}");
            }
        }
    }

    #[test]
    fn a_model_that_opens_its_thinking_may_think_before_its_calls() {
        for r in rendered().into_iter().filter(|r| r.template == "qwen3") {
            // Qwen3's reply opens and closes a think span before the calls.
            assert!(r.reply.starts_with("<think>"), "{}", r.reply);
            let thinking = grammar_thinking(&r, None, true, true);
            assert_eq!(
                accepts(&thinking, &r.reply),
                r.content.is_empty(),
                "{}",
                r.case
            );
            assert!(accepts(&thinking, calls_text(&r)), "{}", r.case);
            assert!(
                !accepts(&grammar_of(&r, None, true), &r.reply),
                "{}",
                r.case
            );
            let open = r.reply.replacen("</think>", "", 1);
            assert!(!accepts(&thinking, &open), "{}", r.case);
        }
    }

    #[test]
    fn required_grammars_refuse_near_misses() {
        for r in rendered() {
            let at = format!("{}/{}", r.template, r.case);
            let text = calls_text(&r);
            let g = grammar_of(&r, None, true);
            let name = r.calls[0]["name"].as_str().unwrap();
            let misses = [
                // An unknown function.
                text.replacen(name, &format!("{name}x"), 1),
                // Cut short.
                text[..text.len() - 1].to_owned(),
                // Text before the calls.
                format!("Sure. {text}"),
                // Text after them.
                format!("{text} Done."),
            ];
            for m in misses {
                assert!(!accepts(&g, &m), "{at}: accepted {m}");
            }
        }
    }

    #[test]
    fn arguments_are_held_to_the_schema() {
        let r = rendered()
            .into_iter()
            .filter(|r| r.case == "plain")
            .collect::<Vec<_>>();
        assert_eq!(r.len(), 5);
        for r in r {
            let text = calls_text(&r);
            let g = grammar_of(&r, None, true);
            // `days` is an integer: 3.5 is refused in every format.
            let i = text.find("days").unwrap();
            let j = i + text[i..].find('3').unwrap();
            let bad_days = format!("{}3.5{}", &text[..j], &text[j + 1..]);
            assert!(!accepts(&g, &bad_days), "{}: {bad_days}", r.template);
        }
    }

    #[test]
    fn bare_strings_keep_their_enum_and_length_and_refuse_a_pattern() {
        let tool = |city: Value| {
            vec![Tool {
                name: "f",
                params: json!({"type": "object", "properties": {"city": city}, "required": ["city"]}),
            }]
        };
        let call = |v: &str| {
            format!("<tool_call>f<arg_key>city</arg_key><arg_value>{v}</arg_value></tool_call>")
        };
        let g = |city: Value| {
            Grammar::parse(
                &calls_gbnf(ToolFormat::GlmXml, &tool(city), true, false).unwrap(),
                None,
            )
            .unwrap()
        };
        let e = g(json!({"type": "string", "enum": ["Oslo", "Lima"]}));
        assert!(accepts(&e, &call("Oslo")) && !accepts(&e, &call("Rome")));
        let n = g(json!({"type": "string", "minLength": 2, "maxLength": 4}));
        assert!(
            accepts(&n, &call("Rome")) && !accepts(&n, &call("Paris")) && !accepts(&n, &call("R"))
        );
        let q = calls_gbnf(
            ToolFormat::QwenXml,
            &tool(json!({"type": "string", "pattern": "^a"})),
            true,
            false,
        );
        assert!(q.unwrap_err().message.contains("`pattern`"));
    }

    #[test]
    fn free_text_stops_short_of_its_closing_tag() {
        let gbnf = format!(
            "root ::= \"<v>\" until-0 \"</v>\"\n{}",
            until_rules("until-0", "</v>")
        );
        let g = Grammar::parse(&gbnf, None).unwrap();
        for ok in [
            "<v></v>",
            "<v>a < b</v>",
            "<v><<</</v</v>",
            "<v>x</</v>",
            "<v></</v>",
            "<v>東京</v>",
        ] {
            assert!(accepts(&g, ok), "{ok}");
        }
        for bad in ["<v></v></v>", "<v>a</v>b</v>", "<v>a", "<v><</v>></v>"] {
            assert!(!accepts(&g, bad), "{bad}");
        }
        // Long texts cost no stack: the states recurse only at their ends.
        let long = format!("<v>{}</v>", "ab<c/</".repeat(5_000));
        assert!(accepts(&g, &long));
    }
}

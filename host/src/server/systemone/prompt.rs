//! A decision's prompt from the model's `systemone` template, as llama-server b11434 builds it:
//! the template renders the state and the questions (JSON keys sorted, `<<clef:` in any string
//! written `<<clef `), the text is split at the separator marker and each piece tokenized on its
//! own (special tokens parsed, no BOS), and a piece that opens with the question or option marker
//! opens that question's or option's span. The leading pieces that do not depend on the questions
//! (the state's part) are the prefix other decisions on the same state share.

use bloomery_exec::decision::{OptionSpan, QuestionSpan};
use bloomery_text::{ChatRequest, ChatTemplate, TemplateValue, Tokenizer};
use serde_json::{json, Map, Value};

use super::request::Question;
use crate::server::error::ApiError;

/// Text between the pieces of the prompt.
pub const SEP: &str = "<<clef:sep>>";
/// Opens a question's span.
pub const MARK_QUESTION: &str = "<<clef:question>>";
/// Opens an option's span.
pub const MARK_OPTION: &str = "<<clef:option>>";
/// What the markers start with, taken out of the request's own text.
const MARKER: &str = "<<clef:";

/// A decision's prompt: its tokens and the spans the head reads.
#[derive(Clone, Debug, PartialEq)]
pub struct Prompt {
    /// Token ids.
    pub tokens: Vec<u32>,
    /// Each question's span, in order.
    pub questions: Vec<QuestionSpan>,
    /// Each option's span, question by question.
    pub options: Vec<OptionSpan>,
    /// The leading tokens that do not depend on the questions: the pieces the template renders
    /// alike with no questions (the state's part).
    pub shared: usize,
}

/// The prompt of `state` and `questions` through `template` (the `systemone` template).
pub fn build(
    template: &ChatTemplate,
    tok: &Tokenizer,
    state: &Value,
    questions: &[Question],
) -> Result<Prompt, ApiError> {
    let qs: Vec<Value> = questions
        .iter()
        .map(|q| {
            let options: Vec<Value> = q
                .options
                .iter()
                .map(|o| json!({"key": o.key, "description": o.description}))
                .collect();
            json!({
                "id": q.id,
                "type": q.kind.name(),
                "instructions": q.instructions,
                "options": options,
            })
        })
        .collect();
    let input = unmark(&sorted(&json!({"state": state, "questions": qs})));
    let text = render(template, &input["state"], &input["questions"])?;
    // The same state without questions: the pieces both texts open with are shared.
    let bare = render(template, &input["state"], &json!([]))?;
    let n_shared = text
        .split(SEP)
        .zip(bare.split(SEP))
        .take_while(|(a, b)| a == b)
        .count();
    let invalid = || ApiError::internal("unexpected layout of the decision prompt");
    let mut p = Prompt {
        tokens: Vec::new(),
        questions: Vec::new(),
        options: Vec::new(),
        shared: 0,
    };
    for (i, piece) in text.split(SEP).enumerate() {
        if i == n_shared {
            p.shared = p.tokens.len();
        }
        let (piece, span) = if let Some(rest) = piece.strip_prefix(MARK_QUESTION) {
            let q = questions.get(p.questions.len()).ok_or_else(invalid)?;
            (rest, Some(Some(q.kind.type_row())))
        } else if let Some(rest) = piece.strip_prefix(MARK_OPTION) {
            (rest, Some(None))
        } else {
            (piece, None)
        };
        let ids = tok
            .encode(piece, false, true)
            .map_err(|e| ApiError::invalid(e.to_string()))?;
        let (start, end) = (p.tokens.len() as u32, (p.tokens.len() + ids.len()) as u32);
        match span {
            Some(_) if ids.is_empty() => {
                return Err(ApiError::invalid(
                    "the instructions and the options of a question must not be empty",
                ))
            }
            Some(Some(kind)) => p.questions.push(QuestionSpan { kind, start, end }),
            Some(None) => {
                let question = p.questions.len().checked_sub(1).ok_or_else(invalid)? as u32;
                p.options.push(OptionSpan {
                    question,
                    start,
                    end,
                });
            }
            None => {}
        }
        p.tokens.extend(ids);
    }
    let n_options: usize = questions.iter().map(|q| q.options.len()).sum();
    if p.questions.len() != questions.len() || p.options.len() != n_options {
        return Err(invalid());
    }
    Ok(p)
}

/// The template's text for `state` and `questions` (already sorted and defused).
fn render(template: &ChatTemplate, state: &Value, questions: &Value) -> Result<String, ApiError> {
    let value = |v: &Value| TemplateValue::from(v);
    let req = ChatRequest {
        messages: value(&json!([])),
        tools: None,
        add_generation_prompt: false,
        kwargs: vec![
            ("state".into(), value(state)),
            ("questions".into(), value(questions)),
            ("images".into(), value(&json!([]))),
            ("sep".into(), value(&json!(SEP))),
            ("mark_question".into(), value(&json!(MARK_QUESTION))),
            ("mark_option".into(), value(&json!(MARK_OPTION))),
        ],
    };
    template
        .render(&req)
        .map_err(|e| ApiError::internal(format!("the systemone template: {e}")))
}

/// `v` with every object's keys in sorted order (byte order, as `std::map` sorts them).
fn sorted(v: &Value) -> Value {
    match v {
        Value::Array(a) => Value::Array(a.iter().map(sorted).collect()),
        Value::Object(o) => {
            let mut keys: Vec<&String> = o.keys().collect();
            keys.sort();
            let mut out = Map::new();
            for k in keys {
                out.insert(k.clone(), sorted(&o[k]));
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}

/// `v` with `<<clef:` written `<<clef ` in every string value (keys are kept).
fn unmark(v: &Value) -> Value {
    match v {
        Value::String(s) => Value::String(s.replace(MARKER, "<<clef ")),
        Value::Array(a) => Value::Array(a.iter().map(unmark).collect()),
        Value::Object(o) => Value::Object(o.iter().map(|(k, x)| (k.clone(), unmark(x))).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_sort_and_markers_in_the_request_are_defused() {
        let v = json!({"b": "x <<clef:sep>> y", "a": {"d": 1, "c": ["<<clef:option>>"]}});
        let out = unmark(&sorted(&v));
        assert_eq!(
            out.to_string(),
            r#"{"a":{"c":["<<clef option>>"],"d":1},"b":"x <<clef sep>> y"}"#
        );
    }
}

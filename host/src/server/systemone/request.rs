//! A `/v1/systemone` request read and checked as llama-server b11434 reads it
//! (`tools/server/server-decision.cpp`): its messages for a bad request, each a 400
//! `invalid_request_error`; images and videos refused as it refuses them without a vision model.

use serde_json::Value;

use crate::server::error::ApiError;

/// The most questions a request may ask.
pub const MAX_QUESTIONS: usize = 64;
/// The most options of a choice question.
pub const MAX_CHOICE_OPTIONS: usize = 26;
/// The most images llama-server takes before it answers that it cannot use them.
const MAX_IMAGES: usize = 8;

/// A question's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Yes or no: options `true` then `false`.
    Noul,
    /// One key of `criteria`.
    Choice,
    /// A level of `criteria` (an array), answered with the expected level.
    Score,
}

impl Kind {
    /// The name on the wire and in the prompt.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Noul => "noul",
            Kind::Choice => "choice",
            Kind::Score => "score",
        }
    }

    /// The row of the head's `token_types.weight`.
    pub fn type_row(self) -> u32 {
        match self {
            Kind::Noul => 0,
            Kind::Choice => 1,
            Kind::Score => 2,
        }
    }
}

/// One option: its key and description (`null` when none was given).
#[derive(Clone, Debug, PartialEq)]
pub struct Choice {
    /// Key.
    pub key: String,
    /// Description.
    pub description: Value,
}

/// One question, its options in the order the head scores them.
#[derive(Clone, Debug, PartialEq)]
pub struct Question {
    /// Its id (the key in `questions`).
    pub id: String,
    /// Type.
    pub kind: Kind,
    /// `instructions`, any JSON value.
    pub instructions: Value,
    /// Options: a choice's sorted by key (code point), a score's in order, a noul's `true` first.
    pub options: Vec<Choice>,
}

/// The state and the questions of a request, in request order; a bad request is a 400 with
/// llama-server's message, images a 501.
pub fn parse(body: &Value) -> Result<(Value, Vec<Question>), ApiError> {
    let state = match body.get("state") {
        Some(s) if !s.is_null() => s,
        _ => return Err(ApiError::invalid("\"state\" must be provided")),
    };
    let questions = match body.get("questions") {
        Some(Value::Object(q)) if !q.is_empty() => q,
        _ => {
            return Err(ApiError::invalid(
                "\"questions\" must be a non-empty object",
            ))
        }
    };
    if questions.len() > MAX_QUESTIONS {
        return Err(ApiError::invalid(format!(
            "\"questions\" has {} fields, at most {MAX_QUESTIONS} are allowed",
            questions.len()
        )));
    }
    let mut out = Vec::new();
    for (id, q) in questions {
        out.push(question(id, q)?);
    }
    images(body, state)?;
    Ok((state.clone(), out))
}

fn question(id: &str, q: &Value) -> Result<Question, ApiError> {
    let err = |m: &str| ApiError::invalid(format!("questions.{id}: {m}"));
    let Value::Object(q) = q else {
        return Err(err("must be an object"));
    };
    let instructions = match q.get("instructions") {
        Some(i) if !i.is_null() => i.clone(),
        _ => return Err(err("\"instructions\" must be provided")),
    };
    let criteria = q.get("criteria").unwrap_or(&Value::Null);
    let (kind, options) = match q.get("type").and_then(Value::as_str).unwrap_or("") {
        "choice" => {
            let Value::Object(c) = criteria else {
                return Err(err("\"criteria\" must be a non-empty object"));
            };
            if c.is_empty() {
                return Err(err("\"criteria\" must be a non-empty object"));
            }
            if c.len() < 2 || c.len() > MAX_CHOICE_OPTIONS {
                return Err(err(&format!(
                    "\"criteria\" has {} options, a choice takes 2 to {MAX_CHOICE_OPTIONS}",
                    c.len()
                )));
            }
            let mut options: Vec<Choice> = c
                .iter()
                .map(|(k, d)| Choice {
                    key: k.clone(),
                    description: d.clone(),
                })
                .collect();
            options.sort_by(|a, b| a.key.cmp(&b.key));
            (Kind::Choice, options)
        }
        "score" => {
            let levels = match criteria {
                Value::Array(a) if (2..=10).contains(&a.len()) => a,
                _ => return Err(err("\"criteria\" must be an array of 2 to 10 levels")),
            };
            let options = levels
                .iter()
                .enumerate()
                .map(|(i, d)| Choice {
                    key: i.to_string(),
                    description: d.clone(),
                })
                .collect();
            (Kind::Score, options)
        }
        "noul" => {
            if !criteria.is_null() && !criteria.is_object() {
                return Err(err("\"criteria\" must be an object"));
            }
            let options = ["true", "false"]
                .into_iter()
                .map(|k| Choice {
                    key: k.into(),
                    description: criteria.get(k).cloned().unwrap_or(Value::Null),
                })
                .collect();
            (Kind::Noul, options)
        }
        _ => return Err(err("\"type\" must be one of: choice, score, noul")),
    };
    Ok(Question {
        id: id.to_owned(),
        kind,
        instructions,
        options,
    })
}

/// Images (`images`, or `image_url` parts of a state of chat messages) and videos: checked as
/// llama-server checks them, then refused with 501, since no decision model here reads images.
fn images(body: &Value, state: &Value) -> Result<(), ApiError> {
    if body
        .get("videos")
        .is_some_and(|v| !v.is_null() && v != &Value::Array(vec![]))
    {
        return Err(ApiError::invalid("\"videos\" is not supported"));
    }
    let mut urls = Vec::new();
    match body.get("images") {
        None | Some(Value::Null) => {}
        Some(Value::Array(a)) => urls.extend(a.iter()),
        Some(_) => return Err(ApiError::invalid("\"images\" must be an array")),
    }
    let messages = match state {
        Value::Object(o) => o.get("messages").unwrap_or(&Value::Null),
        other => other,
    };
    for msg in messages.as_array().into_iter().flatten() {
        let parts = msg.get("content").and_then(Value::as_array);
        for part in parts.into_iter().flatten() {
            if part.get("type").and_then(Value::as_str) == Some("image_url") {
                if let Some(u) = part.get("image_url") {
                    urls.push(u.get("url").unwrap_or(u));
                }
            }
        }
    }
    for (i, url) in urls.iter().enumerate() {
        if !url.as_str().is_some_and(|u| u.starts_with("data:image/")) {
            return Err(ApiError::invalid(
                "images must be data URLs (data:image/...;base64,...)",
            ));
        }
        if i >= MAX_IMAGES {
            return Err(ApiError::invalid(format!(
                "too many images, the maximum is {MAX_IMAGES}"
            )));
        }
    }
    if !urls.is_empty() {
        return Err(ApiError::not_supported(
            "This server does not support image input for decisions. For a model that supports it, start it with `--mmproj`",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn status(body: Value) -> u16 {
        parse(&body).err().map_or(200, |e| e.status.as_u16())
    }

    #[test]
    fn orders_options_and_names_each_refusal() {
        let (_, q) = parse(&json!({"state": "s", "questions": {
            "b": {"type": "choice", "instructions": "x", "criteria": {"z": null, "a": "first"}},
            "a": {"type": "noul", "instructions": "y"},
        }}))
        .unwrap();
        assert_eq!(q[0].id, "b");
        assert_eq!(q[0].options[0].key, "a");
        assert_eq!(q[1].options[0].key, "true");
        for bad in [
            json!({"questions": {"q": {"type": "noul", "instructions": "x"}}}),
            json!({"state": "s"}),
            json!({"state": "s", "questions": {}}),
            json!({"state": "s", "questions": {"q": {"type": "unknown", "instructions": "x"}}}),
            json!({"state": "s", "questions": {"q": {"type": "noul"}}}),
            json!({"state": "s", "questions": {"q": {"type": "choice", "instructions": "x"}}}),
            json!({"state": "s", "questions": {"q": {"type": "score", "instructions": "x", "criteria": ["one"]}}}),
            json!({"state": "s", "questions": {"q": {"type": "noul", "instructions": "x"}}, "images": ["https://x"]}),
        ] {
            assert_eq!(status(bad.clone()), 400, "{bad}");
        }
        let image = json!({"state": "s", "questions": {"q": {"type": "noul", "instructions": "x"}},
            "images": ["data:image/png;base64,AAAA"]});
        assert_eq!(status(image), 501);
    }
}

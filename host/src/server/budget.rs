//! The reasoning budget of a request, as llama-server b11434 reads it: on a chat, from
//! `reasoning_budget_tokens` (or `thinking_budget_tokens`, or Anthropic's `thinking.budget_tokens`),
//! else `--reasoning-budget`, with `<think>` … `</think>` as the span when the template writes
//! them; on a raw completion, only when the request names the span itself
//! (`reasoning_budget_start_tag`, `reasoning_budget_end_tags`). The message
//! (`reasoning_budget_message`, else `--reasoning-budget-message`) is forced before the end.
//!
//! One difference, on purpose: llama.cpp also counts the template's own tokens after the
//! opening `<think>` (a newline) against the budget, so with a template that ends `<think>\n`
//! its budget 0 forces nothing; here only the generated tokens count, so 0 ends the span at once.

use serde_json::Value;

use super::error::ApiError;
use super::params::{Fields, I32_MAX};
use bloomery_runtime::reasoning_budget::{BudgetSpec, EndSwitch};
use bloomery_runtime::request::GenParams;
use bloomery_text::Tokenizer;

/// A chat's thinking span, as bloomery's chat parser reads it.
const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";

/// The server's budget settings (`--reasoning-budget`, `--reasoning-budget-message`).
#[derive(Clone, Debug, Default)]
pub struct BudgetDefaults {
    /// Tokens a thinking span may take (-1: unlimited).
    pub tokens: i64,
    /// Text forced before the span's end when the budget runs out.
    pub message: String,
}

fn tokens(tok: &Tokenizer, text: &str) -> Result<Vec<u32>, ApiError> {
    tok.encode(text, false, true)
        .map_err(|e| ApiError::internal(format!("tokenizing {text:?}: {e}")))
}

/// The request's budget in tokens: its own (`-1`: the server's), checked against llama-server's
/// limits.
fn budget_of(f: &Fields<'_>, keys: &[&str], d: &BudgetDefaults) -> Result<i64, ApiError> {
    let mut n = -1;
    for key in keys {
        if let Some(v) = f.int_in(key, -1, I32_MAX)? {
            n = v;
            break;
        }
    }
    Ok(if n == -1 { d.tokens } else { n })
}

/// `reasoning_control` outside an OpenAI chat completion: `/v1/chat/completions/control` names
/// a completion by the `chatcmpl-` id only those answers carry.
fn refuse_control(f: &Fields<'_>) -> Result<(), ApiError> {
    if f.bool("reasoning_control")? == Some(true) {
        return Err(ApiError::invalid(
            "\"reasoning_control\": ending reasoning at run time (/v1/chat/completions/control) \
             is implemented for /v1/chat/completions, whose answers carry the id it names",
        ));
    }
    Ok(())
}

fn spec(
    tok: &Tokenizer,
    budget: i64,
    (start, ends): (&str, &[String]),
    message: &str,
    opened: bool,
    control: Option<EndSwitch>,
) -> Result<Option<BudgetSpec>, ApiError> {
    // Reasoning control arms the budget with no limit of its own (llama.cpp: INT_MAX).
    let budget = match (budget, &control) {
        (b, Some(_)) if b < 0 => i64::from(i32::MAX),
        (b, _) => b,
    };
    if budget < 0 || start.is_empty() || ends.is_empty() {
        return Ok(None);
    }
    let start = tokens(tok, start)?;
    let ends = ends
        .iter()
        .map(|e| tokens(tok, e))
        .collect::<Result<Vec<_>, _>>()?;
    let mut forced = tokens(tok, message)?;
    forced.extend(&ends[0]);
    Ok(Some(BudgetSpec {
        budget: u32::try_from(budget).unwrap_or(u32::MAX),
        prefill: if opened { start.clone() } else { Vec::new() },
        start,
        ends,
        forced,
        control,
    }))
}

/// Sets a chat's budget on `params`: `thinks` says the template writes thinking spans,
/// `opened` that the prompt ends inside one.
pub fn for_chat(
    f: &Fields<'_>,
    d: &BudgetDefaults,
    tok: &Tokenizer,
    thinking: (bool, bool),
    params: &mut GenParams,
) -> Result<(), ApiError> {
    refuse_control(f)?;
    chat_budget(f, d, tok, thinking, params, false).map(drop)
}

/// As [`for_chat`], for an OpenAI chat completion, which may ask for `reasoning_control`: the
/// switch `/v1/chat/completions/control` sets, where the template writes thinking spans (as
/// llama-server arms it only where the template has thinking tags).
pub fn for_openai_chat(
    f: &Fields<'_>,
    d: &BudgetDefaults,
    tok: &Tokenizer,
    thinking: (bool, bool),
    params: &mut GenParams,
) -> Result<Option<EndSwitch>, ApiError> {
    let control = f.bool("reasoning_control")?.unwrap_or(false);
    chat_budget(f, d, tok, thinking, params, control)
}

fn chat_budget(
    f: &Fields<'_>,
    d: &BudgetDefaults,
    tok: &Tokenizer,
    (thinks, opened): (bool, bool),
    params: &mut GenParams,
    control: bool,
) -> Result<Option<EndSwitch>, ApiError> {
    let mut budget = budget_of(f, &["reasoning_budget_tokens", "thinking_budget_tokens"], d)?;
    // Anthropic's extended thinking: its budget unless the body sets one above (10,000 when
    // the object leaves it out, as llama-server).
    if let Some(t) = f.get("thinking") {
        let kind = t.get("type").and_then(Value::as_str);
        if kind == Some("enabled") && f.get("reasoning_budget_tokens").is_none() {
            budget = match t.get("budget_tokens") {
                None => 10_000,
                Some(v) => v.as_i64().filter(|n| *n >= -1).ok_or_else(|| {
                    ApiError::invalid("\"thinking.budget_tokens\" must be an integer")
                })?,
            };
        }
    }
    if !thinks {
        return Ok(None);
    }
    let message = match f.str("reasoning_budget_message")? {
        Some(m) => m,
        None => &d.message,
    };
    let switch = control.then(EndSwitch::new);
    params.reasoning_budget = spec(
        tok,
        budget,
        (THINK_OPEN, &[THINK_CLOSE.to_owned()]),
        message,
        opened,
        switch.clone(),
    )?;
    Ok(switch)
}

/// Sets a raw completion's budget on `params`: only a request that names its span has one.
pub fn for_completion(
    f: &Fields<'_>,
    d: &BudgetDefaults,
    tok: &Tokenizer,
    params: &mut GenParams,
) -> Result<(), ApiError> {
    refuse_control(f)?;
    let budget = budget_of(f, &["reasoning_budget_tokens"], d)?;
    let start = f.str("reasoning_budget_start_tag")?.unwrap_or("");
    let ends: Vec<String> = if f.get("reasoning_budget_end_tags").is_some() {
        f.strings("reasoning_budget_end_tags")?
    } else {
        f.strings("reasoning_budget_end_tag")?
    };
    let ends: Vec<String> = ends.into_iter().filter(|e| !e.is_empty()).collect();
    let message = f.str("reasoning_budget_message")?.unwrap_or("");
    params.reasoning_budget = spec(tok, budget, (start, &ends), message, false, None)?;
    Ok(())
}

/// Whether a chat template writes thinking spans (it holds both tags).
pub fn template_thinks(source: &str) -> bool {
    source.contains(THINK_OPEN) && source.contains(THINK_CLOSE)
}

//! Grammar flags of `run`, `bench` and `serve` (there the default of requests that bring no
//! grammar, as llama-server's), spelled as llama.cpp spells them: `--grammar`,
//! `--grammar-file`, `-j/--json-schema`, `--json-schema-file`, and `--no-schemajump`.

use std::sync::Arc;

use anyhow::{bail, Context};
use bloomery_grammar::{schema, Grammar};
use bloomery_runtime::request::GrammarSpec;
use clap::Args;

/// Constrained generation.
#[derive(Args, Clone, Debug, Default)]
pub struct GrammarArgs {
    /// A GBNF grammar the output must follow (llama.cpp's syntax, with a `root` rule).
    #[arg(long = "grammar")]
    pub grammar: Option<String>,
    /// A file holding a GBNF grammar.
    #[arg(long = "grammar-file", value_name = "FILE")]
    pub grammar_file: Option<std::path::PathBuf>,
    /// A JSON schema the output must follow (converted to a grammar as llama.cpp converts it).
    #[arg(short = 'j', long = "json-schema")]
    pub json_schema: Option<String>,
    /// A file holding a JSON schema.
    #[arg(long = "json-schema-file", value_name = "FILE")]
    pub json_schema_file: Option<std::path::PathBuf>,
    /// Sample every token, even where the grammar admits one alone (schemajump, on by default,
    /// takes such runs without sampling and evaluates them as one chunk; outputs are the same).
    #[arg(long = "no-schemajump")]
    pub no_schemajump: bool,
}

/// A grammar from its GBNF text, with errors that name the line and column.
pub fn parse_gbnf(text: &str, tok: &bloomery_text::Tokenizer) -> anyhow::Result<Arc<Grammar>> {
    let lookup = |t: &str| tok.token_id(t);
    Ok(Arc::new(Grammar::parse(text, Some(&lookup))?))
}

impl GrammarArgs {
    /// Whether any grammar source was given.
    pub fn given(&self) -> bool {
        self.grammar.is_some()
            || self.grammar_file.is_some()
            || self.json_schema.is_some()
            || self.json_schema_file.is_some()
    }

    /// The grammar these flags ask for (at most one source).
    pub fn spec(&self, tok: &bloomery_text::Tokenizer) -> anyhow::Result<Option<GrammarSpec>> {
        self.gbnf()?
            .map(|gbnf| {
                Ok(GrammarSpec {
                    grammar: parse_gbnf(&gbnf, tok)?,
                    after: None,
                    lazy: None,
                })
            })
            .transpose()
    }

    /// The GBNF text these flags give (a schema converted as llama.cpp converts it).
    pub fn gbnf(&self) -> anyhow::Result<Option<String>> {
        let read = |p: &std::path::Path| {
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
        };
        let given = [
            self.grammar.is_some(),
            self.grammar_file.is_some(),
            self.json_schema.is_some(),
            self.json_schema_file.is_some(),
        ];
        if given.iter().filter(|&&g| g).count() > 1 {
            bail!("give one of --grammar, --grammar-file, --json-schema, --json-schema-file");
        }
        let gbnf = match (
            &self.grammar,
            &self.grammar_file,
            &self.json_schema,
            &self.json_schema_file,
        ) {
            (Some(g), ..) => g.clone(),
            (_, Some(f), ..) => read(f)?,
            (_, _, Some(s), _) => schema_gbnf(s)?,
            (_, _, _, Some(f)) => schema_gbnf(&read(f)?)?,
            _ => return Ok(None),
        };
        Ok(Some(gbnf))
    }
}

fn schema_gbnf(text: &str) -> anyhow::Result<String> {
    let v: serde_json::Value = serde_json::from_str(text).context("the JSON schema")?;
    Ok(schema::to_gbnf(&v)?)
}

//! The Engram of a `deepseek41` file (`docs/deepseek41-plan.md`, "Engram"): the layers that
//! carry a table (`blk.N.engram_embd`, in order; `engram.layer_ids` must agree when present),
//! the n-gram sizes and heads, each row's width, and the hash constants the host computes the
//! row ids with ([`NgramSpec`]).
//!
//! Array layouts (the plan's **Choice**, after a published header): `engram.multipliers` holds
//! `max_ngram_size` values per site, `engram.primes` and `engram.offsets`
//! `(max_ngram_size − 1)·head_count` each per site, site after site; `engram.token_map` one
//! compressed id per vocabulary token; `engram.pad_id` is a compressed id.

use bloomery_plugin_api::hparams::ArchKeys;
use bloomery_plugin_api::ngram::{NgramSpec, MAX_NGRAM};
use bloomery_plugin_api::PluginError;

/// The keys every `deepseek41` file must hold for its Engram.
pub const REQUIRED: &[&str] = &[
    "engram.head_count",
    "engram.max_ngram_size",
    "engram.key_length",
    "engram.multipliers",
    "engram.primes",
    "engram.offsets",
    "engram.token_map",
    "engram.pad_id",
];

/// A site's table: `blk.N.{TABLE}`, `[key_length, rows]`.
pub const TABLE: &str = "engram_embd.weight";

/// The Engram sites and constants.
#[derive(Clone, Debug, PartialEq)]
pub struct Engram {
    /// The layers that read a table before their attention, in order.
    pub layers: Vec<u32>,
    /// Longest n-gram (`engram.max_ngram_size`): sizes 2 to it are hashed.
    pub ngram_size: u32,
    /// Heads per n-gram size (`engram.head_count`).
    pub heads: u32,
    /// Values per table row (`engram.key_length`).
    pub row_width: u32,
    /// The compressed id a position before the sequence start hashes as (`engram.pad_id`).
    pub pad_id: u32,
    /// Token id → compressed id (`engram.token_map`).
    pub token_map: Vec<u32>,
    /// `ngram_size` multipliers per site.
    pub multipliers: Vec<u64>,
    /// Each head's row count (the modulus), `heads_per_site` per site.
    pub primes: Vec<u64>,
    /// Each head's first row, as many.
    pub offsets: Vec<u64>,
    /// Rows of each site's table.
    pub rows: Vec<u64>,
}

impl Engram {
    /// Row ids a site reads per token: `(ngram_size − 1)·heads`.
    pub fn heads_per_site(&self) -> u32 {
        (self.ngram_size - 1) * self.heads
    }

    /// Which site layer `il` is, if it carries a table.
    pub fn site(&self, il: u32) -> Option<usize> {
        self.layers.iter().position(|&l| l == il)
    }

    /// The row-id constants the host hashes with: one table per site, no cut at the pad id.
    pub fn spec(&self) -> NgramSpec {
        NgramSpec {
            ngram_size: self.ngram_size,
            heads_per_ngram: self.heads,
            end_id: self.pad_id,
            cut_at_end: false,
            tables: self.layers.len() as u32,
            token_map: self.token_map.clone().into(),
            multipliers: self.multipliers.clone().into(),
            head_sizes: self.primes.clone().into(),
            head_offsets: self.offsets.clone().into(),
        }
    }
}

/// Reads the Engram keys of a file of `n_layer` layers and `n_vocab` tokens: every key of
/// [`REQUIRED`] (refused by name when missing), counts that agree with the sites, and each site's
/// table at least as long as its heads' last row.
pub fn read(keys: &ArchKeys<'_>, n_layer: u32, n_vocab: u32) -> Result<Engram, PluginError> {
    for k in REQUIRED {
        keys.get(k).ok_or_else(|| keys.bad(k, "missing"))?;
    }
    let view = keys.view();
    let layers: Vec<u32> = (0..n_layer)
        .filter(|il| view.tensor(&format!("blk.{il}.{TABLE}")).is_some())
        .collect();
    if layers.is_empty() {
        return Err(PluginError::MissingTensor {
            name: format!("blk.N.{TABLE} (no layer carries an Engram table)").into(),
        });
    }
    if keys.get("engram.layer_ids").is_some() {
        let ids = keys.u32_array_or_empty("engram.layer_ids")?;
        keys.check(ids == layers, "engram.layer_ids", || {
            format!("{ids:?}, but the layers carrying `{TABLE}` are {layers:?}")
        })?;
    }
    let ngram_size = keys.u32("engram.max_ngram_size")?;
    keys.check(
        (2..=MAX_NGRAM).contains(&ngram_size),
        "engram.max_ngram_size",
        || format!("{ngram_size} (2 to {MAX_NGRAM})"),
    )?;
    let heads = keys.positive("engram.head_count")?;
    let row_width = keys.width("engram.key_length", TABLE, 0)?;
    let n_sites = layers.len();
    let per_site = (ngram_size as usize - 1) * heads as usize;
    let multipliers = keys.u64_array("engram.multipliers", n_sites * ngram_size as usize)?;
    let primes = keys.u64_array("engram.primes", n_sites * per_site)?;
    let offsets = keys.u64_array("engram.offsets", n_sites * per_site)?;
    let token_map = keys
        .u64_array("engram.token_map", n_vocab as usize)?
        .into_iter()
        .map(|v| u32::try_from(v).map_err(|_| keys.bad("engram.token_map", format!("{v} > u32"))))
        .collect::<Result<Vec<_>, _>>()?;
    let pad_id = keys.u32("engram.pad_id")?;
    optional_keys(keys, &token_map, pad_id)?;
    let mut rows = Vec::with_capacity(n_sites);
    for (s, &il) in layers.iter().enumerate() {
        let name = format!("blk.{il}.{TABLE}");
        let have = view.tensor(&name).map_or(0, |t| t.ne[1]);
        let heads = s * per_site..(s + 1) * per_site;
        for (h, (&o, &p)) in offsets[heads.clone()]
            .iter()
            .zip(&primes[heads])
            .enumerate()
        {
            keys.check(p > 0, "engram.primes", || {
                format!("layer {il}: head {h} has no rows (prime 0)")
            })?;
            let end = o.checked_add(p);
            keys.check(end.is_some_and(|e| e <= have), "engram.offsets", || {
                format!(
                    "layer {il}: head {h} reads rows {o} to {o} + {p}, but `{name}` has {have} \
                     rows"
                )
            })?;
        }
        rows.push(have);
    }
    if keys.get("engram.rows").is_some() {
        let said: Vec<u64> = keys
            .u32_array_or_empty("engram.rows")?
            .into_iter()
            .map(u64::from)
            .collect();
        keys.check(said == rows, "engram.rows", || {
            format!("{said:?}, but the tables of layers {layers:?} have {rows:?} rows")
        })?;
    }
    let e = Engram {
        layers,
        ngram_size,
        heads,
        row_width,
        pad_id,
        token_map,
        multipliers,
        primes,
        offsets,
        rows,
    };
    e.spec()
        .check()
        .map_err(|err| keys.bad("engram.multipliers", err.to_string()))?;
    Ok(e)
}

/// The keys some published headers add (`docs/deepseek41-plan.md`, S5): `engram.encoding`, a
/// row format of their own, is refused by name (the table must be a GGML type);
/// `engram.compressed_vocab_size` bounds every mapped id and the pad id.
fn optional_keys(keys: &ArchKeys<'_>, token_map: &[u32], pad_id: u32) -> Result<(), PluginError> {
    if let Some(v) = keys.get("engram.encoding") {
        return Err(keys.bad(
            "engram.encoding",
            format!(
                "{}: a row encoding of its own is not supported (the table must be a GGML type)",
                v.as_str().unwrap_or("not a string")
            ),
        ));
    }
    if keys.get("engram.compressed_vocab_size").is_some() {
        let n = keys.u32("engram.compressed_vocab_size")?;
        let top = token_map.iter().copied().chain([pad_id]).max().unwrap_or(0);
        keys.check(top < n, "engram.compressed_vocab_size", || {
            format!("{n}, but the token map or pad id holds the id {top}")
        })?;
    }
    Ok(())
}

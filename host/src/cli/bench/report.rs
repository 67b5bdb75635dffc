//! A benchmark's results in llama-bench's output formats (`-o md|csv|json|jsonl|sql`): the same
//! fields in the same order (`test::get_fields` of llama-bench b11434), the same value types, the
//! markdown table's padded columns, and its `build:` line. Fields for llama.cpp options bloomery
//! does not take carry the value that describes what bloomery does (the file is always mapped,
//! one device, no CPU mask).

use std::fmt::Write as _;

use bloomery_tiering::cards::CardRequest;

/// llama-bench's fields, in its order.
pub const FIELDS: &[&str] = &[
    "build_commit",
    "build_number",
    "cpu_info",
    "gpu_info",
    "backends",
    "model_filename",
    "model_type",
    "model_size",
    "model_n_params",
    "n_batch",
    "n_ubatch",
    "n_threads",
    "cpu_mask",
    "cpu_strict",
    "poll",
    "type_k",
    "type_v",
    "n_gpu_layers",
    "n_cpu_moe",
    "split_mode",
    "main_gpu",
    "no_kv_offload",
    "flash_attn",
    "devices",
    "tensor_split",
    "tensor_buft_overrides",
    "load_mode",
    "lazy_mode",
    "embeddings",
    "no_op_offload",
    "no_host",
    "repack",
    "fit_target",
    "fit_min_ctx",
    "n_prompt",
    "n_gen",
    "n_depth",
    "test_time",
    "avg_ns",
    "stddev_ns",
    "avg_ts",
    "stddev_ts",
];

/// How a field's value is written in JSON and SQL.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Text,
    Bool,
    Int,
    Float,
}

/// A field's kind, as llama-bench types it.
fn kind(field: &str) -> Kind {
    match field {
        "build_number" | "n_batch" | "n_ubatch" | "n_threads" | "poll" | "model_size"
        | "model_n_params" | "n_gpu_layers" | "main_gpu" | "n_prompt" | "n_gen" | "n_depth"
        | "avg_ns" | "stddev_ns" | "no_op_offload" | "n_cpu_moe" | "fit_target" | "fit_min_ctx"
        | "flash_attn" => Kind::Int,
        "no_kv_offload" | "cpu_strict" | "embeddings" | "no_host" | "repack" => Kind::Bool,
        "avg_ts" | "stddev_ts" => Kind::Float,
        _ => Kind::Text,
    }
}

/// What the whole run shares.
#[derive(Clone, Debug, Default)]
pub struct RunInfo {
    /// The commit bloomery was built from (short hash, `unknown` outside a git checkout).
    pub build_commit: String,
    /// Commits in its history (llama-bench's build number).
    pub build_number: u64,
    /// The CPU's model name.
    pub cpu_info: String,
    /// The model file as given.
    pub model_filename: String,
    /// llama-bench's model description (`qwen3moe 30B.A3B Q4_K - Medium`).
    pub model_type: String,
    /// Bytes of every tensor.
    pub model_size: u64,
    /// Values of every tensor.
    pub model_n_params: u64,
}

/// The card settings as llama-bench writes them (`split_mode`, `main_gpu`, `devices`,
/// `tensor_split`): as given, bloomery's own default `none` (one card) without `-sm`.
#[derive(Clone, Debug, PartialEq)]
pub struct CardColumns {
    /// `-sm`.
    pub split_mode: String,
    /// `-mg`.
    pub main_gpu: u32,
    /// `-dev`: the names joined by `/`, `auto` without.
    pub devices: String,
    /// `-ts`: each share with two decimals joined by `/` up to the last nonzero one.
    pub tensor_split: String,
}

impl Default for CardColumns {
    fn default() -> Self {
        CardColumns::of(None, &CardRequest::default())
    }
}

impl CardColumns {
    /// The columns of `-sm` `split_mode` and the card request the flags made.
    pub fn of(split_mode: Option<&str>, cards: &CardRequest) -> CardColumns {
        let devices = match &cards.devices {
            None => "auto".into(),
            Some(d) => d
                .iter()
                .map(|i| format!("CUDA{i}"))
                .collect::<Vec<_>>()
                .join("/"),
        };
        let last = cards.split.iter().rposition(|&s| s > 0.0).unwrap_or(0);
        let tensor_split = (0..=last)
            .map(|i| format!("{:.2}", cards.split.get(i).copied().unwrap_or(0.0)))
            .collect::<Vec<_>>()
            .join("/");
        CardColumns {
            split_mode: split_mode.unwrap_or("none").into(),
            main_gpu: cards.main,
            devices,
            tensor_split,
        }
    }
}

/// One test's settings and samples.
#[derive(Clone, Debug, Default)]
pub struct Record {
    /// `-sm`, `-mg`, `-dev`, `-ts` as llama-bench writes them.
    pub cards: CardColumns,
    /// The card's name (empty on the CPU).
    pub gpu_info: String,
    /// The kernel plugin the test ran on.
    pub backend: String,
    /// `-b`.
    pub n_batch: u32,
    /// `-ub`.
    pub n_ubatch: u32,
    /// CPU threads.
    pub n_threads: u32,
    /// K cache type (`f16`, `f32`).
    pub type_k: String,
    /// V cache type.
    pub type_v: String,
    /// `-ngl` as given.
    pub n_gpu_layers: i64,
    /// `-ncmoe`.
    pub n_cpu_moe: u32,
    /// `-fa`: -1 auto, 0 off, 1 on (llama.cpp's enum).
    pub flash_attn: i64,
    /// `-ot` as given (`none` without).
    pub tensor_buft_overrides: String,
    /// Prompt tokens of the test.
    pub n_prompt: u32,
    /// Generated tokens of the test (per sequence).
    pub n_gen: u32,
    /// Context before the test.
    pub n_depth: u32,
    /// Sequences decoded together (bloomery's `-np`; in the test's name).
    pub n_seq: u32,
    /// A grammar test (`js<n>`): generation within a grammar.
    pub grammar: bool,
    /// When the test started (RFC 3339, UTC).
    pub test_time: String,
    /// Each repetition's time in nanoseconds.
    pub samples_ns: Vec<u64>,
    /// Each repetition's tokens (prompt and every sequence's generated tokens).
    pub samples_tokens: Vec<u64>,
    /// The test's drafting (`none`, `draft-mtp L1.7`; a column of the markdown table when
    /// `--spec-*` chose it).
    pub spec: String,
    /// Drafts the target kept per verify step over the repetitions (None: nothing drafted).
    pub accepted_per_step: Option<f64>,
}

impl Record {
    /// Tokens per second of each repetition.
    pub fn samples_ts(&self) -> Vec<f64> {
        self.samples_ns
            .iter()
            .zip(&self.samples_tokens)
            .map(|(&ns, &n)| {
                if ns > 0 {
                    1e9 * n as f64 / ns as f64
                } else {
                    0.0
                }
            })
            .collect()
    }

    /// The test's name in the markdown table: `pp512`, `tg128`, `pp512+tg128`, `js64`, with
    /// ` x4` for several sequences and ` @ d4096` after context.
    pub fn test_name(&self) -> String {
        let mut s = match (self.n_prompt, self.n_gen, self.grammar) {
            (_, g, true) => format!("js{g}"),
            (p, 0, _) => format!("pp{p}"),
            (0, g, _) => format!("tg{g}"),
            (p, g, _) => format!("pp{p}+tg{g}"),
        };
        if self.n_seq > 1 && self.n_gen > 0 {
            let _ = write!(s, " x{}", self.n_seq);
        }
        if self.n_depth > 0 {
            let _ = write!(s, " @ d{}", self.n_depth);
        }
        s
    }

    /// Every field's value as llama-bench writes it (numbers as C's `to_string`).
    fn values(&self, run: &RunInfo) -> Vec<String> {
        let ns: Vec<f64> = self.samples_ns.iter().map(|&n| n as f64).collect();
        let (avg_ns, sd_ns) = mean_sd(&ns);
        let (avg_ts, sd_ts) = mean_sd(&self.samples_ts());
        let b = |v: bool| u8::from(v).to_string();
        vec![
            run.build_commit.clone(),
            run.build_number.to_string(),
            run.cpu_info.clone(),
            self.gpu_info.clone(),
            self.backend.clone(),
            run.model_filename.clone(),
            run.model_type.clone(),
            run.model_size.to_string(),
            run.model_n_params.to_string(),
            self.n_batch.to_string(),
            self.n_ubatch.to_string(),
            self.n_threads.to_string(),
            "0x0".into(),
            b(false),
            "50".into(),
            self.type_k.clone(),
            self.type_v.clone(),
            self.n_gpu_layers.to_string(),
            self.n_cpu_moe.to_string(),
            self.cards.split_mode.clone(),
            self.cards.main_gpu.to_string(),
            b(false),
            self.flash_attn.to_string(),
            self.cards.devices.clone(),
            self.cards.tensor_split.clone(),
            self.tensor_buft_overrides.clone(),
            "mmap".into(),
            "off".into(),
            b(false),
            "0".into(),
            b(false),
            b(false),
            "0".into(),
            "0".into(),
            self.n_prompt.to_string(),
            self.n_gen.to_string(),
            self.n_depth.to_string(),
            self.test_time.clone(),
            (avg_ns as u64).to_string(),
            (sd_ns as u64).to_string(),
            format!("{avg_ts:.6}"),
            format!("{sd_ts:.6}"),
        ]
    }
}

/// Mean and sample standard deviation (0 for fewer than two samples), as llama-bench computes
/// them.
pub fn mean_sd(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0);
    }
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    if v.len() < 2 {
        return (mean, 0.0);
    }
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

/// llama-bench's output formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// A markdown table (the default).
    Md,
    /// Comma-separated values with a header of every field.
    Csv,
    /// One JSON array of test objects.
    Json,
    /// One JSON object per line.
    Jsonl,
    /// SQL: a `CREATE TABLE llama_bench` and one `INSERT` per test.
    Sql,
}

/// Which optional markdown columns a run shows (llama-bench shows a parameter's column when it
/// was given a value other than its default, or several).
#[derive(Clone, Debug, Default)]
pub struct Columns {
    /// The run may use a card (`ngl`).
    pub gpu: bool,
    /// `-ncmoe` was given.
    pub n_cpu_moe: bool,
    /// `-t` was given (always shown without a card).
    pub threads: bool,
    /// `-b` was given.
    pub n_batch: bool,
    /// `-ub` was given.
    pub n_ubatch: bool,
    /// `-ctk` was given.
    pub type_k: bool,
    /// `-ctv` was given.
    pub type_v: bool,
    /// `-fa` was given.
    pub flash_attn: bool,
    /// `-ot` was given.
    pub overrides: bool,
    /// `--spec-type` or `--spec-synth-len` was given: each test's drafting, its accepted
    /// drafts per verify step and its mean acceptance length (tokens a verify step, the
    /// target's own included: what `--spec-synth-len` asks for).
    pub spec: bool,
}

/// Writes the results as they come: a header, one entry per test, a footer.
pub struct Printer {
    format: Format,
    fields: Vec<&'static str>,
    first: bool,
}

/// The markdown width of a column (negative: left-aligned), llama-bench's.
fn width(field: &str) -> i32 {
    match field {
        "model" => -30,
        "t/s" => 20,
        "size" | "params" => 10,
        "n_gpu_layers" | "flash_attn" => 3,
        "n_threads" | "n_batch" => 7,
        "n_ubatch" => 8,
        "type_k" | "type_v" => 6,
        "test" => 15,
        "spec" => -16,
        "acc/step" => 8,
        "len" => 5,
        f => {
            let w = f.len().max(10) as i32;
            if kind(f) == Kind::Text {
                -w
            } else {
                w
            }
        }
    }
}

/// The markdown header of a field, llama-bench's.
fn display_name(field: &str) -> &str {
    match field {
        "n_gpu_layers" => "ngl",
        "n_threads" => "threads",
        "flash_attn" => "fa",
        "tensor_buft_overrides" => "ot",
        f => f,
    }
}

/// A cell padded to its column (`%*s`).
fn pad(value: &str, width: i32) -> String {
    let w = width.unsigned_abs() as usize;
    if width < 0 {
        format!("{value:<w$}")
    } else {
        format!("{value:>w$}")
    }
}

/// A size as llama-bench prints it.
fn size(bytes: u64) -> String {
    let x = bytes as f64;
    if bytes < 1 << 30 {
        format!("{:.2} MiB", x / 1024.0 / 1024.0)
    } else {
        format!("{:.2} GiB", x / 1024.0 / 1024.0 / 1024.0)
    }
}

/// A parameter count as llama-bench prints it.
fn params(n: u64) -> String {
    if n < 1_000_000_000 {
        format!("{:.2} M", n as f64 / 1e6)
    } else {
        format!("{:.2} B", n as f64 / 1e9)
    }
}

/// A JSON value of a field.
fn json_value(field: &str, value: &str) -> String {
    match kind(field) {
        Kind::Text => serde_json::Value::String(value.to_owned()).to_string(),
        Kind::Bool => (value != "0").to_string(),
        Kind::Int | Kind::Float => value.to_owned(),
    }
}

/// Numbers of a JSON array, `a, b, c`.
fn json_numbers<T: std::fmt::Display>(v: &[T]) -> String {
    v.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

impl Printer {
    /// A printer of `format`, with the markdown columns `columns` asks for.
    pub fn new(format: Format, columns: &Columns) -> Printer {
        let mut fields = vec!["model", "size", "params", "backend"];
        let optional = [
            (columns.gpu, "n_gpu_layers"),
            (columns.n_cpu_moe, "n_cpu_moe"),
            (columns.threads || !columns.gpu, "n_threads"),
            (columns.n_batch, "n_batch"),
            (columns.n_ubatch, "n_ubatch"),
            (columns.type_k, "type_k"),
            (columns.type_v, "type_v"),
            (columns.flash_attn, "flash_attn"),
            (columns.overrides, "tensor_buft_overrides"),
            (columns.spec, "spec"),
            (columns.spec, "acc/step"),
            (columns.spec, "len"),
        ];
        fields.extend(optional.iter().filter(|(on, _)| *on).map(|(_, f)| *f));
        fields.extend(["test", "t/s"]);
        Printer {
            format,
            fields,
            first: true,
        }
    }

    /// What goes out before the first test.
    pub fn header(&self) -> String {
        match self.format {
            Format::Md => {
                let mut s = String::from("|");
                for f in &self.fields {
                    let _ = write!(s, " {} |", pad(display_name(f), width(f)));
                }
                s.push_str("\n|");
                for f in &self.fields {
                    let w = width(f);
                    let dashes = "-".repeat(w.unsigned_abs() as usize - 1);
                    let _ = write!(s, " {dashes}{} |", if w > 0 { ":" } else { "-" });
                }
                s.push('\n');
                s
            }
            Format::Csv => format!("{}\n", FIELDS.join(",")),
            Format::Json => "[\n".into(),
            Format::Jsonl => String::new(),
            Format::Sql => {
                let mut s = String::from("CREATE TABLE IF NOT EXISTS llama_bench (\n");
                for (i, f) in FIELDS.iter().enumerate() {
                    let t = match kind(f) {
                        Kind::Text => "TEXT",
                        Kind::Bool | Kind::Int => "INTEGER",
                        Kind::Float => "REAL",
                    };
                    let comma = if i + 1 < FIELDS.len() { "," } else { "" };
                    let _ = writeln!(s, "  {f} {t}{comma}");
                }
                s.push_str(");\n\n");
                s
            }
        }
    }

    /// One test's entry.
    pub fn test(&mut self, run: &RunInfo, r: &Record) -> String {
        let values = r.values(run);
        let first = std::mem::replace(&mut self.first, false);
        match self.format {
            Format::Md => {
                let (avg, sd) = mean_sd(&r.samples_ts());
                let mut s = String::from("|");
                for f in &self.fields {
                    let value = match *f {
                        "model" => run.model_type.clone(),
                        "size" => size(run.model_size),
                        "params" => params(run.model_n_params),
                        "backend" => r.backend.clone(),
                        "test" => r.test_name(),
                        "t/s" => format!("{avg:.2} ± {sd:.2}"),
                        "spec" => r.spec.clone(),
                        "acc/step" => r
                            .accepted_per_step
                            .map_or_else(|| "-".into(), |v| format!("{v:.2}")),
                        "len" => r
                            .accepted_per_step
                            .map_or_else(|| "-".into(), |v| format!("{:.2}", 1.0 + v)),
                        other => FIELDS
                            .iter()
                            .position(|g| *g == other)
                            .map_or_else(String::new, |i| values[i].clone()),
                    };
                    // The widths count characters (llama-bench pads bytes and widens the t/s
                    // column by one for its two-byte ±).
                    let _ = write!(s, " {} |", pad(&value, width(f)));
                }
                s.push('\n');
                s
            }
            Format::Csv => {
                let cells: Vec<String> = values
                    .iter()
                    .map(|v| format!("\"{}\"", v.replace('"', "\"\"")))
                    .collect();
                format!("{}\n", cells.join(","))
            }
            Format::Json => {
                let mut s = String::from(if first { "  {\n" } else { ",\n  {\n" });
                for (f, v) in FIELDS.iter().zip(&values) {
                    let _ = writeln!(s, "    \"{f}\": {},", json_value(f, v));
                }
                let _ = writeln!(
                    s,
                    "    \"samples_ns\": [ {} ],",
                    json_numbers(&r.samples_ns)
                );
                let _ = writeln!(
                    s,
                    "    \"samples_ts\": [ {} ]",
                    json_numbers(&r.samples_ts())
                );
                s.push_str("  }");
                s
            }
            Format::Jsonl => {
                let mut s = String::from("{");
                for (f, v) in FIELDS.iter().zip(&values) {
                    let _ = write!(s, "\"{f}\": {}, ", json_value(f, v));
                }
                let _ = write!(s, "\"samples_ns\": [ {} ],", json_numbers(&r.samples_ns));
                let _ = writeln!(s, "\"samples_ts\": [ {} ]}}", json_numbers(&r.samples_ts()));
                s
            }
            Format::Sql => {
                let cells: Vec<String> = values
                    .iter()
                    .map(|v| format!("'{}'", v.replace('\'', "''")))
                    .collect();
                format!(
                    "INSERT INTO llama_bench ({}) VALUES ({});\n",
                    FIELDS.join(", "),
                    cells.join(", ")
                )
            }
        }
    }

    /// What goes out after the last test (markdown's `build:` line).
    pub fn footer(&self, run: &RunInfo) -> String {
        match self.format {
            Format::Md => format!("\nbuild: {} ({})\n", run.build_commit, run.build_number),
            Format::Json => "\n]\n".into(),
            Format::Csv | Format::Jsonl | Format::Sql => String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIELDS_FIXTURE: &str = include_str!("../../../tests/fixtures/llama_bench/fields.txt");
    const MD_FIXTURE: &str =
        include_str!("../../../tests/fixtures/llama_bench/md_prefilled_context.txt");

    fn run_info() -> RunInfo {
        RunInfo {
            build_commit: "8cf427ff".into(),
            build_number: 5163,
            cpu_info: "CPU \"quoted\", with comma".into(),
            model_filename: "models/Qwen2.5-7B-Instruct-Q4_K_M.gguf".into(),
            model_type: "qwen2 7B Q4_K - Medium".into(),
            model_size: 4_677_120_000,
            model_n_params: 7_615_616_512,
        }
    }

    #[test]
    fn card_columns_are_written_as_llama_bench_writes_them() {
        let none = CardColumns::default();
        assert_eq!(
            (
                none.split_mode.as_str(),
                none.main_gpu,
                none.devices.as_str()
            ),
            ("none", 0, "auto")
        );
        assert_eq!(none.tensor_split, "0.00");
        let cards = CardRequest {
            devices: Some(vec![1, 0]),
            main: 1,
            split: vec![3.0, 1.0, 0.0],
            main_only: false,
        };
        let c = CardColumns::of(Some("layer"), &cards);
        assert_eq!(
            (c.split_mode.as_str(), c.main_gpu, c.devices.as_str()),
            ("layer", 1, "CUDA1/CUDA0")
        );
        assert_eq!(c.tensor_split, "3.00/1.00");
        let row = Record {
            cards: c,
            ..record(512, 0, 0)
        };
        let values = row.values(&run_info());
        let at = |name: &str| FIELDS.iter().position(|f| *f == name).unwrap();
        assert_eq!(values[at("split_mode")], "layer");
        assert_eq!(values[at("main_gpu")], "1");
        assert_eq!(values[at("devices")], "CUDA1/CUDA0");
        assert_eq!(values[at("tensor_split")], "3.00/1.00");
    }

    fn record(n_prompt: u32, n_gen: u32, n_depth: u32) -> Record {
        Record {
            backend: "CUDA".into(),
            n_batch: 2048,
            n_ubatch: 512,
            n_threads: 8,
            type_k: "f16".into(),
            type_v: "f16".into(),
            n_gpu_layers: -1,
            flash_attn: -1,
            tensor_buft_overrides: "none".into(),
            n_prompt,
            n_gen,
            n_depth,
            n_seq: 1,
            test_time: "2025-04-24T11:58:51Z".into(),
            samples_ns: vec![1_075_361_300, 1_065_089_400],
            samples_tokens: vec![u64::from(n_prompt + n_gen); 2],
            ..Record::default()
        }
    }

    #[test]
    fn fields_are_llama_benchs_in_its_order() {
        let want: Vec<&str> = FIELDS_FIXTURE.lines().collect();
        assert_eq!(FIELDS, &want[..]);
        let mut p = Printer::new(Format::Csv, &Columns::default());
        assert_eq!(p.header(), format!("{}\n", want.join(",")));
        let row = p.test(&run_info(), &record(512, 0, 0));
        assert!(
            row.starts_with("\"8cf427ff\",\"5163\",\"CPU \"\"quoted\"\", with comma\""),
            "{row}"
        );
        assert_eq!(row.matches("\",\"").count(), FIELDS.len() - 1, "{row}");
    }

    /// The documented table: same header, separator and cells (the rates aside, which come
    /// from the samples).
    #[test]
    fn markdown_pads_columns_as_llama_bench_does() {
        let want: Vec<&str> = MD_FIXTURE.lines().collect();
        let columns = Columns {
            gpu: true,
            ..Columns::default()
        };
        let mut p = Printer::new(Format::Md, &columns);
        let header = p.header();
        let got: Vec<&str> = header.lines().collect();
        assert_eq!(got, want[..2]);
        let run = run_info();
        for (line, (pp, tg, d)) in
            want[2..]
                .iter()
                .zip([(512, 0, 0), (0, 128, 0), (512, 0, 512), (0, 128, 512)])
        {
            let row = p.test(&run, &record(pp, tg, d));
            let cut = |s: &str| s[..s.trim_end_matches(" |").rfind('|').unwrap()].to_owned();
            assert_eq!(cut(row.trim_end()), cut(line), "{row}");
            assert_eq!(
                row.trim_end().chars().count(),
                line.chars().count(),
                "{row}"
            );
        }
        assert_eq!(p.footer(&run), "\nbuild: 8cf427ff (5163)\n");
    }

    #[test]
    fn json_and_jsonl_parse_with_every_field_typed() {
        let run = run_info();
        let mut p = Printer::new(Format::Json, &Columns::default());
        let mut text = p.header();
        text += &p.test(&run, &record(512, 0, 0));
        text += &p.test(&run, &record(0, 128, 0));
        text += &p.footer(&run);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let tests = v.as_array().unwrap();
        assert_eq!(tests.len(), 2);
        let keys: Vec<&String> = tests[0].as_object().unwrap().keys().collect();
        assert_eq!(keys.len(), FIELDS.len() + 2);
        assert!(keys.iter().zip(FIELDS).all(|(k, f)| k == f));
        assert_eq!(tests[0]["n_gpu_layers"], -1);
        assert_eq!(tests[0]["cpu_strict"], false);
        assert_eq!(tests[0]["model_type"], "qwen2 7B Q4_K - Medium");
        assert!(tests[1]["avg_ts"].as_f64().unwrap() > 100.0);
        assert_eq!(tests[1]["samples_ns"].as_array().unwrap().len(), 2);
        let mut p = Printer::new(Format::Jsonl, &Columns::default());
        assert_eq!(p.header(), "");
        let line = p.test(&run, &record(0, 128, 0));
        assert_eq!(line.lines().count(), 1);
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["n_gen"], 128);
        assert_eq!(v["samples_ts"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn sql_creates_the_table_and_inserts_each_test() {
        let run = run_info();
        let mut p = Printer::new(Format::Sql, &Columns::default());
        let header = p.header();
        assert!(header.starts_with("CREATE TABLE IF NOT EXISTS llama_bench (\n  build_commit TEXT,\n  build_number INTEGER,\n"));
        assert!(
            header.ends_with("  avg_ts REAL,\n  stddev_ts REAL\n);\n\n"),
            "{header}"
        );
        let mut r = record(512, 0, 0);
        r.gpu_info = "it's".into();
        let row = p.test(&run, &r);
        assert!(row.starts_with("INSERT INTO llama_bench (build_commit, build_number, "));
        assert!(row.contains("'it''s'"), "{row}");
        assert!(row.ends_with(");\n"));
    }

    #[test]
    fn test_names_say_the_test_the_sequences_and_the_depth() {
        let mut r = record(512, 0, 0);
        assert_eq!(r.test_name(), "pp512");
        r.n_gen = 128;
        assert_eq!(r.test_name(), "pp512+tg128");
        r.n_prompt = 0;
        r.n_seq = 4;
        r.n_depth = 4096;
        assert_eq!(r.test_name(), "tg128 x4 @ d4096");
        r.grammar = true;
        assert_eq!(r.test_name(), "js128 x4 @ d4096");
    }
}

/// The time now as RFC 3339 in UTC (`2025-04-24T11:58:51Z`), llama-bench's `test_time`.
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    rfc3339(secs)
}

/// Seconds since the Unix epoch as RFC 3339 in UTC (days to a civil date by Howard Hinnant's
/// algorithm).
fn rfc3339(secs: u64) -> String {
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
mod time_tests {
    #[test]
    fn rfc3339_dates() {
        assert_eq!(super::rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(super::rfc3339(1_745_495_931), "2025-04-24T11:58:51Z");
        assert_eq!(super::rfc3339(951_825_600), "2000-02-29T12:00:00Z");
    }
}

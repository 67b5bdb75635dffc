//! One loaded model under the runtime and the tests a bench runs on it: requests of random ids
//! (greedy generation on a file with MTP layers), every slot's context of `-d` tokens kept
//! between tests by prefix reuse. A test with other drafting restarts the runtime on the same
//! model.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use anyhow::bail;
use bloomery_devices::Registry;
use bloomery_exec::{LoadOptions, LoadedModel};
use bloomery_plugin_api::kernel::DeviceClass;
use bloomery_runtime::request::{Event, Finish, GenParams, GrammarSpec};
use bloomery_runtime::sampling::SamplerParams;
use bloomery_runtime::{Runtime, RuntimeConfig};
use bloomery_text::Tokenizer;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::mpsc::UnboundedReceiver;

use super::{BenchArgs, Setup};
use crate::flags::grammar::GrammarArgs;
use crate::flags::placement::pass_rows;
use crate::flags::spec::BenchSpec;

/// Drafting's counters in a runtime ([`Session::spec_counts`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct SpecCounts {
    /// Verify steps of drafts.
    pub steps: u64,
    /// Drafts accepted.
    pub accepted: u64,
    /// Pass executors the model prepared.
    pub prepared: u64,
    /// Passes that ran kept tokens again after a refused draft.
    pub rollbacks: u64,
    /// Passes of the MTP block.
    pub mtp_passes: u64,
    /// Bytes target and MTP passes read back to the host.
    pub read_bytes: u64,
}

/// A test's kind and token counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Test {
    /// `pp<n>`: one prompt of n random tokens.
    Prompt(u32),
    /// `tg<n>`: n decode steps of every sequence, each on a forced random token.
    Generate(u32),
    /// `js<n>`: every sequence generating greedily within the grammar, up to n tokens.
    Grammar(u32),
    /// `pp<p>+tg<n>`: a prompt then n decode steps, timed together.
    PromptGenerate(u32, u32),
}

impl Test {
    /// What a progress line calls its runs (llama-bench's words).
    pub fn kind(&self) -> &'static str {
        match self {
            Test::Prompt(_) => "prompt",
            Test::Generate(_) => "generation",
            Test::Grammar(_) => "grammar",
            Test::PromptGenerate(..) => "prompt+generation",
        }
    }
}

/// A model loaded with one setup, its runtime, and the tests' random ids.
pub struct Session {
    /// The setup it was loaded with.
    pub setup: Setup,
    /// The context every slot holds (None before the first fill).
    pub depth: Option<u32>,
    /// The kernel plugin it runs on.
    pub backend: String,
    /// The card's name (empty on the CPU).
    pub gpu_info: String,
    /// CPU threads in use.
    pub threads: u32,
    /// The model gives logits (a decision model's backbone does not: prompts only).
    pub output_head: bool,
    /// Always Some but while the runtime restarts.
    runtime: Option<Runtime>,
    tok: Arc<Tokenizer>,
    /// The runtime's settings (its drafting changes between tests).
    cfg: RuntimeConfig,
    /// The drafting the runtime runs with.
    spec: BenchSpec,
    /// The model's MTP layers (and architecture): generation tests are greedy, not forced,
    /// whenever it has some, so that drafting on and off generate alike.
    n_mtp_layers: u32,
    arch: String,
    rng: StdRng,
    vocab: u32,
    /// Each slot's context.
    context: Vec<Vec<u32>>,
    grammar: Option<GrammarSpec>,
}

/// A request's settings: greedy, with the tokens it generates `forced` (or `n_predict` of its
/// own choosing when none are), reusing the slot's context only when there is one to reuse (a
/// fresh sequence per repetition otherwise).
fn params(reuse: bool, forced: Vec<u32>, n_predict: usize, prompt_only: bool) -> GenParams {
    GenParams {
        sampler: SamplerParams {
            temp: 0.0,
            ..SamplerParams::default()
        },
        n_predict: Some(n_predict),
        stop: Vec::new(),
        n_probs: 0,
        post_sampling_probs: false,
        return_progress: false,
        ignore_eos: true,
        cache_prompt: reuse,
        forced,
        prompt_only,
        grammar: None,
        t_max_predict_ms: None,
        preserved: Vec::new(),
        special: false,
        shift: bloomery_runtime::request::ShiftParams::default(),
        reasoning_budget: None,
    }
}

/// Waits for a request's end.
fn finish(rx: &mut UnboundedReceiver<Event>) -> anyhow::Result<Finish> {
    loop {
        match rx.blocking_recv() {
            Some(Event::Done(f)) => return Ok(f),
            Some(Event::Failed(msg)) => bail!("a benchmark request failed: {msg}"),
            Some(_) => {}
            None => bail!("the scheduler stopped before a benchmark request ended"),
        }
    }
}

impl Session {
    /// Loads the model with `setup` (slots of `ctx` positions) and starts its runtime drafting
    /// as `spec` asks.
    pub fn start(
        reg: &Registry,
        a: &BenchArgs,
        setup: &Setup,
        spec: &BenchSpec,
        ctx: u32,
        grammar: Option<&GrammarArgs>,
    ) -> anyhow::Result<Session> {
        let options = LoadOptions {
            n_slots: a.parallel,
            ctx_per_slot: ctx,
            kv_type_k: setup.kv_type_k,
            kv_type_v: setup.kv_type_v,
            threads: setup.threads,
            graphs: !a.no_graphs,
            mlock: a.placement.mlock,
            overrides: &[],
            check_tensors: a.placement.check_tensors,
            draft_n_max: a.spec.planned_n_max()?,
            draft_history: a.spec.planned_history()?,
        };
        let rows = pass_rows(setup.n_batch, setup.n_ubatch);
        let mut request = a.placement.request(
            (setup.n_cpu_moe > 0).then_some(setup.n_cpu_moe),
            crate::flags::cards::Syntax::Bench,
        )?;
        // A pass holds a prompt's chunk of `rows` rows, or one row of every sequence.
        request.batch_rows = rows.max(a.parallel);
        let model = LoadedModel::load_offloaded(reg, &a.model, options, setup.gpu, &request)?;
        let backend = model.kernel_plugin().to_owned();
        let gpu_info = reg
            .best_kernel(DeviceClass::Gpu)
            .ok()
            .filter(|k| k.name == backend)
            .and_then(|k| k.probe.devices.first().map(|d| d.name.to_string()))
            .unwrap_or_default();
        let threads = match setup.threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()) as u32,
            t => t,
        };
        let vocab = model.spec.hparams.n_vocab;
        let output_head = model.output_head;
        let tok = Arc::new(crate::text::tokenizer(&model.file)?);
        let grammar = match grammar {
            Some(g) => g.spec(&tok)?,
            None => None,
        };
        let schemajump = !a.grammar.no_schemajump;
        let n_mtp_layers = model.spec.caps.n_mtp_layers;
        let arch = model.spec.architecture.to_string();
        let cfg = RuntimeConfig {
            n_ctx_slot: ctx as usize,
            n_batch: request.batch_rows as usize,
            cache_ram: None,
            queue_depth: 1,
            max_checkpoints: bloomery_runtime::DEFAULT_MAX_CHECKPOINTS,
            checkpoint_every: bloomery_runtime::DEFAULT_CHECKPOINT_EVERY,
            schemajump,
            context_shift: false,
            spec: a.spec.bench_config(spec, n_mtp_layers, &arch)?,
            slot_similarity: bloomery_runtime::DEFAULT_SLOT_SIMILARITY,
        };
        let runtime = Runtime::start(model, Arc::clone(&tok), cfg)?;
        Ok(Session {
            setup: setup.clone(),
            depth: None,
            backend,
            gpu_info,
            threads,
            output_head,
            runtime: Some(runtime),
            tok,
            cfg,
            spec: spec.clone(),
            n_mtp_layers,
            arch,
            rng: StdRng::seed_from_u64(0),
            vocab,
            context: vec![Vec::new(); a.parallel as usize],
            grammar,
        })
    }

    fn runtime(&self) -> anyhow::Result<&Runtime> {
        self.runtime
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("the benchmark's runtime failed to restart"))
    }

    /// Restarts the runtime on the same model drafting as `spec` asks, unless it does already
    /// (every slot's context is then filled again).
    pub fn set_spec(&mut self, a: &BenchArgs, spec: &BenchSpec) -> anyhow::Result<()> {
        if self.spec == *spec && self.runtime.is_some() {
            return Ok(());
        }
        self.cfg.spec = a.spec.bench_config(spec, self.n_mtp_layers, &self.arch)?;
        let Some(old) = self.runtime.take() else {
            bail!("the benchmark's runtime failed to restart");
        };
        let model = old.shutdown()?;
        self.runtime = Some(Runtime::start(model, Arc::clone(&self.tok), self.cfg)?);
        self.spec = spec.clone();
        self.depth = None;
        Ok(())
    }

    /// What drafting did so far in this runtime.
    pub fn spec_counts(&self) -> SpecCounts {
        let Some(rt) = self.runtime.as_ref() else {
            return SpecCounts::default();
        };
        let c = &rt.shared().counters;
        let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        SpecCounts {
            steps: get(&c.spec_verify_steps),
            accepted: get(&c.spec_accepted),
            prepared: get(&c.executors_prepared),
            rollbacks: get(&c.rollback_passes),
            mtp_passes: get(&c.mtp_passes),
            read_bytes: get(&c.mtp_read_bytes) + get(&c.pass_read_bytes),
        }
    }

    /// The tokens a test generates: `n` forced random ids, or none (its own greedy choice) on a
    /// file with MTP layers.
    fn generated(&mut self, n: u32) -> Vec<u32> {
        match self.n_mtp_layers {
            0 => self.random(n),
            _ => Vec::new(),
        }
    }

    fn random(&mut self, n: u32) -> Vec<u32> {
        (0..n).map(|_| self.rng.gen_range(0..self.vocab)).collect()
    }

    /// Fills every slot's context with `depth` random tokens (untimed).
    pub fn fill_context(&mut self, depth: u32) -> anyhow::Result<()> {
        let mut requests = Vec::new();
        for slot in 0..self.context.len() {
            self.context[slot] = self.random(depth);
            if depth > 0 {
                requests.push((
                    self.context[slot].clone(),
                    params(true, Vec::new(), 0, true),
                    Some(slot),
                ));
            }
        }
        if !requests.is_empty() {
            for mut rx in self.runtime()?.submit_together_blocking(requests)? {
                finish(&mut rx)?;
            }
        }
        self.depth = Some(depth);
        Ok(())
    }

    /// One run of `test`: its seconds and the tokens it evaluated (or generated, for the
    /// grammar test).
    pub fn once(&mut self, test: &Test) -> anyhow::Result<(f64, u64)> {
        match *test {
            Test::Prompt(n) => Ok((self.prompt_once(n, 0)?, u64::from(n))),
            Test::Generate(n) => Ok((
                self.generate_once(n)?,
                u64::from(n) * self.context.len() as u64,
            )),
            Test::PromptGenerate(p, n) => Ok((self.prompt_once(p, n)?, u64::from(p + n))),
            Test::Grammar(n) => {
                let Some(g) = self.grammar.clone() else {
                    bail!("the grammar test needs a grammar");
                };
                let (secs, made, forced, drafted, accepted) = self.grammar_once(n, &g)?;
                eprintln!(
                    "js{n}: {made} tokens in {:.1} ms, {forced} forced and {accepted} of {drafted} \
                     drafted accepted ({:.1}% without a pass of their own)",
                    secs * 1e3,
                    100.0 * (forced + accepted) as f64 / made.max(1) as f64
                );
                Ok((secs, made))
            }
        }
    }

    /// Seconds for a prompt of `p` random tokens after slot 0's context, then `n` decode steps
    /// (the pp test with `n` = 0, the pg test otherwise).
    fn prompt_once(&mut self, p: u32, n: u32) -> anyhow::Result<f64> {
        let mut prompt = self.context[0].clone();
        prompt.extend(self.random(p));
        let reuse = !self.context[0].is_empty();
        let (forced, n_predict) = match n {
            0 => (Vec::new(), 0),
            n => (self.generated(n + 1), n as usize + 1),
        };
        let mut rx = self.runtime()?.submit_blocking(
            prompt,
            params(reuse, forced, n_predict, n == 0),
            Some(0),
        )?;
        let f = finish(&mut rx)?;
        if n > 0 && f.n_predicted != n as usize + 1 {
            bail!(
                "a prompt+generation test ended after {} of {} tokens ({:?})",
                f.n_predicted,
                n + 1,
                f.stop_type
            );
        }
        Ok((f.prompt_ms + if n > 0 { f.predicted_ms } else { 0.0 }) / 1e3)
    }

    /// Seconds for `n` tokens of every sequence after its context (the generation test): one
    /// random token evaluated as the prompt, then `n` tokens, each a pass of its own (the
    /// random token forced after the last) unless drafts verified together save passes.
    fn generate_once(&mut self, n: u32) -> anyhow::Result<f64> {
        let mut requests = Vec::new();
        for slot in 0..self.context.len() {
            let mut prompt = self.context[slot].clone();
            prompt.extend(self.random(1));
            let reuse = !self.context[slot].is_empty();
            let forced = self.generated(n + 1);
            let mut p = params(reuse, forced, (n + 1) as usize, false);
            // Each sequence its own seed: its synthetic acceptance (`--spec-synth-len`) draws
            // from it, so sequences keep different numbers of drafts in a shared pass.
            p.sampler.seed = u64::from(self.rng.gen::<u32>());
            requests.push((prompt, p, Some(slot)));
        }
        let mut secs: f64 = 0.0;
        for mut rx in self.runtime()?.submit_together_blocking(requests)? {
            let f = finish(&mut rx)?;
            if f.n_predicted != n as usize + 1 {
                bail!(
                    "a generation test ended after {} of {} tokens ({:?})",
                    f.n_predicted,
                    n + 1,
                    f.stop_type
                );
            }
            secs = secs.max(f.predicted_ms / 1e3);
        }
        Ok(secs)
    }

    /// (seconds, tokens, forced tokens, drafted tokens, accepted drafted tokens) of every
    /// sequence generating within `grammar` after its
    /// context, greedily, up to `n` tokens each (the grammar test).
    fn grammar_once(
        &mut self,
        n: u32,
        grammar: &GrammarSpec,
    ) -> anyhow::Result<(f64, u64, usize, usize, usize)> {
        let mut requests = Vec::new();
        for slot in 0..self.context.len() {
            let mut prompt = self.context[slot].clone();
            prompt.extend(self.random(1));
            let reuse = !self.context[slot].is_empty();
            let mut p = params(reuse, Vec::new(), n as usize, false);
            p.ignore_eos = false;
            p.grammar = Some(grammar.clone());
            requests.push((prompt, p, Some(slot)));
        }
        let (mut secs, mut tokens, mut forced, mut drafted, mut accepted) = (0f64, 0, 0, 0, 0);
        for mut rx in self.runtime()?.submit_together_blocking(requests)? {
            let f = finish(&mut rx)?;
            secs = secs.max(f.predicted_ms / 1e3);
            tokens += f.n_predicted as u64;
            forced += f.n_forced;
            drafted += f.n_drafted;
            accepted += f.n_accepted;
        }
        Ok((secs, tokens, forced, drafted, accepted))
    }

    /// Routed calls of the layers with host experts so far: (on the card, on the host); None
    /// when the run has no host experts.
    pub fn routed_calls(&self) -> Option<(u64, u64)> {
        let c = &self.runtime.as_ref()?.shared().counters;
        let (card, host) = (
            c.routed_card.load(Ordering::Relaxed),
            c.routed_host.load(Ordering::Relaxed),
        );
        (host > 0).then_some((card, host))
    }

    /// Stops the runtime and reports on stderr where routed calls ran, what the disk tier read
    /// and what the n-gram tables' gathers cost.
    pub fn finish(self) -> anyhow::Result<()> {
        let Some(rt) = self.runtime else {
            bail!("the benchmark's runtime failed to restart");
        };
        let model = rt.shutdown()?;
        if let Some(s) = model.residency_stats() {
            let all = (s.card + s.host).max(1) as f64;
            eprintln!(
                "routed calls of layers with host experts: {:.1}% on the card ({} of {}), {:.1}% \
                 read by the card over the bus{}, {} experts moved onto the card",
                100.0 * s.card as f64 / all,
                s.card,
                s.card + s.host,
                100.0 * s.bus as f64 / all,
                s.bus_kept
                    .map(|n| format!(
                        " (the card takes {n} of a row's host experts, chosen by timing)"
                    ))
                    .unwrap_or_default(),
                s.flips
            );
        }
        if let Some(d) = model.disk_stats() {
            eprintln!("{d}");
        }
        if let Some((s, on_disk)) = model.ngram_stats() {
            eprintln!(
                "n-gram tables (rows from {}): {} token rows gathered, {} of them prefetched, \
                 {:.4} ms a token row spent in passes{}",
                if on_disk { "disk" } else { "host RAM" },
                s.rows,
                s.prefetched,
                s.exposed.as_secs_f64() * 1e3 / s.rows.max(1) as f64,
                match on_disk {
                    true => format!(
                        "; {} table rows read from disk, {} from the row cache",
                        s.disk_reads, s.cached
                    ),
                    false => String::new(),
                }
            );
        }
        Ok(())
    }
}

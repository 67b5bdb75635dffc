//! The scheduler: one thread owns the model and its slots and runs continuous batching. Each pass
//! holds the next token of every generating slot and chunks of new prompts, up to the batch size,
//! prompts in the order their requests came (the oldest finishes first); a generation never
//! waits for another to finish. A slot keeps the tokens its cache holds, so a
//! request that shares a prefix with the slot's last one skips it. Before a slot's cache is
//! overwritten, its state is saved to the prompt cache in host RAM (`--cache-ram`), from which any
//! slot later restores the longest prefix a request shares with it. A client that goes away (its
//! event receiver dropped) frees its slot before the next pass.
//!
//! A decision (`Job::decide`) runs in a slot like any prompt, its chunks sharing passes with
//! other slots' rows, every row read back (its final-norm rows, which the slot keeps beside its
//! tokens); the decision head then runs once over every decision whose prompt ended in that pass.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bloomery_exec::decision::{DecisionHead, HeadRequest};
use bloomery_exec::{BatchInputs, LoadedModel, Readout, Rewind};
use bloomery_plugin_api::graph::{FINAL_NORM, MAX_VERIFY_ROWS, NEXTN_HIDDEN};
use bloomery_text::{StreamDecoder, Tokenizer};
use tokio::sync::mpsc;

use crate::draft_gate::{Gate, StepCosts, StepShape, Switch, WallClock};
use crate::draft_model::ModelDrafter;
use crate::drafter::{Drafter, Drafters};
use crate::grammar::{token_trie, Constraint};
use crate::ngram_draft::{NgramMod, NgramSimple};
use crate::ngram_map::NgramMap;
use crate::panic::panic_message;
use crate::prompt_cache::{common_prefix, Checkpoint, Inserted, PromptCache, SavedState};
use crate::reasoning_budget::Budget;
use crate::request::{
    Decided, Embedded, Event, Failure, FailureKind, Job, PromptProgress, Request, SlotAction,
    SlotReply,
};
use crate::sampling::rng::Mt19937;
use crate::sampling::Sampler;
use crate::slot_file::SlotFile;
use crate::spec::{Chunk, DraftSource, MtpDrafter, SpecConfig, SpecType, SynthAcceptance, Want};
use crate::status::{Shared, SlotView};
use crate::stop::StopScan;
use crate::task::Task;
use crate::token::{step, Drafted, Row, StepContext};

/// Most rows a slot not drafting puts off taking into the MTP block: while its gate has drafting
/// off it reads its rows only in this many steps before its next drafting probe (which takes
/// them in), so its other plain steps do no drafting work; a longer run, or a prompt chunk that
/// would pass this, goes in at once.
const MAX_BEHIND: usize = 64;

/// Checkpoints a slot keeps by default (llama-server's `--ctx-checkpoints`).
pub const DEFAULT_MAX_CHECKPOINTS: usize = 32;

/// Prompt positions between checkpoints by default (llama-server's `--checkpoint-min-step`).
pub const DEFAULT_CHECKPOINT_EVERY: usize = 8192;

/// Scheduler settings.
#[derive(Clone, Copy, Debug)]
pub struct RuntimeConfig {
    /// Context positions per slot.
    pub n_ctx_slot: usize,
    /// Most rows in one forward pass.
    pub n_batch: usize,
    /// Host RAM for the prompt cache in bytes (`None`: no prompt cache).
    pub cache_ram: Option<u64>,
    /// Requests that may wait for the scheduler (a full queue refuses more).
    pub queue_depth: usize,
    /// Checkpoints of recurrent state a slot keeps (hybrid models); the oldest goes first.
    pub max_checkpoints: usize,
    /// A hybrid model's slot takes a checkpoint when its prompt has advanced this many positions
    /// past the last one (0: only at the ends of prompts), and at the end of every prompt.
    pub checkpoint_every: usize,
    /// Schemajump: where a grammar admits a single token, take it without sampling and evaluate
    /// the run of such tokens in the next pass as one chunk.
    pub schemajump: bool,
    /// When generation reaches a slot's context, drop tokens after the kept ones and go on
    /// (`--context-shift`; the model must be able to move cached positions).
    pub context_shift: bool,
    /// Draft decoding (`--spec-*`).
    pub spec: SpecConfig,
    /// A request without `id_slot` goes to the free slot whose cache shares the largest
    /// fraction of its prompt when that fraction is above this (`-sps`, llama-server's 0.1),
    /// else to the least recently used free slot; 0 always takes the least recently used.
    pub slot_similarity: f32,
}

/// llama-server's `--slot-prompt-similarity` default.
pub const DEFAULT_SLOT_SIMILARITY: f32 = 0.1;

/// A sequence slot: the tokens its cache holds and the request running in it.
struct Slot<'t> {
    id: usize,
    cached: Vec<u32>,
    /// Per-sequence state at earlier points of `cached` (hybrid models), oldest first.
    checkpoints: Vec<Checkpoint>,
    task: Option<Task<'t>>,
    /// The scheduler's clock when the slot last took a request: for a running slot, when its
    /// request came (the order prompts are served in).
    last_used: u64,
    /// The final-norm rows of the first positions of `cached`, `n_embd` values each (what a
    /// decision read; a later decision sharing the prefix reuses them).
    hidden: Vec<f32>,
    n_embd: usize,
    /// Whether each drafter of the chain pays in this slot ([`crate::draft_gate`]), in the
    /// order they are consulted (empty when drafting is not gated).
    gates: Vec<Gate>,
    /// What the last drafting took, when drafters were consulted for this slot's next step.
    asked: Option<Asked>,
}

/// The drafters consulted for a slot's step: what they took, which the step's cost includes.
#[derive(Clone, Copy, Debug)]
struct Asked {
    /// Seconds the drafting took (the draft passes with the MTP block or a draft model).
    seconds: f64,
    /// Whether the chain's last drafter was consulted: a step it drafted nothing for is still
    /// its step (its draft passes ran), where an n-gram drafter consulted before it and
    /// drafting nothing costs nothing.
    last: bool,
}

impl Slot<'_> {
    /// Keeps the first `n` cached positions and the checkpoints and rows within them.
    fn keep(&mut self, n: usize) {
        self.cached.truncate(n);
        self.checkpoints.retain(|c| c.n <= n);
        self.hidden.truncate(n * self.n_embd);
    }

    /// Positions whose final-norm rows the slot keeps.
    fn hidden_rows(&self) -> usize {
        self.hidden.len() / self.n_embd.max(1)
    }
}

/// The scheduler's state.
struct Scheduler<'t> {
    model: LoadedModel,
    tok: &'t Tokenizer,
    cfg: RuntimeConfig,
    slots: Vec<Slot<'t>>,
    shared: Arc<Shared>,
    clock: u64,
    n_vocab: usize,
    /// Values a row the MTP block pairs with: `n_embd`, or the width of the rows a separate
    /// draft file's block reads.
    row_width: usize,
    /// What slot files are tied to, worked out at the first save or restore (it reads samples
    /// of every weight).
    identity: Option<String>,
    /// How far back the model's state restores (its checkpoints, if it keeps per-sequence
    /// state); fixed at load.
    rewind: Rewind,
    cache: Option<PromptCache>,
    /// The vocabulary trie grammars mask with, built for the first request with a grammar.
    vocab: Option<Arc<bloomery_grammar::TokenTrie>>,
    /// The model's decision head, when it has one (jobs with `decide`).
    head: Option<DecisionHead>,
    /// Requests that ended since `/slots` was last published: their ending events go out
    /// after it ([`Scheduler::deliver`]).
    ended: Vec<Task<'t>>,
    /// What drafts generated tokens for the target to verify (none: drafting off).
    drafter: Option<Drafters>,
    /// A benchmark's fixed acceptance length (`--spec-synth-len`), forcing each verify step's
    /// verdict on the drafter's drafts.
    synth: Option<SynthAcceptance>,
    /// Drafts are verified by passes that keep every row's per-sequence state
    /// ([`LoadedModel::forward_verify`]), so a refused draft needs no second pass.
    row_states: bool,
    /// When the scheduler ends for idleness (`--sleep-idle-seconds`), and the clock it waits on.
    sleep: Option<(Duration, tokio::runtime::Runtime)>,
    /// What prices a generation step for the slots' drafting gates.
    costs: Box<dyn StepCosts>,
}

/// What a scheduler may start with besides its model and queue.
#[derive(Default)]
pub(crate) struct Extras {
    /// Drafts from here instead of the model's MTP block (tests and benchmarks).
    pub source: Option<Box<dyn DraftSource>>,
    /// What prices steps for the drafting gate instead of the wall clock (tests).
    pub costs: Option<Box<dyn StepCosts>>,
    /// Sleeping when idle.
    pub dozing: Option<Dozing>,
    /// A separate draft file's model (qwen4exp's MTP-only file, `-md`) whose block drafts,
    /// checked to fit the model ([`crate::spec::check_draft_model`]).
    pub draft: Option<LoadedModel>,
}

/// How a scheduler that sleeps when idle starts (`--sleep-idle-seconds`).
pub(crate) struct Dozing {
    /// Time with nothing running and no request after which the scheduler ends.
    pub after: Duration,
    /// The request that woke the model, taken before any other.
    pub first: Option<Request>,
}

/// Why the scheduler ended.
pub(crate) enum Ended {
    /// Every job sender is gone and nothing runs: the model back.
    Closed(Box<LoadedModel>),
    /// Idle for [`Dozing::after`]: the model, its slots and the prompt cache are freed; the
    /// queue back, with whatever came in since.
    Idle(mpsc::Receiver<Request>),
}

/// What the scheduler's wait for work ended with.
enum Intake {
    /// Work to run, or nothing to wait for.
    Go,
    /// Every job sender is gone and nothing runs.
    Closed,
    /// Nothing came for the sleep time.
    Idle,
}

/// Runs the scheduler on the current thread until every job sender is gone and nothing runs
/// (the model given back), or, with `dozing`, until it has been idle that long (the model freed).
pub(crate) fn run(
    mut model: LoadedModel,
    head: Option<DecisionHead>,
    tok: Arc<Tokenizer>,
    cfg: RuntimeConfig,
    jobs: mpsc::Receiver<Request>,
    shared: Arc<Shared>,
    extras: Extras,
) -> Ended {
    let Extras {
        source,
        costs,
        dozing,
        draft,
    } = extras;
    let rewind = model.rewind();
    let mut cfg = cfg;
    if source.is_none() {
        let arch = &model.spec.architecture;
        let spec = cfg.spec.for_model(arch);
        if spec.kind != SpecType::None && spec.n_max < cfg.spec.n_max {
            tracing::info!(
                "`{arch}`'s MTP layers draft at most {} token(s) a step: --spec-draft-n-max {} \
                 taken as {}",
                spec.n_max,
                cfg.spec.n_max,
                spec.n_max
            );
        }
        cfg.spec = spec;
    }
    if cfg.spec.synthetic() {
        tracing::warn!(
            "synthetic speculative acceptance is enabled for benchmarking; generated output is \
             not valid"
        );
    }
    let n_slots = model.options.n_slots as usize;
    let n_vocab = model.spec.hparams.n_vocab as usize;
    let n_embd = model.spec.hparams.n_embd as usize;
    // With a separate draft file both models' rows are the ones its block reads.
    if draft.is_some() && cfg.spec.kind == SpecType::DraftMtp {
        model.read_rows_from(NEXTN_HIDDEN);
    }
    let drafter = drafter_of(&model, cfg.spec, cfg.n_batch, (source, draft))
        .filter(|_| rollback_ready(&mut model, rewind));
    // A drafter drafts as `cfg.spec` lists (a test source in the last drafter's place).
    let gated_drafters = match drafter {
        Some(_) => cfg.spec.gated_drafters(true),
        None => Vec::new(),
    };
    let row_width = match drafter.as_ref().map(|d| &d.last) {
        Some(Drafter::Mtp(m)) => m.width(),
        _ => n_embd,
    };
    // A verify pass holds each slot's sampled token and its drafts, at most MAX_VERIFY_ROWS.
    let verify_rows = (n_slots * (cfg.spec.most() + 1)).min(MAX_VERIFY_ROWS as usize) as u32;
    let row_states =
        drafter.is_some() && rewind.per_sequence && row_states_ready(&mut model, verify_rows);
    let mut s = Scheduler {
        model,
        tok: &tok,
        cfg,
        slots: (0..n_slots)
            .map(|id| Slot {
                id,
                cached: Vec::new(),
                checkpoints: Vec::new(),
                task: None,
                last_used: 0,
                hidden: Vec::new(),
                n_embd,
                gates: gated_drafters.iter().map(|&d| Gate::new(d)).collect(),
                asked: None,
            })
            .collect(),
        shared,
        clock: 0,
        n_vocab,
        identity: None,
        rewind,
        cache: cfg.cache_ram.map(|b| PromptCache::new(b, rewind)),
        vocab: None,
        head,
        ended: Vec::new(),
        row_width,
        drafter,
        synth: SynthAcceptance::of(&cfg.spec),
        row_states,
        sleep: None,
        costs: costs.unwrap_or_else(|| Box::new(WallClock)),
    };
    let mut first = None;
    if let Some(d) = dozing {
        match tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
        {
            Ok(clock) => s.sleep = Some((d.after, clock)),
            // Not sleeping is safe: the server keeps serving.
            Err(e) => tracing::error!("the idle timer could not start ({e}): not sleeping"),
        }
        first = d.first;
    }
    s.publish();
    // After publishing the slots, so that /slots answers while the allocation runs.
    if s.cache.is_some() {
        if let Err(e) = s.model.reserve_snapshot_staging() {
            tracing::warn!("preparing the prompt cache's copies: {e}");
        }
    }
    if let Some(job) = first {
        s.take(job, 0);
    }
    match s.serve(jobs) {
        None => Ended::Closed(Box::new(s.model)),
        Some(jobs) => {
            s.forget();
            // The model, the decision head and the prompt cache go here, before the queue goes
            // back, so that a reload never overlaps the memory they held.
            drop(s);
            Ended::Idle(jobs)
        }
    }
}

impl<'t> Scheduler<'t> {
    /// Turns until every job sender is gone and nothing runs (`None`), or until idle for the
    /// sleep time (the queue back). A panic that no request's own guard caught (in a forward
    /// pass, which every running request shares) fails the running requests and the scheduler
    /// goes on: the thread outlives any request.
    fn serve(&mut self, mut jobs: mpsc::Receiver<Request>) -> Option<mpsc::Receiver<Request>> {
        loop {
            match catch_unwind(AssertUnwindSafe(|| self.turn(&mut jobs))) {
                Ok(Intake::Go) => {}
                Ok(Intake::Closed) => return None,
                Ok(Intake::Idle) => return Some(jobs),
                Err(panic) => {
                    let what = panic_message(panic.as_ref());
                    tracing::error!(
                        "the scheduler panicked outside any one request's work: {what}"
                    );
                    self.fail_all(&format!("internal error: {what}"));
                    self.publish();
                    self.deliver();
                }
            }
        }
    }

    /// Takes waiting jobs, ends what was cancelled or cut, and runs one pass; what the wait for
    /// work ended with.
    fn turn(&mut self, jobs: &mut mpsc::Receiver<Request>) -> Intake {
        match self.intake(jobs) {
            Intake::Go => {}
            other => return other,
        }
        self.cut_if_stopping();
        self.drop_cancelled();
        if self.slots.iter().all(|s| s.task.is_none()) {
            return Intake::Go;
        }
        if let Err(msg) = self.pass() {
            tracing::error!("a forward pass failed: {msg}");
            self.fail_all(&msg);
        }
        self.publish();
        self.deliver();
        Intake::Go
    }

    /// Waits for the next job while nothing runs: without a sleep time, until one comes or every
    /// sender is gone; with one, `None` once that long has passed since the wait began (or since
    /// a front end last [touched](Shared::touched) the timer) with no job.
    fn wait_job(&self, jobs: &mut mpsc::Receiver<Request>) -> Option<Option<Request>> {
        let Some((after, clock)) = &self.sleep else {
            return Some(jobs.blocking_recv());
        };
        let began = Instant::now();
        loop {
            let touched = self.shared.touched.lock().ok().and_then(|t| *t);
            let since = touched.map_or(began, |t| t.max(began));
            let Some(deadline) = since.checked_add(*after) else {
                // Further off than the clock reaches: never.
                return Some(jobs.blocking_recv());
            };
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                // A job that came in at the deadline is served rather than slept on.
                return match jobs.try_recv() {
                    Ok(j) => Some(Some(j)),
                    Err(mpsc::error::TryRecvError::Disconnected) => Some(None),
                    Err(mpsc::error::TryRecvError::Empty) => None,
                };
            }
            if let Ok(job) = clock.block_on(async {
                // The timer is made inside the runtime, whose clock drives it.
                tokio::time::timeout(left, jobs.recv()).await
            }) {
                return Some(job);
            }
        }
    }

    /// Before the model is freed for sleep: every slot shown empty (its cache goes with the
    /// model) and the prompt cache's gauges at zero.
    fn forget(&mut self) {
        for slot in &mut self.slots {
            slot.keep(0);
        }
        self.publish();
        let c = &self.shared.counters;
        c.cache_bytes.store(0, Ordering::Relaxed);
        c.cache_entries.store(0, Ordering::Relaxed);
        tracing::info!(
            "idle for {} s: freeing the model, its slots' caches and the prompt cache (sleeping)",
            self.sleep.as_ref().map_or(0, |(d, _)| d.as_secs())
        );
    }

    /// Sends the ending events of the requests that ended, once `/slots` (and so `/metrics`)
    /// shows their slots free.
    fn deliver(&mut self) {
        for task in self.ended.drain(..) {
            if let Some(e) = task.end {
                let _ = task.job.events.send(e);
            }
        }
    }

    /// At the end of a shutdown's drain: ends every running request as shutting down and logs
    /// what each had done.
    fn cut_if_stopping(&mut self) {
        if !self.shared.stop.load(Ordering::Relaxed) {
            return;
        }
        let mut cut = 0;
        for slot in &mut self.slots {
            let Some(task) = slot.task.take() else {
                continue;
            };
            cut += 1;
            let n_prompt = task.job.prompt.len();
            tracing::warn!(
                "shutdown: slot {} cut at its deadline after {} of {} prompt tokens and {} generated",
                slot.id,
                task.n_past.min(n_prompt),
                n_prompt,
                task.generated
            );
            self.ended.push(Task {
                end: Some(Event::Failed(shutting_down())),
                ..task
            });
        }
        if cut > 0 {
            self.publish();
            self.deliver();
        }
    }

    /// Moves waiting jobs into free slots; blocks when nothing runs, until a job comes, every
    /// sender is gone ([`Intake::Closed`]) or the sleep time passes ([`Intake::Idle`]).
    fn intake(&mut self, jobs: &mut mpsc::Receiver<Request>) -> Intake {
        loop {
            if !self.slots.iter().any(|s| s.task.is_none()) {
                break;
            }
            let idle = self.slots.iter().all(|s| s.task.is_none());
            let job = if idle {
                match self.wait_job(jobs) {
                    Some(Some(j)) => j,
                    Some(None) => return Intake::Closed,
                    None => return Intake::Idle,
                }
            } else {
                match jobs.try_recv() {
                    Ok(j) => j,
                    Err(mpsc::error::TryRecvError::Empty) => break,
                    Err(mpsc::error::TryRecvError::Disconnected) => break,
                }
            };
            self.take(job, jobs.len());
        }
        Intake::Go
    }

    /// Takes one job off the queue (`waiting` more behind it).
    fn take(&mut self, job: Request, waiting: usize) {
        self.shared
            .counters
            .deferred
            .store(waiting as u64, Ordering::Relaxed);
        match job {
            Request::Generate(job) => self.assign(*job),
            Request::GenerateTogether(jobs) => {
                for job in jobs {
                    self.assign(job);
                }
            }
            Request::ResidencyReset(reply) => {
                self.model.reset_residency();
                let _ = reply.send(self.model.residency_stats().is_some());
            }
            Request::Slot(cmd) => {
                let id = cmd.id;
                let result = catch_unwind(AssertUnwindSafe(|| self.slot_command(id, cmd.action)))
                    .unwrap_or_else(|panic| {
                        let what = panic_message(panic.as_ref());
                        tracing::error!("slot {id}: a slot action panicked: {what}");
                        // Its state may be half-written.
                        if let Some(slot) = self.slots.get_mut(id) {
                            slot.keep(0);
                        }
                        Err(format!("internal error: {what}"))
                    });
                // /slots shows the action's effect by the time its answer is read.
                self.publish();
                let _ = cmd.reply.send(result);
            }
        }
    }

    /// Saves, restores or erases a slot that is not running a request.
    fn slot_command(&mut self, id: usize, action: SlotAction) -> Result<SlotReply, String> {
        let started = Instant::now();
        let slot = self
            .slots
            .get(id)
            .ok_or_else(|| format!("no slot {id} ({} slots)", self.slots.len()))?;
        if slot.task.is_some() {
            return Err(format!("slot {id} is busy"));
        }
        let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
        match action {
            SlotAction::Erase => {
                let n = slot.cached.len();
                self.slots[id].keep(0);
                Ok(SlotReply {
                    n_tokens: n,
                    n_bytes: 0,
                    ms: ms(started),
                })
            }
            SlotAction::Save(path) => {
                let tokens = slot.cached.clone();
                let parts = self
                    .model
                    .read_slot(id as u32, tokens.len() as u32)
                    .map_err(|e| e.to_string())?;
                let file = SlotFile {
                    identity: self.identity().to_owned(),
                    tokens,
                    parts,
                };
                let n_bytes = file.write(&path).map_err(|e| e.to_string())?;
                Ok(SlotReply {
                    n_tokens: file.tokens.len(),
                    n_bytes,
                    ms: ms(started),
                })
            }
            SlotAction::Restore(path) => {
                let (file, n_bytes) =
                    SlotFile::read(&path, self.identity()).map_err(|e| e.to_string())?;
                if file.tokens.len() >= self.cfg.n_ctx_slot {
                    return Err(format!(
                        "the saved slot holds {} tokens; a slot's context here holds {}",
                        file.tokens.len(),
                        self.cfg.n_ctx_slot
                    ));
                }
                if let Some(&bad) = file.tokens.iter().find(|&&t| t as usize >= self.n_vocab) {
                    return Err(format!(
                        "the saved slot holds token {bad}, outside the vocabulary"
                    ));
                }
                if let Some(old) = self.capture(id, 0) {
                    self.store(id, old);
                }
                self.slots[id].keep(0);
                self.model
                    .write_slot(
                        id as u32,
                        file.tokens.len() as u32,
                        file.tokens.len() as u32,
                        &file.parts,
                        None,
                    )
                    .map_err(|e| e.to_string())?;
                let n = file.tokens.len();
                self.slots[id].cached = file.tokens;
                Ok(SlotReply {
                    n_tokens: n,
                    n_bytes,
                    ms: ms(started),
                })
            }
        }
    }

    /// Starts `job` in the slot it asked for, or the free slot whose cache shares the longest
    /// prefix with its prompt (the least recently used among equals). A panic while the request
    /// is set up fails that request alone and forgets its slot's cache (which it may have
    /// half-written).
    fn assign(&mut self, job: Job) {
        if job.events.is_closed() {
            return;
        }
        let id = match self.choose(&job) {
            Ok(id) => id,
            Err(failure) => {
                let _ = job.events.send(Event::Failed(failure));
                return;
            }
        };
        let events = job.events.clone();
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| self.start(id, job))) {
            let what = panic_message(panic.as_ref());
            tracing::error!("slot {id}: setting up a request panicked: {what}");
            let slot = &mut self.slots[id];
            slot.task = None;
            slot.keep(0);
            let _ = events.send(Event::Failed(Failure::new(
                FailureKind::Internal,
                format!("internal error: {what}"),
            )));
        }
    }

    /// The slot `job` goes to, or why it cannot run.
    fn choose(&self, job: &Job) -> Result<usize, Failure> {
        if self.shared.stop.load(Ordering::Relaxed) {
            return Err(shutting_down());
        }
        if job.decide.is_some() && self.head.is_none() {
            return Err(Failure::new(
                FailureKind::Invalid,
                "this model has no decision head",
            ));
        }
        // A generation needs a position for its first token; an embedding or a decision may
        // fill the slot.
        let generates = job.generates();
        if !generates && self.model.rows_name() != FINAL_NORM {
            return Err(Failure::new(
                FailureKind::Invalid,
                "embeddings and decisions are not served while a separate MTP draft file drafts \
                 (the passes read the rows its block pairs with, not the final-norm rows)",
            ));
        }
        if generates && !job.params.prompt_only && !self.model.output_head {
            return Err(Failure::new(
                FailureKind::Invalid,
                format!(
                    "this model (`{}`) has no output head, so it cannot generate text: a decision \
                     model answers POST /v1/systemone",
                    self.model.spec.architecture
                ),
            ));
        }
        let room = self.cfg.n_ctx_slot.saturating_sub(usize::from(generates));
        if job.prompt.is_empty() || job.prompt.len() > room {
            return Err(Failure::new(
                FailureKind::Invalid,
                format!(
                    "the prompt has {} tokens; a slot's context holds {}",
                    job.prompt.len(),
                    self.cfg.n_ctx_slot
                ),
            ));
        }
        let free = |s: &&Slot| s.task.is_none();
        let chosen = match job.id_slot {
            Some(id) => match self.slots.get(id) {
                Some(s) if s.task.is_none() => Some(id),
                // Asked-for slot busy: any free slot instead, as llama-server does.
                Some(_) => self.slots.iter().find(free).map(|s| s.id),
                None => {
                    return Err(Failure::new(
                        FailureKind::Invalid,
                        format!("id_slot {id} does not exist ({} slots)", self.slots.len()),
                    ))
                }
            },
            None => self.most_similar(job).or_else(|| {
                // The least recently used; the last among equals, as llama-server's loop.
                self.slots
                    .iter()
                    .filter(free)
                    .max_by_key(|s| std::cmp::Reverse(s.last_used))
                    .map(|s| s.id)
            }),
        };
        chosen.ok_or_else(|| Failure::new(FailureKind::Internal, "no slot is free"))
    }

    /// The free slot whose cache shares the largest fraction of `job`'s prompt, if that is
    /// above `slot_similarity` (llama-server b11434's `get_available_slot`: the first of equals).
    /// A request that does not reuse its prefix (`cache_prompt` false) keeps the caches it
    /// could not use: none.
    fn most_similar(&self, job: &Job) -> Option<usize> {
        let threshold = self.cfg.slot_similarity;
        if threshold == 0.0 || !job.params.cache_prompt {
            return None;
        }
        let mut best: Option<(usize, f32)> = None;
        for s in self
            .slots
            .iter()
            .filter(|s| s.task.is_none() && !s.cached.is_empty())
        {
            let f = common_prefix(&s.cached, &job.prompt) as f32 / job.prompt.len() as f32;
            if f > threshold && best.is_none_or(|(_, b)| f > b) {
                best = Some((s.id, f));
            }
        }
        best.map(|(id, _)| id)
    }

    /// Runs `job` in free slot `id`: its prefix kept or restored, its sampler primed with the
    /// prompt.
    fn start(&mut self, id: usize, job: Job) {
        self.clock += 1;
        self.slots[id].last_used = self.clock;
        // The prompt's time includes restoring a saved prefix.
        let started = Instant::now();
        // An embedding reads rows of its whole prompt: no cached prefix stands in for them. A
        // decision reuses a prefix whose rows are kept.
        let reuse = job.params.cache_prompt && job.embed.is_none();
        let rows = job.decide.is_some();
        // A decision's kept rows stay where they were evaluated: no chunk of it moves.
        let n_cache_reuse = if rows {
            0
        } else {
            job.params.shift.n_cache_reuse
        };
        let keep = self.prepare_slot(id, &job.prompt, reuse, n_cache_reuse, rows);
        if let Some(d) = self.drafter.as_mut() {
            d.begin(id, &job.prompt, keep == 0);
        }
        // The penalty window never holds more than a slot's context: a longer one (a client's
        // -1 read as "all") is the whole context, not an allocation of its length.
        let mut params = job.params.sampler.clone();
        params.penalty_last_n = params.penalty_last_n.min(self.cfg.n_ctx_slot);
        params.dry_penalty_last_n = params.dry_penalty_last_n.min(self.cfg.n_ctx_slot);
        let mut sampler = Sampler::new(params, self.n_vocab);
        if job.params.post_sampling_probs && job.params.n_probs > 0 {
            sampler.keep_candidates();
        }
        for &t in &job.prompt {
            sampler.accept(t);
        }
        self.shared
            .counters
            .cached_tokens
            .fetch_add(keep as u64, Ordering::Relaxed);
        let _ = job.events.send(Event::Started {
            id_slot: id,
            n_cached: keep,
        });
        if job.params.return_progress {
            let _ = job.events.send(Event::PromptProgress(PromptProgress {
                total: job.prompt.len(),
                cache: keep,
                processed: keep,
                elapsed_ms: 0.0,
            }));
        }
        let stop = StopScan::new(job.params.stop.clone());
        let grammar = job.params.grammar.as_ref().map(|spec| {
            let vocab = self
                .vocab
                .get_or_insert_with(|| token_trie(self.tok, self.n_vocab))
                .clone();
            Constraint::new(spec, vocab)
        });
        let budget = job.params.reasoning_budget.as_ref().map(Budget::new);
        let decoder =
            StreamDecoder::new(self.tok, job.params.special).preserving(&job.params.preserved);
        let job_seed = job.params.sampler.seed as u32;
        let slot = &mut self.slots[id];
        slot.task = Some(Task {
            job,
            n_past: keep,
            n_cached: keep,
            sampler,
            decoder,
            stop,
            generated: 0,
            next: Vec::new(),
            draft: 0,
            n_drafted: 0,
            n_accepted: 0,
            spec_by: None,
            synth_rng: self.synth.as_ref().map(|_| Mt19937::new(job_seed)),
            grammar,
            budget,
            started,
            first_token: None,
            probs_scratch: Vec::new(),
            rows: Vec::new(),
            shifted: false,
            end: None,
        });
    }

    /// Leaves in slot `id` the longest prefix of `prompt` it can have without evaluating it: its
    /// own cached prefix (with runs of at least `n_cache_reuse` cached tokens the prompt holds
    /// further on moved after it, when that is not 0) or one restored from the prompt cache,
    /// whichever is longer. What the
    /// slot held is saved to the prompt cache before any of it is overwritten. Returns the
    /// prefix's length, always short of the whole prompt: the last prompt token is evaluated,
    /// its logits give the first token. With `rows` (a decision) the prefix is one whose
    /// final-norm rows are kept, and the slot's rows cover it.
    fn prepare_slot(
        &mut self,
        id: usize,
        prompt: &[u32],
        cache_prompt: bool,
        n_cache_reuse: usize,
        rows: bool,
    ) -> usize {
        let limit = prompt.len() - 1;
        let rule = self.rewind;
        let slot = &self.slots[id];
        let own_limit = if rows {
            limit.min(slot.hidden_rows())
        } else {
            limit
        };
        let (own, own_checkpoint) = if cache_prompt {
            rule.reach(
                slot.cached.len(),
                slot.checkpoints.iter().map(|c| c.n),
                common_prefix(&slot.cached, prompt).min(own_limit),
            )
        } else {
            (0, None)
        };
        let from_cache = match &self.cache {
            Some(c) if cache_prompt => c.best(prompt, limit, rows).filter(|&(_, n)| n > own),
            _ => None,
        };
        // The slot's state is copied out first and stored last, so that making room for it
        // cannot evict the entry being restored. It is worth a copy only when the request
        // discards a real part of it: not when it keeps all but a few tokens (a regenerated
        // answer), since those stay in the slot.
        let held = slot.cached.len();
        let lost = if from_cache.is_some() {
            held
        } else {
            held - own
        };
        let old = if lost > 0 && lost * 8 >= held {
            self.capture(id, if from_cache.is_some() { 0 } else { own })
        } else {
            None
        };
        let keep = match (from_cache, self.cache.as_mut()) {
            (Some((i, n)), Some(cache)) => {
                let state = cache.touch(i);
                // Once writing starts the slot's old state is gone, whatever the outcome.
                self.slots[id].keep(0);
                let saved = state.tokens.len() as u32;
                let checkpoint = state
                    .reach(rule, n)
                    .1
                    .map(|c| state.checkpoints[c].parts.as_slice());
                match self
                    .model
                    .write_slot(id as u32, n as u32, saved, &state.parts, checkpoint)
                {
                    Ok(()) => {
                        let slot = &mut self.slots[id];
                        slot.cached = state.tokens[..n].to_vec();
                        let kept = n.min(state.hidden_rows) * slot.n_embd;
                        slot.hidden = state.hidden[..kept].to_vec();
                        slot.checkpoints = state
                            .checkpoints
                            .iter()
                            .filter(|c| c.n <= n)
                            .cloned()
                            .collect();
                        let c = &self.shared.counters;
                        c.cache_restores.fetch_add(1, Ordering::Relaxed);
                        c.cache_restored_tokens
                            .fetch_add(n as u64, Ordering::Relaxed);
                        tracing::debug!("slot {id}: restored {n} positions from the prompt cache");
                        n
                    }
                    Err(e) => {
                        tracing::warn!("slot {id}: restoring a saved prompt state failed: {e}");
                        0
                    }
                }
            }
            _ => {
                let keep = match own_checkpoint {
                    Some(c) => {
                        let parts = &self.slots[id].checkpoints[c].parts;
                        match self.model.write_checkpoint(id as u32, parts) {
                            Ok(()) => {
                                tracing::debug!("slot {id}: back to its checkpoint at {own}");
                                own
                            }
                            Err(e) => {
                                tracing::warn!("slot {id}: restoring a checkpoint failed: {e}");
                                0
                            }
                        }
                    }
                    None if cache_prompt && n_cache_reuse > 0 => {
                        self.reuse_chunks(id, prompt, own, n_cache_reuse)
                    }
                    None => own,
                };
                self.slots[id].keep(keep);
                keep
            }
        };
        if let Some(state) = old {
            self.store(id, state);
        }
        keep
    }

    /// llama-server's cache reuse: after the `keep` positions slot `id` shares with `prompt`,
    /// each run of at least `min` cached tokens that the prompt holds further on, in order,
    /// is moved down to where the prompt has it (keys rotated by the move) rather than
    /// evaluated again. Returns the positions the slot now holds for the prompt (short of its
    /// last token, whose logits give the first token). A model whose cache cannot move keeps
    /// `keep` (`--cache-reuse` is refused at start for it).
    fn reuse_chunks(&mut self, id: usize, prompt: &[u32], keep: usize, min: usize) -> usize {
        if self.model.shift_refusal().is_some() {
            return keep;
        }
        let limit = prompt.len() - 1;
        let slot = &mut self.slots[id];
        let (mut head_c, mut head_p) = (keep, keep);
        while head_c < slot.cached.len() && head_p < limit {
            let n = slot.cached[head_c..]
                .iter()
                .zip(&prompt[head_p..limit])
                .take_while(|(a, b)| a == b)
                .count();
            if n < min || n == 0 {
                head_c += 1;
                continue;
            }
            if let Err(e) =
                self.model
                    .move_positions(id as u32, head_c as u32, head_p as u32, n as u32)
            {
                tracing::warn!("slot {id}: reusing a cached chunk failed: {e}");
                break;
            }
            tracing::debug!(
                "slot {id}: reusing {n} cached tokens, [{head_c}, {}) -> [{head_p}, {})",
                head_c + n,
                head_p + n
            );
            slot.cached.copy_within(head_c..head_c + n, head_p);
            head_c += n;
            head_p += n;
        }
        slot.keep(head_p);
        head_p
    }

    /// The model identity slot files carry.
    fn identity(&mut self) -> &str {
        self.identity.get_or_insert_with(|| self.model.identity())
    }

    /// Slot `id`'s tokens and state, when there is a prompt cache that lacks them. The slot goes
    /// on with at most its first `keep` positions: the final-norm rows and checkpoints past them
    /// move into the saved state instead of being copied (a decision's rows on Clef-Flash are
    /// 16 KiB a position, a checkpoint about 50 MB).
    fn capture(&mut self, id: usize, keep: usize) -> Option<SavedState> {
        let cache = self.cache.as_ref()?;
        let slot = &self.slots[id];
        let n = slot.cached.len();
        if n == 0 || cache.covers(&slot.cached, slot.hidden_rows()) {
            return None;
        }
        let started = Instant::now();
        let parts = match self.model.read_slot(id as u32, n as u32) {
            Ok(parts) => parts,
            Err(e) => {
                tracing::warn!("slot {id}: saving its state to the prompt cache failed: {e}");
                return None;
            }
        };
        tracing::debug!(
            "slot {id}: copied its {n} positions out in {:.2} ms",
            started.elapsed().as_secs_f64() * 1e3
        );
        let slot = &mut self.slots[id];
        let hidden_rows = slot.hidden_rows();
        let hidden = std::mem::take(&mut slot.hidden);
        let checkpoints = std::mem::take(&mut slot.checkpoints);
        // Checkpoints are in the order of their positions, so those kept keep their indices.
        slot.hidden = hidden[..keep.min(hidden_rows) * slot.n_embd].to_vec();
        slot.checkpoints = checkpoints
            .iter()
            .filter(|c| c.n <= keep)
            .cloned()
            .collect();
        Some(SavedState {
            tokens: slot.cached.clone(),
            hidden,
            hidden_rows,
            parts,
            checkpoints: checkpoints.into_iter().filter(|c| c.n < n).collect(),
        })
    }

    /// Keeps a state captured from slot `id` in the prompt cache.
    fn store(&mut self, id: usize, state: SavedState) {
        let Some(cache) = self.cache.as_mut() else {
            return;
        };
        let n = state.tokens.len();
        let c = &self.shared.counters;
        match cache.insert(state) {
            Inserted::Stored { evicted, .. } => {
                c.cache_saves.fetch_add(1, Ordering::Relaxed);
                c.cache_evictions
                    .fetch_add(evicted as u64, Ordering::Relaxed);
                tracing::debug!("slot {id}: saved {n} positions to the prompt cache");
            }
            Inserted::TooLarge => {
                tracing::debug!("slot {id}: its state of {n} positions exceeds --cache-ram");
            }
            Inserted::Covered => {}
        }
        c.cache_bytes.store(cache.bytes(), Ordering::Relaxed);
        c.cache_entries.store(cache.len() as u64, Ordering::Relaxed);
    }

    /// Frees the slots of requests whose clients went away, and shows it in `/slots` (when that
    /// leaves every slot idle, the next turn waits for a job without a pass to publish it).
    fn drop_cancelled(&mut self) {
        let mut dropped = false;
        for slot in &mut self.slots {
            if slot.task.as_ref().is_some_and(|t| t.job.events.is_closed()) {
                tracing::info!("slot {}: client went away, request cancelled", slot.id);
                // K/V of a half-evaluated prompt chunk are still valid up to `cached`.
                slot.task = None;
                dropped = true;
            }
        }
        if dropped {
            self.publish();
        }
    }

    /// Ends every running request with `msg` and forgets every slot's cache (its K/V may be
    /// half-written).
    fn fail_all(&mut self, msg: &str) {
        for slot in &mut self.slots {
            if let Some(task) = slot.task.take() {
                let failure = Failure::new(FailureKind::Internal, msg);
                self.ended.push(Task {
                    end: Some(Event::Failed(failure)),
                    ..task
                });
            }
            slot.keep(0);
        }
    }

    /// Hands the hashed n-gram table rows of every slot's next tokens to the model's prefetch
    /// thread: their row ids depend only on tokens, known once sampled, so the next pass finds
    /// the rows gathered (`bloomery_exec::ngram_table`). Nothing for a model without tables, or
    /// with `BLOOMERY_NGRAM_PREFETCH=0` (to measure the gather a pass waits for without it).
    fn prefetch_ngram_rows(&self) {
        let Some(n) = self.model.spec.ngram.as_ref().into_option() else {
            return;
        };
        if std::env::var_os("BLOOMERY_NGRAM_PREFETCH").is_some_and(|v| v == "0") {
            return;
        }
        let mut ids = Vec::new();
        for slot in &self.slots {
            if let Some(task) = slot.task.as_ref().filter(|t| !t.next.is_empty()) {
                n.extend_rows(&slot.cached, &task.next, &mut ids);
            }
        }
        self.model.prefetch_ngram(&ids);
    }

    /// One forward pass over the next token of every generating slot and as much prompt as fits.
    fn pass(&mut self) -> Result<(), String> {
        let began = Instant::now();
        let mut batch = BatchInputs {
            tokens: Vec::new(),
            positions: Vec::new(),
            slots: Vec::new(),
            output_rows: Vec::new(),
            ngram_rows: Vec::new(),
            logit_rows: vec![],
        };
        if self.cfg.context_shift {
            self.shift_full_slots();
        }
        // A model with a hashed n-gram table reads each row's row ids, hashed here from the
        // slot's record of its sequence.
        let ngram = self.model.spec.ngram.clone().into_option();
        let mut plan: Vec<Planned> = Vec::new();
        // What the output rows read back: logits for generations, final-norm rows for
        // embeddings, and with the MTP block drafting, every generation row's final-norm row.
        let (mut logits, mut embeddings) = (false, false);
        let reads_rows = self.drafter.as_ref().is_some_and(Drafters::reads_rows);
        // Slots whose drafted tokens this pass evaluates, with their first row: a refused draft
        // rolls back to the state of its last kept row, which a verify pass keeps, or else to
        // the state saved on the device before the pass.
        let mut drafting: Vec<(usize, usize)> = Vec::new();
        // Generated tokens first: one row per slot, or a run schemajump forced as one chunk
        // (split over passes when it does not fit; its last row gives the next logits), then
        // the slot's drafted tokens, each row an output that verifies the next. A draft that
        // does not fit the pass is dropped, being only a guess.
        for slot in &mut self.slots {
            let Some(task) = &mut slot.task else { continue };
            if task.next.is_empty() {
                continue;
            }
            let room = self.cfg.n_batch.saturating_sub(batch.tokens.len()).max(1);
            let committed = task.next.len() - task.draft;
            if task.next.len() > room {
                let keep = room.max(committed);
                task.next.truncate(keep);
                task.draft = keep - committed;
            }
            let take = task.next.len().min(room);
            let start = slot.cached.len();
            let first_row = batch.tokens.len();
            for (i, &t) in task.next[..take].iter().enumerate() {
                batch.tokens.push(t as i32);
                batch.positions.push((start + i) as i32);
                batch.slots.push(slot.id as i32);
            }
            if let Some(n) = &ngram {
                n.extend_rows(&slot.cached, &task.next[..take], &mut batch.ngram_rows);
            }
            let outputs = if take == task.next.len() {
                task.draft + 1
            } else {
                0
            };
            // A slot whose gate has drafting off reads its rows only when its next drafting
            // probe is near enough for the block to take them in then (MAX_BEHIND).
            let rows_read = reads_rows
                && slot
                    .gates
                    .last()
                    .is_none_or(|g| g.rows_wanted(MAX_BEHIND as u32));
            let read = if rows_read { take } else { outputs };
            let end = batch.tokens.len() as i32;
            batch.output_rows.extend(end - read as i32..end);
            logits |= outputs > 0;
            embeddings |= rows_read;
            if outputs > 1 && self.rewind.per_sequence {
                drafting.push((slot.id, first_row));
            }
            plan.push(Planned {
                id: slot.id,
                tokens: task.next[..take].to_vec(),
                outputs,
                read,
                step: committed == 1 && take == task.next.len(),
                rows: rows_read,
            });
        }
        // Prompts go in in the order their requests came, so that a pass holding several
        // finishes the oldest first and no request waits behind one that came after it (in
        // slot order, a low slot that took request after request starved the higher ones).
        let mut waiting: Vec<&Slot> = self
            .slots
            .iter()
            .filter(|s| s.task.as_ref().is_some_and(|t| t.next.is_empty()))
            .collect();
        waiting.sort_by_key(|s| s.last_used);
        for slot in waiting {
            let Some(task) = &slot.task else { continue };
            let room = self.cfg.n_batch.saturating_sub(batch.tokens.len());
            if room == 0 {
                break;
            }
            let prompt = &task.job.prompt;
            let rest = &prompt[task.n_past..];
            let mut take = rest.len().min(room);
            // A decision's chunk ends where the part other decisions may share ends, so that
            // point is checkpointed (a hybrid model's recurrent state cannot be rewound to it).
            if let Some(d) = task
                .job
                .decide
                .as_ref()
                .filter(|_| self.rewind.per_sequence)
            {
                if task.n_past < d.shared {
                    take = take.min(d.shared - task.n_past);
                }
            }
            let start = slot.cached.len();
            let first_row = batch.tokens.len();
            for (i, &t) in rest[..take].iter().enumerate() {
                batch.tokens.push(t as i32);
                batch.positions.push((start + i) as i32);
                batch.slots.push(slot.id as i32);
            }
            if let Some(n) = &ngram {
                n.extend_rows(&slot.cached, &rest[..take], &mut batch.ngram_rows);
            }
            let last = take == rest.len();
            let mut read = None;
            let outputs = match task.job.embed {
                // A decision reads every row.
                None if task.job.decide.is_some() => {
                    batch
                        .output_rows
                        .extend((first_row..first_row + take).map(|i| i as i32));
                    embeddings = true;
                    take
                }
                // The MTP block takes in every row of a generation's prompt.
                None if reads_rows => {
                    batch
                        .output_rows
                        .extend((first_row..first_row + take).map(|i| i as i32));
                    embeddings = true;
                    logits |= last;
                    read = Some(take);
                    usize::from(last)
                }
                // An embedding reads its pooling's rows of every chunk.
                Some(pooling) => {
                    let read = (0..take).filter(|&i| pooling.reads(task.n_past + i, prompt.len()));
                    let before = batch.output_rows.len();
                    batch
                        .output_rows
                        .extend(read.map(|i| (first_row + i) as i32));
                    embeddings |= batch.output_rows.len() > before;
                    batch.output_rows.len() - before
                }
                // A prompt-only request to a model without an output head reads nothing.
                None if last && !self.model.output_head => 0,
                None if last => {
                    batch.output_rows.push(batch.tokens.len() as i32 - 1);
                    logits = true;
                    1
                }
                None => 0,
            };
            plan.push(Planned {
                id: slot.id,
                tokens: rest[..take].to_vec(),
                outputs,
                rows: read.is_some(),
                read: read.unwrap_or(outputs),
                step: false,
            });
        }
        if batch.tokens.is_empty() {
            return Ok(());
        }
        // Drafts are verified by a pass that keeps every row's state where the model's verify
        // graph does and the rows fit; otherwise each drafting slot's state is saved first.
        let verify = self.row_states
            && !drafting.is_empty()
            && batch.tokens.len() <= self.model.verify_rows() as usize;
        if !verify {
            for &(id, _) in &drafting {
                self.model
                    .save_sequence(id as u32)
                    .map_err(|e| format!("slot {id}: saving its state before a draft: {e}"))?;
            }
        }
        // The output head runs on each generation's last `outputs` rows. Where the pass also
        // reads other rows' final-norm rows (the MTP block taking in a prompt's rows), it runs
        // on those alone: the logits of every row of a long prompt are its larger part.
        let mut logit_at = Vec::with_capacity(plan.len());
        let mut row = 0;
        for p in &plan {
            logit_at.push(batch.logit_rows.len());
            let generates = self.slots[p.id]
                .task
                .as_ref()
                .is_some_and(|t| t.job.generates());
            if generates {
                let rows = row + p.read - p.outputs..row + p.read;
                batch.logit_rows.extend(rows.map(|r| r as i32));
            }
            row += p.read;
        }
        let split = logits && embeddings && batch.logit_rows.len() < batch.output_rows.len();
        let readout = match split {
            true => Readout::Split(batch.logit_rows.len() as u32),
            false => {
                batch.logit_rows.clear();
                Readout::of(logits, embeddings)
            }
        };
        let t0 = Instant::now();
        let read = match verify {
            true => self.model.forward_verify(&batch, readout),
            false => self.model.forward_reading(&batch, readout),
        }
        .map_err(|e| e.to_string())?;
        let (logits, rows) = (read.logits, read.embeddings);
        let n_embd = self.model.spec.hparams.n_embd as usize;
        let row_width = self.row_width;
        let us = t0.elapsed().as_micros() as u64;
        tracing::trace!(
            "a pass of {} rows, {} outputs: {:.2} ms",
            batch.tokens.len(),
            batch.output_rows.len(),
            us as f64 / 1e3
        );
        let c = &self.shared.counters;
        if let Some(s) = self.model.residency_stats() {
            c.routed_card.store(s.card, Ordering::Relaxed);
            c.routed_host.store(s.host, Ordering::Relaxed);
            c.routed_bus.store(s.bus, Ordering::Relaxed);
            c.residency_flips.store(s.flips, Ordering::Relaxed);
        }
        if let Some(d) = self.model.disk_stats() {
            c.disk_reads.store(d.reads, Ordering::Relaxed);
            c.disk_prefetched.store(d.prefetched, Ordering::Relaxed);
            c.disk_prefetch_hits
                .store(d.prefetch_hits, Ordering::Relaxed);
        }
        c.decode_calls.fetch_add(1, Ordering::Relaxed);
        c.pass_read_bytes
            .fetch_add(4 * (logits.len() + rows.len()) as u64, Ordering::Relaxed);
        if plan.iter().any(|p| p.rows) {
            c.row_read_passes.fetch_add(1, Ordering::Relaxed);
        }
        c.busy_slot_passes
            .fetch_add(plan.len() as u64, Ordering::Relaxed);
        let n_prompt_rows: usize = plan
            .iter()
            .filter(|p| {
                self.slots[p.id]
                    .task
                    .as_ref()
                    .is_some_and(|t| t.next.is_empty())
            })
            .map(|p| p.tokens.len())
            .sum();
        let n_rows = batch.tokens.len().max(1);
        c.prompt_tokens
            .fetch_add(n_prompt_rows as u64, Ordering::Relaxed);
        c.prompt_us
            .fetch_add(us * n_prompt_rows as u64 / n_rows as u64, Ordering::Relaxed);
        c.predicted_us.fetch_add(
            us * (n_rows - n_prompt_rows) as u64 / n_rows as u64,
            Ordering::Relaxed,
        );
        let mut out = 0;
        let checkpoints = self.rewind.per_sequence;
        // Decisions whose prompt this pass ended.
        let mut decided = Vec::new();
        // Generation rows the MTP block takes in: (slot, first position, tokens, first output
        // row, rows kept).
        let mut taken: Vec<(usize, usize, Vec<u32>, usize, usize)> = Vec::new();
        // Slots whose refused drafts roll back: (slot, first position of the pass), or after a
        // verify pass (slot, the row whose state it keeps).
        let mut refused: Vec<(usize, usize)> = Vec::new();
        let mut keep_rows: Vec<(usize, usize)> = Vec::new();
        // Generation steps the drafting gates weigh: (slot, the drafter's place in the chain
        // where one drafted, tokens drafted, tokens kept).
        let mut steps: Vec<(usize, Option<usize>, usize, usize)> = Vec::new();
        for (
            Planned {
                id,
                tokens: toks,
                outputs,
                read,
                step: is_step,
                rows: rows_read,
            },
            logit_first,
        ) in plan.into_iter().zip(logit_at)
        {
            let base = out;
            out += read;
            let has_output = outputs > 0;
            let slot = &mut self.slots[id];
            let start = slot.cached.len();
            slot.cached.extend_from_slice(&toks);
            let Some(task) = slot.task.as_mut() else {
                continue;
            };
            let generates = task.job.generates();
            if rows_read && generates {
                taken.push((id, start, toks.clone(), base, toks.len()));
            }
            if task.next.is_empty() {
                task.n_past += toks.len();
                if task.job.params.return_progress {
                    let _ = task.job.events.send(Event::PromptProgress(PromptProgress {
                        total: task.job.prompt.len(),
                        cache: task.n_cached,
                        processed: task.n_past,
                        elapsed_ms: task.started.elapsed().as_secs_f64() * 1e3,
                    }));
                }
                let n = slot.cached.len();
                let since = n - slot.checkpoints.last().map_or(0, |c| c.n);
                // A request that generates nothing (a decision, an embedding) leaves the state
                // where its prompt ends, and a later request restores a whole state without a
                // checkpoint: one there would be a copy of the per-sequence state (Clef-Flash's
                // is about 50 MB) that nothing reads.
                let ended = task.n_past == task.job.prompt.len() && generates;
                let at_shared = task
                    .job
                    .decide
                    .as_ref()
                    .is_some_and(|d| d.shared > 0 && d.shared == task.n_past);
                if checkpoints
                    && self.cfg.max_checkpoints > 0
                    && task.job.params.cache_prompt
                    && (ended
                        || at_shared
                        || (self.cfg.checkpoint_every > 0 && since >= self.cfg.checkpoint_every))
                {
                    match self.model.read_checkpoint(id as u32) {
                        Ok(parts) => {
                            if slot.checkpoints.len() >= self.cfg.max_checkpoints {
                                slot.checkpoints.remove(0);
                            }
                            slot.checkpoints.push(Checkpoint { n, parts });
                        }
                        Err(e) => tracing::warn!("slot {id}: taking a checkpoint failed: {e}"),
                    }
                }
            }
            if !task.next.is_empty() {
                task.next.drain(..toks.len());
            }
            if task.job.decide.is_some() {
                let first = slot.cached.len() - toks.len();
                let held = slot.hidden.len() / n_embd.max(1);
                let ended = task.n_past == task.job.prompt.len();
                if held == first {
                    slot.hidden
                        .extend_from_slice(&rows[base * n_embd..(base + outputs) * n_embd]);
                    if ended {
                        decided.push(id);
                    }
                } else {
                    // Rows for a prefix the slot does not hold cannot happen: prepare_slot
                    // keeps only a prefix with rows. Refuse rather than misread.
                    let failure = Failure::new(
                        FailureKind::Internal,
                        format!("slot {id}: final-norm rows for {held} of {first} positions"),
                    );
                    if let Some(task) = slot.task.take() {
                        self.ended.push(Task {
                            end: Some(Event::Failed(failure)),
                            ..task
                        });
                    }
                    slot.keep(0);
                }
                continue;
            }
            if let Some(pooling) = task.job.embed {
                if outputs > 0 {
                    task.rows
                        .extend_from_slice(&rows[base * n_embd..(base + outputs) * n_embd]);
                }
                if task.n_past == task.job.prompt.len() {
                    let embedded = Embedded {
                        rows: pooling.pool(&task.rows, n_embd),
                        id_slot: id,
                        n_prompt: task.n_past,
                        prompt_ms: task.started.elapsed().as_secs_f64() * 1e3,
                    };
                    task.end = Some(Event::Embedded(embedded));
                    self.ended.extend(slot.task.take());
                }
                continue;
            }
            if !has_output {
                if task.job.params.prompt_only && task.n_past == task.job.prompt.len() {
                    // A model without an output head: the prompt-only request ends here (its
                    // step reads no row).
                    let cx = StepContext {
                        id_slot: id,
                        tok: self.tok,
                        n_cached: slot.cached.len(),
                        n_ctx: self.cfg.n_ctx_slot,
                        context_shift: self.cfg.context_shift,
                        counters: c,
                        schemajump: self.cfg.schemajump,
                        drafts: false,
                    };
                    step(&cx, task, &[], Drafted::No);
                    self.ended.extend(slot.task.take());
                }
                continue;
            }
            // The drafted tokens end the chunk; the rows before each give its verdict.
            let n_drafted = outputs - 1;
            let drafted = &toks[toks.len() - n_drafted..];
            let verified = slot.cached.len() - n_drafted;
            task.draft = 0;
            task.n_drafted += n_drafted;
            c.drafted.fetch_add(n_drafted as u64, Ordering::Relaxed);
            let mut accepted = 0;
            let mut done = false;
            // This chunk's first row of logits: with the head on a few rows, among those.
            let first = match split {
                true => logit_first,
                false => base + read - outputs,
            };
            // With a fixed acceptance length the drafter's drafts are taken, not checked.
            let tok = self.tok;
            let n_take = match (&self.synth, task.synth_rng.as_mut()) {
                (Some(s), Some(rng)) if task.spec_by.is_some() => {
                    s.accepted(rng, drafted, |t| tok.is_eog(t))
                }
                _ => 0,
            };
            let synth = self.synth.is_some() && task.spec_by.is_some();
            for (j, row) in logits[first * self.n_vocab..(first + outputs) * self.n_vocab]
                .chunks_exact(self.n_vocab)
                .enumerate()
            {
                let cx = StepContext {
                    id_slot: id,
                    tok: self.tok,
                    n_cached: verified + j,
                    n_ctx: self.cfg.n_ctx_slot,
                    context_shift: self.cfg.context_shift,
                    counters: c,
                    schemajump: self.cfg.schemajump,
                    drafts: !self.rewind.per_sequence,
                };
                // A panic in one request's sampling ends that request alone: the pass is
                // done, so the slot's cache is whole.
                let row = catch_unwind(AssertUnwindSafe(|| {
                    let d = match drafted.get(j) {
                        Some(&t) if j < n_take => Drafted::Take(t),
                        Some(&t) if !synth => Drafted::Check(t),
                        _ => Drafted::No,
                    };
                    step(&cx, task, row, d)
                }))
                .unwrap_or_else(|panic| {
                    let what = panic_message(panic.as_ref());
                    tracing::error!("slot {id}: sampling a token panicked: {what}");
                    let failure =
                        Failure::new(FailureKind::Internal, format!("internal error: {what}"));
                    task.end = Some(Event::Failed(failure));
                    Row::Ended
                });
                match row {
                    Row::Accepted => accepted += 1,
                    Row::Sampled => break,
                    Row::Ended => {
                        done = true;
                        break;
                    }
                }
            }
            let drafted_by = task.spec_by.filter(|_| n_drafted > 0);
            if n_drafted > 0 {
                if let Some(by) = task.spec_by.take() {
                    if let Some(d) = self.drafter.as_mut() {
                        tracing::trace!(
                            "slot {id}: {accepted} of the {} draft {drafted:?} at position \
                             {verified} accepted",
                            d.type_at(by).name()
                        );
                        d.accepted(id, by, accepted);
                    }
                    c.spec_verify_steps.fetch_add(1, Ordering::Relaxed);
                    c.spec_draft_tokens
                        .fetch_add(n_drafted as u64, Ordering::Relaxed);
                    c.spec_accepted
                        .fetch_add(accepted as u64, Ordering::Relaxed);
                    if let Ok(mut per) = c.spec_accepted_per_pos.lock() {
                        let n = per.len().max(self.cfg.spec.most());
                        per.resize(n, 0);
                        per.iter_mut().take(accepted).for_each(|p| *p += 1);
                    }
                }
            }
            if is_step {
                steps.push((id, drafted_by, n_drafted, accepted + 1));
            }
            // Drafted tokens after the first refused one leave the cache; per-sequence state
            // becomes that of the last kept row, or goes back to before the pass and takes in
            // the kept tokens again.
            let kept = verified + accepted;
            if kept < slot.cached.len() {
                if let Some(i) = drafting.iter().position(|&(s, _)| s == id) {
                    let (_, first_row) = drafting.swap_remove(i);
                    match verify {
                        true => keep_rows.push((id, first_row + (kept - start) - 1)),
                        false => refused.push((id, start)),
                    }
                }
            }
            slot.keep(kept);
            if let Some(t) = taken.last_mut().filter(|t| t.0 == id) {
                t.4 = kept - start;
            }
            if done {
                self.ended.extend(slot.task.take());
            }
        }
        for (id, row) in keep_rows {
            self.model
                .keep_row_state(id as u32, row as u32)
                .map_err(|e| {
                    format!("slot {id}: keeping the state of a refused draft's row: {e}")
                })?;
        }
        self.roll_back(&refused)?;
        self.prefetch_ngram_rows();
        // The target rows the MTP block takes in (or puts off: draft_next).
        let chunks: Vec<Chunk<'_>> = taken
            .iter()
            .map(|(slot, start, tokens, base, kept)| Chunk {
                slot: *slot,
                start: *start,
                tokens,
                rows: &rows[base * row_width..(base + tokens.len()) * row_width],
                kept: *kept,
            })
            .collect();
        if n_prompt_rows == 0 {
            let shape_rows = batch.tokens.len();
            self.weigh(&steps, shape_rows, began.elapsed().as_secs_f64());
        }
        self.draft_next(&chunks)?;
        // The drafted tokens' rows too (those of the sampled ones are already on their way).
        self.prefetch_ngram_rows();
        self.shared
            .counters
            .executors_prepared
            .store(self.model.executors_prepared(), Ordering::Relaxed);
        if !decided.is_empty() {
            self.decide(&decided);
        }
        Ok(())
    }

    /// Gives each slot's drafting gates its generation step of this pass (`steps`: slot, the
    /// place in the chain of the drafter whose draft it verified, tokens drafted, tokens kept),
    /// a pass of `rows` rows that took `seconds` (with the drafting before it, for the slots it
    /// drafted for), logging and counting each switch. The step is that drafter's; without a
    /// draft, the chain's last drafter's where it was consulted (its draft passes ran for
    /// nothing); else a plain step, which every gate of the slot counts.
    fn weigh(&mut self, steps: &[(usize, Option<usize>, usize, usize)], rows: usize, seconds: f64) {
        for &(id, by, drafted, kept) in steps {
            let slot = &mut self.slots[id];
            let asked = slot.asked.take();
            if slot.gates.is_empty() {
                continue;
            }
            let shape = StepShape { rows, drafted };
            let cost = self
                .costs
                .seconds(shape, seconds + asked.map_or(0.0, |a| a.seconds));
            let last = slot.gates.len() - 1;
            let whose = by.or(asked.filter(|a| a.last).map(|_| last));
            let switches: Vec<(usize, Switch)> = match whose {
                Some(k) => slot.gates[k]
                    .drafted(cost, kept)
                    .map(|sw| (k, sw))
                    .into_iter()
                    .collect(),
                None => (slot.gates.iter_mut().enumerate())
                    .filter_map(|(k, g)| g.plain(cost).map(|sw| (k, sw)))
                    .collect(),
            };
            for (k, sw) in switches {
                tracing::info!("{}", slot.gates[k].describe(id, sw));
                self.shared
                    .counters
                    .spec_gate_switches
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Puts each slot of `refused` back to the state saved on the device before the pass at
    /// its first position and runs the tokens it keeps from there again, all in one pass
    /// without outputs: its per-sequence state then holds exactly the kept tokens. (Positional
    /// caches need nothing: rows past the kept ones are written again before any row reads
    /// them.)
    fn roll_back(&mut self, refused: &[(usize, usize)]) -> Result<(), String> {
        if refused.is_empty() {
            return Ok(());
        }
        let mut batch = BatchInputs {
            tokens: Vec::new(),
            positions: Vec::new(),
            slots: Vec::new(),
            output_rows: Vec::new(),
            ngram_rows: Vec::new(),
            logit_rows: vec![],
        };
        for (id, start) in refused {
            self.model
                .restore_sequence(*id as u32)
                .map_err(|e| format!("slot {id}: rolling back a refused draft: {e}"))?;
            let cached = &self.slots[*id].cached;
            for (p, &t) in cached.iter().enumerate().skip(*start) {
                batch.tokens.push(t as i32);
                batch.positions.push(p as i32);
                batch.slots.push(*id as i32);
            }
            if let Some(n) = self.model.spec.ngram.as_ref().into_option() {
                let (before, kept) = cached.split_at(*start);
                n.extend_rows(before, kept, &mut batch.ngram_rows);
            }
        }
        // Nothing is read: with the MTP block drafting (whose passes read final-norm rows, so
        // the graph has them) the pass stops at the final norm, skipping the output head.
        let readout = match self.drafter.as_ref().is_some_and(Drafters::reads_rows) {
            true => Readout::Embeddings,
            false => Readout::Logits,
        };
        self.model
            .forward_reading(&batch, readout)
            .map_err(|e| format!("taking in the kept tokens after a refused draft: {e}"))?;
        self.shared
            .counters
            .rollback_passes
            .fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Drafts the tokens after each slot's newly sampled token, for the next pass to verify:
    /// slots generating one sampled token (no forced run, no schemajump draft), as many as the
    /// request's limit and the slot's context leave room for (llama-server's
    /// `get_n_draft_max`) and the drafter's own limit. The n-gram drafters consulted first
    /// draft where they can; the last drafter drafts for the rest (b11434's
    /// `common_speculative_draft`). With the MTP block, its first draft pass also takes in
    /// `chunks`, the target rows of the pass just run, and the rows drafting slots put off; a
    /// slot it does not draft for now (not drafting, or drafted for by an n-gram drafter) puts
    /// its rows off.
    fn draft_next(&mut self, chunks: &[Chunk<'_>]) -> Result<(), String> {
        let Some(drafters) = self.drafter.as_mut() else {
            return Ok(());
        };
        let spec = self.cfg.spec;
        let mut wants = Vec::new();
        for slot in &mut self.slots {
            slot.asked = None;
            let Some(task) = &slot.task else { continue };
            if task.next.len() != 1 || task.draft != 0 || !task.job.params.forced.is_empty() {
                continue;
            }
            if !slot.gates.is_empty() && !slot.gates.iter().any(Gate::drafts_next) {
                continue;
            }
            let room = self.cfg.n_ctx_slot.saturating_sub(slot.cached.len() + 2);
            let left = task
                .job
                .params
                .n_predict
                .map_or(usize::MAX, |n| n.saturating_sub(task.generated + 1));
            let max = spec.most().min(room).min(left);
            if max > 0 {
                wants.push(Want {
                    slot: slot.id,
                    last: task.next[0],
                    pos: slot.cached.len(),
                    max,
                });
            }
        }
        // The drafting step's time includes taking in the rows before its first draft row
        // (the target's rows of this pass, and those a slot put off while not drafting): work
        // that exists only because the slot drafts.
        let t0 = Instant::now();
        let slots = &self.slots;
        let held = |w: &Want| {
            let mut tokens = slots[w.slot].cached.clone();
            tokens.push(w.last);
            tokens
        };
        // Whether slot `s`'s gate lets the drafter at place `k` of the chain draft its step.
        let open = |s: usize, k: usize| slots[s].gates.get(k).is_none_or(Gate::drafts_next);
        let by_last = drafters.first.len();
        let mut drafts =
            drafters.draft_first(&wants, held, |t| spec.cap(t), |w, k| open(w.slot, k));
        // What no drafter before it drafted for, the last drafter drafts for, within its limit.
        let (rest, rest_wants): (Vec<usize>, Vec<Want>) = wants
            .iter()
            .enumerate()
            .filter(|(i, w)| drafts[*i].is_none() && open(w.slot, by_last))
            .map(|(i, w)| {
                let max = w.max.min(spec.cap(spec.kind));
                (i, Want { max, ..*w })
            })
            .unzip();
        let last = match &mut drafters.last {
            Drafter::Mtp(m) => {
                // A slot the block does not draft for now puts its rows off (up to
                // MAX_BEHIND), to take them in with its first draft pass when it drafts again.
                let mut now = Vec::with_capacity(chunks.len());
                for c in chunks {
                    let drafts = rest_wants.iter().any(|w| w.slot == c.slot);
                    match drafts || m.behind(c.slot) + c.kept > MAX_BEHIND {
                        true => now.push(Chunk { ..*c }),
                        false => m.defer(c),
                    }
                }
                let drafts = m.take_in_and_draft(&mut self.model, &now, &rest_wants)?;
                let stats = m.stats();
                let c = &self.shared.counters;
                c.mtp_passes.store(stats.passes, Ordering::Relaxed);
                c.mtp_read_bytes.store(stats.read_bytes, Ordering::Relaxed);
                drafts
            }
            Drafter::Model(_) | Drafter::Source(_) if rest_wants.is_empty() => Vec::new(),
            Drafter::Model(m) => {
                m.catch_up(&rest_wants, |s| &slots[s].cached)?;
                m.draft(&rest_wants)?
            }
            Drafter::Source(src) => rest_wants
                .iter()
                .map(|w| {
                    let mut d = src.draft(w.slot, &held(w), w.max);
                    d.truncate(w.max);
                    d
                })
                .collect(),
        };
        for (&i, d) in rest.iter().zip(last) {
            if !d.is_empty() {
                drafts[i] = Some((by_last, d));
            }
        }
        let seconds = t0.elapsed().as_secs_f64();
        for (i, (w, d)) in wants.iter().zip(drafts).enumerate() {
            self.slots[w.slot].asked = Some(Asked {
                seconds,
                last: rest.contains(&i),
            });
            if let Some(task) = self.slots[w.slot].task.as_mut() {
                let (by, d) = d.map_or((None, Vec::new()), |(by, d)| (Some(by), d));
                task.draft = d.len();
                task.spec_by = by;
                task.next.extend(d);
            }
        }
        Ok(())
    }

    /// Context shift, as llama-server does it before a pass: each generating slot whose next
    /// tokens would not fit its context keeps its first `n_keep` positions (the prompt's first
    /// `n_keep` tokens after the BOS the model adds; -1: the whole prompt; at most the context
    /// less 4), drops the `n_discard` after them (0: half of the rest) and moves the rest down.
    /// Drafted tokens are dropped (they are only guesses); a request whose forced tokens still
    /// do not fit fails.
    fn shift_full_slots(&mut self) {
        let n_ctx = self.cfg.n_ctx_slot;
        let add_bos = self.tok.special().add_bos;
        for id in 0..self.slots.len() {
            let slot = &mut self.slots[id];
            let Some(task) = slot.task.as_mut() else {
                continue;
            };
            let held = slot.cached.len();
            if task.next.is_empty() || held + task.next.len() < n_ctx {
                continue;
            }
            let shift = task.job.params.shift;
            let mut n_keep = match usize::try_from(shift.n_keep) {
                Ok(n) => n,
                Err(_) => task.job.prompt.len(),
            };
            n_keep += usize::from(add_bos);
            let n_keep = n_keep.min(n_ctx.saturating_sub(4)).min(held);
            let n_left = held - n_keep;
            let n_discard = match shift.n_discard {
                0 => n_left / 2,
                n => n,
            }
            .min(n_left.saturating_sub(1));
            tracing::warn!(
                "slot {id}: context shift, n_keep = {n_keep}, n_left = {n_left}, n_discard = {n_discard}"
            );
            let moved = match n_discard {
                0 => Err(format!(
                    "context shift has nothing to drop: n_keep = {n_keep} of {held} positions"
                )),
                _ => self
                    .model
                    .move_positions(
                        id as u32,
                        (n_keep + n_discard) as u32,
                        n_keep as u32,
                        (n_left - n_discard) as u32,
                    )
                    .map_err(|e| format!("context shift failed: {e}")),
            };
            let failure = match moved {
                Err(e) => Some(e),
                Ok(()) => {
                    slot.cached.drain(n_keep..n_keep + n_discard);
                    slot.checkpoints.clear();
                    task.shifted = true;
                    let committed = task.next.len() - task.draft;
                    task.next.truncate(committed);
                    task.draft = 0;
                    (slot.cached.len() + task.next.len() > n_ctx).then(|| {
                        format!(
                            "context shift left {} positions, short of the {} tokens taken",
                            n_ctx - slot.cached.len(),
                            task.next.len()
                        )
                    })
                }
            };
            if let Some(msg) = failure {
                tracing::error!("slot {id}: {msg}");
                if let Some(task) = slot.task.take() {
                    self.ended.push(Task {
                        end: Some(Event::Failed(Failure::new(FailureKind::Internal, msg))),
                        ..task
                    });
                }
                slot.keep(0);
            }
        }
    }

    /// Runs the decision head once over the decisions of slots `ids`, whose prompts (and rows)
    /// are complete, and answers each; their slots keep the tokens and rows for later
    /// decisions. A failure or panic of the head fails those decisions alone.
    fn decide(&mut self, ids: &[usize]) {
        let started = Instant::now();
        let tokens: Vec<Vec<i32>> = ids
            .iter()
            .map(|&id| {
                self.slots[id].task.as_ref().map_or_else(Vec::new, |t| {
                    t.job.prompt.iter().map(|&x| x as i32).collect()
                })
            })
            .collect();
        let result = {
            let reqs: Vec<HeadRequest<'_>> = ids
                .iter()
                .zip(&tokens)
                .filter_map(|(&id, tokens)| {
                    let slot = &self.slots[id];
                    let d = slot.task.as_ref()?.job.decide.as_ref()?;
                    Some(HeadRequest {
                        hidden: slot.hidden.get(..tokens.len() * slot.n_embd)?,
                        tokens,
                        questions: &d.questions,
                        options: &d.options,
                    })
                })
                .collect();
            match (&self.head, reqs.len() == ids.len()) {
                (Some(head), true) => catch_unwind(AssertUnwindSafe(|| head.scores_batch(&reqs)))
                    .map_err(|panic| format!("internal error: {}", panic_message(panic.as_ref())))
                    .and_then(|r| r.map_err(|e| e.to_string())),
                (None, _) => Err("this model has no decision head".into()),
                (_, false) => Err("a decision's rows are missing".into()),
            }
        };
        let n_rows: usize = tokens.iter().map(Vec::len).sum();
        tracing::debug!(
            "decision head: {} requests, {n_rows} rows in one run: {:.2} ms",
            ids.len(),
            started.elapsed().as_secs_f64() * 1e3
        );
        let c = &self.shared.counters;
        c.decision_head_runs.fetch_add(1, Ordering::Relaxed);
        c.decision_rows.fetch_add(n_rows as u64, Ordering::Relaxed);
        let n_batched = ids.len();
        match result {
            Ok(scores) => {
                c.decisions.fetch_add(n_batched as u64, Ordering::Relaxed);
                for (&id, scores) in ids.iter().zip(scores) {
                    let Some(task) = self.slots[id].task.take() else {
                        continue;
                    };
                    let decided = Event::Decided(Decided {
                        scores,
                        id_slot: id,
                        n_prompt: task.job.prompt.len(),
                        n_cached: task.n_cached,
                        n_batched,
                        prompt_ms: task.started.elapsed().as_secs_f64() * 1e3,
                    });
                    self.ended.push(Task {
                        end: Some(decided),
                        ..task
                    });
                }
            }
            Err(msg) => {
                tracing::error!("the decision head failed: {msg}");
                for &id in ids {
                    if let Some(task) = self.slots[id].task.take() {
                        let failure = Failure::new(FailureKind::Internal, msg.clone());
                        self.ended.push(Task {
                            end: Some(Event::Failed(failure)),
                            ..task
                        });
                    }
                }
            }
        }
    }

    /// Refreshes what `/slots` shows, and the longest sequence `/metrics` reports.
    fn publish(&self) {
        let longest = self.slots.iter().map(|s| s.cached.len()).max().unwrap_or(0);
        self.shared
            .counters
            .n_tokens_max
            .fetch_max(longest as u64, Ordering::Relaxed);
        let views = self
            .slots
            .iter()
            .map(|s| SlotView {
                id: s.id,
                is_processing: s.task.is_some(),
                n_cached: s.cached.len(),
                n_decoded: s.task.as_ref().map_or(0, |t| t.generated),
                n_remain: s.task.as_ref().map_or(0, |t| {
                    t.job
                        .params
                        .n_predict
                        .map_or(-1, |n| n.saturating_sub(t.generated) as i64)
                }),
                speculative: self.drafter.is_some(),
                gates: s.gates.iter().map(Gate::view).collect(),
            })
            .collect();
        if let Ok(mut g) = self.shared.slots.lock() {
            *g = views;
        }
    }
}

/// One slot's rows in a pass.
struct Planned {
    id: usize,
    /// The tokens the pass adds to the slot's cache.
    tokens: Vec<u32>,
    /// Output rows, the chunk's last ones: its drafted tokens and the row before them (0 for a
    /// chunk of a prompt or forced run that continues in the next pass).
    outputs: usize,
    /// Output rows the pass reads for the chunk: `outputs`, or every row when the MTP block
    /// takes them in (the chunk's `outputs` then its last ones).
    read: usize,
    /// A generation step: the slot's one sampled token and its drafts (not a prompt chunk or
    /// a forced run), which the drafting gate weighs.
    step: bool,
    /// The pass reads the chunk's final-norm rows for the MTP block.
    rows: bool,
}

/// What drafts for the target to verify, as `spec` or a `source` asks (the n-gram drafters of
/// `spec.first` before either); none (with a warning naming why) where this model cannot draft.
fn drafter_of(
    model: &LoadedModel,
    spec: SpecConfig,
    batch_rows: usize,
    (source, draft): (Option<Box<dyn DraftSource>>, Option<LoadedModel>),
) -> Option<Drafters> {
    if spec.kind == SpecType::None && source.is_none() {
        return None;
    }
    let n_slots = model.options.n_slots as usize;
    let first = spec
        .first
        .iter()
        .filter_map(|&t| Some((t, ngram_drafter(t, spec, n_slots)?)))
        .collect();
    let last = match source {
        Some(source) => Drafter::Source(source),
        None => last_drafter(model, spec, batch_rows, draft)?,
    };
    Some(Drafters {
        first,
        last,
        last_type: spec.kind,
    })
}

/// The drafter of n-gram type `t` for `n_slots` slots (None for another type).
fn ngram_drafter(t: SpecType, spec: SpecConfig, n_slots: usize) -> Option<Box<dyn DraftSource>> {
    match t {
        SpecType::NgramSimple => Some(Box::new(NgramSimple::new(spec.ngram_simple))),
        SpecType::NgramMod => {
            if spec.ngram_mod.n_match < 16 {
                tracing::warn!(
                    "ngram-mod: --spec-ngram-mod-n-match {} is short: drafts may be poor (as \
                     llama-server warns below 16)",
                    spec.ngram_mod.n_match
                );
            }
            Some(Box::new(NgramMod::new(spec.ngram_mod, n_slots)))
        }
        SpecType::NgramMapK => Some(Box::new(NgramMap::new(spec.ngram_map_k, true, n_slots))),
        SpecType::NgramMapK4v => Some(Box::new(NgramMap::new(spec.ngram_map_k4v, false, n_slots))),
        _ => None,
    }
}

/// The drafter of `spec.kind`, which drafts when no n-gram drafter before it does; none (with
/// a warning naming why) where this model cannot draft with it.
fn last_drafter(
    model: &LoadedModel,
    spec: SpecConfig,
    batch_rows: usize,
    draft: Option<LoadedModel>,
) -> Option<Drafter> {
    let n_slots = model.options.n_slots as usize;
    if let Some(src) = ngram_drafter(spec.kind, spec, n_slots) {
        return Some(Drafter::Source(src));
    }
    if spec.kind == SpecType::DraftSimple {
        let Some(draft) = draft else {
            tracing::warn!("drafting off: draft-simple has no draft model (-md)");
            return None;
        };
        let n_vocab = model.spec.hparams.n_vocab as usize;
        let m = ModelDrafter::new(spec, draft, n_slots, batch_rows, n_vocab);
        return Some(Drafter::Model(m));
    }
    if let Some(draft) = draft {
        let Some(width) = draft.hidden_width() else {
            tracing::warn!("drafting off: the draft file builds no draft graph");
            return None;
        };
        let m = MtpDrafter::new(spec, n_slots, width).with_draft_model(draft);
        return Some(Drafter::Mtp(m));
    }
    if model.spec.caps.n_mtp_layers == 0 {
        tracing::warn!(
            "drafting off: this model (`{}`) has no MTP layers to draft with",
            model.spec.architecture
        );
        return None;
    }
    let n_embd = model.spec.hparams.n_embd as usize;
    Some(Drafter::Mtp(MtpDrafter::new(spec, n_slots, n_embd)))
}

/// Whether a refused draft can roll back: a model with per-sequence state needs the spare copy
/// of it on the device, made here (drafting off, with a warning naming why, where it cannot be).
fn rollback_ready(model: &mut LoadedModel, rewind: Rewind) -> bool {
    if !rewind.per_sequence {
        return true;
    }
    match model.reserve_sequence_spare() {
        Ok(()) => {
            tracing::info!(
                "drafting: {:.1} MiB on the device hold the slots' recurrent state for refused \
                 drafts to roll back to",
                model.sequence_spare_bytes() as f64 / f64::from(1 << 20)
            );
            true
        }
        Err(e) => {
            tracing::warn!(
                "drafting off: no room on the device for the copy of the slots' recurrent state \
                 a refused draft rolls back to ({e})"
            );
            false
        }
    }
}

/// Whether verify passes of up to `rows` rows keep every row's per-sequence state (made here
/// when the model's verify graph writes them); where not, refused drafts roll back from the spare copy by running the
/// kept rows again, and the reason is logged.
fn row_states_ready(model: &mut LoadedModel, rows: u32) -> bool {
    match model.reserve_row_states(rows) {
        Ok(true) => {
            tracing::info!(
                "drafting: {:.1} MiB on the device hold the recurrent state of each row of a \
                 verify pass of up to {rows} rows, so a refused draft keeps its last kept row's \
                 without a second pass",
                model.row_state_bytes() as f64 / f64::from(1 << 20)
            );
            true
        }
        Ok(false) => false,
        Err(e) => {
            tracing::warn!(
                "drafting: no room on the device for each verify row's recurrent state ({e}); \
                 refused drafts run their kept rows again"
            );
            false
        }
    }
}

/// What a request cut or refused by a shutdown is told.
fn shutting_down() -> Failure {
    Failure::new(FailureKind::ShuttingDown, "the server is shutting down")
}

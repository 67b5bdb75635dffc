//! The handle front ends hold: the scheduler thread started with a model, where requests go, what
//! it publishes, and its shutdown.

use std::sync::Arc;
use std::thread::JoinHandle;

use bloomery_exec::decision::DecisionHead;
use bloomery_exec::LoadedModel;
use bloomery_text::Tokenizer;
use tokio::sync::mpsc;

use crate::draft_gate::StepCosts;
use crate::embedding::Pooling;
use crate::request::{Event, GenParams, Job, Request};
use crate::scheduler::{self, Ended, Extras, RuntimeConfig};
use crate::spec::{DraftSource, SpecType};
use crate::status::Shared;

/// The running scheduler: where requests go, what it publishes, and its thread.
pub struct Runtime {
    jobs: mpsc::Sender<Request>,
    /// Whether the model has a decision head (jobs with `decide` are served).
    pub decides: bool,
    shared: Arc<Shared>,
    thread: JoinHandle<Ended>,
}

/// Why the runtime refused or lost a request.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The scheduler thread could not start.
    #[error("starting the scheduler thread: {0}")]
    Start(std::io::Error),
    /// The scheduler has stopped (a panic outside a pass, or shutdown).
    #[error("the scheduler has stopped")]
    Stopped,
    /// A separate draft file that cannot draft for the model, or drafting not asked for.
    #[error("the draft file: {0}")]
    Draft(String),
}

impl Runtime {
    /// Starts the scheduler thread with `model`, which it owns until [`Runtime::shutdown`].
    pub fn start(
        model: LoadedModel,
        tok: Arc<Tokenizer>,
        cfg: RuntimeConfig,
    ) -> Result<Runtime, RuntimeError> {
        Self::start_with_head(model, None, tok, cfg)
    }

    /// As [`Runtime::start`], with drafts from `source` instead of the model's MTP block (tests
    /// and benchmarks: `cfg.spec.n_max` and the room left bound each draft).
    pub fn start_drafting(
        model: LoadedModel,
        tok: Arc<Tokenizer>,
        cfg: RuntimeConfig,
        source: Box<dyn DraftSource>,
    ) -> Result<Runtime, RuntimeError> {
        Self::start_inner(model, None, tok, cfg, Some(source), None, None)
    }

    /// As [`Runtime::start`], drafting with the separate file `draft` (llama-server's `-md`):
    /// with `cfg.spec` of kind `draft-mtp` its MTP block (qwen4exp's MTP-only file), refused by
    /// name unless it fits the model ([`crate::spec::check_draft_model`]); of kind
    /// `draft-simple` the whole draft model ([`crate::draft_model`]), refused by name unless its
    /// state is positional ([`crate::draft_model::check_draft_simple`]; its vocabulary is the
    /// caller's to check, [`crate::draft_model::check_vocab`]).
    pub fn start_with_draft_model(
        model: LoadedModel,
        draft: LoadedModel,
        tok: Arc<Tokenizer>,
        cfg: RuntimeConfig,
    ) -> Result<Runtime, RuntimeError> {
        match cfg.spec.kind {
            SpecType::DraftMtp => crate::spec::check_draft_model(&model.spec, &draft.spec),
            SpecType::DraftSimple => crate::draft_model::check_draft_simple(&model, &draft),
            _ => Err("a draft file drafts with --spec-type draft-mtp or draft-simple".into()),
        }
        .map_err(RuntimeError::Draft)?;
        Self::start_inner(model, None, tok, cfg, None, Some(draft), None)
    }

    /// As [`Runtime::start`], the drafting gate pricing each step with `costs` instead of the
    /// wall clock (tests: deterministic choices), and drafts from `source` where given.
    pub fn start_priced(
        model: LoadedModel,
        tok: Arc<Tokenizer>,
        cfg: RuntimeConfig,
        source: Option<Box<dyn DraftSource>>,
        costs: Box<dyn StepCosts>,
    ) -> Result<Runtime, RuntimeError> {
        Self::start_inner(model, None, tok, cfg, source, None, Some(costs))
    }

    /// As [`Runtime::start`], with the model's decision head (which the scheduler owns beside
    /// the model it reads).
    pub fn start_with_head(
        model: LoadedModel,
        head: Option<DecisionHead>,
        tok: Arc<Tokenizer>,
        cfg: RuntimeConfig,
    ) -> Result<Runtime, RuntimeError> {
        Self::start_inner(model, head, tok, cfg, None, None, None)
    }

    fn start_inner(
        model: LoadedModel,
        head: Option<DecisionHead>,
        tok: Arc<Tokenizer>,
        cfg: RuntimeConfig,
        source: Option<Box<dyn DraftSource>>,
        draft: Option<LoadedModel>,
        costs: Option<Box<dyn StepCosts>>,
    ) -> Result<Runtime, RuntimeError> {
        let decides = head.is_some();
        let drafts = cfg.spec.kind != SpecType::None || source.is_some();
        let shared = Arc::new(Shared::new(
            model.options.n_slots as usize,
            drafts,
            &cfg.spec.gated_drafters(source.is_some()),
        ));
        let (jobs, rx) = mpsc::channel(cfg.queue_depth.max(1));
        let published = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("bloomery-scheduler".into())
            .spawn(move || {
                let extras = Extras {
                    source,
                    costs,
                    dozing: None,
                    draft,
                };
                scheduler::run(model, head, tok, cfg, rx, published, extras)
            })
            .map_err(RuntimeError::Start)?;
        Ok(Runtime {
            jobs,
            decides,
            shared,
            thread,
        })
    }

    /// Where requests go (bounded: a full queue means the server is busy).
    pub fn sender(&self) -> mpsc::Sender<Request> {
        self.jobs.clone()
    }

    /// What the scheduler publishes.
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Submits a generation request from a thread outside any async runtime, waiting while the
    /// queue is full; the receiver gets its events.
    pub fn submit_blocking(
        &self,
        prompt: Vec<u32>,
        params: GenParams,
        id_slot: Option<usize>,
    ) -> Result<mpsc::UnboundedReceiver<Event>, RuntimeError> {
        let (events, rx) = mpsc::unbounded_channel();
        let job = Job {
            prompt,
            params,
            id_slot,
            embed: None,
            decide: None,
            events,
        };
        self.jobs
            .blocking_send(Request::Generate(Box::new(job)))
            .map_err(|_| RuntimeError::Stopped)?;
        Ok(rx)
    }

    /// Submits the embedding of `prompt` (its final-norm rows pooled so) from a thread outside
    /// any async runtime, waiting while the queue is full; the receiver gets its events, the
    /// last of them [`Event::Embedded`].
    pub fn submit_embedding_blocking(
        &self,
        prompt: Vec<u32>,
        pooling: Pooling,
    ) -> Result<mpsc::UnboundedReceiver<Event>, RuntimeError> {
        let (events, rx) = mpsc::unbounded_channel();
        let job = Job {
            prompt,
            params: GenParams::embedding(),
            id_slot: None,
            embed: Some(pooling),
            decide: None,
            events,
        };
        self.jobs
            .blocking_send(Request::Generate(Box::new(job)))
            .map_err(|_| RuntimeError::Stopped)?;
        Ok(rx)
    }

    /// As [`Runtime::submit_blocking`] for several requests that start together, in the same
    /// passes: each `(prompt, params, slot)` gets its receiver, in order.
    pub fn submit_together_blocking(
        &self,
        requests: Vec<(Vec<u32>, GenParams, Option<usize>)>,
    ) -> Result<Vec<mpsc::UnboundedReceiver<Event>>, RuntimeError> {
        let mut receivers = Vec::with_capacity(requests.len());
        let mut jobs = Vec::with_capacity(requests.len());
        for (prompt, params, id_slot) in requests {
            let (events, rx) = mpsc::unbounded_channel();
            receivers.push(rx);
            jobs.push(Job {
                prompt,
                params,
                id_slot,
                embed: None,
                decide: None,
                events,
            });
        }
        self.jobs
            .blocking_send(Request::GenerateTogether(jobs))
            .map_err(|_| RuntimeError::Stopped)?;
        Ok(receivers)
    }

    /// Stops taking requests, waits for the running ones to end and gives the model back.
    pub fn shutdown(self) -> Result<LoadedModel, RuntimeError> {
        drop(self.jobs);
        match self.thread.join() {
            Ok(Ended::Closed(model)) => Ok(*model),
            // Without a sleep time the scheduler never ends idle; a panic ends it too.
            Ok(Ended::Idle(_)) | Err(_) => Err(RuntimeError::Stopped),
        }
    }
}

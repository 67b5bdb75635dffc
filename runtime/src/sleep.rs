//! Sleeping when idle (llama-server's `--sleep-idle-seconds`). After the set time with nothing
//! running and no request, the scheduler ends and frees the model: its weights, every slot's
//! cache, the prompt cache, the decision head and the scheduler's thread. The queue stays: the
//! next request on it, or a front end's [`Sleeper::wake`], loads the model again (the request
//! waits meanwhile) and a new scheduler serves it first. Like llama-server, nothing is saved:
//! slots wake empty and the prompt cache wakes empty; the counters carry on.
//!
//! A reload that fails is not fatal (llama-server aborts): every request waiting for it fails
//! with the reason, the state says so, and the next request tries again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bloomery_exec::decision::DecisionHead;
use bloomery_exec::LoadedModel;
use bloomery_text::Tokenizer;
use tokio::sync::{mpsc, oneshot, watch};

use crate::handle::RuntimeError;
use crate::request::{Event, Failure, FailureKind, Request};
use crate::scheduler::{self, Dozing, Ended, Extras, RuntimeConfig};
use crate::spec::SpecType;
use crate::status::Shared;

/// Loads the model (and its decision head) again after sleep; the error says why not.
pub type Reload =
    Box<dyn FnMut() -> Result<(LoadedModel, Option<DecisionHead>), String> + Send + 'static>;

/// Where the model is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Loaded and served.
    Awake,
    /// Freed for idleness.
    Asleep,
    /// Loading again for a request.
    Waking,
    /// The last reload failed (why); the next request tries again.
    Failed(String),
}

/// The phase and how many reloads have begun (a waiter knows which failure is its own).
#[derive(Clone, Debug)]
struct State {
    phase: Phase,
    reloads: u64,
}

/// A scheduler that sleeps when idle, as front ends hold it.
pub struct Sleeper {
    jobs: mpsc::Sender<Request>,
    shared: Arc<Shared>,
    state: watch::Receiver<State>,
    /// Wake requests; each holds the sender of a channel its waiter keeps open while it waits.
    wake: mpsc::UnboundedSender<oneshot::Sender<()>>,
}

/// What the supervisor task owns.
struct Supervisor {
    tok: Arc<Tokenizer>,
    cfg: RuntimeConfig,
    shared: Arc<Shared>,
    after: Duration,
    reload: Option<Reload>,
    state: watch::Sender<State>,
    wake: mpsc::UnboundedReceiver<oneshot::Sender<()>>,
}

impl Sleeper {
    /// Starts the scheduler with `model`, freeing it after `after` idle and loading it again with
    /// `reload`. Call inside a tokio runtime: the task that reloads runs there.
    pub fn start(
        model: LoadedModel,
        head: Option<DecisionHead>,
        tok: Arc<Tokenizer>,
        cfg: RuntimeConfig,
        after: Duration,
        reload: Reload,
    ) -> Result<Sleeper, RuntimeError> {
        let rt = tokio::runtime::Handle::try_current().map_err(|e| {
            RuntimeError::Start(std::io::Error::other(format!(
                "sleeping when idle needs a tokio runtime: {e}"
            )))
        })?;
        let shared = Arc::new(Shared::new(
            model.options.n_slots as usize,
            cfg.spec.kind != SpecType::None,
            &cfg.spec.gated_drafters(false),
        ));
        let (jobs, rx) = mpsc::channel(cfg.queue_depth.max(1));
        let (state_tx, state) = watch::channel(State {
            phase: Phase::Awake,
            reloads: 0,
        });
        let (wake, wake_rx) = mpsc::unbounded_channel();
        let sup = Supervisor {
            tok,
            cfg,
            shared: Arc::clone(&shared),
            after,
            reload: Some(reload),
            state: state_tx,
            wake: wake_rx,
        };
        rt.spawn(sup.run(model, head, rx));
        Ok(Sleeper {
            jobs,
            shared,
            state,
            wake,
        })
    }

    /// Where requests go; one that comes while the model sleeps wakes it.
    pub fn sender(&self) -> mpsc::Sender<Request> {
        self.jobs.clone()
    }

    /// What the scheduler publishes (kept across sleeps).
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Where the model is now.
    pub fn phase(&self) -> Phase {
        self.state.borrow().phase.clone()
    }

    /// Counts as activity: an idle scheduler waits the sleep time again from now.
    pub fn touch(&self) {
        if let Ok(mut t) = self.shared.touched.lock() {
            *t = Some(Instant::now());
        }
    }

    /// Returns once the model is loaded, waking it if it sleeps (llama-server's
    /// `wait_until_no_sleep`); the reason when the reload this waited for failed.
    pub async fn wake(&self) -> Result<(), String> {
        let mut state = self.state.clone();
        let now = state.borrow_and_update().clone();
        // The reload whose failure answers this waiter: one under way, else the next.
        let asked = match now.phase {
            Phase::Awake => return Ok(()),
            Phase::Waking => now.reloads.saturating_sub(1),
            Phase::Asleep | Phase::Failed(_) => now.reloads,
        };
        // Held open while this waits: a request left over from a wait that ended is skipped.
        let (tx, _waiting) = oneshot::channel();
        if now.phase != Phase::Waking && self.wake.send(tx).is_err() {
            return Err(RuntimeError::Stopped.to_string());
        }
        loop {
            if state.changed().await.is_err() {
                return Err(RuntimeError::Stopped.to_string());
            }
            let s = state.borrow_and_update().clone();
            match s.phase {
                Phase::Awake => return Ok(()),
                Phase::Failed(e) if s.reloads > asked => return Err(e),
                _ => {}
            }
        }
    }
}

impl Supervisor {
    /// Serves, sleeps and wakes until every job sender is gone or the scheduler stops.
    async fn run(
        mut self,
        mut model: LoadedModel,
        mut head: Option<DecisionHead>,
        mut rx: mpsc::Receiver<Request>,
    ) {
        let mut first = None;
        loop {
            self.set(Phase::Awake);
            let (done, ended) = oneshot::channel();
            let (tok, shared) = (Arc::clone(&self.tok), Arc::clone(&self.shared));
            let (cfg, after) = (self.cfg, self.after);
            let started = std::thread::Builder::new()
                .name("bloomery-scheduler".into())
                .spawn(move || {
                    let extras = Extras {
                        source: None,
                        costs: None,
                        dozing: Some(Dozing { after, first }),
                        draft: None,
                    };
                    let e = scheduler::run(model, head, tok, cfg, rx, shared, extras);
                    let _ = done.send(e);
                });
            if let Err(e) = started {
                tracing::error!("starting the scheduler thread: {e}");
                return;
            }
            rx = match ended.await {
                Ok(Ended::Idle(rx)) => rx,
                // Every sender gone, or the thread panicked: the queue closes with it.
                Ok(Ended::Closed(_)) | Err(_) => return,
            };
            self.set(Phase::Asleep);
            let Some((m, h, f)) = self.wake_up(&mut rx).await else {
                return;
            };
            (model, head, first) = (m, h, f);
        }
    }

    /// Waits for a request or a wake, then loads the model until a load succeeds: the model,
    /// its head and the request that woke it. `None` once the queue or the reload is gone.
    async fn wake_up(
        &mut self,
        rx: &mut mpsc::Receiver<Request>,
    ) -> Option<(LoadedModel, Option<DecisionHead>, Option<Request>)> {
        loop {
            let first = tokio::select! {
                job = rx.recv() => Some(job?),
                w = self.wake.recv() => match w {
                    // A waiter that has gone (its wait ended otherwise) wakes nothing.
                    Some(w) if w.is_closed() => continue,
                    Some(_) => None,
                    None => return None,
                },
            };
            let reloads = self.state.borrow().reloads + 1;
            self.state.send_replace(State {
                phase: Phase::Waking,
                reloads,
            });
            tracing::info!("a request came while sleeping: loading the model again");
            let began = Instant::now();
            let mut reload = self.reload.take()?;
            let out = tokio::task::spawn_blocking(move || {
                let out = reload();
                (reload, out)
            })
            .await;
            let why = match out {
                Ok((reload, Ok((model, head)))) => {
                    self.reload = Some(reload);
                    tracing::info!(
                        "the model is loaded again after sleeping ({:.1} s)",
                        began.elapsed().as_secs_f64()
                    );
                    return Some((model, head, first));
                }
                Ok((reload, Err(e))) => {
                    self.reload = Some(reload);
                    e
                }
                Err(e) => format!("the reload panicked: {e}"),
            };
            let msg = format!("loading the model again after sleeping failed: {why}");
            tracing::error!("{msg}");
            let failure = Failure::new(FailureKind::Internal, msg.clone());
            self.set(Phase::Failed(msg));
            first.into_iter().for_each(|j| refuse(j, &failure));
            while let Ok(j) = rx.try_recv() {
                refuse(j, &failure);
            }
            self.reload.as_ref()?;
        }
    }

    /// Publishes `phase`, keeping the reload count.
    fn set(&self, phase: Phase) {
        self.state.send_modify(|s| s.phase = phase);
    }
}

/// Ends a request that waited for a reload that failed.
fn refuse(job: Request, failure: &Failure) {
    let fail = |events: &mpsc::UnboundedSender<Event>| {
        let _ = events.send(Event::Failed(failure.clone()));
    };
    match job {
        Request::Generate(j) => fail(&j.events),
        Request::GenerateTogether(js) => js.iter().for_each(|j| fail(&j.events)),
        Request::Slot(cmd) => {
            let _ = cmd.reply.send(Err(failure.message.clone()));
        }
        // Its answer has no error: the dropped reply answers.
        Request::ResidencyReset(_) => {}
    }
}

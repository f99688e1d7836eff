//! What both chaos runs (forward mode in `chaos.rs`, queue mode in
//! `chaos_queue.rs`) are made of: three `hookgate run` processes behind a
//! balancer, one of which is SIGKILLed and replaced mid-run, and a crowd of
//! senders that deliver every copy of every event like providers do.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use hookgate::provider::Scheme;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::task::JoinHandle;

use crate::cli::Child;
use crate::support::fixture::GateFixture;
use crate::support::gate::{SECRET, signed, stripe_event};

pub const GATES: usize = 3;
/// The slot whose process is SIGKILLed mid-run.
pub const VICTIM: usize = 1;
/// A sender gives up on a copy after this many attempts (a real provider
/// retries for days; this bounds a broken run instead of hanging it).
const MAX_ATTEMPTS: u32 = 60;

pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// What one sender saw on one attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    Status(u16),
    /// Connection refused, reset, or no answer in time.
    Broken,
}

impl Seen {
    pub fn ok(self) -> bool {
        matches!(self, Self::Status(s) if (200..300).contains(&s))
    }
}

/// The gate processes, by slot; the balancer picks a slot per attempt.
/// Process `n` forwards under `/i{n}`, so the app's records say which one
/// called; the victim's replacement is process `GATES`. Shared by the
/// senders (`pick`) and the test (the kill), so every method takes `&self`.
pub struct Gates {
    config: Box<dyn Fn(usize) -> GateFixture + Send + Sync>,
    /// Each process's config, kept while it runs (its files live there).
    configs: Mutex<Vec<GateFixture>>,
    children: Mutex<Vec<Option<Child>>>,
    addrs: Mutex<Vec<SocketAddr>>,
    /// `slots[g]` is the process slot g sends to now.
    slots: Mutex<[usize; GATES]>,
}

impl Gates {
    /// Starts `GATES` processes, process `n` on `config(n)`.
    pub async fn start(config: impl Fn(usize) -> GateFixture + Send + Sync + 'static) -> Arc<Self> {
        let gates = Arc::new(Self {
            config: Box::new(config),
            configs: Mutex::new(Vec::new()),
            children: Mutex::new(Vec::new()),
            addrs: Mutex::new(Vec::new()),
            slots: Mutex::new([0, 1, 2]),
        });
        for _ in 0..GATES {
            gates.spawn().await;
        }
        gates
    }

    /// Starts the next process; returns its number.
    async fn spawn(&self) -> usize {
        let (n, path) = {
            let mut configs = self.configs.lock().unwrap();
            let n = configs.len();
            configs.push((self.config)(n));
            (n, configs[n].config_file())
        };
        let (child, addr) = tokio::task::spawn_blocking(move || Child::spawn(&path))
            .await
            .unwrap();
        self.children.lock().unwrap().push(Some(child));
        self.addrs.lock().unwrap().push(addr);
        n
    }

    /// The process an attempt goes to, by a random draw: (its number, where).
    pub fn pick(&self, r: u64) -> (usize, SocketAddr) {
        let process = self.slots.lock().unwrap()[(r % GATES as u64) as usize];
        (process, self.addrs.lock().unwrap()[process])
    }

    /// The first process's config file, e.g. to open the same store.
    pub fn toml(&self) -> String {
        self.configs.lock().unwrap()[0].toml()
    }

    /// SIGKILLs the victim slot's process and starts a replacement in its
    /// slot; returns the killed process's log lines.
    pub async fn kill_and_replace_victim(&self) -> Vec<String> {
        let victim = self.children.lock().unwrap()[VICTIM].take().unwrap();
        let log = tokio::task::spawn_blocking(move || victim.kill())
            .await
            .unwrap();
        let reborn = self.spawn().await;
        self.slots.lock().unwrap()[VICTIM] = reborn;
        log
    }

    /// Stops every live process (SIGTERM); returns their log lines.
    pub async fn stop(&self) -> Vec<String> {
        let children: Vec<Child> = self
            .children
            .lock()
            .unwrap()
            .iter_mut()
            .filter_map(Option::take)
            .collect();
        let mut lines = Vec::new();
        for child in children {
            if let Ok((_, log)) = tokio::task::spawn_blocking(move || child.stop()).await {
                lines.extend(log);
            }
        }
        lines
    }
}

/// Every copy of every event, shuffled by `seed`.
pub fn shuffled_copies(events: usize, copies: usize, seed: u64) -> Vec<usize> {
    let mut rng = Rng(seed);
    let mut order: Vec<usize> = (0..events)
        .flat_map(|e| std::iter::repeat_n(e, copies))
        .collect();
    for i in (1..order.len()).rev() {
        order.swap(i, (rng.next() % (i as u64 + 1)) as usize);
    }
    order
}

/// `clients` tasks delivering the copies of `order` in turn, each like a
/// provider (see [`deliver`]), event `n` as `{prefix}{n}`.
pub struct Senders {
    total: usize,
    done: Arc<AtomicUsize>,
    gave_up: Arc<AtomicUsize>,
    tasks: Vec<JoinHandle<()>>,
}

impl Senders {
    /// Starts the senders; `on_attempt(event, process, answer,
    /// Hookgate-Result)` hears of every attempt.
    pub fn start(
        gates: &Arc<Gates>,
        order: Vec<usize>,
        clients: usize,
        seed: u64,
        prefix: &'static str,
        on_attempt: impl Fn(usize, usize, Seen, Option<String>) + Send + Sync + 'static,
    ) -> Self {
        let total = order.len();
        let (order, on_attempt) = (Arc::new(order), Arc::new(on_attempt));
        let client = http_client();
        let next = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(AtomicUsize::new(0));
        let gave_up = Arc::new(AtomicUsize::new(0));
        let tasks = (0..clients)
            .map(|c| {
                let (order, next, gates) =
                    (Arc::clone(&order), Arc::clone(&next), Arc::clone(gates));
                let (done, gave_up) = (Arc::clone(&done), Arc::clone(&gave_up));
                let (client, on_attempt) = (client.clone(), Arc::clone(&on_attempt));
                tokio::spawn(async move {
                    let mut rng = Rng(seed ^ ((c as u64 + 1) << 20));
                    while let Some(&event) = order.get(next.fetch_add(1, Ordering::Relaxed)) {
                        let id = format!("{prefix}{event}");
                        let seen =
                            |process, answer, result| on_attempt(event, process, answer, result);
                        if !deliver(&client, &gates, &id, Rng(rng.next() | 1), seen).await {
                            gave_up.fetch_add(1, Ordering::Relaxed);
                        }
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        Self {
            total,
            done,
            gave_up,
            tasks,
        }
    }

    /// Copies delivered (or given up on) so far.
    pub fn done(&self) -> usize {
        self.done.load(Ordering::Relaxed)
    }

    /// Waits until `fraction` of the copies are done: where faults strike.
    pub async fn reached(&self, fraction: f64) {
        while (self.done() as f64) < self.total as f64 * fraction {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Waits for every sender; returns how many copies were given up on.
    pub async fn finish(self) -> usize {
        for task in self.tasks {
            task.await.unwrap();
        }
        self.gave_up.load(Ordering::Relaxed)
    }
}

/// Delivers one copy of `event` like a provider: until a 2xx, with capped
/// exponential backoff and jitter, on whichever process the balancer picks;
/// `seen` hears of every attempt (process, answer, `Hookgate-Result`).
async fn deliver(
    client: &HttpClient,
    gates: &Gates,
    event: &str,
    mut rng: Rng,
    mut seen: impl FnMut(usize, Seen, Option<String>),
) -> bool {
    let body = stripe_event(event);
    for n in 0..MAX_ATTEMPTS {
        let (process, addr) = gates.pick(rng.next());
        let (answer, result) = attempt(client, addr, &body).await;
        seen(process, answer, result);
        if answer.ok() {
            return true;
        }
        let backoff = (20u64 << n.min(6)).min(1000);
        let jitter = rng.next() % (backoff / 2 + 1);
        tokio::time::sleep(Duration::from_millis(backoff / 2 + jitter)).await;
    }
    false
}

fn http_client() -> HttpClient {
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(2))
        .build(HttpConnector::new())
}

/// One POST, never panicking: a broken connection is an answer too. With
/// the answer's `Hookgate-Result`.
async fn attempt(client: &HttpClient, addr: SocketAddr, body: &[u8]) -> (Seen, Option<String>) {
    let mut req = Request::builder()
        .method("POST")
        .uri(format!("http://{addr}/webhooks/stripe"));
    for (k, v) in signed(&Scheme::Stripe, SECRET, body, "", None) {
        req = req.header(k, v);
    }
    let req = req.body(Full::new(Bytes::copy_from_slice(body))).unwrap();
    let call = async {
        let response = client.request(req).await.ok()?;
        let status = response.status().as_u16();
        let result = response
            .headers()
            .get("hookgate-result")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        response.into_body().collect().await.ok()?;
        Some((Seen::Status(status), result))
    };
    tokio::time::timeout(Duration::from_secs(5), call)
        .await
        .ok()
        .flatten()
        .unwrap_or((Seen::Broken, None))
}

pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A small deterministic generator (xorshift64*): the run's order and
/// choices vary by seed, not by chance.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// The app's 2xx answers per event (the number after `prefix` in the
/// body's `id`), and which process each came through (`/i{n}/...`).
pub fn app_successes(
    received: &[crate::support::upstream::Received],
    prefix: &str,
) -> std::collections::HashMap<usize, Vec<usize>> {
    let mut oks: std::collections::HashMap<usize, Vec<usize>> = Default::default();
    for r in received.iter().filter(|r| (200..300).contains(&r.status)) {
        let Some(event) = serde_json::from_slice::<serde_json::Value>(&r.body)
            .ok()
            .and_then(|v| v["id"].as_str()?.strip_prefix(prefix)?.parse().ok())
        else {
            continue;
        };
        let process = r.uri[2..r.uri.find("/webhooks").unwrap()].parse().unwrap();
        oks.entry(event).or_default().push(process);
    }
    oks
}

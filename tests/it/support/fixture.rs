//! One way to set up a gate for a test. `GateFixture` builds its config (a
//! temp dir for the sqlite store and the secret files, an upstream, the
//! providers, the store, extra settings) and starts the real gate in-process
//! on port 0, through the same `hookgate::start` that `hookgate run` calls
//! (`cli::blocking::serve`). The
//! `Gate` it hands back keeps all of that alive and talks to the gate.
//!
//! Settings apply to what was added last: `.secret(..)` and
//! `.provider_extra(..)` to the newest provider.

use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use hookgate::provider::Scheme;
use hookgate::settings::Settings;
use hookgate::{Running, config};
use http::Method;
use tempfile::TempDir;

use crate::support::gate::{self, Answer, SECRET, signed};
use crate::support::store_server::StoreServer;
use crate::support::upstream::Upstream;

type EditSettings = Arc<dyn Fn(&mut Settings) + Send + Sync>;

/// A gate's configuration, not yet started. Cloning it shares the temp dir
/// and the upstream: a clone starts another gate on the same config.
#[derive(Clone)]
pub struct GateFixture {
    dir: Arc<TempDir>,
    upstream: Target,
    upstream_timeout: String,
    upstream_extra: String,
    server_extra: String,
    store: StoreConfig,
    sections: String,
    providers: Vec<Provider>,
    edit: Option<EditSettings>,
}

/// Where the gate forwards.
#[derive(Clone)]
enum Target {
    /// A recording upstream started with the gate.
    Fresh,
    Recording(Upstream),
    /// Anything else: an app that writes raw bytes, a closed port, https.
    Url(String),
}

#[derive(Clone)]
struct Provider {
    name: String,
    scheme: Scheme,
    /// Entries of `secrets = [...]`, as TOML.
    secrets: Vec<String>,
    /// The first secret given by value: what `Gate::sign` signs with.
    signing: Option<String>,
    extra: String,
}

/// The `[store]` section: sqlite in the fixture's dir unless told otherwise.
#[derive(Clone)]
pub struct StoreConfig {
    backend: &'static str,
    url: Option<String>,
    lease: String,
    timeout: Option<String>,
    extra: String,
}

impl StoreConfig {
    pub fn sqlite() -> Self {
        Self::backend("sqlite", None)
    }

    pub fn memory() -> Self {
        Self::backend("memory", None)
    }

    /// The store on a test server (redis or postgres), with the server's
    /// default operation timeout unless `timeout` says otherwise.
    pub fn on<S: StoreServer>(server: &S) -> Self {
        Self::backend(S::BACKEND, Some(server.url())).extra(S::STORE_EXTRA)
    }

    fn backend(backend: &'static str, url: Option<String>) -> Self {
        Self {
            backend,
            url,
            lease: "5s".into(),
            timeout: None,
            extra: String::new(),
        }
    }

    pub fn lease(mut self, lease: &str) -> Self {
        self.lease = lease.into();
        self
    }

    /// `store.timeout`: how long one store operation may take.
    pub fn timeout(mut self, timeout: &str) -> Self {
        self.timeout = Some(timeout.into());
        self
    }

    /// More lines of the section, e.g. `max_response_bytes = 16`.
    pub fn extra(mut self, toml: &str) -> Self {
        self.extra.push_str(toml);
        self.extra.push('\n');
        self
    }

    fn toml(&self, dir: &Path) -> String {
        let mut out = format!("backend = \"{}\"\n", self.backend);
        if self.backend == "sqlite" {
            out += &format!("path = \"{}\"\n", dir.join("gate.db").display());
        }
        if let Some(url) = &self.url {
            out += &format!("url = \"{url}\"\n");
        }
        out += &format!("lease = \"{}\"\n", self.lease);
        if let Some(timeout) = &self.timeout {
            out += &format!("timeout = \"{timeout}\"\n");
        }
        out + &self.extra
    }
}

impl Default for GateFixture {
    fn default() -> Self {
        Self::new()
    }
}

impl GateFixture {
    /// No providers yet: a gate that only passes through, until
    /// `add_provider`.
    pub fn new() -> Self {
        Self {
            dir: Arc::new(tempfile::tempdir().expect("a temp dir for the gate")),
            upstream: Target::Fresh,
            upstream_timeout: "2s".into(),
            upstream_extra: String::new(),
            server_extra: String::new(),
            store: StoreConfig::sqlite(),
            sections: String::new(),
            providers: Vec::new(),
            edit: None,
        }
    }

    /// The provider most tests use: `stripe` at `/webhooks/stripe`, signed
    /// with `SECRET`.
    pub fn stripe() -> Self {
        Self::provider("stripe", Scheme::Stripe).secret(SECRET)
    }

    /// One provider `name` at `/webhooks/{name}`, with no secret yet.
    pub fn provider(name: &str, scheme: Scheme) -> Self {
        Self::new().add_provider(name, scheme)
    }

    /// Another provider `name` at `/webhooks/{name}`, with no secret yet.
    pub fn add_provider(mut self, name: &str, scheme: Scheme) -> Self {
        self.providers.push(Provider {
            name: name.into(),
            scheme,
            secrets: Vec::new(),
            signing: None,
            extra: String::new(),
        });
        self
    }

    /// A secret of the newest provider, written to a file in the temp dir
    /// (see `secret_path`).
    pub fn secret(mut self, value: &str) -> Self {
        let source = self.write_secret(value);
        let provider = self.newest();
        provider.signing.get_or_insert_with(|| value.to_owned());
        provider.secrets.push(format!("\"{source}\""));
        self
    }

    /// A secret of the newest provider that stops verifying after
    /// `not_after` (RFC 3339).
    pub fn secret_until(mut self, value: &str, not_after: &str) -> Self {
        let source = self.write_secret(value);
        self.newest().secrets.push(format!(
            "{{ source = \"{source}\", not_after = \"{not_after}\" }}"
        ));
        self
    }

    /// A secret source written as is (`env:NAME`, a `file:` that is not
    /// there).
    pub fn secret_source(mut self, source: &str) -> Self {
        self.newest().secrets.push(format!("\"{source}\""));
        self
    }

    /// The file holding secret `n` (from 0) of provider `name`, to rotate it.
    pub fn secret_path(&self, name: &str, n: usize) -> PathBuf {
        self.dir.path().join(format!("{name}.secret{n}"))
    }

    /// More lines of the newest provider's section.
    pub fn provider_extra(mut self, toml: &str) -> Self {
        let provider = self.newest();
        provider.extra.push_str(toml);
        provider.extra.push('\n');
        self
    }

    /// Forward to this recording upstream (shared with the test, which may
    /// outlive the gate or serve several gates).
    pub fn upstream(mut self, up: &Upstream) -> Self {
        self.upstream = Target::Recording(up.clone());
        self
    }

    /// Forward to a URL the test serves some other way.
    pub fn upstream_url(mut self, url: &str) -> Self {
        self.upstream = Target::Url(url.into());
        self
    }

    /// `upstream.timeout` (2 s unless told).
    pub fn upstream_timeout(mut self, timeout: &str) -> Self {
        self.upstream_timeout = timeout.into();
        self
    }

    /// More lines of `[upstream]`.
    pub fn upstream_extra(mut self, toml: &str) -> Self {
        self.upstream_extra.push_str(toml);
        self.upstream_extra.push('\n');
        self
    }

    /// More lines of `[server]`.
    pub fn server_extra(mut self, toml: &str) -> Self {
        self.server_extra.push_str(toml);
        self.server_extra.push('\n');
        self
    }

    pub fn store(mut self, store: StoreConfig) -> Self {
        self.store = store;
        self
    }

    /// Whole sections of their own, such as `[telemetry]`.
    pub fn section(mut self, toml: &str) -> Self {
        self.sections.push_str(toml);
        self.sections.push('\n');
        self
    }

    /// Edits the runtime settings after the config is loaded, before the
    /// gate starts: for what no config can say, such as `faults`.
    pub fn settings(mut self, edit: impl Fn(&mut Settings) + Send + Sync + 'static) -> Self {
        self.edit = Some(Arc::new(edit));
        self
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The config file's text.
    pub fn toml(&self) -> String {
        let url = match &self.upstream {
            Target::Fresh => panic!("the fixture has no upstream yet: give it one, or start it"),
            Target::Recording(up) => up.url(),
            Target::Url(url) => url.clone(),
        };
        let providers: String = self.providers.iter().map(Provider::toml).collect();
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nshutdown_grace = \"2s\"\n{}\n\
             [upstream]\nurl = \"{url}\"\ntimeout = \"{}\"\n{}\n[store]\n{}\n{}{providers}",
            self.server_extra,
            self.upstream_timeout,
            self.upstream_extra,
            self.store.toml(self.dir.path()),
            self.sections,
        )
    }

    /// Writes the config to `gate.toml` in the temp dir, for a `hookgate`
    /// process or command; returns its path.
    pub fn config_file(&self) -> PathBuf {
        let path = self.dir.path().join("gate.toml");
        std::fs::write(&path, self.toml()).unwrap();
        path
    }

    /// Starts the gate (and a recording upstream, if it has none).
    pub async fn start(mut self) -> Gate {
        if let Target::Fresh = self.upstream {
            self.upstream = Target::Recording(Upstream::start().await);
        }
        let toml = self.toml();
        let mut settings = config::load(&config::figment_from_str(&toml))
            .unwrap_or_else(|e| panic!("test config invalid:\n{e}\n---\n{toml}"));
        if let Some(edit) = &self.edit {
            edit(&mut settings);
        }
        let running = hookgate::start(settings).await.expect("gate starts");
        Gate {
            running,
            fixture: self,
        }
    }

    fn write_secret(&mut self, value: &str) -> String {
        let provider = &self.providers.last().expect("add a provider first");
        let path = self.secret_path(&provider.name, provider.secrets.len());
        std::fs::write(&path, value).unwrap();
        format!("file:{}", path.display())
    }

    fn newest(&mut self) -> &mut Provider {
        self.providers.last_mut().expect("add a provider first")
    }
}

impl Provider {
    fn toml(&self) -> String {
        format!(
            "[providers.{name}]\nscheme = \"{}\"\npath = \"/webhooks/{name}\"\nsecrets = [{}]\n{}\n",
            self.scheme.name(),
            self.secrets.join(", "),
            self.extra,
            name = self.name,
        )
    }
}

/// A running gate with everything it needs; dereferences to
/// `hookgate::Running` (`addr`, `admin_addr`, `gate`).
pub struct Gate {
    running: Running,
    fixture: GateFixture,
}

impl Deref for Gate {
    type Target = Running;

    fn deref(&self) -> &Running {
        &self.running
    }
}

impl Gate {
    /// The recording upstream the gate forwards to.
    pub fn upstream(&self) -> &Upstream {
        match &self.fixture.upstream {
            Target::Recording(up) => up,
            _ => panic!("this gate forwards to a URL, not to a recording upstream"),
        }
    }

    /// The config it runs on: `.fixture().clone().start()` starts another
    /// gate on the same store, upstream and secrets.
    pub fn fixture(&self) -> &GateFixture {
        &self.fixture
    }

    /// The first provider's path.
    pub fn path(&self) -> String {
        format!("/webhooks/{}", self.first().name)
    }

    /// Headers the first provider's sender would attach to `body`, signed
    /// now with its first secret.
    pub fn sign(&self, body: &[u8]) -> Vec<(String, String)> {
        let provider = self.first();
        let secret = provider
            .signing
            .as_deref()
            .expect("the first provider has a secret given by value");
        signed(&provider.scheme, secret, body, "", None)
    }

    /// Delivers `body` to the first provider, signed as its sender would.
    pub async fn deliver(&self, body: &[u8]) -> Answer {
        self.deliver_to(&self.path(), body).await
    }

    /// Like `deliver`, to another path: another spelling of it, another
    /// provider that shares the secret, a path no provider has.
    pub async fn deliver_to(&self, path: &str, body: &[u8]) -> Answer {
        self.post(path, &self.sign(body), body).await
    }

    /// Delivers every one of `bodies` to the first provider at once, signed,
    /// with `extra` headers after the signed ones; the answers come back in
    /// the order of `bodies`.
    pub async fn deliver_all_at_once(
        &self,
        bodies: Vec<Vec<u8>>,
        extra: &[(&str, &str)],
    ) -> Vec<Answer> {
        let sends: Vec<_> = bodies
            .into_iter()
            .map(|body| {
                let mut headers = self.sign(&body);
                headers.extend(extra.iter().map(|&(n, v)| (n.to_owned(), v.to_owned())));
                let (addr, path) = (self.addr, self.path());
                tokio::spawn(async move { gate::post(addr, &path, &headers, &body).await })
            })
            .collect();
        let mut answers = Vec::with_capacity(sends.len());
        for send in sends {
            answers.push(send.await.expect("the delivery's task ends"));
        }
        answers
    }

    pub async fn post(&self, path: &str, headers: &[(String, String)], body: &[u8]) -> Answer {
        gate::post(self.addr, path, headers, body).await
    }

    pub async fn send(
        &self,
        method: Method,
        path: &str,
        headers: &[(String, String)],
        body: impl Into<Bytes>,
    ) -> Answer {
        gate::send(self.addr, method, path, headers, body).await
    }

    /// A GET on the admin listener.
    pub async fn admin(&self, path: &str) -> Answer {
        gate::send(self.admin_addr, Method::GET, path, &[], "").await
    }

    /// The Prometheus text of `/metrics`.
    pub async fn metrics(&self) -> String {
        String::from_utf8_lossy(&self.admin("/metrics").await.body).into_owned()
    }

    /// Stops the gate gracefully (see `Running::shutdown`).
    pub async fn shutdown(self) {
        self.running.shutdown().await
    }

    fn first(&self) -> &Provider {
        self.fixture
            .providers
            .first()
            .expect("the gate has a provider")
    }
}

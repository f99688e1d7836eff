//! `hookgate queue`: the operator's view of queue mode's outbox.

use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use clap::Subcommand;

use super::EXIT_BAD_CONFIG;
use crate::settings::Settings;
use crate::store::outbox::{JobFilter, JobState, JobSummary, Outbox};

#[derive(Debug, Subcommand)]
pub enum QueueAction {
    /// List jobs, newest first.
    List {
        /// pending, dead or delivered; default: all.
        #[arg(long)]
        state: Option<String>,
        #[arg(long)]
        provider: Option<String>,
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Show an event's jobs.
    Show {
        #[arg(long)]
        provider: String,
        /// The event's key, as the provider sends it.
        key: String,
    },
    /// Deliver again, as a new series of attempts: one event's jobs, or
    /// (--dead) the dead letter. The dedupe record never blocks a replay.
    Replay {
        #[arg(long)]
        provider: Option<String>,
        /// The event's key (needs --provider).
        key: Option<String>,
        /// Replay every dead job (of --provider, received --since).
        #[arg(long)]
        dead: bool,
        /// An RFC 3339 time, or a duration ago ("2h").
        #[arg(long)]
        since: Option<String>,
    },
    /// Delete dead jobs (received --before).
    Purge {
        /// Required: only the dead letter is ever purged.
        #[arg(long)]
        dead: bool,
        #[arg(long)]
        provider: Option<String>,
        /// An RFC 3339 time, or a duration ago ("7d").
        #[arg(long)]
        before: Option<String>,
    },
}

/// Runs a `hookgate queue` command. Exit 0 when it did what was asked, 1
/// when there was nothing to act on or the store failed, 64 for a usage
/// error.
pub async fn queue(settings: &Settings, action: &QueueAction) -> ExitCode {
    let filter = match filter(settings, action) {
        Ok(filter) => filter,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(EXIT_BAD_CONFIG);
        }
    };
    let store = match super::open_store(settings).await {
        Ok(s) => s,
        Err(code) => return code,
    };
    let result = match action {
        QueueAction::List { limit, .. } => store.jobs(filter, *limit).await.map(|jobs| {
            print_jobs(&jobs);
            true
        }),
        QueueAction::Show { .. } => store.jobs(filter, 100).await.map(|jobs| {
            print_jobs(&jobs);
            !jobs.is_empty()
        }),
        QueueAction::Replay { .. } => store.replay(filter).await.map(|n| {
            println!("{n} job(s) put back to pending, due now");
            n > 0
        }),
        QueueAction::Purge { .. } => store.purge(filter).await.map(|n| {
            println!("{n} dead job(s) deleted");
            true
        }),
    };
    super::store_exit(result)
}

fn filter(settings: &Settings, action: &QueueAction) -> Result<JobFilter, String> {
    let known = |p: &Option<String>| match p {
        Some(name) if !settings.providers.iter().any(|s| &s.name == name) => {
            let names: Vec<&str> = settings.providers.iter().map(|p| p.name.as_str()).collect();
            Err(format!(
                "no provider named {name}; configured: {}",
                names.join(", ")
            ))
        }
        _ => Ok(p.clone()),
    };
    Ok(match action {
        QueueAction::List {
            state, provider, ..
        } => JobFilter {
            state: state
                .as_deref()
                .map(|s| {
                    JobState::parse(s)
                        .ok_or(format!("--state is pending, dead or delivered, not {s}"))
                })
                .transpose()?,
            provider: known(provider)?,
            ..JobFilter::default()
        },
        QueueAction::Show { provider, key } => JobFilter {
            provider: known(&Some(provider.clone()))?,
            key: Some(key.trim().to_lowercase()),
            ..JobFilter::default()
        },
        QueueAction::Replay {
            provider,
            key,
            dead,
            since,
        } => match (key, dead) {
            (Some(key), false) if provider.is_some() => JobFilter {
                provider: known(provider)?,
                key: Some(key.trim().to_lowercase()),
                ..JobFilter::default()
            },
            (None, true) => JobFilter {
                state: Some(JobState::Dead),
                provider: known(provider)?,
                since: since.as_deref().map(time).transpose()?,
                ..JobFilter::default()
            },
            _ => {
                return Err(
                    "replay one event (--provider P KEY) or the dead letter (--dead)".into(),
                );
            }
        },
        QueueAction::Purge {
            dead,
            provider,
            before,
        } => {
            if !dead {
                return Err("purge deletes dead jobs only: say --dead".into());
            }
            JobFilter {
                state: Some(JobState::Dead),
                provider: known(provider)?,
                before: before.as_deref().map(time).transpose()?,
                ..JobFilter::default()
            }
        }
    })
}

/// An RFC 3339 time, or a duration before now.
fn time(text: &str) -> Result<SystemTime, String> {
    humantime::parse_rfc3339_weak(text)
        .or_else(|_| humantime::parse_duration(text).map(|d: Duration| SystemTime::now() - d))
        .map_err(|_| format!("`{text}` is neither an RFC 3339 time nor a duration like 2h"))
}

fn print_jobs(jobs: &[JobSummary]) {
    for job in jobs {
        let stamp = |t: SystemTime| humantime::format_rfc3339_seconds(t).to_string();
        println!(
            "{}\t{}\t{}\tattempts={}\treceived={}\tdue={}\tlast_status={}\tlast_error={}",
            job.id,
            job.state.as_str(),
            job.key,
            job.attempts,
            stamp(job.received_at),
            stamp(job.due_at),
            job.last_status.map_or("-".to_owned(), |s| s.to_string()),
            job.last_error.as_deref().unwrap_or("-"),
        );
    }
}
